"""The real Claude Code CLI as fanout's worker, through the gateway, against the mock
Messages API (tests/mockapi.py) in tool mode: each unit is a real two-turn agent loop
(a Bash tool call that writes out.txt, then the end of the turn), in bwrap, on this
machine and on an SSH host (through the host's remote forward).

The upstream allows 2 requests in any 0.9 s and the job declares 2 a second: it never
receives more than that in a window, never answers 429 (so no 429 can reach an agent),
sees only the real key, and each unit's reported requests and tokens are its share of
the upstream's tally."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fanout.attempt import staging

from helpers import cli, write_job
from mockapi import MockApi, Usage

pytestmark = pytest.mark.slow

KEY = "sk-ant-real-claude-9e1f4a7c2d6b8305"
UNITS = ("alpha", "beta", "gamma")


def _job(directory: Path, claude: Path, upstream: str, runtime: str) -> Path:
    items = ", ".join(f'"{unit}"' for unit in UNITS)
    return write_job(
        directory,
        f"""
        version = 1
        name = "claude-through-gateway"
        [inputs]
        items = [{items}]
        [units]
        collect = ["out.txt"]
        [task]
        prompt = "Write done into out.txt."
        command = ["{claude}", "-p", "--output-format", "json", "--allowedTools", "Bash"]
        timeout = "90s"
        # No traffic but the API's; a reservation the outputTokens window can hold.
        env = {{ CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1", \
CLAUDE_CODE_MAX_OUTPUT_TOKENS = "4096" }}
        [runtime]
        network = true
        sandbox = "bwrap"
        {runtime}
        [[apis]]
        name = "anthropic"
        upstream = "{upstream}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        requests = {{ limit = 2, per = "1s" }}
        outputTokens = {{ limit = 20000, per = "1m" }}
        """,
    )


def _check_run(directory: Path, mock: MockApi, out: str) -> None:
    posts = mock.posts()
    assert [p.status for p in posts] == [200] * 2 * len(UNITS), out
    assert mock.max_in_window(0.9) <= 2
    assert {p.key for p in posts} == {KEY}
    (path,) = (directory / ".fanout" / "runs").glob("*/report.json")
    report: dict[str, Any] = json.loads(path.read_text())
    assert report["totals"] == {"succeeded": len(UNITS)}
    tally = mock.tally()
    (api,) = report["apis"]
    assert (api["requests"], api["inputTokens"], api["outputTokens"]) == (
        2 * len(UNITS),
        tally.input_tokens,
        tally.output_tokens,
    )
    assert api["cacheReadTokens"] == tally.cache_read_tokens
    one = mock.config.usage
    for unit in report["units"]:
        (used,) = unit["usage"]
        assert (used["requests"], used["inputTokens"], used["outputTokens"]) == (
            2,
            2 * one.input_tokens,
            2 * one.output_tokens,
        )
        assert unit["collected"] == ["out.txt"]
        folder = path.parent / "units" / staging.unit_folder_name(unit["unit"])
        assert (folder / "out.txt").read_text() == "done\n"  # the Bash tool's work
    for file in directory.rglob("*"):
        if file.is_file() and not file.is_symlink():
            assert KEY.encode() not in file.read_bytes(), file


@pytest.fixture
def claude_mock(mock_api: MockApi, monkeypatch: pytest.MonkeyPatch) -> MockApi:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required (scripts/system-deps installs it)")
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)
    mock_api.configure(
        tool=True,
        limit=2,
        window=0.9,
        require_key=KEY,
        usage=Usage(input_tokens=40, output_tokens=9, cache_read_tokens=3),
    )
    return mock_api


def test_the_claude_cli_runs_units_through_the_gateway_in_bwrap(
    claude_cli: Path, claude_mock: MockApi, tmp_path: Path
) -> None:
    job = _job(tmp_path, claude_cli, claude_mock.url, "maxConcurrentTasks = 3")
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    _check_run(tmp_path, claude_mock, ran.out + ran.err)


def test_the_claude_cli_runs_units_through_the_gateway_on_an_ssh_host(
    claude_cli: Path, claude_mock: MockApi, tmp_path: Path, ssh_pool: Any
) -> None:
    ssh_pool.inventory(tmp_path, ssh_pool.add("h1"), slots=3)
    root = ssh_pool.base / "sandboxes"
    job = _job(tmp_path, claude_cli, claude_mock.url, 'hosts = "hosts.toml"')
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    _check_run(tmp_path, claude_mock, ran.out + ran.err)
    assert sorted(root.iterdir()) == []  # every sandbox removed, claude's HOME with it
    events = next((tmp_path / ".fanout" / "runs").glob("*/events.jsonl")).read_text()
    hosts = {json.loads(line).get("host") for line in events.splitlines()}
    assert "h1" in hosts
