"""The real Claude Code CLI against the mock upstream (tests/mockapi.py), inside bwrap as
fanout's sandboxes run it: the mock's tool mode gives it a real two-turn agent loop (a
Bash tool call, then the end of the turn), and what the CLI reports is what the mock
answered.  No fanout in between: this proves the mock and the worker's environment
that the gateway's end-to-end tests build on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fanout.sandbox import command, tool_dirs
from fanout.transport import Place

from mockapi import MockApi, Usage

pytestmark = pytest.mark.slow

TOKEN = "tok-claude-cli-test-7f3a9c"


def test_claude_runs_a_two_turn_tool_loop_against_the_mock(
    claude_cli: Path, mock_api: MockApi, tmp_path: Path
) -> None:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required for these tests (scripts/system-deps installs it)")
    mock_api.configure(
        tool=True,
        command="echo done > out.txt",
        usage=Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4, cache_write_tokens=2),
    )
    # The sandbox directory is bound into bwrap's view (its /tmp and /var/tmp are
    # private), so a HOME inside it is writable there wherever tmp_path lies.
    base = tmp_path / "sandbox"
    (base / "work").mkdir(parents=True)
    (base / "home").mkdir()
    path = f"{claude_cli.parent}:/usr/local/bin:/usr/bin:/bin"
    place = Place(
        host="local",
        kind="bwrap",
        base=str(base),
        path=path,
        tools=tuple(str(d) for d in tool_dirs(path)),
        root=os.geteuid() == 0,
    )
    env = {
        "PATH": path,
        "HOME": str(base / "home"),
        "ANTHROPIC_BASE_URL": mock_api.url,
        "ANTHROPIC_API_KEY": TOKEN,
        # Without it the CLI looks up some 40 names in DNS (measured): nothing else may
        # leave the sandbox.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # The CLI's default of 64000 would exceed any sensible outputTokens window.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
    }
    # As root (CI, the sandboxes here) --dangerously-skip-permissions is refused, and
    # without a permission flag the Bash call is silently denied (exit 0).
    argv = [str(claude_cli), "-p", "--output-format", "json", "--allowedTools", "Bash"]
    done = subprocess.run(
        command(place, argv, network=True),
        input="Write done to out.txt.",
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )

    assert done.returncode == 0, (done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert (result["type"], result["is_error"], result["num_turns"]) == ("result", False, 2)
    assert (result["result"], result["stop_reason"], result["permission_denials"]) == (
        "All done.",
        "end_turn",
        [],
    )
    assert (base / "work" / "out.txt").read_text() == "done\n"

    posts = mock_api.posts()
    assert [(s.path, s.query, s.key, s.status) for s in posts] == [
        ("/v1/messages", "beta=true", TOKEN, 200)
    ] * 2
    assert [s.json()["max_tokens"] for s in posts] == [4096, 4096]
    assert [s.stream for s in posts] == [True, True]
    tool_result = posts[1].json()["messages"][-1]["content"][0]
    assert (tool_result["type"], tool_result["is_error"]) == ("tool_result", False)
    assert [(s.method, s.path) for s in mock_api.seen if s.method != "POST"] == [("HEAD", "/")]

    tally = mock_api.tally(TOKEN)
    assert tally == Usage(
        input_tokens=60, output_tokens=14, cache_read_tokens=8, cache_write_tokens=4
    )
    usage = result["usage"]
    assert (
        usage["input_tokens"],
        usage["output_tokens"],
        usage["cache_read_input_tokens"],
        usage["cache_creation_input_tokens"],
    ) == (
        tally.input_tokens,
        tally.output_tokens,
        tally.cache_read_tokens,
        tally.cache_write_tokens,
    )
    # The CLI keeps its transcript in HOME, but never the key it was given.
    written = [p for p in base.rglob("*") if p.is_file()]
    assert written
    assert [p for p in written if TOKEN.encode() in p.read_bytes()] == []
