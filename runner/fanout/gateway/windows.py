"""The sliding windows of one API's limiter: each window's entries, their running sum,
and the earliest moment an amount fits.

Windows.  Each admission leaves an entry (its time, 1 request, input and output tokens).
A request may be admitted at t only if, for every window, the entries with time > t -
per - SKEW plus its own amounts stay <= limit.  An entry's time is its request's
sending (``sent``).  SKEW covers the time from there to the upstream counting the
request: two requests sent ``per + SKEW`` apart reach the upstream at least ``per``
apart even when the first was slow and the second quick, so no window of length
``per`` anywhere holds more than ``limit`` as the upstream sees it.  At 50 ms the
upstream (a mock in a process of its own, on a loaded machine) still saw 51 in a 5 s
window of 50 now and then; at 100 ms none in bench/gateway.py's runs, at a cost of 2%
of the rate at 5 s windows and 0.2% at a minute.  A reservation above a window's limit
is capped at the limit: otherwise it could never pass.

Corrections.  ``sent`` moves an entry's time from its admission to the moment its
request left for the upstream (see there).  ``settle`` replaces the reservation with
the real usage; the entry keeps its time, when the upstream counted it.  Usage below the
reservation frees room at once.  Usage above it cannot be undone (the upstream has it):
the window then holds more than its limit, and later requests wait until the excess has
left it too, so the overshoot is paid back rather than repeated.  ``release`` (no usage
known, e.g. the upstream failed) keeps the reservation: the upstream may well have
counted it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from ..pacing.ceiling import Admission

SKEW = 0.1  # sending to the upstream's arrival (see the docstring)


class Kind(Enum):
    REQUESTS = "requests"
    TOKENS = "tokens"  # input and output together (OpenAI; Anthropic's tightest): both ours
    INPUT = "input tokens"
    OUTPUT = "output tokens"


@dataclass(eq=False, slots=True)
class Entry:
    at: float
    input: int
    output: int
    admission: Admission | None = None  # the ceiling's start, taken at admission

    def amount(self, kind: Kind) -> int:
        amounts = {Kind.REQUESTS: 1, Kind.INPUT: self.input, Kind.OUTPUT: self.output}
        return amounts.get(kind, self.input + self.output)


@dataclass(eq=False, slots=True)
class Log:
    """One window's entries that still count, oldest first, and their running sum."""

    kind: Kind
    limit: int
    reach: float  # per + SKEW
    entries: deque[Entry] = field(default_factory=deque)
    total: int = 0
    pruned: float = -math.inf  # entries with at + reach <= pruned have left

    def counts(self, entry: Entry) -> bool:
        return entry.at + self.reach > self.pruned

    def due(self, amount: int, t: float) -> float:
        """The earliest moment >= t at which ``amount`` fits.  An entry counts while
        t < at + reach: the same sum sets the timer and judges it when it fires, so
        float rounding cannot make them disagree."""
        while self.entries and self.entries[0].at + self.reach <= t:
            self.total -= self.entries.popleft().amount(self.kind)
        self.pruned = max(self.pruned, t)
        excess = self.total + amount - self.limit
        for entry in self.entries:
            if excess <= 0:
                break
            excess -= entry.amount(self.kind)
            t = entry.at + self.reach  # once the oldest entries have left, it fits
        return t
