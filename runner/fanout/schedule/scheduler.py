"""The scheduler behind ``fanout schedule``: fires the cron triggers of one or more jobs.

The algorithm, per trigger:

* The last fire is persisted in ``<stateDir>/schedule/<job>.json`` *before* its run
  starts, so a scheduler killed at any point never fires the same moment twice.
* On start, fires missed while the scheduler was down (after the persisted last fire,
  up to now) are caught up by the trigger's ``catchUp``: ``none`` skips them (and says
  so), ``latest`` runs the latest one once if it is no older than
  ``startingDeadline``.  A trigger seen for the first time starts from now.
* Then the scheduler sleeps until the earliest next fire of any trigger and fires every
  trigger that is due.  Fire times come from ``cron`` (cronsim, Debian cron's DST rules)
  in each trigger's time zone.
* ``overlap`` decides what a fire does while the job's previous run is still going,
  whoever started it (this scheduler, system cron, a person): ``skip`` it, ``queue`` it
  (at most one waits per job), or ``replace`` the running one (it is interrupted and
  stays resumable).  The job lock (``lock``) makes this hold across processes.
* A run that parks (``Parked``: an agent's usage window resets hours away) is
  continued at the reset time, not at the next fire: the continuation is persisted
  with the fire log, and until it is due the job's fires are skipped (each would only
  meet the closed window again, and the continuation resumes the same run anyway).

Time is injected (``Clock``), so tests run days of schedule in milliseconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from ..errors import JobLocked, Parked
from ..isolation import hidden
from ..spec import Spec, Trigger

_LONGEST_SLEEP = 60.0  # re-read the clock at least this often (suspend, clock changes)
_MOST_MISSED = 100_000  # how far back missed fires are counted after downtime
# A parked run continues this long after the reset its agent named: the provider's clock
# and ours differ, and "resets 3:45pm" means the minute, not a second into it.
_RESET_MARGIN = 5.0
# Plus up to this share of the wait (at most _MOST_JITTER), at random: jobs and
# schedulers parked on the same account's window do not all knock at the same second.
_JITTER_SHARE = 0.1
_MOST_JITTER = 60.0


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True, slots=True)
class Fire:
    job: Spec
    index: int
    trigger: Trigger
    at: datetime
    catch_up: bool = False
    # A parked run's continuation (``at`` is then when it was due): it resumes the
    # job's unfinished run and never starts a new one.
    resume: bool = False

    @property
    def context(self) -> dict[str, Any]:
        """The ``trigger`` variable the run's templates see."""
        return {
            "name": self.trigger.name,
            "schedule": self.trigger.schedule.text,
            "vars": dict(self.trigger.vars),
            "time": self.at.isoformat(),
        }


StartRun = Callable[[Fire], Awaitable[Any]]


def trigger_key(index: int, trigger: Trigger) -> str:
    """Identifies a trigger across restarts; editing its schedule makes it a new one."""
    return f"{index}:{trigger.schedule.text}@{trigger.timezone}"


@dataclass(frozen=True, slots=True)
class Continuation:
    """A parked run of a job, to be continued ``at``, with the trigger that started it."""

    at: datetime
    index: int


_PARKED = "parked"  # the fire log's key of a continuation (no trigger key looks like it)


class FireLog:
    """The last fire of each trigger of one job, and a parked run's continuation,
    persisted atomically."""

    def __init__(self, job: Spec) -> None:
        self.path = job.runtime.state_dir / "schedule" / f"{job.name}.json"
        try:
            self._data: dict[str, Any] = json.loads(self.path.read_text())
        except (OSError, json.JSONDecodeError):
            self._data = {}

    def get(self, key: str) -> datetime | None:
        text = self._data.get(key)
        return datetime.fromisoformat(text) if isinstance(text, str) else None

    def set(self, key: str, when: datetime) -> None:
        self._data[key] = when.astimezone(UTC).isoformat()
        self._save()

    def parked(self) -> Continuation | None:
        entry = self._data.get(_PARKED) or {}
        try:
            return Continuation(at=datetime.fromisoformat(entry["at"]), index=int(entry["trigger"]))
        except (TypeError, KeyError, ValueError):
            return None  # none, or a hand-edited file: the next fire continues the run

    def park(self, continuation: Continuation | None) -> None:
        if continuation is None:
            self._data.pop(_PARKED, None)
        else:
            at = continuation.at.astimezone(UTC).isoformat()
            self._data[_PARKED] = {"at": at, "trigger": continuation.index}
        self._save()

    def _save(self) -> None:
        # A scheduler records its first fires before any run: the state directory may be
        # born here.
        hidden.make_state_dir(self.path.parent.parent)
        self.path.parent.mkdir(exist_ok=True)
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self._data, indent=2) + "\n")
        os.replace(temporary, self.path)


class Scheduler:
    def __init__(
        self,
        jobs: Sequence[Spec],
        *,
        start_run: StartRun,
        clock: Clock | None = None,
        log: Callable[[str], None] = print,
        rng: random.Random | None = None,
    ) -> None:
        self.jobs = list(jobs)
        self.start_run = start_run
        self.clock = clock or SystemClock()
        self.log = log
        self.rng = rng or random.Random()
        self._logs = {job.name: FireLog(job) for job in self.jobs}
        self._last: dict[tuple[str, int], datetime] = {}
        # Parked runs by job name: when each continues (persisted in its fire log too).
        self._parked: dict[str, Continuation] = {}
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._queued: dict[str, asyncio.Task[Any]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()
        # Set when a run parks: the loop's sleep ends early to count its continuation.
        self._changed = asyncio.Event()

    def stop(self) -> None:
        """Stop firing (SIGTERM); ``run`` then drains the runs in progress."""
        self._stopping.set()

    async def run(self, until: datetime | None = None) -> None:
        """Fire triggers until stopped, then interrupt the runs in progress.  With
        ``until`` (tests), stop firing after that time and let the runs finish."""
        triggers = [(job, i, t) for job in self.jobs for i, t in enumerate(job.triggers)]
        if not triggers:
            self.log("no triggers in the given job files; nothing to schedule")
            return
        self._catch_up(triggers)
        try:
            while not self._stopping.is_set():
                due_at = min(
                    [self._next(job, i, t) for job, i, t in triggers]
                    + [c.at for c in self._parked.values()]
                )
                if until is not None and due_at > until:
                    break
                if not await self._sleep_until(due_at):
                    break
                now = self.clock.now()
                for job in self.jobs:
                    parked = self._parked.get(job.name)
                    if parked is not None and parked.at <= now:
                        self._continue(job, parked)
                for job, index, trigger in triggers:
                    at = self._next(job, index, trigger)
                    if at <= now:
                        self._fire(Fire(job=job, index=index, trigger=trigger, at=at))
        finally:
            await self._drain(interrupt=self._stopping.is_set() or until is None)

    def _next(self, job: Spec, index: int, trigger: Trigger) -> datetime:
        return trigger.schedule.next_fires(self._last[(job.name, index)], 1)[0]

    async def _sleep_until(self, when: datetime) -> bool:
        """Sleep until ``when``, or until a run parks (the loop then counts its
        continuation); False if stopped first."""
        self._changed.clear()
        while (left := (when - self.clock.now()).total_seconds()) > 0:
            await _first(
                self.clock.sleep(min(left, _LONGEST_SLEEP)),
                self._stopping.wait(),
                self._changed.wait(),
            )
            if self._stopping.is_set():
                return False
            if self._changed.is_set():
                break
        return True

    def _catch_up(self, triggers: list[tuple[Spec, int, Trigger]]) -> None:
        now = self.clock.now()
        for job in self.jobs:
            parked = self._logs[job.name].parked()
            if parked is not None and job.triggers:
                # Due while the scheduler was down: continued at once, by the loop.
                self._parked[job.name] = parked
                self.log(f"{job.name}: a parked run continues at {_at(max(parked.at, now))}")
        for job, index, trigger in triggers:
            key = trigger_key(index, trigger)
            fire_log = self._logs[job.name]
            last = fire_log.get(key)
            if last is None:
                self._last[(job.name, index)] = now
                fire_log.set(key, now)
                continue
            missed: list[datetime] = []
            for moment in trigger.schedule.fires_after(last):
                if moment > now or len(missed) >= _MOST_MISSED:
                    break
                missed.append(moment)
            self._last[(job.name, index)] = last
            if not missed:
                continue
            latest = missed[-1]
            late = (now - latest).total_seconds()
            if trigger.catch_up == "latest" and late <= trigger.starting_deadline:
                self.log(
                    f"{job.name}: {trigger.name!r} missed {len(missed)} fire(s) while down; "
                    f"catching up the latest ({latest.isoformat()})"
                )
                self._fire(Fire(job=job, index=index, trigger=trigger, at=latest, catch_up=True))
            else:
                why = (
                    "catchUp = none" if trigger.catch_up == "none" else "past its startingDeadline"
                )
                self.log(
                    f"{job.name}: {trigger.name!r} missed {len(missed)} fire(s) while down "
                    f"(latest {latest.isoformat()}); skipped: {why}"
                )
                self._last[(job.name, index)] = latest
                fire_log.set(key, latest)

    def _continue(self, job: Spec, parked: Continuation) -> None:
        """Start the continuation of a parked run, forgotten first (like a fire): a
        scheduler killed during it leaves the run resumable, and the next fire goes on."""
        del self._parked[job.name]
        self._logs[job.name].park(None)
        running = self._running.get(job.name)
        if running is not None and not running.done():
            self.log(f"{job.name}: the parked run is already going again; nothing to continue")
            return
        index = parked.index if parked.index < len(job.triggers) else 0
        fire = Fire(job=job, index=index, trigger=job.triggers[index], at=parked.at, resume=True)
        self.log(f"{job.name}: continuing the parked run")
        self._start(fire, None, queued=False)

    def _park(self, fire: Fire, parked: Parked) -> None:
        """A run stopped for a usage window: continue it after the reset (margin and
        jitter added), or, if the agent named no reset time, at the next fire."""
        job = fire.job
        if parked.resume_at is None:
            self.log(f"{job.name}: run parked, with no reset time said; the next fire continues it")
            return
        reset = datetime.fromtimestamp(parked.resume_at, UTC)
        wait = max(0.0, (reset - self.clock.now()).total_seconds())
        jitter = self.rng.uniform(0.0, min(_MOST_JITTER, wait * _JITTER_SHARE))
        at = reset + timedelta(seconds=_RESET_MARGIN + jitter)
        continuation = Continuation(at=at, index=fire.index)
        self._parked[job.name] = continuation
        self._logs[job.name].park(continuation)
        self._changed.set()
        self.log(
            f"{job.name}: run parked until {_at(reset)}; continuing it at {_at(at)}, "
            "skipping the fires before"
        )

    def _fire(self, fire: Fire) -> None:
        """Persist the fire, then start (or skip, queue, replace) its run."""
        job = fire.job
        self._last[(job.name, fire.index)] = fire.at
        self._logs[job.name].set(trigger_key(fire.index, fire.trigger), fire.at)
        label = f"{job.name}: {fire.trigger.name!r} fired for {fire.at.isoformat()}"
        parked = self._parked.get(job.name)
        if parked is not None:
            self.log(f"{label}; skipped: the run is parked until {_at(parked.at)}")
            return
        running = self._running.get(job.name)
        busy = running is not None and not running.done()
        overlap = fire.trigger.overlap
        if busy and overlap == "skip":
            self.log(f"{label}; skipped: the previous run is still going (overlap = skip)")
            return
        if busy and overlap == "queue":
            queued = self._queued.get(job.name)
            if queued is not None and not queued.done():
                self.log(f"{label}; a run is already queued behind the running one")
                return
            self.log(f"{label}; queued behind the running run (overlap = queue)")
        if busy and overlap == "replace":
            assert running is not None
            self.log(f"{label}; replacing the running run (overlap = replace)")
            running.cancel()
        else:
            self.log(label)
        # Queued: it waits for the running one to end.  Replacing: so does it, for the
        # interrupted run to drain (it stays resumable) before its lock is taken.
        behind = running if busy and overlap in ("queue", "replace") else None
        self._start(fire, behind, queued=behind is not None and overlap == "queue")

    def _start(self, fire: Fire, behind: asyncio.Task[Any] | None, *, queued: bool) -> None:
        """Start ``fire``'s run (after ``behind`` ends, if given; ``queued``: as the one
        waiting run of its job)."""
        job = fire.job
        task = asyncio.ensure_future(self._run(fire, behind, queued=queued))
        # Owned by the scheduler: every task is awaited in ``_drain``, whatever ended it.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if queued:
            self._queued[job.name] = task
        else:
            self._running[job.name] = task

    async def _run(self, fire: Fire, behind: asyncio.Task[Any] | None, *, queued: bool) -> None:
        job = fire.job
        try:
            if behind is not None:
                await asyncio.wait({behind})
            if queued:
                self._running[job.name] = self._queued.pop(job.name)
            result = await self.start_run(fire)
        except JobLocked as exc:
            self.log(f"{job.name}: {exc}")
        except Parked as exc:
            self._park(fire, exc)
        except asyncio.CancelledError:
            self.log(f"{job.name}: run for {fire.at.isoformat()} interrupted")
            raise
        except Exception as exc:  # a failed run must not stop the scheduler
            self.log(f"{job.name}: run for {fire.at.isoformat()} failed: {exc}")
        else:
            self.log(f"{job.name}: run for {fire.at.isoformat()} done: {result}")

    async def _drain(self, *, interrupt: bool) -> None:
        """Wait for the runs in progress, interrupting them first (they stay resumable)."""
        if interrupt:
            for task in list(self._tasks):
                task.cancel()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _first(*waits: Coroutine[Any, Any, object]) -> None:
    """Wait until the first of ``waits`` ends, then cancel the others.  Each runs in a
    task of a group that awaits them all, however this call ends (cancelled, even twice):
    none outlives it.  A wait that fails (a clock's sleep) raises its error, alone."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(wait) for wait in waits]
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in tasks:
                task.cancel()
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None


def _at(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="seconds")
