"""A fleet and an upstream on virtual time, for the ceiling's tests: units start when the
ceiling lets them (and a slot is free), each sends one request to an upstream that
counts a sliding window and answers 429 with an honest Retry-After (whole seconds,
rounded up, as the real APIs send it), and a throttled unit goes back to the front of
the queue.  Pure arithmetic: no loop, no sleeps, the same result every time."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fanout.pacing.ceiling import Admission, Ceiling, Pause


@dataclass
class Upstream:
    """``limit(t)`` requests per sliding ``window`` seconds."""

    limit: Callable[[float], int]
    window: float
    honest: bool = True  # False: no Retry-After at all
    accepted: deque[float] = field(default_factory=deque)
    answers: list[float] = field(default_factory=list)
    refusals: list[float] = field(default_factory=list)

    def ask(self, t: float) -> float | None:
        """None: answered; else the Retry-After (0.0 when none is said)."""
        while self.accepted and self.accepted[0] <= t - self.window:
            self.accepted.popleft()
        limit = self.limit(t)
        if len(self.accepted) >= limit:
            self.refusals.append(t)
            if not self.honest:
                return 0.0
            wait = self.accepted[len(self.accepted) - limit] + self.window - t if limit else 1
            return float(max(1, math.ceil(wait)))
        self.accepted.append(t)
        self.answers.append(t)
        return None


def fixed(limit: int) -> Callable[[float], int]:
    return lambda t: limit


@dataclass
class Record:
    starts: list[float] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    wall: float = 0.0


def run(
    ceiling: Ceiling,
    upstream: Upstream,
    *,
    units: int,
    slots: int,
    duration: Callable[[int], float] = lambda unit: 0.05,
    refusal: float | None = None,
    start: float = 0.0,
    until: float = 100_000.0,
) -> Record:
    """Run ``units`` through ``ceiling`` against ``upstream``; each unit's request is
    sent as it starts and the unit ends ``duration(unit)`` later, or at once when its
    request is refused (or ``refusal`` later: a worker that takes longer to say it was
    throttled than to answer).  The clock starts at ``start`` (a loop's is far past 0)."""
    record = Record()
    pending = deque(range(units))
    running: list[tuple[float, int, Admission, float | None]] = []
    t = start
    while (pending or running) and t < start + until:
        while pending and len(running) < slots:
            due = ceiling.due(t)
            if due is None or due > t + 1e-9:
                break
            unit = pending.popleft()
            admission = ceiling.start(t)
            record.starts.append(t)
            refused = upstream.ask(t)
            # A refused request comes back at once: the worker exits with its 429.
            took = duration(unit) if refused is None else min(duration(unit), 0.05)
            if refused is not None and refusal is not None:
                took = refusal
            running.append((t + took, unit, admission, refused))
        moments = [end for end, *_ in running]
        if pending and len(running) < slots:
            due = ceiling.due(t)
            if due is not None:
                moments.append(max(due, t + 1e-9))
        t = min(moments)
        for item in [r for r in running if r[0] <= t]:
            running.remove(item)
            _, unit, admission, refused = item
            pause = ceiling.finish(
                admission,
                t,
                throttled=refused is not None,
                retry_after=refused or None,
            )
            if refused is not None:
                pending.appendleft(unit)
            if pause is not None:
                record.pauses.append(pause)
    record.wall = t - start
    return record


def most_in_any_window(times: list[float], width: float) -> int:
    """The most of ``times`` in any half-open window [t, t + width)."""
    ordered = sorted(times)
    best, left = 0, 0
    for right, moment in enumerate(ordered):
        while ordered[left] <= moment - width:
            left += 1
        best = max(best, right - left + 1)
    return best
