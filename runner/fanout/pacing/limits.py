"""Rate limits of the external APIs workers call: how fast units may start, and the
pause that follows when an API says "slow down".

Pacing.  A task takes ``requestsPerTask`` requests from every limit it uses, so at most
``floor(requests / requestsPerTask)`` tasks fit in any window of length ``per`` (50
requests a minute at 4 a task is 12 tasks, not 12.5: the 13th would make 52).  Starts
are spaced evenly, one every ``per / floor(requests / requestsPerTask)`` seconds: n + 1
starts then span at least ``per``, so no window of length ``per`` ever holds more than
the limit allows (a leaky bucket with a burst would let a whole period's worth through at
once and about twice the rate in the first period).  Every limit the task uses applies,
so the tightest sets the pace of the fleet, and a start takes its place on every limit at
the one moment it starts: not earlier, while it still waits for another limit or a
pause.  ``maxInFlight`` caps concurrent tasks per API.  (No rate-limit library: one
takes capacity when ``acquire`` returns, not at the start; docs/design.md says more.)

The pause gate.  When a worker reports a throttle signal (see ``throttle``) the named
limit, or every limit the task uses, stops granting starts for
``max(Retry-After, backoff) * (1 + U(0, jitter))``, capped at ``retry.throttle.max`` but
never shorter than Retry-After.  ``backoff`` doubles from ``retry.throttle.initial``
with each throttle in a row on that limit and resets after a success; the jitter keeps
clients from retrying in lockstep.  Units already running are not disturbed; queued units
hold no capacity, so the pause reaches them.  With no limits declared a throttle signal
pauses all dispatch.

Starts are granted first come, first served: waiters pass the pauses and the pacing one
at a time, in arrival order.  Without that order a unit whose start comes due inside a
new pause would sleep again behind the unit just throttled, which re-enters first: a
unit throttled on every attempt would take every start after each pause, and a queued
unit would never start.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..events import Events
from ..outcome import AttemptResult, Status
from ..spec import Limit, Spec, Throttle, Window
from ..spec.apis import FACTS
from .ceiling import Admission, Ceiling, Learned, Pause, describe

# Waits shorter than this are float dust (``until - now`` of 7e-15 after a sleep that
# ended on time): waiting them out would spin forever on a coarse or virtual clock, which
# does not move while nothing else is scheduled.  A start may so begin up to _DUST early,
# and the spacing is widened by twice that (plus a relative hair for rounding), so even
# then n + 1 starts span more than ``per``.
_DUST = 1e-6
_SAFETY = 1 + 1e-6
ALL = "*"


@dataclass(frozen=True, slots=True)
class Pace:
    limit: Limit

    @property
    def tasks_per_window(self) -> int:
        return self.limit.requests // self.limit.requests_per_task

    @property
    def tasks_per_second(self) -> float:
        return self.tasks_per_window / self.limit.per


def paces(spec: Spec) -> list[Pace]:
    """One pace per limit the task uses, tightest first."""
    return sorted((Pace(limit) for limit in spec.task_limits()), key=lambda p: p.tasks_per_second)


def tightest(spec: Spec) -> Pace | None:
    found = paces(spec)
    return found[0] if found else None


# An [[apis]] entry's windows: its field, and the key job files, events and an
# attempt's usage (``outcome.ApiUsage.as_dict``) name it by.
WINDOW_KEYS = (
    ("requests", "requests"),
    ("input_tokens", "inputTokens"),
    ("output_tokens", "outputTokens"),
)
WINDOW_WORDS = {
    "requests": "requests",
    "inputTokens": "input tokens",
    "outputTokens": "output tokens",
}


def pace_fields(spec: Spec) -> dict[str, Any]:
    """What may set the pace, as the ``round.started`` event's ``paces`` (``pacer``
    names the one that does): each limit the task uses, in task starts per minute,
    tightest first; then each window of each API the gateway paces, in requests or
    tokens per minute, with the fields of an attempt's usage that the window counts."""
    found: list[dict[str, Any]] = [
        {"limit": pace.limit.name, "perMinute": round(pace.tasks_per_second * 60, 3)}
        for pace in paces(spec)
    ]
    for api in spec.apis:
        for field_name, key in WINDOW_KEYS:
            window: Window | None = getattr(api, field_name)
            if window is None:
                continue
            counts = [key]
            if key == "inputTokens":
                counts.append("cacheWriteTokens")
                if FACTS[api.style].input_limit_counts_cache_reads:
                    counts.append("cacheReadTokens")
            found.append(
                {
                    "api": api.name,
                    "window": key,
                    "perMinute": round(window.limit * 60 / window.per, 3),
                    "counts": counts,
                }
            )
    return {"paces": found}


def pacer(
    paces: Sequence[Mapping[str, Any]],
    *,
    slots: int,
    attempts: int,
    own_seconds: float,
    used: Mapping[tuple[str, str], float],
) -> str:
    """What bounds the pace now (``limit api 120/min``, ``api anthropic 240
    requests/min``, ``4 slot(s)``, or a pace's own ``label``; "" when nothing is
    known), of ``pace_fields``'s ``paces``, the ``slots`` free to run units, and the
    ``attempts`` finished so far: their ``own_seconds`` (durations less the time their
    requests waited in the gateway's queue, which is the APIs' pacing, not the slots')
    and what they ``used`` of each API, by (api, usage field).

    Each bound is the units a second it allows on its own: a limit its task starts, an
    API window its rate over the mean amount an attempt takes of it (known once an
    attempt that used the API has finished), the slots their number over an attempt's
    mean own time.  The least names the pace; the slots do unless a bound is below them
    (before any attempt has finished, a declared limit is assumed to be)."""
    bounds: list[tuple[float, str]] = []
    for pace in paces:
        per_minute = float(pace["perMinute"])
        if "limit" in pace:
            said = pace.get("label") or f"limit {pace['limit']} {per_minute:g}/min"
            bounds.append((per_minute / 60, said))
            continue
        amount = sum(used.get((pace["api"], key), 0.0) for key in pace["counts"])
        if attempts and amount > 0:
            said = (
                pace.get("label")
                or f"api {pace['api']} {per_minute:,g} {WINDOW_WORDS[pace['window']]}/min"
            )
            bounds.append((per_minute / 60 / (amount / attempts), said))
    mean = own_seconds / attempts if attempts else 0.0
    slots_per_second = slots / mean if mean > 0 else float("inf")
    tightest_bound = min(bounds, default=None, key=lambda bound: bound[0])
    if slots and (tightest_bound is None or tightest_bound[0] >= slots_per_second):
        return f"{slots} slot(s)"
    return "" if tightest_bound is None else tightest_bound[1]


def minimum_wall_time(spec: Spec, units: int) -> float | None:
    """Seconds ``units`` task starts need at the tightest limit's pace (None: unlimited)."""
    pace = tightest(spec)
    return None if pace is None else units / pace.tasks_per_second


def concurrency(spec: Spec) -> int:
    """Most units that can run at once: the task cap, host slots and in-flight limits."""
    cap = spec.runtime.max_concurrent_tasks
    if spec.runtime.hosts:
        cap = min(cap, sum(host.slots for host in spec.runtime.hosts))
    for limit in spec.task_limits():
        if limit.max_in_flight is not None:
            cap = min(cap, limit.max_in_flight)
    return cap


@dataclass(frozen=True, slots=True)
class Start:
    """A start the gate let through: what each limit admitted, and the in-flight
    places it holds (given back by ``Gate.finish``)."""

    admissions: Mapping[str, Admission]
    held: tuple[asyncio.Semaphore, ...] = ()


class Gate(Protocol):
    """Rate capacity for task starts: ``acquire`` before a worker starts, ``finish``
    when it ends, with its result (None: it never ran), so throttle signals pause the
    fleet and teach each limit its ceiling."""

    async def acquire(self) -> Start: ...

    def finish(self, start: Start, result: AttemptResult | None) -> None: ...

    def stats(self) -> dict[str, dict[str, Any]]: ...

    def learned(self) -> dict[str, Learned]: ...


class OpenGate:
    """No limits and no pauses: every start is allowed at once."""

    async def acquire(self) -> Start:
        return Start({})

    def finish(self, start: Start, result: AttemptResult | None) -> None:
        return None

    def stats(self) -> dict[str, dict[str, Any]]:
        return {}

    def learned(self) -> dict[str, Learned]:
        return {}


@dataclass(eq=False)
class _State:
    name: str
    ceiling: Ceiling
    # Seconds between two starts at the declared pace, and the earliest moment of the
    # next one (None: nothing declared).
    interval: float | None
    in_flight: asyncio.Semaphore | None
    configured_per_second: float | None
    next_start: float = float("-inf")
    throttles: int = 0
    paused_seconds: float = 0.0
    starts: int = 0
    first_start: float = 0.0
    last_start: float = 0.0
    version: int = 0  # the ceiling's, when last told


class RateGate:
    """Paces task starts to every limit a task uses, declared and learned, and pauses
    them on throttle signals (one pause per episode: see ``ceiling``)."""

    def __init__(
        self,
        limits: Sequence[Limit],
        throttle: Throttle,
        *,
        events: Events | None = None,
        rng: random.Random | None = None,
        slots: int | None = None,
        learned: Mapping[str, Learned] | None = None,
    ) -> None:
        self._events = events or Events()
        self._rng = rng or random.Random()
        self._states: dict[str, _State] = {}
        self._turn = asyncio.Lock()  # FIFO: starts pass the pauses in arrival order
        self._changed = asyncio.Event()
        kept = learned or {}
        for limit in limits:
            pace = Pace(limit)
            self._states[limit.name] = _State(
                name=limit.name,
                ceiling=Ceiling(
                    throttle,
                    self._rng,
                    declared=(pace.tasks_per_window, limit.per),
                    learned=kept.get(limit.name),
                    slow_start=False,
                    slots=slots,
                ),
                interval=limit.per / pace.tasks_per_window * _SAFETY + 2 * _DUST,
                in_flight=asyncio.Semaphore(limit.max_in_flight) if limit.max_in_flight else None,
                configured_per_second=pace.tasks_per_second,
            )
        if not self._states:
            self._states[ALL] = _State(
                name=ALL,
                ceiling=Ceiling(throttle, self._rng, learned=kept.get(ALL), slots=slots),
                interval=None,
                in_flight=None,
                configured_per_second=None,
            )
        for state in self._states.values():
            state.version = state.ceiling.version

    async def acquire(self) -> Start:
        loop = asyncio.get_running_loop()
        held: list[asyncio.Semaphore] = []
        try:
            for state in self._states.values():
                if state.in_flight is not None:
                    await state.in_flight.acquire()
                    held.append(state.in_flight)
            async with self._turn:
                await self._due()
        except BaseException:
            for semaphore in held:
                semaphore.release()
            raise
        now = loop.time()
        admissions = {}
        for state in self._states.values():
            if state.interval is not None:
                # From the moment it was due, so a start let through _DUST early does
                # not pull the next one earlier too.
                state.next_start = max(now, state.next_start) + state.interval
            if not state.starts:
                state.first_start = now
            state.starts += 1
            state.last_start = now
            admissions[state.name] = state.ceiling.start(now)
        return Start(admissions, tuple(held))

    async def _due(self) -> None:
        """Sleep until no limit is paused, every limit's next start is due and no
        ceiling's flight is full.  A pause may begin (or grow), a flight empty or a
        probe raise the pace during the sleep, so the moment is recomputed after each
        wake, by the clock or by a ``finish``."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            dues: list[float | None] = []
            for state in self._states.values():
                learned = state.ceiling.due(now)
                self._tell(state)
                dues.append(None if learned is None else max(learned, state.next_start))
            changed = self._changed
            if None in dues:
                await changed.wait()
                continue
            due = max(d for d in dues if d is not None)
            if due - now <= _DUST:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), due - now)

    def finish(self, start: Start, result: AttemptResult | None) -> None:
        for semaphore in start.held:
            semaphore.release()
        now = asyncio.get_running_loop().time()
        throttled = result is not None and (
            result.status is Status.THROTTLED or result.retry_after is not None
        )
        named = self._states.get((result.throttled_limit or "") if result else "")
        for name, admission in start.admissions.items():
            state = self._states.get(name)
            if state is None:
                continue
            ceiling = state.ceiling
            if result is None or (throttled and named is not None and named is not state):
                ceiling.cancel(admission)
            elif not throttled:
                ceiling.finish(admission, now, throttled=False)
            else:
                assert result is not None
                self._throttled(
                    state,
                    admission,
                    now,
                    result.retry_after,
                    result.reason,
                    running=True,
                    window=result.limit_window,
                )
            self._tell(state)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _throttled(
        self,
        state: _State,
        admission: Admission,
        now: float,
        retry_after: float | None,
        reason: str,
        *,
        running: bool,
        window: float | None = None,
    ) -> Pause | None:
        """Tell ``state``'s ceiling of a throttle (and the ``window`` its message
        stated); count it, and say the pause it takes."""
        state.throttles += 1
        before = state.ceiling.paused_until
        pause = state.ceiling.finish(
            admission,
            now,
            throttled=True,
            retry_after=retry_after,
            window=window,
            running=running,
        )
        if pause is not None and pause.seconds > 0:
            state.paused_seconds += pause.until - max(now, before)
            known = state.ceiling.known()
            self._events.emit(
                "limit.paused",
                limit=_label(state.name),
                seconds=round(pause.seconds, 3),
                retryAfter=retry_after,
                reason=reason,
                episode="new" if pause.new_episode else "same",
                level=pause.level,
                learned=None if known is None else describe(known, declared=state.ceiling.declared),
            )
        return pause

    def _tell(self, state: _State) -> None:
        """Say a change of a limit's learned pace (``limit.learned``) or of slow start's
        flight (``limit.ramp``)."""
        ceiling = state.ceiling
        if ceiling.version == state.version:
            return
        state.version = ceiling.version
        known = ceiling.known()
        if known is not None:
            self._events.emit(
                "limit.learned",
                limit=_label(state.name),
                perWindow=round(known.per_window, 3),
                window=round(known.window, 3),
                throttles=known.throttles,
                concurrency=known.concurrency,
                text=describe(known, declared=ceiling.declared),
            )
        else:
            self._events.emit("limit.ramp", limit=_label(state.name), ramping=ceiling.ramping)

    def pause(self, name: str, retry_after: float | None, *, reason: str = "throttled") -> float:
        """Pause ``name`` as a throttle signal from outside any start asks (a new
        episode); returns the pause in seconds."""
        state = self._states[name]
        now = asyncio.get_running_loop().time()
        admission = state.ceiling.start(now)
        pause = self._throttled(state, admission, now, retry_after, reason, running=False)
        self._wake()
        return 0.0 if pause is None else pause.seconds

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per limit: starts, achieved and configured starts per minute, throttles,
        pause, and what its ceiling learned."""
        found = {}
        for state in self._states.values():
            known = state.ceiling.known()
            if state.name == ALL and not state.throttles and known is None:
                continue
            span = state.last_start - state.first_start
            achieved = (state.starts - 1) / span * 60 if span > 0 else None
            found[state.name] = {
                "starts": state.starts,
                "achievedPerMinute": None if achieved is None else round(achieved, 3),
                "configuredPerMinute": None
                if state.configured_per_second is None
                else round(state.configured_per_second * 60, 3),
                "throttles": state.throttles,
                "pausedSeconds": round(state.paused_seconds, 3),
                "learned": None if known is None else known.as_dict(),
                "learnedText": None
                if known is None
                else describe(known, declared=state.ceiling.declared),
            }
        return found

    def ramping(self) -> list[str]:
        """The limits in slow start (nothing learned yet, the flight still opening)."""
        return [_label(s.name) for s in self._states.values() if s.ceiling.ramping]

    def learned(self) -> dict[str, Learned]:
        """What each limit's ceiling knows, to keep for the next run."""
        found = {}
        for name, state in self._states.items():
            known = state.ceiling.known()
            if known is not None:
                found[name] = known
        return found


def _label(name: str) -> str:
    return "all dispatch" if name == ALL else name


def gate_for(
    spec: Spec,
    events: Events | None = None,
    rng: random.Random | None = None,
    *,
    learned: Mapping[str, Learned] | None = None,
) -> RateGate:
    """The rate gate ``spec`` needs, starting from what earlier runs ``learned``."""
    return RateGate(
        spec.task_limits(),
        spec.retry.throttle,
        events=events,
        rng=rng,
        slots=concurrency(spec),
        learned=learned,
    )
