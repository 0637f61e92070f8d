"""fanout.agents.usagewindows: every documented usage-limit form read into an epoch reset,
wall-clock forms on the zone's own calendar (DST gaps and repeats, a time already passed
today, a reset seconds ago)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from fanout.agents.usagewindows import find

DUBLIN = ZoneInfo("Europe/Dublin")
BERLIN = ZoneInfo("Europe/Berlin")


def utc(year: int, month: int, day: int, hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


CASES = [
    # (text, now, expected reset (UTC), the words it was read from)
    (
        "You've hit your session limit · resets 3:45pm (Europe/Dublin)",
        utc(2026, 12, 1, 14, 0),
        utc(2026, 12, 1, 15, 45),
        "resets 3:45pm (Europe/Dublin)",
    ),
    # Already passed today: tomorrow's.
    (
        "You've hit your session limit · resets 3:45pm (Europe/Dublin)",
        utc(2026, 12, 1, 16, 0),
        utc(2026, 12, 2, 15, 45),
        "resets 3:45pm (Europe/Dublin)",
    ),
    # Read 30 s after it: the window that has just reset (GRACE), not tomorrow's.
    (
        "resets 3:45pm (Europe/Dublin)",
        utc(2026, 12, 1, 15, 45, 30),
        utc(2026, 12, 1, 15, 45),
        "resets 3:45pm (Europe/Dublin)",
    ),
    # 61 s after it: tomorrow.
    (
        "resets 3:45pm (Europe/Dublin)",
        utc(2026, 12, 1, 15, 46, 1),
        utc(2026, 12, 2, 15, 45),
        "resets 3:45pm (Europe/Dublin)",
    ),
    # Summer time: 3:45pm IST is 14:45 UTC.
    (
        "resets 3:45pm (Europe/Dublin)",
        utc(2026, 7, 1, 10, 0),
        utc(2026, 7, 1, 14, 45),
        "resets 3:45pm (Europe/Dublin)",
    ),
    # Spring forward (29 March 2026, 01:00 GMT -> 02:00 IST): 1:30am does not exist that
    # night; it reads as GMT, the instant half an hour after the jump (02:30 IST).
    (
        "resets 1:30am (Europe/Dublin)",
        utc(2026, 3, 28, 23, 0),
        utc(2026, 3, 29, 1, 30),
        "resets 1:30am (Europe/Dublin)",
    ),
    # Fall back (25 October 2026, 02:00 IST -> 01:00 GMT): 1:30am happens twice; the
    # first (IST, 00:30 UTC)...
    (
        "resets 1:30am (Europe/Dublin)",
        utc(2026, 10, 25, 0, 10),
        utc(2026, 10, 25, 0, 30),
        "resets 1:30am (Europe/Dublin)",
    ),
    # ...and once it has passed, the second (GMT, 01:30 UTC), not tomorrow's.
    (
        "resets 1:30am (Europe/Dublin)",
        utc(2026, 10, 25, 0, 45),
        utc(2026, 10, 25, 1, 30),
        "resets 1:30am (Europe/Dublin)",
    ),
    # "Today" is the zone's date: 07:00 UTC is still 30 November in Los Angeles.
    (
        "Claude usage limit reached. Your limit will reset at 11:30pm (America/Los_Angeles).",
        utc(2026, 12, 1, 7, 0),
        utc(2026, 12, 1, 7, 30),
        "reset at 11:30pm (America/Los_Angeles)",
    ),
    # A date: the weekly window.
    (
        "You've hit your weekly limit · resets Jan 5, 3pm (America/New_York)",
        utc(2026, 12, 1, 16, 0),
        utc(2027, 1, 5, 20, 0),
        "resets Jan 5, 3pm (America/New_York)",
    ),
    # No zone, or one zoneinfo does not know: the coordinator's (now's).
    (
        "5-hour limit reached ∙ resets 9pm",
        datetime(2026, 12, 1, 17, 0, tzinfo=BERLIN),
        utc(2026, 12, 1, 20, 0),
        "resets 9pm",
    ),
    (
        "resets 9pm (Mars/Olympus)",
        datetime(2026, 12, 1, 17, 0, tzinfo=BERLIN),
        utc(2026, 12, 1, 20, 0),
        "resets 9pm (Mars/Olympus)",
    ),
    # The older form: the epoch itself.
    (
        "Claude AI usage limit reached|1767225600",
        utc(2026, 12, 1, 16, 0),
        utc(2026, 1, 1, 0, 0),
        "usage limit reached|1767225600",
    ),
    # Codex: the coordinator's zone, 24-hour clocks, a date, a span.
    (
        "You've hit your usage limit. Upgrade to Pro or try again at 3:28 PM.",
        datetime(2026, 12, 1, 16, 0, tzinfo=BERLIN),
        utc(2026, 12, 2, 14, 28),
        "try again at 3:28 PM",
    ),
    (
        "You've hit your usage limit. Try again at Sep 5th, 2027 3:28 PM.",
        datetime(2026, 12, 1, 16, 0, tzinfo=BERLIN),
        utc(2027, 9, 5, 13, 28),
        "Try again at Sep 5th, 2027 3:28 PM",
    ),
    (
        "try again at 15:28",
        datetime(2026, 12, 1, 15, 0, tzinfo=BERLIN),
        utc(2026, 12, 1, 14, 28),
        "try again at 15:28",
    ),
    (
        "You've hit your usage limit. Try again in 2 hours 5 minutes.",
        utc(2026, 12, 1, 16, 0),
        utc(2026, 12, 1, 18, 5),
        "Try again in 2 hours 5 minutes",
    ),
    (
        '{"type":"usage_limit_reached","resets_in_seconds":1234}',
        utc(2026, 12, 1, 16, 0),
        utc(2026, 12, 1, 16, 20, 34),
        '"resets_in_seconds":1234',
    ),
    (
        '{"resets_at": 1767225600}',
        utc(2026, 12, 1, 16, 0),
        utc(2026, 1, 1, 0, 0),
        '"resets_at": 1767225600',
    ),
    (
        '{"resets_at": 1767225600000}',
        utc(2026, 12, 1, 16, 0),
        utc(2026, 1, 1, 0, 0),
        '"resets_at": 1767225600000',
    ),
    (
        '{"resets_at": "2027-01-01T00:00:00Z"}',
        utc(2026, 12, 1, 16, 0),
        utc(2027, 1, 1, 0, 0),
        '"resets_at": "2027-01-01T00:00:00Z"',
    ),
    # The API's own spend and usage limits (a spend cap's reset, not a window's).
    (
        "API Error: Request rejected (429) · You have reached your organization's monthly"
        " spend limit; it resets at 2027-01-01T00:00:00Z.",
        utc(2026, 12, 1, 16, 0),
        utc(2027, 1, 1, 0, 0),
        "resets at 2027-01-01T00:00:00Z",
    ),
    (
        "API Error: 400 You have reached your specified API usage limits. You will regain"
        " access on 2027-01-01 at 00:00 UTC.",
        utc(2026, 12, 1, 16, 0),
        utc(2027, 1, 1, 0, 0),
        "regain access on 2027-01-01 at 00:00 UTC",
    ),
    # Several: the first stated wins.
    (
        "try again in 5 minutes (resets 3:45pm (Europe/Dublin))",
        utc(2026, 12, 1, 14, 0),
        utc(2026, 12, 1, 14, 5),
        "try again in 5 minutes",
    ),
]


@pytest.mark.parametrize(("text", "now", "expected", "said"), CASES)
def test_a_documented_form_reads_as_its_reset(
    text: str, now: datetime, expected: datetime, said: str
) -> None:
    window = find(text, now=now)
    assert window is not None
    assert (datetime.fromtimestamp(window.reset_at, UTC), window.said) == (expected, said)


@pytest.mark.parametrize(
    "text",
    [
        "API Error: Request rejected (429) · mock limit",
        "the counter resets 3 times a day",
        "resets 25:00",
        "resets 13pm (Europe/Dublin)",
        "try again in a moment",
        '{"resets_at": "soon"}',
    ],
)
def test_text_without_a_reset_reads_as_none(text: str) -> None:
    assert find(text, now=utc(2026, 12, 1, 16, 0)) is None


def test_now_must_know_its_zone() -> None:
    with pytest.raises(ValueError, match=r"^now must be timezone-aware$"):
        find("resets 3pm", now=datetime(2026, 12, 1, 16, 0))
