"""A fleet and an upstream on virtual time, for the ceiling's tests: units start when the
ceiling lets them (and a slot is free), each sends one request (or a few, as an agent's
turns) to an upstream that counts a sliding window and answers 429 with an honest Retry-After (whole seconds,
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
    # A refusal's message states the limit and its window ("of 2 requests per 10
    # seconds", as Anthropic's does), even without a Retry-After.
    states: bool = False
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


@dataclass
class Bucket:
    """A token bucket, as Anthropic limits (its docs): ``capacity`` requests at once,
    refilled at ``capacity / window`` a second; a refusal's honest Retry-After is the
    whole seconds, rounded up, until one token is back."""

    capacity: int
    window: float
    states: bool = False
    tokens: float = -1.0  # -1: full at the first request
    at: float = 0.0
    answers: list[float] = field(default_factory=list)
    refusals: list[float] = field(default_factory=list)

    def ask(self, t: float) -> float | None:
        rate = self.capacity / self.window
        if self.tokens < 0:
            self.tokens = self.capacity
        else:
            self.tokens = min(self.capacity, self.tokens + (t - self.at) * rate)
        self.at = t
        if self.tokens < 1:
            self.refusals.append(t)
            return float(max(1, math.ceil((1 - self.tokens) / rate)))
        self.tokens -= 1
        self.answers.append(t)
        return None


def fixed(limit: int) -> Callable[[float], int]:
    return lambda t: limit


@dataclass
class Record:
    starts: list[float] = field(default_factory=list)
    pauses: list[Pause] = field(default_factory=list)
    wall: float = 0.0


@dataclass
class _Unit:
    unit: int
    admission: Admission
    asks: deque[float]  # the moments of its requests not sent yet
    end: float  # when it ends, once its last request is answered
    refused: float | None = None  # the Retry-After of the request refused (0.0: none said)


def run(
    ceiling: Ceiling,
    upstream: Upstream | Bucket,
    *,
    units: int,
    slots: int,
    duration: Callable[[int], float] = lambda unit: 0.05,
    refusal: float | None = None,
    start: float = 0.0,
    until: float = 100_000.0,
    requests: int = 1,
    gap: float = 0.3,
) -> Record:
    """Run ``units`` through ``ceiling`` against ``upstream``.  Each unit sends
    ``requests`` requests, the first as it starts and each next ``gap`` later (an
    agent's turns), and ends ``duration(unit)`` after its last; a refused request ends
    it at once, or ``refusal`` later (a worker that takes longer to say it was
    throttled than to answer), and the ceiling is told the Retry-After and the window
    the upstream stated (``Upstream.states``).  The clock starts at ``start`` (a loop's
    is far past 0)."""
    record = Record()
    pending = deque(range(units))
    running: list[_Unit] = []
    t = start
    while (pending or running) and t < start + until:
        for item in running:  # the requests due by now, in order
            while item.asks and item.asks[0] <= t + 1e-12 and item.refused is None:
                refused = upstream.ask(item.asks.popleft())
                if refused is not None:
                    item.refused = refused
                    item.asks.clear()
                    item.end = t + (refusal if refusal is not None else 0.05)
        for item in [r for r in running if r.end <= t and not r.asks]:
            running.remove(item)
            pause = ceiling.finish(
                item.admission,
                t,
                throttled=item.refused is not None,
                retry_after=item.refused or None,
                window=upstream.window if item.refused is not None and upstream.states else None,
            )
            if item.refused is not None:
                pending.appendleft(item.unit)
            if pause is not None:
                record.pauses.append(pause)
        while pending and len(running) < slots:
            due = ceiling.due(t)
            if due is None or due > t + 1e-9:
                break
            unit = pending.popleft()
            record.starts.append(t)
            asks = deque(t + i * gap for i in range(requests))
            item = _Unit(unit, ceiling.start(t), asks, asks[-1] + duration(unit))
            running.append(item)
            refused = upstream.ask(item.asks.popleft())  # the first goes as it starts
            if refused is not None:
                item.refused = refused
                item.asks.clear()
                # A refused request comes back at once: the worker exits with its 429.
                took = min(duration(unit), 0.05) if refusal is None else refusal
                item.end = t + took
        moments = [r.asks[0] if r.asks else r.end for r in running]
        if pending and len(running) < slots:
            due = ceiling.due(t)
            if due is not None:
                moments.append(max(due, t + 1e-9))
        if not moments:
            break
        t = max(min(moments), t)
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
