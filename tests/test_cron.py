"""Next-fire tables across time zones, DST changes, month ends, Feb 29 and the
day-of-month / day-of-week OR rule (Debian cron semantics, via cronsim)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fanout.values import cron


def _table(expression: str, zone: str, after: str, count: int) -> list[str]:
    start = datetime.fromisoformat(after)
    fires = cron.parse(expression, zone).next_fires(start, count)
    return [f"{f.isoformat()} = {f.astimezone(UTC):%Y-%m-%dT%H:%MZ}" for f in fires]


CASES = [
    # New York springs forward on 2027-03-14 at 02:00: 02:30 does not exist that day;
    # like Debian cron, the job runs right after the gap, once.
    (
        "30 2 * * *",
        "America/New_York",
        "2027-03-12T12:00Z",
        [
            "2027-03-13T02:30:00-05:00 = 2027-03-13T07:30Z",
            "2027-03-14T03:00:00-04:00 = 2027-03-14T07:00Z",
            "2027-03-15T02:30:00-04:00 = 2027-03-15T06:30Z",
        ],
    ),
    # New York falls back on 2027-11-07 at 02:00: 01:30 happens twice, the job runs once.
    (
        "30 1 * * *",
        "America/New_York",
        "2027-11-05T12:00Z",
        [
            "2027-11-06T01:30:00-04:00 = 2027-11-06T05:30Z",
            "2027-11-07T01:30:00-04:00 = 2027-11-07T05:30Z",
            "2027-11-08T01:30:00-05:00 = 2027-11-08T06:30Z",
        ],
    ),
    # An hourly job runs in both 01:00 hours of the fall-back night (it follows the clock).
    (
        "0 * * * *",
        "America/New_York",
        "2027-11-07T04:30Z",
        [
            "2027-11-07T01:00:00-04:00 = 2027-11-07T05:00Z",
            "2027-11-07T01:00:00-05:00 = 2027-11-07T06:00Z",
            "2027-11-07T02:00:00-05:00 = 2027-11-07T07:00Z",
        ],
    ),
    # Berlin springs forward on 2027-03-28 at 02:00 and falls back on 2027-10-31 at 03:00.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2027-03-26T12:00Z",
        [
            "2027-03-27T02:30:00+01:00 = 2027-03-27T01:30Z",
            "2027-03-28T03:00:00+02:00 = 2027-03-28T01:00Z",
            "2027-03-29T02:30:00+02:00 = 2027-03-29T00:30Z",
        ],
    ),
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2027-10-29T12:00Z",
        [
            "2027-10-30T02:30:00+02:00 = 2027-10-30T00:30Z",
            "2027-10-31T02:30:00+02:00 = 2027-10-31T00:30Z",
            "2027-11-01T02:30:00+01:00 = 2027-11-01T01:30Z",
        ],
    ),
    (
        "0 3 * * 1-5",
        "Europe/Berlin",
        "2027-10-29T00:00Z",
        [
            "2027-10-29T03:00:00+02:00 = 2027-10-29T01:00Z",
            "2027-11-01T03:00:00+01:00 = 2027-11-01T02:00Z",
            "2027-11-02T03:00:00+01:00 = 2027-11-02T02:00Z",
        ],
    ),
    # Month ends: the 31st only where it exists; L is the last day of every month.
    (
        "0 0 31 * *",
        "UTC",
        "2027-01-01T00:00Z",
        [
            "2027-01-31T00:00:00+00:00 = 2027-01-31T00:00Z",
            "2027-03-31T00:00:00+00:00 = 2027-03-31T00:00Z",
            "2027-05-31T00:00:00+00:00 = 2027-05-31T00:00Z",
        ],
    ),
    (
        "0 18 L * *",
        "America/New_York",
        "2028-01-15T00:00Z",
        [
            "2028-01-31T18:00:00-05:00 = 2028-01-31T23:00Z",
            "2028-02-29T18:00:00-05:00 = 2028-02-29T23:00Z",
            "2028-03-31T18:00:00-04:00 = 2028-03-31T22:00Z",
        ],
    ),
    # Feb 29 exists only in leap years.
    (
        "0 12 29 2 *",
        "UTC",
        "2027-01-01T00:00Z",
        [
            "2028-02-29T12:00:00+00:00 = 2028-02-29T12:00Z",
            "2032-02-29T12:00:00+00:00 = 2032-02-29T12:00Z",
        ],
    ),
    # Day of month and day of week both restricted: either matches (the 13th OR Fridays).
    (
        "0 0 13 * 5",
        "UTC",
        "2027-09-01T00:00Z",
        [
            "2027-09-03T00:00:00+00:00 = 2027-09-03T00:00Z",
            "2027-09-10T00:00:00+00:00 = 2027-09-10T00:00Z",
            "2027-09-13T00:00:00+00:00 = 2027-09-13T00:00Z",
            "2027-09-17T00:00:00+00:00 = 2027-09-17T00:00Z",
        ],
    ),
    (
        "@weekly",
        "UTC",
        "2027-09-01T00:00Z",
        [
            "2027-09-05T00:00:00+00:00 = 2027-09-05T00:00Z",
            "2027-09-12T00:00:00+00:00 = 2027-09-12T00:00Z",
        ],
    ),
]


@pytest.mark.parametrize(("expression", "zone", "after", "expected"), CASES)
def test_next_fire_tables(expression: str, zone: str, after: str, expected: list[str]) -> None:
    assert _table(expression, zone, after, len(expected)) == expected


def test_readings_in_plain_english() -> None:
    assert cron.parse("0 3 * * 1-5").explain() == "At 03:00 on Monday through Friday"
    assert cron.parse("@hourly").explain() == "At the start of every hour"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "'61 * * * *' is not a valid schedule: bad minute"),
        ("* * *", "'* * *' has 3 fields; a schedule has five: minute hour day month weekday"),
        (
            "0 0 0 0 0 0",
            "'0 0 0 0 0 0' has 6 fields; a schedule has five: minute hour day month weekday",
        ),
        (
            "@fortnightly",
            "unknown shortcut '@fortnightly'; use one of @hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually",
        ),
    ],
)
def test_bad_expressions(expression: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        cron.parse(expression)
    assert str(caught.value) == message
