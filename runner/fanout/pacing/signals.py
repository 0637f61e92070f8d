"""Throttle signals from workers: how a worker says "the API told me to slow down".

A worker is throttled when it exits with 75 (EX_TEMPFAIL), prints a ``Retry-After:``
line (seconds or an HTTP date) on stdout or stderr, writes a control file at
``$FANOUT_CONTROL`` such as ``{"throttled": true, "retryAfter": 30, "limit": "x"}``, or
prints a line matching one of the job's ``throttlePatterns``.
"""

from __future__ import annotations

import email.utils
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

EX_TEMPFAIL = 75
CONTROL_FILE = ".fanout-control.json"

_RETRY_AFTER = re.compile(r"retry-after:\s*(?P<value>[^\r\n]+)", re.I)


@dataclass(frozen=True, slots=True)
class Signal:
    """A throttle signal: how long to wait at least (None: not said) and for which limit."""

    retry_after: float | None
    limit: str | None
    source: str


def parse_retry_after(value: str, now: datetime | None = None) -> float | None:
    """Seconds in a Retry-After value: delta-seconds or an HTTP date."""
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


class Scanner:
    """Watches output lines for Retry-After and the job's patterns."""

    def __init__(
        self,
        patterns: Iterable[re.Pattern[str]] = (),
        now: Callable[[], datetime] | None = None,
    ):
        self.patterns = tuple(patterns)  # compiled once, by the spec's builder
        self.now = now or (lambda: datetime.now(UTC))
        self.signal: Signal | None = None

    def line(self, text: str) -> None:
        match = _RETRY_AFTER.search(text)
        if match:
            seconds = parse_retry_after(match.group("value"), self.now())
            if seconds is not None:
                self.signal = Signal(seconds, None, "Retry-After")
                return
        if self.signal is None:
            for pattern in self.patterns:
                if pattern.search(text):
                    self.signal = Signal(None, None, f"pattern {pattern.pattern!r}")
                    return


def from_control(text: str) -> Signal | None:
    """The signal in a control file's JSON, if it says the worker was throttled."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or data.get("throttled") is not True:
        return None
    retry_after = data.get("retryAfter")
    seconds = float(retry_after) if isinstance(retry_after, int | float) else None
    limit = data.get("limit") if isinstance(data.get("limit"), str) else None
    return Signal(seconds, limit, "control file")


def classify(
    exit_code: int | None, scanned: Signal | None, control: Signal | None
) -> Signal | None:
    """The throttle signal of a finished worker, if any (control file first)."""
    if control is not None:
        return control
    if scanned is not None:
        return scanned
    if exit_code == EX_TEMPFAIL:
        return Signal(None, None, "exit code 75")
    return None
