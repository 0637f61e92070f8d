"""What the dispatcher does with each class of the failure taxonomy, driven by the real
Claude Code CLI (``task.agent = "claude"``) against the mock Messages API, without a
gateway (the agent calls the mock with its own key, as a job without ``[[apis]]``
does): a 429 is a throttle that uses no rung, a usage window hours away stops the run
resumably with exit 8 and charges no unit, a spend cap stops it with exit 7, a turn
limit and a silent permission denial are the unit's failures, and every attempt's
class is in the journal, the events and the report."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import (
    claude_own_key_job,
    cli,
    far_from_resets,
    finished_attempts,
    own_key,
    pin_wall_clock,
    run_report,
)
from mockapi import Fault, MockApi

pytestmark = pytest.mark.slow

KEY = "sk-ant-own-key-outcomes-5b2e9c1d7a"


@pytest.fixture
def claude_job(
    claude_cli: Path, mock_api: MockApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    own_key(claude_cli, mock_api, monkeypatch, "ANTHROPIC_API_KEY", KEY)
    return claude_own_key_job(
        tmp_path,
        mock_api.url,
        "claude-outcomes",
        rest="""
        [retry]
        backoff = { initial = "250ms", max = "1s", jitter = "none" }
        throttle = { initial = "250ms", max = "10m" }
        """,
    )


def test_a_429_is_a_throttle_and_the_unit_then_succeeds(
    claude_job: Path, mock_api: MockApi
) -> None:
    mock_api.script(Fault.RATE_LIMIT, retry_after=0.2)
    ran = cli("run", str(claude_job))
    assert ran.code == 0, ran.out + ran.err
    attempts = finished_attempts(claude_job.parent)
    assert [(a["status"], a["kind"]) for a in attempts] == [
        ("throttled", "rate-limited"),
        ("succeeded", "success"),
    ]
    assert (
        attempts[0]["reason"]
        == "claude: rate-limited: API Error: Request rejected (429) · mock limit"
    )
    report = run_report(claude_job.parent)
    assert report["agentOutcomes"] == {"rate-limited": 1, "success": 1}
    (unit,) = report["units"]
    assert unit["rung"] == "default"  # the throttle used no rung
    # No gateway: the agent's own count of its tokens is the usage.
    (used,) = unit["usage"]
    assert used["api"] == "claude"
    assert (used["inputTokens"], used["outputTokens"]) == (12, 5)


def test_a_usage_window_hours_away_parks_the_run_with_exit_8(
    claude_job: Path, mock_api: MockApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "resets 3:45pm (Europe/Dublin)", read at a time of day hours before it: past
    # throttle.max (at the real time it is minutes away for a while every day).
    pin_wall_clock(monkeypatch, far_from_resets())
    mock_api.script(Fault.USAGE_WINDOW)
    ran = cli("run", str(claude_job))
    assert ran.code == 8, ran.out + ran.err
    assert "You've hit your session limit" in ran.err
    assert "`fanout run` continues the run after " in ran.err
    report = run_report(claude_job.parent)
    assert report["state"] == "stopped"
    assert report["totals"] == {"interrupted": 1}  # no unit charged, none failed
    assert report["agentOutcomes"] == {"usage-window": 1}
    # The window is over (the mock answers again): the same run continues and succeeds.
    ran = cli("run", str(claude_job))
    assert ran.code == 0, ran.out + ran.err
    assert run_report(claude_job.parent)["totals"] == {"succeeded": 1}


def test_a_spend_cap_stops_the_run_with_exit_7(claude_job: Path, mock_api: MockApi) -> None:
    mock_api.script(Fault.CREDIT)
    ran = cli("run", str(claude_job))
    assert ran.code == 7, ran.out + ran.err
    assert "claude: spend-cap: " in ran.err
    assert run_report(claude_job.parent)["totals"] == {"interrupted": 1}


def test_a_silent_permission_denial_is_a_false_success_and_fails_the_attempt(
    claude_job: Path, mock_api: MockApi
) -> None:
    # The mock's Bash call is denied (the job allows no tools): claude exits 0 anyway.
    mock_api.configure(tool=True)
    claude_job.write_text(
        claude_job.read_text().replace(
            "[retry]", '[[retry.ladder]]\nname = "only"\nattempts = 1\n[retry]'
        )
    )
    ran = cli("run", str(claude_job))
    assert ran.code == 1, ran.out + ran.err
    (attempt,) = finished_attempts(claude_job.parent)
    assert (attempt["status"], attempt["kind"]) == ("failed", "false-success")
    assert run_report(claude_job.parent)["totals"] == {"failed": 1}


def _one_rung_each(job: Path, *rungs: str) -> None:
    """Give ``job`` a ladder of one-attempt rungs named ``rungs``."""
    ladder = "".join(f'[[retry.ladder]]\nname = "{name}"\nattempts = 1\n' for name in rungs)
    job.write_text(job.read_text().replace("[retry]", ladder + "[retry]"))


def test_an_overload_is_a_throttle_that_uses_no_rung(claude_job: Path, mock_api: MockApi) -> None:
    mock_api.script(Fault.OVERLOADED)
    ran = cli("run", str(claude_job))
    assert ran.code == 0, ran.out + ran.err
    attempts = finished_attempts(claude_job.parent)
    assert [(a["status"], a["kind"], a["rung"]) for a in attempts] == [
        ("throttled", "overloaded", "default"),
        ("succeeded", "success", "default"),
    ]


def test_a_turn_limit_fails_the_attempt_and_the_unit_climbs(
    claude_job: Path, mock_api: MockApi
) -> None:
    # One turn allowed, and the mock's first answer is a tool call: error_max_turns.
    # The second rung allows the turns it takes (and the Bash tool the mock calls).
    mock_api.configure(tool=True)
    claude_job.write_text(
        claude_job.read_text().replace(
            'agent = "claude"', 'agent = "claude"\nargs = ["--allowedTools", "Bash"]'
        )
    )
    _one_rung_each(claude_job, "short", "long")
    text = claude_job.read_text().replace(
        'name = "short"\nattempts = 1\n',
        'name = "short"\nattempts = 1\ncommand = ["claude", "-p", "--output-format", "json",'
        ' "--allowedTools", "Bash", "--max-turns", "1"]\n',
    )
    claude_job.write_text(text)
    ran = cli("run", str(claude_job))
    assert ran.code == 0, ran.out + ran.err
    attempts = finished_attempts(claude_job.parent)
    assert [(a["status"], a["kind"], a["rung"]) for a in attempts] == [
        ("failed", "turn-limit", "short"),
        ("succeeded", "success", "long"),
    ]


def test_a_refused_key_is_an_error_and_fails_the_unit(claude_job: Path, mock_api: MockApi) -> None:
    mock_api.script(Fault.UNAUTHORIZED)
    _one_rung_each(claude_job, "only")
    ran = cli("run", str(claude_job))
    assert ran.code == 1, ran.out + ran.err
    (attempt,) = finished_attempts(claude_job.parent)
    assert (attempt["status"], attempt["kind"]) == ("failed", "error")
    assert attempt["reason"].startswith("claude: error: ")
