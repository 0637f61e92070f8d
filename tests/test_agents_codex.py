"""fanout.agents.codex against the real Codex CLI's output: golden files captured from
codex 0.171.0 run in bwrap against tests/mockapi.py's Responses route, one per situation
(tests/codexrun.py; each .json says how it was captured and the Reading expected), the
documented cases the real binary does not produce here (an exit 0 beside turn.failed),
and a live re-capture that must still print what the goldens hold."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import codexrun
import pytest

from fanout import agents
from fanout.agents import codex
from fanout.agents.taxonomy import Kind, Reading

GOLDEN = Path(__file__).parent / "data" / "agents" / "codex"
CASES = sorted(p.stem for p in GOLDEN.glob("*.out"))


def _golden(case: str) -> tuple[dict[str, Any], str]:
    header = json.loads((GOLDEN / f"{case}.json").read_text())
    return header, (GOLDEN / f"{case}.out").read_text()


def _expected(header: dict[str, Any]) -> Reading:
    fields = dict(header["reading"])
    return Reading(**{**fields, "kind": Kind(fields["kind"])})


def test_every_capture_has_a_golden() -> None:
    assert sorted(codexrun.CASES) == CASES


@pytest.mark.parametrize("case", CASES)
def test_a_golden_reads_as_its_header_says(case: str) -> None:
    header, output = _golden(case)
    now = datetime.fromisoformat(header["now"])
    reading = codex.read(exit_code=header["exit_code"], output=output, now=now)
    assert reading == _expected(header)
    assert agents.read("codex", exit_code=header["exit_code"], output=output, now=now) == reading


def test_the_goldens_cover_the_taxonomy_codex_can_report() -> None:
    kinds = {case: _expected(_golden(case)[0]).kind for case in CASES}
    assert kinds == {
        "overloaded": Kind.OVERLOADED,
        "quota": Kind.SPEND_CAP,
        "rate-limit": Kind.RATE_LIMITED,
        "stream-error": Kind.ERROR,
        "success": Kind.SUCCESS,
        "unauthorized": Kind.ERROR,
        "unreachable": Kind.ERROR,
        "usage-window": Kind.USAGE_WINDOW,
    }


def test_the_usage_window_parks_until_the_wall_clock_codex_printed() -> None:
    header, output = _golden("usage-window")
    assert "try again at 5:46 PM." in output
    reading = codex.read(exit_code=1, output=output, now=datetime.fromisoformat(header["now"]))
    assert reading.reset_at == datetime(2026, 12, 1, 17, 46, tzinfo=UTC).timestamp()
    # Read after 5:46 PM the same words mean tomorrow's 5:46 PM.
    later = codex.read(exit_code=1, output=output, now=datetime(2026, 12, 1, 18, 0, tzinfo=UTC))
    assert later.reset_at == datetime(2026, 12, 2, 17, 46, tzinfo=UTC).timestamp()
    # The clock is codex's, in the TZ the preset gives it (UTC), not the coordinator's.
    new_york = datetime.fromisoformat(header["now"]).astimezone(ZoneInfo("America/New_York"))
    assert codex.read(exit_code=1, output=output, now=new_york).reset_at == reading.reset_at


def test_the_success_reports_the_turns_usage_uncached_input_apart() -> None:
    header, output = _golden("success")
    assert '"input_tokens":68,"cached_input_tokens":8' in output
    reading = codex.read(exit_code=0, output=output, now=datetime.fromisoformat(header["now"]))
    # Two requests of the mock's 30 uncached + 4 cached input and 7 output tokens.
    assert (
        reading.input_tokens,
        reading.cache_read_tokens,
        reading.cache_write_tokens,
        reading.output_tokens,
    ) == (60, 8, 0, 14)


# The issue: "Codex can exit 0 beside a turn.failed event".  0.171 exits 1 there; an exit
# 0 must read the same, and a failure of no class of its own is then a false success.
@pytest.mark.parametrize(
    ("case", "kind"),
    [
        ("rate-limit", Kind.RATE_LIMITED),
        ("usage-window", Kind.USAGE_WINDOW),
        ("quota", Kind.SPEND_CAP),
        ("overloaded", Kind.OVERLOADED),
        ("unauthorized", Kind.FALSE_SUCCESS),
        ("stream-error", Kind.FALSE_SUCCESS),
        ("unreachable", Kind.FALSE_SUCCESS),
    ],
)
def test_an_exit_0_beside_turn_failed_is_the_failure_not_a_success(case: str, kind: Kind) -> None:
    header, output = _golden(case)
    now = datetime.fromisoformat(header["now"])
    reading = codex.read(exit_code=0, output=output, now=now)
    assert reading == replace(_expected(header), kind=kind)


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_an_exit_0_without_a_completed_turn_is_a_false_success() -> None:
    output = '{"type":"thread.started","thread_id":"t"}\n{"type":"turn.started"}\n'
    assert codex.read(exit_code=0, output=output, now=NOW) == Reading(
        kind=Kind.FALSE_SUCCESS, detail="codex exited 0 without turn.completed"
    )


def test_a_completed_turn_with_a_failing_exit_is_an_error_with_the_usage() -> None:
    header, output = _golden("success")
    assert codex.read(exit_code=137, output=output, now=NOW) == replace(
        _expected(header), kind=Kind.ERROR, detail="codex exited 137"
    )


def test_a_crash_before_any_event_is_an_error_in_its_last_words() -> None:
    output = "error: unexpected argument '--jsonn' found\n\nUsage: codex exec [OPTIONS]\n"
    assert codex.read(exit_code=2, output=output, now=NOW) == Reading(
        kind=Kind.ERROR, detail="codex exited 2: error: unexpected argument '--jsonn' found"
    )


# The API's own rate-limit message, as Codex passes on a response.failed of
# rate_limit_exceeded: the wait it names is the pause, the limit's window a minute.
@pytest.mark.parametrize(("said", "after"), [("1.5s", 1.5), ("250ms", 0.25), ("20s", 20.0)])
def test_a_rate_limit_that_names_its_wait_pauses_that_long(said: str, after: float) -> None:
    message = f"Rate limit reached for gpt-5 on tokens per min. Please try again in {said}."
    output = json.dumps({"type": "turn.failed", "error": {"message": message}})
    assert codex.read(exit_code=1, output=output, now=NOW) == Reading(
        kind=Kind.RATE_LIMITED, detail=message, retry_after=after, window=60.0
    )


def test_a_context_window_overflow_climbs_the_ladder() -> None:
    message = "Codex ran out of room in the model's context window. Start a new thread."
    output = json.dumps({"type": "turn.failed", "error": {"message": message}})
    assert codex.read(exit_code=1, output=output, now=NOW) == Reading(
        kind=Kind.TURN_LIMIT, detail=message
    )


def test_a_long_message_is_cut_to_one_line() -> None:
    message = "unexpected status 400 Bad Request:\n" + "x" * 400
    output = json.dumps({"type": "turn.failed", "error": {"message": message}})
    reading = codex.read(exit_code=1, output=output, now=NOW)
    assert reading.detail == ("unexpected status 400 Bad Request: " + "x" * 264 + "…")
    assert len(reading.detail) == codex.DETAIL_LIMIT


def _normal(output: str) -> str:
    """A capture with what differs between two runs made alike: the thread's id, the
    mock's port, the wall clock of a reset; and without the warning a CODEX_HOME under
    /tmp draws (tmp_path; the goldens were captured under /var/tmp), which changes
    nothing else."""
    output = re.sub(
        r"(?m)^WARNING: proceeding, even though we could not create PATH.*\n?", "", output
    )
    output = re.sub(r'"thread_id":"[0-9a-f-]+"', '"thread_id":"T"', output)
    output = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", output)
    return _RESET.sub("try again at CLOCK", output)


# The reset as codex prints it: the clock alone when it falls on the same day, the date
# before it when on another ("Dec 2nd, 2026 12:17 AM": a capture near midnight).
_RESET = re.compile(
    r"try again at (?:[A-Z][a-z]{2} \d{1,2}(?:st|nd|rd|th), \d{4} )?\d{1,2}:\d{2} [AP]M"
)


def _codex_says(reset: datetime, now: datetime) -> str:
    """How codex words a reset at ``reset`` read at ``now`` (both in its TZ)."""
    clock = f"{reset.hour % 12 or 12}:{reset.minute:02d} {'AM' if reset.hour < 12 else 'PM'}"
    if reset.date() == now.date():
        return clock
    suffix = (
        "th" if reset.day in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(reset.day % 10, "th")
    )
    return f"{reset:%b} {reset.day}{suffix}, {reset.year} {clock}"


@pytest.mark.parametrize(
    ("now", "says"),
    [
        (datetime(2026, 12, 1, 16, 16, tzinfo=UTC), "5:46 PM"),
        (datetime(2026, 12, 1, 22, 47, tzinfo=UTC), "Dec 2nd, 2026 12:17 AM"),
        (datetime(2026, 12, 31, 23, 30, tzinfo=UTC), "Jan 1st, 2027 1:00 AM"),
    ],
)
def test_a_capture_at_any_hour_normalises_to_the_golden(now: datetime, says: str) -> None:
    # The live capture's window reopens 90 minutes after it; read near midnight, codex
    # names the next day's date as well as the clock.
    reset = now + timedelta(seconds=5400)
    assert _codex_says(reset, now) == says
    _, golden = _golden("usage-window")
    live = golden.replace("try again at 5:46 PM", f"try again at {says}")
    assert _normal(live) == _normal(golden)
    reading = codex.read(exit_code=1, output=live, now=now)
    assert reading.reset_at == reset.timestamp()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(codexrun.CASES))
def test_the_real_codex_still_prints_the_golden(codex_cli: Path, tmp_path: Path, case: str) -> None:
    now = datetime.now(UTC)
    ran = codexrun.capture(codex_cli, case, tmp_path / "sandbox")
    header, golden = _golden(case)
    output = ran.stdout + ran.stderr
    assert (ran.exit_code, _normal(output)) == (header["exit_code"], _normal(golden))
    reading = codex.read(exit_code=ran.exit_code, output=output, now=now)
    expected = _expected(header)
    assert reading.kind == expected.kind
    if case == "success":
        assert reading == expected
        assert (ran.work / "out.txt").read_text() == "done\n"
        # The CLI keeps its session in CODEX_HOME, but never the token it was given.
        written = [p for p in ran.work.parent.rglob("*") if p.is_file()]
        assert written
        assert [p for p in written if codexrun.TOKEN.encode() in p.read_bytes()] == []
    if case == "usage-window":
        # The mock's window reopens 5400 s after the refusal; codex prints the minute.
        assert reading.reset_at is not None
        assert now.timestamp() + 5400 - 60 <= reading.reset_at <= now.timestamp() + 5400 + 60
