"""``task.agent = "claude"`` runs the real Claude Code CLI: the preset's command and
environment, and nothing else from the job but ``--allowedTools``, make a working
headless worker through the gateway against the mock Messages API (tests/mockapi.py),
in bwrap, a real two-turn tool loop per unit."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from helpers import cli, write_job
from mockapi import MockApi, Usage

pytestmark = pytest.mark.slow

KEY = "sk-ant-real-preset-3c8e1b9d5f2a7064"
UNITS = ("alpha", "beta")


def test_the_claude_preset_runs_the_real_cli_through_the_gateway(
    claude_cli: Path, mock_api: MockApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required (scripts/system-deps installs it)")
    # The preset's command is `claude`, found on the PATH workers get.
    monkeypatch.setenv("PATH", f"{claude_cli.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)
    mock_api.configure(tool=True, require_key=KEY, usage=Usage(input_tokens=40, output_tokens=9))
    items = ", ".join(f'"{unit}"' for unit in UNITS)
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "claude-preset"
        [inputs]
        items = [{items}]
        [units]
        collect = ["out.txt"]
        [task]
        agent = "claude"
        args = ["--allowedTools", "Bash"]
        prompt = "Write done into out.txt."
        timeout = "90s"
        [runtime]
        network = true
        sandbox = "bwrap"
        maxConcurrentTasks = 2
        [[apis]]
        name = "anthropic"
        upstream = "{mock_api.url}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        outputTokens = {{ limit = 6000, per = "1m" }}
        """,
    )
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    posts = mock_api.posts()
    assert [p.status for p in posts] == [200] * 2 * len(UNITS)
    # CLAUDE_CODE_MAX_OUTPUT_TOKENS: half the outputTokens window.
    assert {p.json()["max_tokens"] for p in posts} == {3000}
    (path,) = (tmp_path / ".fanout" / "runs").glob("*/report.json")
    report: dict[str, Any] = json.loads(path.read_text())
    assert report["totals"] == {"succeeded": len(UNITS)}
    assert sorted(unit["collected"] == ["out.txt"] for unit in report["units"]) == [True, True]
