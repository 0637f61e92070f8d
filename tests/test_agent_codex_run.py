"""``task.agent = "codex"`` runs the real Codex CLI through the gateway: the preset's
command, its config file written into the unit's HOME by the attempt's setup step (the
gateway's URL for this host, the token's variable, no update check, no plugins), and a
two-turn tool loop against the mock Responses API, in bwrap."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fanout.attempt import staging

from helpers import cli, write_job
from mockapi import MockApi, Usage

pytestmark = pytest.mark.slow

KEY = "sk-proj-real-codex-run-8d1f3b6a9c2e4f70"


def test_the_codex_preset_runs_the_real_cli_through_the_gateway(
    codex_cli: Path, mock_api: MockApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required (scripts/system-deps installs it)")
    monkeypatch.setenv("PATH", f"{codex_cli.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FANOUT_TEST_OPENAI_KEY", KEY)
    mock_api.configure(tool=True, require_key=KEY, usage=Usage(input_tokens=30, output_tokens=7))
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "codex-preset"
        [inputs]
        items = ["alpha", "beta"]
        [units]
        collect = ["out.txt"]
        [task]
        agent = "codex"
        args = ["--model", "gpt-5-codex"]   # a model codex knows offers its shell tool
        prompt = "Write done into out.txt."
        timeout = "90s"
        [runtime]
        network = true
        sandbox = "bwrap"
        [[apis]]
        name = "openai"
        upstream = "{mock_api.url}/v1"
        style = "openai"
        keySecret = "FANOUT_TEST_OPENAI_KEY"
        requests = {{ limit = 20, per = "1s" }}
        """,
    )
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    posts = mock_api.posts()
    assert {p.path for p in posts} == {"/v1/responses"}
    assert {p.key for p in posts} == {KEY}
    assert all(p.status == 200 for p in posts)
    (path,) = (tmp_path / ".fanout" / "runs").glob("*/report.json")
    report = json.loads(path.read_text())
    assert report["totals"] == {"succeeded": 2}
    assert report["agentOutcomes"] == {"success": 2}
    for unit in report["units"]:
        folder = path.parent / "units" / staging.unit_folder_name(unit["unit"])
        assert (folder / "out.txt").read_text() == "done\n"  # codex's shell call
        (used,) = unit["usage"]
        assert used["requests"] == len(posts) // 2
