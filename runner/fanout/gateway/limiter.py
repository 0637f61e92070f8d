"""Per-request pacing of one API: sliding windows of requests, input tokens and output
tokens (``windows``), requests in flight, pauses, a learned ceiling and the upstream's
own counts, behind one first-come-first-served queue shared by every worker that calls
the API.

Order.  One queue, and only its head is considered: later callers never overtake it even
when they would fit, so a large request is not starved by a stream of small ones.  The
head waits on one loop timer for its due moment (windows only empty as time passes) and
is re-checked on every settle, release, pause, observation and arrival: no polling.  A
cancelled waiter leaves the queue; one cancelled after its admission but before it ran
has the admission undone: cancellation leaves no trace.

The learned ceiling (``ceiling.Ceiling``, one per API, counting requests).  An API
whose limit nobody declared learns it from its throttles: every admission takes a start
of the ceiling, every answer tells it through (``answered``) or throttled
(``throttled``, which returns the pause the throttle begins: one per episode, however
many requests one burst got refused), and the head also waits for the ceiling's due
moment (its pause, its pace, and the requests it lets be in flight: None re-checks on
the next answer, settle or release).  A declared requests window is the ceiling's
bound; it slow-starts only with neither a requests window nor ``maxInFlight``.  A
request settled or released without an answer (the upstream could not be reached) is
forgotten by the ceiling.  Until it learns, a declared requests window paces alone, as
before the ceiling (a burst of the window's limit, then the window's wait), not spaced
evenly.  The upstream's stated limit (``Remaining.requests_limit``)
bounds its probes and scales its pace when it changes.  ``shared`` sets the fraction
of the limit this job may use when other jobs share the key (``shares``): the learned
pace and every declared window are scaled by it.

Upstream feedback (``observe``).  "Small" is below SMALL_FRACTION of our window of that
kind; with no such window, fewer than SMALL_REQUESTS requests, and tokens are never
small.  Only when little remains, so bursts stay while there is room: Anthropic's reset
is when its bucket is full again, which understates the real rate.

- Requests, none or few left, with a known reset, a job alone on its key: rationed.
  What is left, less the requests admitted after the one whose answer said it (the
  upstream had not counted them), goes as it comes; then nothing until the reset.  By
  the reset one more request is free (a sliding window's oldest leaves, a bucket is
  full): it goes then, and the next waiters one a reset apart until an answer says
  more.  Spreading what was left over the reset instead lost most of a window on short
  runs (a sliding window of 2 used 0.86 of its limit).
- The same with jobs sharing the key: spread.  This job's share of ``remaining + 1``
  goes evenly until the reset (none left: nothing until the reset, then one per
  ``reset / share``).  Rations that each job took at once landed together.
- Tokens few left: spread until the reset, an admission of ``a`` tokens followed by the
  next no sooner than ``a * reset / remaining`` later (this job's share of it), and
  never later than the reset.  None left: nothing until the reset.

The newest observation of a kind replaces the older one.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..pacing.ceiling import Admission, Ceiling, Learned, Pause
from ..spec import Throttle, Window
from .windows import SKEW, Entry, Kind, Log

# Float dust (a timer fired at 60.049999999 for 60.05): the head is judged at now + _DUST
# so it never spins on a timer due "now"; SKEW is 50,000 times larger, so this is safe.
_DUST = 1e-6
SMALL_FRACTION = 0.1
SMALL_REQUESTS = 5
# Pauses after a 429/529: max(retry-after, backoff) * (1 + U(0, jitter)), the backoff
# doubling from 1 s to 60 s with each episode that follows a pause honoured in vain.
# The jitter spreads the retries of many waiting requests apart after a pause ends.
THROTTLE = Throttle(initial=1.0, max=60.0, jitter=0.2)


class Peers(Protocol):
    """The other jobs that share the API's key (``shares``), told the moments when this
    job's part of the limit must be current: a request arrives (a job that was idle
    joins), or a throttle is about to teach the ceiling (which counts this job's starts
    as its part's worth)."""

    def arrived(self) -> None: ...

    def settled(self) -> None: ...

    def throttling(self) -> None: ...


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
    # The upstream's own requests limit (``*-ratelimit-requests-limit``).
    requests_limit: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Ticket:
    """An admitted request: ``queued`` seconds from ``admit`` to admission, and the
    start its ceiling counted (told through or throttled by ``answered``,
    ``throttled``)."""

    queued: float
    admission: Admission
    _entry: Entry = field(repr=False, compare=False)


@dataclass(eq=False, slots=True)
class _Waiter:
    future: asyncio.Future[Entry]
    entry: Entry  # the reservation, capped; ``at`` is set at admission
    previous: Entry | None = None  # the admission before it (undone with it)


class Limiter:
    """Admits the requests of one API in arrival order, at the pace of its windows and
    of its learned ceiling.  ``learned``: what an earlier run learned (the ceiling
    starts from it); ``told``: called with what the ceiling knows whenever that
    changes."""

    def __init__(
        self,
        *,
        requests: Window | None,
        input_tokens: Window | None,
        output_tokens: Window | None,
        max_in_flight: int | None,
        clock: Callable[[], float] | None = None,
        throttle: Throttle = THROTTLE,
        rng: random.Random | None = None,
        learned: Learned | None = None,
        told: Callable[[Learned], None] | None = None,
    ) -> None:
        self._clock = clock
        self._max_in_flight = max_in_flight
        kinds = (Kind.REQUESTS, Kind.INPUT, Kind.OUTPUT)
        windows = zip(kinds, (requests, input_tokens, output_tokens), strict=True)
        self._logs = [Log(kind, w.limit, w.per + SKEW) for kind, w in windows if w is not None]
        self._declared_limits = [log.limit for log in self._logs]
        self.declared = None if requests is None else (requests.limit, requests.per)
        self.ceiling = Ceiling(
            throttle,
            rng or random.Random(),
            declared=self.declared,
            learned=learned,
            slow_start=requests is None and max_in_flight is None,
            slots=max_in_flight,
        )
        self._told = told
        self._known = self.ceiling.known()
        self.peers: Peers | None = None  # set by ``shares``
        self._last: Entry | None = None  # the newest admission: spreads count from it
        self._open: set[Entry] = set()  # admitted, neither settled nor released
        self._queue: deque[_Waiter] = deque()
        self._paused_until = -math.inf
        # Per kind: the units a second the upstream has left, until when, and from when
        # an admission counts (the first after a hold goes at the hold's end).
        self._spreads: dict[Kind, tuple[float, float, float]] = {}
        # The one request admitted as a spread ended: the others wait for what its
        # answer says (an observation), or for it to end.
        self._probe: Entry | None = None
        # Few requests left (``observe``): how many more may go, and the reset's moment
        # and length.
        self._ration: tuple[int, float, float] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._admitted = 0
        self._queued_seconds = 0.0

    def now(self) -> float:
        """The limiter's clock: the loop's, unless one was given."""
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    def _cap(self, kind: Kind, amount: int) -> int:
        return min([max(0, amount)] + [log.limit for log in self._logs if log.kind is kind])

    async def admit(self, *, input_tokens: int, output_tokens: int) -> Ticket:
        """Wait for this request's turn and room in every window, then take it."""
        called = self.now()
        fit = self._cap
        reserved = Entry(called, fit(Kind.INPUT, input_tokens), fit(Kind.OUTPUT, output_tokens))
        waiter = _Waiter(asyncio.get_running_loop().create_future(), reserved)
        self._queue.append(waiter)
        if self.peers is not None:
            self.peers.arrived()
        self._grant()
        try:
            entry = await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                # Admitted, then cancelled before it could run: undo the admission.
                if reserved.admission is not None:
                    self.ceiling.cancel(reserved.admission)
                self._open.discard(reserved)
                self._count(reserved, -1)
                for log in self._logs:
                    if log.counts(reserved):
                        log.entries.remove(reserved)
                if self._last is reserved:
                    self._last = waiter.previous
            elif waiter in self._queue:
                self._queue.remove(waiter)
            self._grant()  # it may have been the head that held the others
            raise
        queued = entry.at - called
        self._admitted += 1
        self._queued_seconds += queued
        assert entry.admission is not None
        return Ticket(queued=queued, admission=entry.admission, _entry=entry)

    def sent(self, ticket: Ticket) -> None:
        """The request's headers have just left for the upstream: from now on its entry
        counts from this moment, not from its admission.  Between the two lie the
        loop's own delays (resuming the waiter, taking a connection), measured at up to
        52 ms on a busy coordinator (bench/gateway.py), more than SKEW: two requests
        admitted ``per + SKEW`` apart then reached the upstream 4.98 s apart under a 5 s
        window.  A later time only keeps an entry in its windows longer (an entry
        behind it in the log is let go no sooner than it), so this errs on the safe
        side."""
        entry = ticket._entry
        now = self.now()
        if now > entry.at:
            entry.at = now

    def settle(self, ticket: Ticket, *, input_tokens: int, output_tokens: int) -> None:
        """The real usage replaces the reservation; the in-flight slot is freed."""
        entry = ticket._entry
        if entry is self._probe:
            self._probe = None
        if entry not in self._open:
            return  # settled or released already: a second call must not free twice
        self.ceiling.cancel(ticket.admission)  # no answer was told: the ceiling forgets it
        self._open.discard(entry)
        self._count(entry, -1)
        entry.input, entry.output = max(0, input_tokens), max(0, output_tokens)
        self._count(entry, +1)
        self._grant()

    def release(self, ticket: Ticket) -> None:
        """No usage known: the reservation stays in the windows; in flight is freed."""
        self.settle(ticket, input_tokens=ticket._entry.input, output_tokens=ticket._entry.output)

    def answered(self, ticket: Ticket) -> None:
        """The upstream answered the request (anything but a throttle): it got through."""
        if ticket._entry is self._probe:
            self._probe = None
        self.ceiling.finish(ticket.admission, self.now(), throttled=False)
        if self.peers is not None:
            self.peers.settled()
        self._grant()

    def throttled(self, ticket: Ticket, retry_after: float | None) -> Pause | None:
        """The upstream throttled the request (a 429 or 529, ``retry_after`` seconds
        asked): the pause it begins or lengthens, None when the episode's pause covers
        it already.  Admissions wait for it (``paused_until``)."""
        if self.peers is not None:
            self.peers.throttling()
        if ticket._entry is self._probe:
            self._probe = None
        pause = self.ceiling.finish(
            ticket.admission, self.now(), throttled=True, retry_after=retry_after, counted=False
        )
        if self.peers is not None:
            self.peers.settled()  # the refused request is no longer counted
        self._grant()
        return pause

    @property
    def paused_until(self) -> float:
        """Until when (on the limiter's clock) nothing is admitted, for a pause."""
        return max(self._paused_until, self.ceiling.paused_until)

    def shared(self, fraction: float) -> None:
        """This job may use ``fraction`` of the API's limit (0 < fraction <= 1; the
        rest is other jobs' that share the key): of the learned pace and of each
        declared window."""
        fraction = min(1.0, max(fraction, 1e-3))
        if fraction == self.ceiling.share:
            return
        self.ceiling.share = fraction
        for log, limit in zip(self._logs, self._declared_limits, strict=True):
            log.limit = max(1, math.floor(limit * fraction))
        self._grant()

    def adopt(self, learned: Learned) -> bool:
        """A job sharing the key learned ``learned`` from a throttle: paced at it when
        it is below what this one paces at (``Ceiling.adopt``).  True if taken."""
        taken = self.ceiling.adopt(learned, self.now())
        if taken:
            self._grant()
        return taken

    def counted(self) -> list[float]:
        """This job's starts the upstream counts now (``Ceiling.counted``), on the
        limiter's clock (``now``)."""
        return self.ceiling.counted(self.now())

    def heard(self, starts: list[float]) -> None:
        """The starts of the other jobs sharing the key that the upstream counts, on
        the limiter's clock: the ceiling's window estimates count them too."""
        self.ceiling.others = tuple(starts)

    def demand(self) -> int:
        """Requests waiting or in flight."""
        return len(self._queue) + len(self._open)

    def pause(self, seconds: float) -> None:
        """Admit nothing for ``seconds`` (a longer pause already running stays)."""
        self._paused_until = max(self._paused_until, self.now() + seconds)
        self._grant()

    def observe(self, remaining: Remaining, *, of: Ticket | None = None) -> None:
        """Hold, ration or spread admissions by what the upstream says it has left, in
        the answer to ``of`` (requests admitted after it are not in its count)."""
        now = self.now()
        r = remaining
        self._probe = None  # what it waited for
        for kind, left, reset in (
            (Kind.REQUESTS, r.requests, r.requests_reset),
            (Kind.TOKENS, r.tokens, r.tokens_reset),
            (Kind.INPUT, r.input_tokens, r.input_tokens_reset),
            (Kind.OUTPUT, r.output_tokens, r.output_tokens_reset),
        ):
            if left is None or reset is None:
                continue
            self._spreads.pop(kind, None)
            if kind is Kind.REQUESTS:
                self._ration = None
                if self.ceiling.window_known and self.ceiling.others:
                    # Shared: the ceiling paces a window it knows, every job's requests
                    # counted (bench case E: spreading each job's share of what remained
                    # as well used 0.80 of the limit).  Alone, the upstream's count
                    # stays the guide: an API that limits by token bucket (Anthropic)
                    # says no window in its Retry-After.
                    continue
                if reset <= 0 or (left > 0 and not self._small(kind, left)):
                    continue
                if self.ceiling.share < 1:
                    self._spread_requests(left, now, reset)
                else:
                    self._ration_requests(left, now, reset, of)
            elif left <= 0:
                self._paused_until = max(self._paused_until, now + reset)
            elif reset > 0 and self._small(kind, left):
                # What remains is the key's: this job's share of it (``shared``).
                self._spreads[kind] = (left * self.ceiling.share / reset, now + reset, -math.inf)
        if r.requests_limit is not None:
            self.ceiling.stated(r.requests_limit)
        self._grant()

    def _ration_requests(self, left: int, now: float, reset: float, of: Ticket | None) -> None:
        """Few requests left, this job alone on its key: those left, less the ones
        admitted after the answer's own request (not in the upstream's count yet), go
        as they come; then nothing until the reset.  Spreading them over the reset
        instead lost most of a window on a short run (bench case C: 12 requests at 2 per
        10 s went 5.5 s apart, 0.86 of the limit used, where a window's two go
        together)."""
        after = 0
        newest = self._last.admission if self._last is not None else None
        if of is not None and newest is not None:
            after = max(0, newest.number - of.admission.number)
        if left - after > 0:
            self._ration = (left - after, now + reset, reset)
        else:
            self._hold_requests(now + reset, reset)

    def _hold_requests(self, until: float, reset: float) -> None:
        """Nothing until ``until``; then one more is free (a sliding window's oldest
        leaves, a bucket is full), not one for every waiter: they go one a reset apart
        until an answer says more (bench case C: four at the reset of a window of 2
        drew three 429s)."""
        self._paused_until = max(self._paused_until, until)
        self._spreads[Kind.REQUESTS] = (1 / reset, until + reset, until)

    def _spread_requests(self, left: int, now: float, reset: float) -> None:
        """Few or no requests left of a key other jobs share: this job's share of what
        is left and of the one the reset frees, spread until the reset (two jobs that
        each took theirs at once drew more 429s together, bench case E).  None left:
        nothing until the reset, then one a reset apart for this job's share."""
        share = self.ceiling.share
        if left <= 0:
            self._paused_until = max(self._paused_until, now + reset)
            self._spreads[Kind.REQUESTS] = (share / reset, now + 2 * reset, -math.inf)
        else:
            self._spreads[Kind.REQUESTS] = ((left + 1) * share / reset, now + reset, -math.inf)

    def _small(self, kind: Kind, left: int) -> bool:
        kinds = (Kind.INPUT, Kind.OUTPUT) if kind is Kind.TOKENS else (kind,)
        ours = [log.limit for log in self._logs if log.kind in kinds]
        if not ours:
            return kind is Kind.REQUESTS and left < SMALL_REQUESTS
        return left < SMALL_FRACTION * sum(ours)

    def stats(self) -> dict[str, Any]:
        return {
            "admitted": self._admitted,
            "queuedSeconds": round(self._queued_seconds, 3),
            "inFlight": len(self._open),
            "waiting": len(self._queue),
        }

    def _grant(self) -> None:
        """Admit the head of the queue while it fits; else arm one timer for its due
        moment (none when only an in-flight cap holds it: an answer or a settle
        re-checks).  Called after every change, the ceiling's pace included, so the
        timer is always for the newest."""
        if self._timer is not None:
            self._timer.cancel()  # the head, or the moment it is due, may have changed
            self._timer = None
        try:
            self._admit_due()
        finally:
            self._tell()

    def _admit_due(self) -> None:
        while self._queue:
            head = self._queue[0]
            if head.future.done():  # cancelled; its admit() is about to see it
                self._queue.popleft()
                continue
            now = self.now()
            due = self._due(head.entry, now + _DUST)
            if due is None:
                return
            if due > now + _DUST:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(due - now, self._grant)
                return
            self._queue.popleft()
            ended = [k for k, (_, until, _) in self._spreads.items() if until <= now]
            if ended:
                # A spread ends at its reset, and what it held must not all go at once
                # (bench case E: three at a spread's end, two 429s): this one goes, the
                # rest wait for what its answer says.
                for kind in ended:
                    del self._spreads[kind]
                self._probe = head.entry
            head.entry.admission = self.ceiling.start(now)
            head.entry.at, head.previous, self._last = now, self._last, head.entry
            for log in self._logs:
                log.entries.append(head.entry)
            self._count(head.entry, +1)
            self._open.add(head.entry)
            if self._ration is not None:
                left, until, reset = self._ration
                if left > 1:
                    self._ration = (left - 1, until, reset)
                else:  # the last of it: nothing more until the reset
                    self._ration = None
                    self._hold_requests(until, reset)
            head.future.set_result(head.entry)

    def _tell(self) -> None:
        """Say what the ceiling knows when it changed (a throttle, a probe, a peer's
        rate, a stated limit)."""
        known = self.ceiling.known()
        if known != self._known:
            self._known = known
            if known is not None and self._told is not None:
                self._told(known)

    def _count(self, entry: Entry, sign: int) -> None:
        for log in self._logs:
            if log.counts(entry):  # one that has left no longer weighs
                log.total += sign * entry.amount(log.kind)

    def _due(self, reserved: Entry, t: float) -> float | None:
        """The earliest moment >= t at which ``reserved`` may be admitted, or None while
        the in-flight cap holds it.  Each part only eases as time passes, so the latest of
        them is the answer until something new happens (which re-checks)."""
        if self._max_in_flight is not None and len(self._open) >= self._max_in_flight:
            return None
        if self._probe is not None and self._probe in self._open:
            return None
        if self.declared is not None and self.ceiling.rate is None:
            # Its requests window paces, bursts and all (the ceiling would space the
            # declared rate evenly): until the ceiling learns, only its pause applies.
            paced: float | None = max(t, self.ceiling.paused_until)
        else:
            paced = self.ceiling.due(t)
        if paced is None:
            return None
        due = max(t, paced, self._paused_until, self._spread_due())
        for log in self._logs:
            due = max(due, log.due(reserved.amount(log.kind), t))
        return due

    def _spread_due(self) -> float:
        last = self._last
        if not self._spreads or last is None:
            return -math.inf
        return max(
            min(until, last.at + last.amount(k) / rate) if last.at >= counts_from else -math.inf
            for k, (rate, until, counts_from) in self._spreads.items()
        )
