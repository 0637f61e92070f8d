"""When a subscription's usage window resets, read from what the agent said: one parser
for every documented form, used by every classifier.

    You've hit your session limit · resets 3:45pm (Europe/Dublin)   Claude Code (also
        "resets Jan 5, 3pm (Europe/Dublin)"; no zone: the coordinator's)
    Claude AI usage limit reached|1767225600                          Claude Code, older
    try again at 3:28 PM                                              Codex (the
        coordinator's zone; also "try again at Sep 5th, 2026 3:28 PM")
    try again in 2 hours 5 minutes                                    Codex, older
    "resets_in_seconds": 1234                                         Codex JSON
    "resets_at": 1767225600  or  "resets_at": "2027-01-01T00:00:00Z"   JSON
    it resets at 2027-01-01T00:00:00Z                                 Anthropic spend limit
    You will regain access on 2027-01-01 at 00:00 UTC                 Anthropic usage limits

A wall-clock time is the next such time after `now` in its zone, counted on that zone's
calendar (zoneinfo), so a reset at 1:30am on a day that skips or repeats that hour still
lands on a real instant."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# A wall-clock reset up to this long ago is the window that has just reset, not
# tomorrow's: the agents print times rounded to the minute (or the hour), so "resets
# 3:45pm" read at 3:45:20 means "now", and parking a day for it would be the worst answer.
GRACE = timedelta(seconds=60)

_MONTHS = {
    name: n
    for n, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
    )
}
_CLOCK = r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<ampm>[ap]m\b|[ap]\.m\.)?"
_DATE = (
    r"(?:(?P<month>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]*\.?\s+"
    r"(?P<day>\d{1,2})(?:st|nd|rd|th)?,?\s+(?:(?P<year>\d{4}),?\s+)?(?:at\s+)?)?"
)
_RESETS = re.compile(
    rf"\bresets?\s+(?:at\s+)?{_DATE}{_CLOCK}(?:\s*\((?P<zone>[A-Za-z][\w+\-/]*)\))?",
    re.IGNORECASE,
)
_TRY_AT = re.compile(rf"\btry again at\s+{_DATE}{_CLOCK}", re.IGNORECASE)
_TRY_IN = re.compile(
    r"\btry again in\s+(?P<span>\d+\s*[a-z]+(?:,?\s*(?:and\s+)?\d+\s*[a-z]+)*)", re.IGNORECASE
)
_EPOCH = re.compile(r"usage limit reached\|(?P<epoch>\d{9,12})\b", re.IGNORECASE)
_IN_SECONDS = re.compile(r'"?resets_in_seconds"?\s*[:=]\s*(?P<seconds>\d+(?:\.\d+)?)')
_AT = re.compile(
    r'"?resets_at"?\s*[:=]\s*(?:(?P<epoch>\d{9,13}(?:\.\d+)?)|"(?P<iso>[0-9T:.\-+Z ]+)")'
)
_ISO = re.compile(
    r"\bresets?\s+(?:at|on)\s+(?P<iso>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
    r"(?:Z|[+-]\d{2}:?\d{2})?)",
    re.IGNORECASE,
)
_REGAIN = re.compile(
    r"\bregain access on (?P<day>\d{4}-\d{2}-\d{2}) at (?P<clock>\d{2}:\d{2}) UTC", re.IGNORECASE
)
_UNITS = {
    "s": 1,
    "sec": 1,
    "second": 1,
    "m": 60,
    "min": 60,
    "minute": 60,
    "h": 3600,
    "hr": 3600,
    "hour": 3600,
    "d": 86400,
    "day": 86400,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Window:
    """A usage window's end as the agent stated it: `reset_at` in epoch seconds, `said`
    the words it was read from."""

    reset_at: float
    said: str


def find(text: str, *, now: datetime) -> Window | None:
    """The first usage-window reset stated in `text`, or None.  `now` must be
    timezone-aware: its zone is the coordinator's, for times given without one."""
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    found: list[tuple[int, Window]] = []
    for match in _EPOCH.finditer(text):
        found.append((match.start(), _window(match, float(match["epoch"]))))
    for match in _IN_SECONDS.finditer(text):
        found.append((match.start(), _window(match, now.timestamp() + float(match["seconds"]))))
    for match in _AT.finditer(text):
        at = _absolute(match["epoch"], match["iso"])
        if at is not None:
            found.append((match.start(), _window(match, at)))
    for match in _ISO.finditer(text):
        at = _absolute(None, match["iso"])
        if at is not None:
            found.append((match.start(), _window(match, at)))
    for match in _REGAIN.finditer(text):
        at = _absolute(None, f"{match['day']}T{match['clock']}:00+00:00")
        if at is not None:
            found.append((match.start(), _window(match, at)))
    for match in _TRY_IN.finditer(text):
        seconds = _span(match["span"])
        if seconds is not None:
            found.append((match.start(), _window(match, now.timestamp() + seconds)))
    for pattern in (_RESETS, _TRY_AT):
        for match in pattern.finditer(text):
            clock = _wall_clock(match, now)
            if clock is not None:
                found.append((match.start(), _window(match, clock.timestamp())))
    return min(found, key=lambda pair: pair[0])[1] if found else None


def next_wall_clock(at: time, zone: tzinfo, now: datetime, day: date | None = None) -> datetime:
    """The first instant at or after `now - GRACE` that reads `at` on a clock in `zone`
    (on `day` if given, else today or tomorrow there).  An hour repeated by a DST change
    counts twice (the earlier first); one skipped by it reads as the zone's offset before
    the change, an instant just after the gap."""
    local_today = now.astimezone(zone).date()
    days = [day] if day is not None else [local_today, local_today + timedelta(days=1)]
    floor = now - GRACE
    for candidate_day in days:
        naive = datetime.combine(candidate_day, at)
        for fold in (0, 1):
            instant = naive.replace(tzinfo=zone, fold=fold)
            if instant >= floor:
                return instant
    # A date given with no year that has passed this year: the same date next year.
    assert day is not None
    return next_wall_clock(at, zone, now, day.replace(year=day.year + 1))


def _window(match: re.Match[str], reset_at: float) -> Window:
    return Window(reset_at=reset_at, said=match.group(0).strip())


def _wall_clock(match: re.Match[str], now: datetime) -> datetime | None:
    hour, minute = int(match["hour"]), int(match["minute"] or 0)
    ampm = (match["ampm"] or "").lower().replace(".", "")
    if ampm:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if ampm == "pm" else 0)
    elif match["minute"] is None:
        return None  # a bare number ("resets 3 times") is not a time
    if hour > 23 or minute > 59:
        return None
    zone = _zone(match.groupdict().get("zone"), now)
    day: date | None = None
    if match["month"]:
        local = now.astimezone(zone)
        year = int(match["year"]) if match["year"] else local.year
        try:
            day = date(year, _MONTHS[match["month"][:3].lower()], int(match["day"]))
        except ValueError:
            return None
        if match["year"]:
            return datetime.combine(day, time(hour, minute)).replace(tzinfo=zone)
    return next_wall_clock(time(hour, minute), zone, now, day)


def _zone(name: str | None, now: datetime) -> tzinfo:
    if name:
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            pass  # an unknown name: the coordinator's zone is the best guess left
    assert now.tzinfo is not None
    return now.tzinfo


def _absolute(epoch: str | None, iso: str | None) -> float | None:
    if epoch is not None:
        value = float(epoch)
        return value / 1000 if value > 1e11 else value  # milliseconds, as JS writes them
    assert iso is not None
    try:
        parsed = datetime.fromisoformat(iso.strip())
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _span(span: str) -> float | None:
    total = 0.0
    for count, unit in re.findall(r"(\d+)\s*([a-z]+)", span, re.IGNORECASE):
        unit = unit.lower()
        singular = unit[:-1] if unit.endswith("s") and len(unit) > 1 else unit
        factor = _UNITS.get(unit) or _UNITS.get(singular)
        if factor is None:
            return None
        total += int(count) * factor
    return total or None
