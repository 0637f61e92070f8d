"""Cron expressions: parsing, next fire times and plain-English readings.

cronsim does the calendar arithmetic.  It was chosen over croniter because it matches
Debian cron on DST days: a daily 01:30 job in a zone that falls back at 03:00 fires
once, not twice, and a fire inside the skipped spring hour runs right after the gap.
This is the only module that imports cronsim.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


@dataclass(frozen=True, slots=True)
class CronExpr:
    """A validated five-field cron expression read in one time zone."""

    text: str
    fields: str
    zone: tzinfo

    def fires_after(self, after: datetime) -> Iterator[datetime]:
        """Fire times strictly after ``after`` (aware), in the expression's zone."""
        start = after.astimezone(self.zone)
        return iter(CronSim(self.fields, start))

    def next_fires(self, after: datetime, count: int) -> list[datetime]:
        fires = self.fires_after(after)
        return [next(fires) for _ in range(count)]

    def explain(self) -> str:
        return str(CronSim(self.fields, datetime(2000, 1, 1, tzinfo=UTC)).explain())


def zone(name: str) -> tzinfo:
    """The IANA time zone ``name``; ValueError with a readable message if unknown."""
    if name.upper() == "UTC":
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a name too long for a file name, or a directory ('America').
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"
        raise ValueError(
            f"unknown time zone {shown}; use an IANA name such as 'Europe/Berlin' or 'UTC'"
        ) from None


def parse(text: str, timezone: str = "UTC") -> CronExpr:
    """Parse ``text`` (five fields or an @alias); ValueError names what is wrong."""
    fields = ALIASES.get(text.strip().lower(), text.strip())
    if fields.startswith("@"):
        raise ValueError(f"unknown shortcut {text!r}; use one of {', '.join(ALIASES)}")
    count = len(fields.split())
    if count != 5:
        raise ValueError(
            f"{text!r} has {count} fields; a schedule has five: minute hour day month weekday"
        )
    try:
        CronSim(fields, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ValueError(f"{text!r} is not a valid schedule: {str(exc).lower()}") from None
    return CronExpr(text=text, fields=fields, zone=zone(timezone))
