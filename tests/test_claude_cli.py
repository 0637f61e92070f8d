"""The real Claude Code CLI against the mock upstream (tests/mockapi.py), inside bwrap as
fanout's sandboxes run it: the mock's tool mode gives it a real two-turn agent loop (a
Bash tool call, then the end of the turn), and what the CLI reports is what the mock
answered.  No fanout in between: this proves the mock, and the worker environment the
gateway's end-to-end tests build on; the second test pins what the CLI does with each
upstream refusal, which is what the gateway must absorb or pass through."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import run_agent
from mockapi import Fault, MockApi, Usage

pytestmark = pytest.mark.slow

TOKEN = "tok-claude-cli-test-7f3a9c"


def _claude(
    claude_cli: Path,
    api: MockApi,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    *,
    prefix: str = "",
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run `claude -p` once in a bwrap sandbox at tmp_path/sandbox, with network (the
    mock is on the host's loopback) and nothing in its environment but what is named
    here; returns the process and the sandbox's work directory (its cwd)."""
    base = tmp_path / "sandbox"
    (base / "home").mkdir(parents=True)
    environment = {
        "HOME": str(base / "home"),
        "ANTHROPIC_BASE_URL": api.url + prefix,
        "ANTHROPIC_API_KEY": TOKEN,
        # Without it the CLI looks up some 40 names in DNS (measured): nothing else may
        # leave the sandbox.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # The CLI's default of 64000 would exceed any sensible outputTokens window.
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        **(env or {}),
    }
    # As root (CI, the sandboxes here) --dangerously-skip-permissions is refused, and
    # without a permission flag the Bash call is silently denied (exit 0).
    args = ["-p", "--output-format", "json", "--allowedTools", "Bash"]
    done = run_agent(
        claude_cli, args, base, environment, stdin="Write done to out.txt.", timeout=90
    )
    return done, base / "work"


# "/anthropic": a base URL with a path, as the gateway's is ({gateway}/{api name}): the
# CLI sends its HEAD pre-check to that path and its POSTs below it.
@pytest.mark.parametrize("prefix", ["", "/anthropic"])
def test_claude_runs_a_two_turn_tool_loop_against_the_mock(
    claude_cli: Path, mock_api: MockApi, tmp_path: Path, prefix: str
) -> None:
    mock_api.configure(
        tool=True,
        command="echo done > out.txt",
        usage=Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4, cache_write_tokens=2),
        prefix=prefix,
    )
    done, work = _claude(claude_cli, mock_api, tmp_path, prefix=prefix)

    assert done.returncode == 0, (done.stdout, done.stderr)
    result = json.loads(done.stdout)
    assert (result["type"], result["is_error"], result["num_turns"]) == ("result", False, 2)
    assert (result["result"], result["stop_reason"], result["permission_denials"]) == (
        "All done.",
        "end_turn",
        [],
    )
    assert (work / "out.txt").read_text() == "done\n"

    posts = mock_api.posts()
    assert [(s.path, s.query, s.key, s.status) for s in posts] == [
        (f"{prefix}/v1/messages", "beta=true", TOKEN, 200)
    ] * 2
    assert [s.json()["max_tokens"] for s in posts] == [4096, 4096]
    assert [s.stream for s in posts] == [True, True]
    tool_result = posts[1].json()["messages"][-1]["content"][0]
    assert (tool_result["type"], tool_result["is_error"]) == ("tool_result", False)
    assert [(s.method, s.path) for s in mock_api.seen if s.method != "POST"] == [
        ("HEAD", prefix or "/")
    ]

    tally = mock_api.tally(TOKEN)
    assert tally == Usage(
        input_tokens=60, output_tokens=14, cache_read_tokens=8, cache_write_tokens=4
    )
    assert _usage(result) == tally
    # The CLI keeps its transcript in HOME, but never the key it was given.
    written = [p for p in work.parent.rglob("*") if p.is_file()]
    assert written
    assert [p for p in written if TOKEN.encode() in p.read_bytes()] == []


def _usage(result: dict[str, Any]) -> Usage:
    usage = result["usage"]
    return Usage(
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        cache_read_tokens=usage["cache_read_input_tokens"],
        cache_write_tokens=usage["cache_creation_input_tokens"],
    )


@pytest.mark.parametrize(
    ("fault", "retries", "statuses", "exit_code", "answer"),
    [
        # The problem: a 429 the gateway lets through ends the agent, its turns lost.
        (Fault.RATE_LIMIT, "0", [429], 1, "API Error: Request rejected (429) · mock limit"),
        # A credit refusal is not retried even with the CLI's default retries...
        (Fault.CREDIT, None, [400], 1, "Credit balance is too low"),
        # ...but a spend-limit 429 and a 401 are, as often as CLAUDE_CODE_MAX_RETRIES
        # allows (by default for minutes): the gateway must answer the retries of a
        # stopped API, and a revoked token, with something the CLI gives up on.
        (
            Fault.SPEND_LIMIT,
            "2",
            [429, 429, 429],
            1,
            "API Error: Request rejected (429) · You have reached your organization's"
            " monthly spend limit; it resets at 2027-01-01T00:00:00Z.",
        ),
        (Fault.UNAUTHORIZED, "2", [401, 401, 401], 1, "Invalid API key · Fix external API key"),
        # A stream that breaks mid-way is retried whatever CLAUDE_CODE_MAX_RETRIES says,
        # and the CLI counts the broken stream's usage too.
        (Fault.STREAM_ERROR, "0", [200, 200, 200], 0, "All done."),
    ],
    ids=lambda v: v.name if isinstance(v, Fault) else None,
)
def test_what_the_cli_does_with_an_upstream_refusal(
    claude_cli: Path,
    mock_api: MockApi,
    tmp_path: Path,
    fault: Fault,
    retries: str | None,
    statuses: list[int],
    exit_code: int,
    answer: str,
) -> None:
    mock_api.configure(tool=True)
    mock_api.script(fault, times=len(statuses) if exit_code else 1)
    env = {} if retries is None else {"CLAUDE_CODE_MAX_RETRIES": retries}
    done, _ = _claude(claude_cli, mock_api, tmp_path, env)
    result = json.loads(done.stdout)
    assert (done.returncode, result["is_error"], result["result"]) == (
        exit_code,
        bool(exit_code),
        answer,
    )
    assert [s.status for s in mock_api.posts()] == statuses
    assert result["api_error_status"] == (statuses[-1] if exit_code else None)
    assert _usage(result) == mock_api.tally()
