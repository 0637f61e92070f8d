"""Per-request pacing of one API: sliding windows of requests, input tokens and output
tokens, requests in flight, pauses, and the upstream's own remaining counts, behind one
first-come-first-served queue shared by every worker that calls the API.

Windows.  Each admitted request leaves an entry (admission time, 1 request, input and
output tokens) in a log.  A request may be admitted at t only if, for every window,
the entries with time > t - per - SKEW plus its own amounts stay <= limit.  SKEW covers
the time from our admission to the moment the upstream counts the request (a connection,
TLS, the body's upload): two requests admitted ``per + SKEW`` apart reach the upstream at
least ``per`` apart even when the first was quick and the second slow, so no window of
length ``per`` anywhere holds more than ``limit`` as the upstream sees it.  A reservation
above a window's limit is capped at the limit: otherwise it could never pass.

Corrections.  ``settle`` replaces the reservation with the real usage; the entry keeps
its admission time, since that is when the upstream counted it.  Usage below the
reservation frees room at once.  Usage above it cannot be undone (the upstream has it
already): the window then holds more than its limit, and later requests wait until the
excess has left the window too, so the overshoot is paid back rather than repeated.
``release`` (no usage known, e.g. the upstream failed) keeps the reservation: the
upstream may well have counted the request.

Order.  One queue, and only its head is considered: later callers never overtake it even
when they would fit, so a large request is not starved by a stream of small ones.  The
head waits on one loop timer for its due moment (windows only empty as time passes) and
is re-checked on every settle, release, pause, observation and arrival: no polling.  A
cancelled waiter leaves the queue; one cancelled after its admission but before it ran
has the admission undone: cancellation leaves no trace.

Upstream feedback (``observe``).  Remaining 0 with a known reset: nothing is admitted
until the reset.  Remaining small (below SMALL_FRACTION of our window of that kind; with
no such window, fewer than SMALL_REQUESTS requests, and tokens are never "small"): the
rest is spread until the reset, so an admission of amount ``a`` of that kind is followed
by the next no sooner than ``a * reset / remaining`` later (requests: one per ``reset /
remaining``), and never later than the reset.  Only when little remains, so bursts stay
while there is room: Anthropic's reset is when its bucket is full again, which
understates the real rate.  The newest observation of a kind replaces the older one.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..spec import Window

# Admission to the upstream's arrival, on loopback or a nearby region (see the docstring).
SKEW = 0.05
# Waits shorter than this are float dust (a timer fired at 60.049999999 for 60.05): the
# head is judged at now + _DUST, so it never spins on a timer that is due "now".  SKEW is
# 50,000 times larger, so the upstream's windows are unaffected.
_DUST = 1e-6
SMALL_FRACTION = 0.1
SMALL_REQUESTS = 5


class _Kind(Enum):
    REQUESTS = "requests"
    TOKENS = "tokens"  # input and output together (OpenAI; Anthropic's tightest)
    INPUT = "input tokens"
    OUTPUT = "output tokens"


@dataclass(frozen=True, kw_only=True, slots=True)
class Remaining:
    """What the upstream says is left of its own limits, and seconds until each resets
    (None: not said)."""

    requests: int | None = None
    requests_reset: float | None = None
    tokens: int | None = None
    tokens_reset: float | None = None
    input_tokens: int | None = None
    input_tokens_reset: float | None = None
    output_tokens: int | None = None
    output_tokens_reset: float | None = None


@dataclass(eq=False, slots=True)
class _Entry:
    at: float
    input: int
    output: int

    def amount(self, kind: _Kind) -> int:
        if kind is _Kind.REQUESTS:
            return 1
        if kind is _Kind.INPUT:
            return self.input
        if kind is _Kind.OUTPUT:
            return self.output
        return self.input + self.output


@dataclass(frozen=True, kw_only=True, slots=True)
class Ticket:
    """An admitted request: ``queued`` seconds from ``admit`` to admission."""

    queued: float
    _entry: _Entry = field(repr=False, compare=False)


@dataclass(eq=False, slots=True)
class _Waiter:
    future: asyncio.Future[_Entry]
    entry: _Entry  # the reservation, capped; ``at`` is set at admission


@dataclass(frozen=True, slots=True)
class _Spread:
    rate: float  # units of its kind per second the upstream has left
    until: float


class Limiter:
    """Admits the requests of one API in arrival order, at the pace of its windows."""

    def __init__(
        self,
        *,
        requests: Window | None,
        input_tokens: Window | None,
        output_tokens: Window | None,
        max_in_flight: int | None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock
        self._max_in_flight = max_in_flight
        kinds = (_Kind.REQUESTS, _Kind.INPUT, _Kind.OUTPUT)
        self._by_kind = dict(zip(kinds, (requests, input_tokens, output_tokens), strict=True))
        self._windows = [(k, w) for k, w in self._by_kind.items() if w is not None]
        self._reach = max((w.per for _, w in self._windows), default=0.0) + SKEW
        self._log: deque[_Entry] = deque()  # admission order, so sorted by time
        self._open: set[_Entry] = set()  # admitted, neither settled nor released
        self._queue: deque[_Waiter] = deque()
        self._paused_until = -math.inf
        self._spreads: dict[_Kind, _Spread] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = 0
        self._queued_seconds = 0.0

    def _now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    def _cap(self, kind: _Kind, amount: int) -> int:
        window = self._by_kind[kind]
        amount = max(0, amount)
        return amount if window is None else min(amount, window.limit)

    async def admit(self, *, input_tokens: int, output_tokens: int) -> Ticket:
        """Wait for this request's turn and room in every window, then take it."""
        called = self._now()
        reserved = _Entry(
            at=called,
            input=self._cap(_Kind.INPUT, input_tokens),
            output=self._cap(_Kind.OUTPUT, output_tokens),
        )
        waiter = _Waiter(asyncio.get_running_loop().create_future(), reserved)
        self._queue.append(waiter)
        self._grant()
        try:
            entry = await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                # Admitted, then cancelled before it could run: undo the admission.
                self._open.discard(reserved)
                self._log.remove(reserved)
            elif waiter in self._queue:
                self._queue.remove(waiter)
            self._grant()  # it may have been the head that held the others
            raise
        queued = entry.at - called
        self._admitted += 1
        self._queued_seconds += queued
        return Ticket(queued=queued, _entry=entry)

    def settle(self, ticket: Ticket, *, input_tokens: int, output_tokens: int) -> None:
        """The real usage replaces the reservation; the in-flight slot is freed."""
        entry = ticket._entry
        if entry not in self._open:
            return  # settled or released already: a second call must not free twice
        self._open.discard(entry)
        entry.input, entry.output = max(0, input_tokens), max(0, output_tokens)
        self._grant()

    def release(self, ticket: Ticket) -> None:
        """No usage known: the reservation stays in the windows; in flight is freed."""
        self.settle(ticket, input_tokens=ticket._entry.input, output_tokens=ticket._entry.output)

    def pause(self, seconds: float) -> None:
        """Admit nothing for ``seconds`` (a longer pause already running stays)."""
        self._paused_until = max(self._paused_until, self._now() + seconds)
        self._grant()

    def observe(self, remaining: Remaining) -> None:
        """Hold or spread admissions by what the upstream says it has left."""
        now = self._now()
        r = remaining
        for kind, left, reset in (
            (_Kind.REQUESTS, r.requests, r.requests_reset),
            (_Kind.TOKENS, r.tokens, r.tokens_reset),
            (_Kind.INPUT, r.input_tokens, r.input_tokens_reset),
            (_Kind.OUTPUT, r.output_tokens, r.output_tokens_reset),
        ):
            if left is None or reset is None:
                continue
            self._spreads.pop(kind, None)
            if left <= 0:
                self._paused_until = max(self._paused_until, now + reset)
            elif reset > 0 and self._small(kind, left):
                self._spreads[kind] = _Spread(rate=left / reset, until=now + reset)
        self._grant()

    def _small(self, kind: _Kind, left: int) -> bool:
        if kind is _Kind.TOKENS:
            limits = [w.limit for k, w in self._windows if k is not _Kind.REQUESTS]
            limit: int | None = sum(limits) if limits else None
        else:
            window = self._by_kind[kind]
            limit = None if window is None else window.limit
        if limit is None:
            return kind is _Kind.REQUESTS and left < SMALL_REQUESTS
        return left < SMALL_FRACTION * limit

    def stats(self) -> dict[str, Any]:
        return {
            "admitted": self._admitted,
            "queuedSeconds": round(self._queued_seconds, 3),
            "inFlight": len(self._open),
            "waiting": len(self._queue),
        }

    def _grant(self) -> None:
        """Admit the head of the queue while it fits; else arm one timer for its due
        moment (none when only the in-flight cap holds it: a settle re-checks)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._queue:
            head = self._queue[0]
            if head.future.done():  # cancelled; its admit() is about to see it
                self._queue.popleft()
                continue
            now = self._now()
            self._prune(now)
            due = self._due(head.entry, now + _DUST)
            if due is None:
                return
            if due > now + _DUST:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(due - now, self._grant)
                return
            self._queue.popleft()
            head.entry.at = now
            self._log.append(head.entry)
            self._open.add(head.entry)
            head.future.set_result(head.entry)

    def _prune(self, now: float) -> None:
        # The newest entry stays: the spread of upstream feedback counts from it.
        while len(self._log) > 1 and self._log[0].at + self._reach <= now:
            self._log.popleft()

    def _due(self, reserved: _Entry, t: float) -> float | None:
        """The earliest moment >= t at which ``reserved`` may be admitted, or None while
        the in-flight cap holds it.  Each part only eases as time passes, so the latest of
        them is the answer until something new happens (which re-checks)."""
        if self._max_in_flight is not None and len(self._open) >= self._max_in_flight:
            return None
        due = max(t, self._paused_until, self._spread_due())
        for kind, window in self._windows:
            due = max(due, self._window_due(kind, window, reserved.amount(kind), t))
        return due

    def _window_due(self, kind: _Kind, window: Window, amount: int, t: float) -> float:
        reach = window.per + SKEW
        # An entry counts while t < at + reach; the same sum decides the timer's moment
        # and the check when it fires, so float rounding cannot make them disagree.
        live = [entry for entry in self._log if entry.at + reach > t]
        excess = sum(entry.amount(kind) for entry in live) + amount - window.limit
        for entry in live:
            if excess <= 0:
                break
            excess -= entry.amount(kind)
            t = entry.at + reach  # once the oldest entries have left, it fits
        return t

    def _spread_due(self) -> float:
        if not self._spreads or not self._log:
            return -math.inf
        last = self._log[-1]
        return max(
            min(spread.until, last.at + last.amount(kind) / spread.rate)
            for kind, spread in self._spreads.items()
        )
