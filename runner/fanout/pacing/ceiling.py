"""The learned ceiling of one limit: how fast starts may go, and how many may run at
once, when nobody said how much the upstream allows.  Pure logic on a clock it is given.

A *start* is what the limit counts: a task start for the rate gate (``limits``), a
request for the gateway (``gateway.limiter``).  The upstream's only word is a throttle
(a 429, exit 75), often with an honest Retry-After.

The controller (docs/guides/rate-limits.md, "Why this controller", says why this one):

- **Slow start** (TCP, RFC 5681), while nothing is known, in generations: the first
  of ``INITIAL_WINDOW`` starts, each next one twice as large, opened when every start
  of the one before got through (TCP doubles per round trip) or ``RAMP_S`` after it
  opened (so units that run for minutes still open it up).  Counting starts, not
  starts in flight, matters for quick units: a flight refilled as each one ends lets
  a whole burst through before the first throttle comes back.  It ends at the first
  throttle, or when a generation would reach the slots.
- **Decrease to what got through**, not by a fixed factor.  The upstream's window
  comes first, from what it said:
  - an honest Retry-After R at t is when its oldest counted request leaves, and that
    request is the N-th newest that got through (N its stated limit, else what got
    through in the window believed so far), at s: the window is t + R - s, never less
    than the upstream's (R is rounded up, and a start reaches it after it starts), so
    the least of the newest ``ESTIMATES`` is kept.  A whole-second R puts the window
    within the second below t + R - s, and windows are whole seconds: that one.  R
    alone is the window only when the throttle comes early in it (a throttle late in a
    sliding window says 1-2 s of a 10 s window, and pacing at "2 per 2 s" drew a 429 a
    window);
  - a throttle message that states the limit ("of 50 requests per minute", read by
    the agent presets) says the window outright.

  The rate is then the starts that got through in that window, one window's worth: an
  exact count where AIMD's halving would guess; with a stated limit (the gateway reads
  it from the answers' headers), that limit over the window.  With no window said it
  is the longest pause taken (a pause that ended too soon is followed by a longer one),
  and the rate ``BETA`` times the lower of the rate paced at and what got through.
  The starts in flight are capped as well, at what ran beside the throttled one
  (Netflix's concurrency-limits AIMD, decreased to what got through), then one more
  for each cap's worth that gets through: that is the bound for long units, whose
  starts are rare but whose requests keep coming.
- **Probe upward** while there is demand and no throttle: after ``hold`` windows,
  ``step`` more starts per window, the step doubling on each probe that passes, and no
  further than halfway to the rate that was last refused (BIC-TCP's binary search, the
  ancestor of CUBIC).  A probe that is throttled doubles ``hold`` (to ``HOLD_MAX``)
  and restarts the step at one; close to the refused rate the probing stops until
  ``HOLD_MAX`` windows pass quietly, and then the refused rate is forgotten (the limit
  may have been raised).  A declared or stated limit is the bound of every probe.
- **One backoff per episode.**  Throttles of starts admitted before the current pause
  began are that pause's episode: they may lower the estimate and lengthen the pause to
  their Retry-After, but they do not escalate it.  The pause doubles (from
  ``retry.throttle.initial``) only when the first starts after a pause that honoured the
  Retry-After are throttled again before any got through.  Retry-After is the floor,
  with jitter on top.
"""

from __future__ import annotations

import contextlib
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..spec import Throttle
from ..values.quantities import format_duration
from .backoff import Backoff, Jitter

# The interval's widening: a start's request reaches the upstream later than it starts,
# by a delay that varies.
MARGIN = 1.05
# The same for a window estimated from a Retry-After (``_window_from``): the estimate
# already holds a start's delay (when one more fits, less when the start that leaves
# began, not when it arrived), and the Retry-After's rounding up; this only covers
# the delays' difference from one start to the next.
ESTIMATED_MARGIN = 1.01
BETA = 0.85  # multiplicative decrease where nothing better is known
# Slow start's first flight.  One, as TCP began (RFC 2001; RFC 6928 raised it to 10
# segments for latency): every start beyond what the upstream allows is a 429, and an
# agent refused mid-conversation has paid for the turns before it.  Doubling reaches 64
# in six generations, at most 12 s (RAMP_S).
INITIAL_WINDOW = 1
RAMP_S = 2.0
HOLD = 2  # windows without a throttle before the first probe
HOLD_MAX = 8
# The longest window guessed from pauses when the upstream says no Retry-After: rate
# limits are counted per second, per 10 s or per minute.
GUESS_MAX = 60.0
CLOSE = 0.03  # within 3% of the refused rate: stop probing
# Window estimates kept: the least of the newest few is the window (each is at least the
# upstream's, see ``_window_from``), and an old one ages out if the window grows.
ESTIMATES = 4


@dataclass(frozen=True, kw_only=True, slots=True)
class Learned:
    """What a ceiling learned: ``rate`` starts a second over a ``window`` of seconds,
    from ``throttles`` throttles (over runs), and the cap on starts in flight.  ``said``:
    the window is the upstream's own (``Ceiling.window_known``); a peer sharing the
    limit takes it so (``adopt``), the next run does not (``as_dict`` leaves it out: a
    window kept from yesterday paces evenly until this run hears the upstream)."""

    rate: float
    window: float
    throttles: int
    concurrency: int | None = None
    said: bool = field(default=False, compare=False)

    @property
    def per_window(self) -> float:
        return self.rate * self.window

    def as_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "window": self.window,
            "throttles": self.throttles,
            "concurrency": self.concurrency,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Learned | None:
        """The inverse of ``as_dict``; None for anything it did not write."""
        try:
            rate, window = float(data["rate"]), float(data["window"])
            throttles = int(data["throttles"])
            concurrency = data.get("concurrency")
            concurrency = None if concurrency is None else max(1, int(concurrency))
        except (KeyError, TypeError, ValueError):
            return None
        if not (math.isfinite(rate) and rate > 0 and math.isfinite(window) and window > 0):
            return None
        return cls(rate=rate, window=window, throttles=throttles, concurrency=concurrency)


def describe(learned: Learned, *, declared: tuple[int, float] | None = None) -> str:
    """``2.0 per 10s learned from 3 throttles (declared 8 per 10s)``."""
    count = f"{learned.throttles} throttle{'' if learned.throttles == 1 else 's'}"
    text = f"{learned.per_window:.1f} per {format_duration(learned.window)} learned from {count}"
    if learned.concurrency is not None:
        text += f", {learned.concurrency} at once"
    if declared is not None:
        text += f" (declared {declared[0]} per {format_duration(declared[1])})"
    else:
        text += " (none declared)"
    return text


@dataclass(frozen=True, slots=True)
class Admission:
    """One start the ceiling let through: its number in order, and when."""

    number: int
    at: float


@dataclass(frozen=True, slots=True)
class Pause:
    """A pause a throttle began (or lengthened): until when, and the backoff level."""

    seconds: float
    until: float
    level: int
    new_episode: bool


@dataclass(eq=False, slots=True)
class _Start:
    admission: Admission
    state: str = "running"  # running, through, throttled


@dataclass(eq=False)
class Ceiling:
    """The ceiling of one limit (see the module docstring).  Call ``due`` for the
    earliest next start (None: the flight is full, wait for a ``finish``), ``start``
    when one starts, ``finish`` when it ends."""

    throttle: Throttle
    rng: random.Random = field(default_factory=random.Random)
    # A declared limit: (starts, per seconds); the bound of every probe.
    declared: tuple[int, float] | None = None
    learned: Learned | None = None
    slow_start: bool = True
    slots: int | None = None
    # The fraction of the rate this job may use (``gateway.shares``): 1 when alone.
    share: float = 1.0

    def __post_init__(self) -> None:
        if not self.throttle.learn:
            self.slow_start, self.learned = False, None
        # retry.throttle: a pause's backoff, with up to ``jitter`` of it more on top.
        self.backoff = Backoff(
            initial=self.throttle.initial,
            max=self.throttle.max,
            jitter=Jitter.above(self.throttle.jitter),
        )
        self.rate: float | None = None
        # The upstream's window, learned from the longest Retry-After (an honest one is
        # at most the window), no longer than a declared one.
        self.window: float | None = None
        self.concurrency: int | None = None
        self._window_said = False  # the window came from the upstream (see _window_from)
        self._window_estimated = False  # ... estimated from a Retry-After
        self._estimates: deque[float] = deque(maxlen=ESTIMATES)
        # The through starts of other jobs that share this limit (``gateway.shares``),
        # on this ceiling's clock: the upstream counts them too.
        self.others: tuple[float, ...] = ()
        self.throttles = 0
        self._stated: int | None = None
        if self.learned is not None:
            self.rate = self._bounded(self.learned.rate)
            self.window = self.learned.window
            self.concurrency = self.learned.concurrency
            self.throttles = self.learned.throttles
        # Slow start's generation: its size (None: not ramping), how many of it have
        # started, which of those are still running, and when it opened.
        # Also when the slots are no more than the first generation: it counts starts, so
        # a slot freed by a quick answer waits for the generation (bench case A: two
        # answers back before two 429s let two more starts into the same burst).
        self._generation: int | None = (
            INITIAL_WINDOW if self.slow_start and self.rate is None else None
        )
        self._generation_started = 0
        self._generation_open: set[int] = set()
        # When the generation opened: the first's with its first start (a loop's clock
        # is far past 0.0, so 0.0 had the first generation opened RAMP_S long ago).
        self._generation_at: float | None = None
        self._flight_gains = 0
        self._recent: deque[_Start] = deque()
        self._running: dict[int, _Start] = {}
        self._number = 0
        # The starts of the last two windows, oldest first (``burst`` looks back).
        self._start_times: deque[float] = deque()
        self._after_pause = False
        self.paused_until = -math.inf
        self._pause_begun_at = 0  # admissions numbered >= this started after the pause began
        self._level = -1  # the last pause's backoff level (-1: none yet)
        self._through_since_pause = True
        self._refused: float | None = None
        self._refused_at = 0.0
        self._step = 1.0
        self._hold = HOLD
        self._calm_since: float | None = None
        self._wanted = False  # a start waited for the pace since the last change
        self.version = 0  # bumps whenever the pace changes (for a waiter's timer)
        if self.rate is not None and self.window is not None:
            # What an earlier run learned was refused one start a window above it: no
            # probe until that is HOLD_MAX windows old (the next cron fire starts at
            # yesterday's pace, not with a throttle).
            self._refused = self.rate + 1 / self.window

    # -- pacing ---------------------------------------------------------------------

    @property
    def margin(self) -> float:
        """How much wider than the window the pace spreads a window's worth."""
        return ESTIMATED_MARGIN if self._window_estimated else MARGIN

    @property
    def interval(self) -> float | None:
        """Seconds between two starts (None: not paced).  Until it learns, a
        declared limit's own spacing."""
        if self.rate is None:
            return None if self.declared is None else self._declared_interval()
        return self.margin / (self.rate * self.share)

    @property
    def burst(self) -> int:
        """How many starts may go together: a learned window's whole starts (at least
        one).  ``n`` starts in any ``n`` intervals is what the upstream allows a window
        (a sliding window, a fixed one or a bucket that refills at the rate), and
        spacing them evenly instead lost most of a window on a short run: 12 requests
        at 2 per 10 s took 11 intervals of 5.25 s, not 5 windows of 10.5 s
        (bench/adaptive.py case C used 0.86 of the limit).  Only a window the upstream
        said (a Retry-After): one guessed from pauses may be shorter than the upstream's,
        and a window's worth at once then overruns it (case B), and what an earlier run
        learned is paced evenly until this run hears a Retry-After of its own.  Jobs
        sharing a key each take their share's worth: n of them with floor(N / n) each
        never exceed N together."""
        if self.rate is None or self.window is None or not self.window_known:
            return 1
        return max(1, math.floor(self.rate * self.share * self.window + 1e-9))

    def _declared_interval(self) -> float:
        # Widened by a hair, so float rounding never puts n + 1 starts inside ``per``.
        assert self.declared is not None
        return self.declared[1] / self.declared[0] * (1 + 1e-6) + 2e-6

    def due(self, now: float) -> float | None:
        """The earliest moment >= now of the next start; None while the flight is full
        (a ``finish`` changes that)."""
        self._probe(now)
        due = max(now, self.paused_until)
        if self.ramping and self._generation_started >= (self._generation or 0):
            opened = now if self._generation_at is None else self._generation_at
            if not self._generation_open or now - opened >= RAMP_S:
                self._next_generation(now)
            else:  # the next generation opens when this one is through, or at RAMP_S
                due = max(due, opened + RAMP_S)
        if self.concurrency is not None and len(self._running) >= self.concurrency:
            return None
        interval = self.interval
        if self._after_pause:
            interval = self._declared_interval() if self.declared else None
        if interval is not None:
            burst = self.burst if not self._after_pause else 1
            starts = self._start_times
            paced = starts[-burst] + burst * interval if len(starts) >= burst else -math.inf
            if paced > due:
                self._wanted = True
            due = max(due, paced)
        return max(due, self._key_due(), self._declared_due())

    def _declared_due(self) -> float:
        """A declared limit, N per W, as a sliding window of this ceiling's starts: the
        bound of every pace.  A learned window shorter than W lets a window's worth go
        together more often than W allows (5 per 30 s at twice is 10, and a start before
        them an 11th in 60 s)."""
        if self.declared is None:
            return -math.inf
        count, per = self.declared
        starts = self._start_times
        if len(starts) < count:
            return -math.inf
        return starts[-count] + per * (1 + 1e-6) + 2e-6

    def _key_due(self) -> float:
        """With others sharing the limit: when the key's whole window has room, every
        job's counted starts in it.  Each job keeps to its share (``due``), so this
        binds only while shares change: a job that left still has its last starts in
        the upstream's window, and the one that takes its share back waits for them."""
        if not self.others or not self.window_known or self._after_pause:
            return -math.inf
        assert self.rate is not None
        assert self.window is not None
        whole = max(1, math.floor(self.rate * self.window + 1e-9))
        span = self.window * self.margin
        newest = max([*self.others, *(e.admission.at for e in self._recent)], default=0.0)
        counted = sorted(
            [t for t in self.others if t > newest - span]
            + [
                e.admission.at
                for e in self._recent
                if e.state in ("through", "running") and e.admission.at > newest - span
            ]
        )
        return counted[-whole] + span if len(counted) >= whole else -math.inf

    def start(self, now: float) -> Admission:
        self._number += 1
        admission = Admission(self._number, now)
        entry = _Start(admission)
        self._running[admission.number] = entry
        self._recent.append(entry)
        if self.ramping:
            if self._generation_at is None:
                self._generation_at = now
            self._generation_started += 1
            self._generation_open.add(admission.number)
        self._start_times.append(now)
        # Kept by age, not by count: a burst that grows (a share given back) must still
        # see the starts of its window.
        horizon = max(
            (self.window or 0.0) * 2 * self.margin,
            GUESS_MAX,
            2 * self.declared[1] if self.declared else 0.0,
        )
        while len(self._start_times) > 1 and self._start_times[0] < now - horizon:
            self._start_times.popleft()
        self._after_pause = False
        if self._calm_since is None:
            self._calm_since = now
            # A seed's refusal dates from the first start (0.0 is a clock's own zero:
            # a loop's monotonic clock is far past it, and the seed was probed at once).
            self._refused_at = now
        self._forget(now)
        return admission

    def cancel(self, admission: Admission) -> None:
        """A start that never reached the upstream: forget it."""
        entry = self._running.pop(admission.number, None)
        self._generation_open.discard(admission.number)
        if entry is not None:
            entry.state = "cancelled"

    # -- feedback --------------------------------------------------------------------

    def finish(
        self,
        admission: Admission,
        now: float,
        *,
        throttled: bool,
        retry_after: float | None = None,
        window: float | None = None,
        running: bool = True,
        counted: bool = True,
    ) -> Pause | None:
        """The start ended: through, or throttled (a pause to take, or None when an
        earlier pause already covers it), with the ``window`` the upstream's message
        stated, if it did.  ``counted``: a throttled start may still count upstream (a
        unit may have sent requests before the one refused); a refused request does
        not, and gives its place in the pace back."""
        entry = self._running.pop(admission.number, None)
        if entry is None:
            return None
        if not throttled:
            entry.state = "through"
            self._generation_open.discard(admission.number)
            if admission.number >= self._pause_begun_at:
                self._through_since_pause = True
            self._gained(now)
            return None
        # What ran beside it and was not throttled bounds the flight (``running``:
        # it was a start that ran, not a signal from outside any start).
        beside = len(self._running) if running else None
        entry.state = "throttled"
        if not counted:
            with contextlib.suppress(ValueError):
                self._start_times.remove(admission.at)
        return self._throttled(admission, now, retry_after, window, beside)

    def _gained(self, now: float) -> None:
        if self.concurrency is not None:
            self._flight_gains += 1
            if self._flight_gains >= self.concurrency:
                self._flight_gains = 0
                if self.slots is None or self.concurrency < self.slots:
                    self.concurrency += 1

    def _next_generation(self, now: float) -> None:
        assert self._generation is not None
        self._generation *= 2
        if self.slots is not None and self._generation >= self.slots:
            self._generation = None  # the slots bound it from here
        self._generation_started = 0
        self._generation_open = set()
        self._generation_at = now
        self.version += 1

    def _throttled(
        self,
        admission: Admission,
        now: float,
        retry_after: float | None,
        stated_window: float | None,
        beside: int | None,
    ) -> Pause | None:
        self.throttles += 1
        before = self.window  # a rate is a count over it: rescaled if the window changes
        same_episode = admission.number < self._pause_begun_at and now < self.paused_until + (
            self.window or 0.0
        )
        if not self.throttle.learn:  # retry.throttle.learn = false: only the pause
            return self._only_paused(now, retry_after, same_episode)
        if stated_window is not None and stated_window > 0:
            self._window_said, self._window_estimated = True, False
            self.window = stated_window
        elif retry_after is not None and retry_after > 0:
            self._window_said, self._window_estimated = True, True
            self.window = self._window_from(now, retry_after, admission)
        if self.window is not None and self.declared:
            self.window = min(self.window, self.declared[1])
        pause = self._pause(now, retry_after, same_episode)
        window = self.window or (
            self.declared[1] if self.declared else max(self.throttle.initial, pause.seconds)
        )
        if retry_after is None and pause.new_episode and not self.declared:
            # With no Retry-After the window is a guess, the backoff: a pause the first
            # starts after it were throttled again was shorter than the upstream's
            # window, so the guess grows with the backoff that follows (without its
            # jitter, which is not the upstream's; to GUESS_MAX: a longer pause is an
            # outage, not a window).
            window = max(window, min(self.backoff.step(pause.level + 1), GUESS_MAX))
        self.window = window
        got = sum(1 for t in self._counted_before(admission) if t > now - window)
        # The rate is the limit's whole (``share`` of it is this job's): what got
        # through of every job's starts, when the others said theirs; else this job's
        # is its share's worth.
        whole = 1.0 if self.others else self.share
        observed = max(1, got) / window / whole
        tried = (got + 1) / window / whole
        if same_episode:  # what got through in the same window, counted again
            paced = observed if self.rate is None else self.rate * (before or window) / window
            self.rate = self._bounded(min(paced, observed))
            self._refused = min(self._refused or tried, tried)
        else:
            # A window the upstream said makes the count exact; a guessed one does not.
            # A count at or above the pace that was refused explains nothing (a token
            # bucket's Retry-After is one token's refill, not a window): then the pace
            # itself was too high, and it decreases by BETA, each episode again.
            refused = self.rate
            estimate = observed if self._window_said else BETA * min(refused or observed, observed)
            if refused is not None and estimate >= refused:
                estimate = BETA * refused
            self._refused = min(refused, tried) if refused is not None else tried
            self._refused_at = now
            self.rate = self._bounded(estimate)
            if beside is not None:
                self.concurrency = max(1, beside)
                if self.slots is not None:
                    self.concurrency = min(self.concurrency, self.slots)
            if self._calm_since is not None and self._step > 1:
                self._hold = min(self._hold * 2, HOLD_MAX)  # a probe was refused
            self._step = 1.0
        self._generation = None
        self._calm_since = max(now, self.paused_until)  # windows count from the pause's end
        self._wanted = False
        self.version += 1
        return pause if (pause.new_episode or pause.seconds > 0) else None

    def _only_paused(
        self, now: float, retry_after: float | None, same_episode: bool
    ) -> Pause | None:
        """The pause of a throttle, with nothing learned from it: not the window its
        message states either (a pause until that window empties is learning it)."""
        pause = self._pause(now, retry_after, same_episode)
        return pause if (pause.new_episode or pause.seconds > 0) else None

    def _counted_before(self, admission: Admission) -> list[float]:
        """The starts the upstream counted when it refused ``admission``'s, oldest
        first: this job's that got through, or still run and were admitted before it
        (a unit's request goes out as it starts, long before it ends; one admitted
        after it, in the same burst, was likely refused too), and the others' that
        share the limit, started before it."""
        own = [
            e.admission.at
            for e in self._recent
            if e.state == "through"
            or (e.state == "running" and e.admission.number < admission.number)
        ]
        return sorted(own + [t for t in self.others if t < admission.at])

    def _window_from(self, now: float, retry_after: float, admission: Admission) -> float:
        """The upstream's window from an honest Retry-After (see the module
        docstring): the least of the newest estimates, each ``now + retry_after`` less
        the N-th newest start it counted (``_counted_before``), at least
        ``retry_after``."""
        through = self._counted_before(admission)
        if self._stated is not None:
            count = self._stated
        else:
            believed = max(self.window or 0.0, retry_after)
            count = sum(1 for t in through if t >= now - believed)
        estimate = retry_after
        if 0 < count <= len(through):
            estimate = max(retry_after, now + retry_after - through[-count])
            if float(retry_after).is_integer():
                # Rounded up to whole seconds, the Retry-After puts the window within a
                # second below the estimate, and upstreams count whole seconds (per
                # second, per minute): the whole second there is the window.
                estimate = max(retry_after, math.floor(estimate + 1e-9))
        self._estimates.append(estimate)
        return min(self._estimates)

    def _window_ends(self, now: float) -> float:
        """Seconds until the oldest start that got through in the said window leaves
        it (widened by MARGIN): when one more fits, the Retry-After a worker that
        states the window without one did not say.  0 when nothing is known."""
        if not self._window_said or self.window is None:
            return 0.0
        inside = [
            e.admission.at
            for e in self._recent
            if e.state in ("through", "running") and e.admission.at > now - self.window
        ]
        return max(0.0, min(inside) + self.window * MARGIN - now) if inside else 0.0

    def _pause(self, now: float, retry_after: float | None, same_episode: bool) -> Pause:
        floor = retry_after or 0.0
        # Computed, not said: exact, so no jitter on it (the backoff's guess keeps its
        # own), and the pace after the pause spreads the starts anyway.
        # Not a Retry-After, so no longer than ``retry.throttle.max``, as a backoff.
        ends = 0.0 if retry_after else min(self._window_ends(now), self.throttle.max)
        if same_episode:
            if now + (floor or ends) > self.paused_until:
                jitter = self.backoff.jitter.factor(self.rng) if floor else 1.0
                self.paused_until = now + (floor * jitter or ends)
                return Pause(self.paused_until - now, self.paused_until, self._level, False)
            return Pause(0.0, self.paused_until, self._level, False)
        level = self._level + 1 if not self._through_since_pause and self._level >= 0 else 0
        seconds = max(ends, self.backoff.delay(level + 1, self.rng, floor=floor))
        self._level = level
        self._through_since_pause = False
        self._pause_begun_at = self._number + 1
        self.paused_until = max(self.paused_until, now + seconds)
        # The first start after the pause goes at its end (no sooner than a declared
        # pace allows); the learned pace counts from there.
        self._after_pause = True
        return Pause(seconds, self.paused_until, level, True)

    def _probe(self, now: float) -> None:
        if self.rate is None or self._calm_since is None or now < self.paused_until:
            return
        window = self.window or 1.0
        quiet = now - self._calm_since
        if self._refused is not None and now - self._refused_at >= HOLD_MAX * window:
            self._refused = None  # refused long ago: the limit may have been raised since
        if quiet < self._hold * window or not self._wanted:
            return
        target = self.rate + self._step / window
        if self._refused is not None and target >= self._refused:
            # Nothing to find between them: within CLOSE, or one start a window apart
            # (a window counts whole starts).
            gap = self._refused - self.rate
            if gap <= CLOSE * self._refused or gap * window <= 1 + 1e-9:
                return
            target = (self.rate + self._refused) / 2
        bounded = self._bounded(target)
        if bounded <= self.rate:
            return
        self.rate = bounded
        self._step *= 2
        self._calm_since = now
        self._wanted = False
        self.version += 1

    def _bounded(self, rate: float) -> float:
        bounds = [rate]
        if self.declared is not None:
            bounds.append(self.declared[0] / self.declared[1])
        if self._stated is not None and self.window:
            bounds.append(self._stated / self.window)
        return min(bounds)

    def stated(self, limit: int) -> None:
        """The upstream said its limit (a ``*-ratelimit-requests-limit`` header): a
        change scales the learned rate with it, and it bounds the probes."""
        if limit <= 0:
            return
        previous, self._stated = self._stated, limit
        if previous is not None and previous != limit and self.rate is not None:
            self.rate = self._bounded(self.rate * limit / previous)
            self._refused = None
            self.version += 1
        elif self.rate is not None:
            self.rate = self._bounded(self.rate)

    def adopt(self, learned: Learned, now: float) -> bool:
        """A peer sharing this limit (``gateway.shares``) was throttled and learned
        ``learned``: taken when it is below the rate paced at, or nothing is known
        (slow start ends), then probed from as if learned here.  True if taken."""
        rate = self._bounded(learned.rate)
        if self.rate is not None and rate >= self.rate:
            return False
        self.rate = rate
        self.window = max(self.window or 0.0, learned.window)
        if self.declared:
            self.window = min(self.window, self.declared[1])
        if learned.said and not self._window_said:
            self._window_said = self._window_estimated = True  # the peer's estimate
        # The peer was refused one start a window above it, as a seed was: no probe
        # there until that is HOLD_MAX windows old.
        self._refused, self._refused_at = rate + 1 / self.window, now
        self._generation = None
        self._calm_since = now
        self._wanted = False
        self.version += 1
        return True

    def _forget(self, now: float) -> None:
        # Two windows, and at least the longest a window is guessed: before a window is
        # known, the first throttle may come late in one (_window_from).
        horizon = max((self.window or 0.0) * 2, GUESS_MAX)
        while self._recent and self._recent[0].admission.at < now - horizon:
            self._recent.popleft()

    # -- what it knows -------------------------------------------------------------

    def counted(self, now: float) -> list[float]:
        """The starts of the last window (or GUESS_MAX) that got through or still
        run, oldest first: what the upstream counts of this job's, for others that
        share the limit (``others``)."""
        since = now - (self.window or GUESS_MAX)
        return [
            e.admission.at
            for e in self._recent
            if e.state in ("through", "running") and e.admission.at >= since
        ]

    def known(self) -> Learned | None:
        """What it has learned (None: never throttled, nothing kept)."""
        if self.rate is None or self.window is None:
            return None
        return Learned(
            rate=self.rate,
            window=self.window,
            throttles=self.throttles,
            concurrency=self.concurrency,
            said=self._window_said,
        )

    @property
    def window_known(self) -> bool:
        """It paces at a rate over a window the upstream said: a window's worth
        together, no guess (``burst``)."""
        return self._window_said and self.rate is not None and self.window is not None

    @property
    def ramping(self) -> bool:
        """Slow start holds the flight (nothing learned yet)."""
        return self._generation is not None and self.rate is None
