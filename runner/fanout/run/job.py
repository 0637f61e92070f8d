"""One run of a job: rounds of selection and dispatch, fan-in between rounds
(``applying``), and the report at the end.  ``execute`` starts or resumes a run;
``retry`` re-runs the failed units of an earlier run.

Rounds: after every unit of a round has settled, the collected files are applied to
the workspace, the inputs are selected again from the whole workspace and a new round
runs over what remains.  Re-selecting everything (not just the units of the last round)
is what catches breakage a fix causes in files no unit touched.  Rounds stop when
nothing remains, at ``rounds.max``, or when a round made no progress: nothing it
collected changed the workspace, or the new selection equals the last one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import view
from ..attempt import invocation
from ..attempt.seam import Transport
from ..backlog.units import Unit
from ..errors import (
    EnvironmentProblem,
    ExitCode,
    FanoutError,
    NothingSelected,
    StateError,
    storage_problem,
)
from ..events import EventLog, Events
from ..journal import Journal, RunRow
from ..outcome import RunState, StopReason, Summary, UnitState
from ..pacing import limits
from ..pacing.limits import Gate, OpenGate
from ..report import aggregate
from ..report import document as report
from ..spec import Spec
from ..transports import preflight as commands
from . import applying, kept
from . import selection as backlog
from .dispatch import dispatch
from .round import Round

if TYPE_CHECKING:  # the gateway (and aiohttp) load only for a job with [[apis]]
    from ..gateway import Gateway

# How long the end of a run waits for the transport to close once the journal and the
# report are written.  Closing removes sandboxes and ends SSH connections, which takes
# well under a second when all is well; a host that stopped answering must not keep the
# user (or the next scheduled fire) waiting, and whatever is left behind is either
# removed by the next run (local sandboxes) or by the host (a dropped connection).
CLOSE_BOUND_S = 10.0


@dataclass(kw_only=True)
class Options:
    apply: bool | None = None
    # True: continue the job's last run, which must be unfinished.  False: a new run.
    # None: continue the last run if it did not finish (and, for a scheduled fire, was
    # started by the same trigger), else start a new one; what cron and the CLI use.
    resume: bool | None = False
    trigger: Mapping[str, Any] | None = None
    concurrency: int | None = None
    # False: no unit reuses an earlier run's success (``--no-reuse``), whatever
    # units.reuse says.
    reuse: bool = True


@dataclass(kw_only=True)
class Runner:
    """Runs a job with injected parts (transport, journal, gate, clock, randomness)."""

    spec: Spec
    transport: Transport
    journal: Journal
    environ: Mapping[str, str]
    events: Events = field(default_factory=Events)
    gate: Gate = field(default_factory=OpenGate)
    # The API gateway for the job's [[apis]] (None without): started before the
    # transport, closed after it, its spending so far restored on resume.
    gateway: Gateway | None = None
    rng: random.Random = field(default_factory=random.Random)
    monotonic: Callable[[], float] = time.monotonic
    # Where local workers start their commands, checked before anything is dispatched
    # (None: the transport checks its hosts itself, or a test's fake runs nothing real).
    workers: commands.Workers | None = None
    # Told how each run ended, once its report is written and before its error (if
    # any) is raised: the run's notifications (``notify``).  It never raises; the run
    # waits for it, and it bounds itself.
    ended: Callable[[Summary], Awaitable[None]] | None = None
    # Asked, with the run's trigger, before a run is recorded, after the run's own
    # checks: raises the FanoutError that refuses it (a work tree [publish] would not
    # publish from: ``publish.Publisher.refuse``).
    refuse: Callable[[Mapping[str, Any] | None], Awaitable[None]] | None = None
    # The event log of the run going on (the report reads its host states).
    _log: EventLog | None = field(default=None, init=False, repr=False)
    # The round dispatching now, and a stop asked for from outside the run (``stop``).
    _current: Round | None = field(default=None, init=False, repr=False)
    _stop: FanoutError | None = field(default=None, init=False, repr=False)

    def stop(self, error: FanoutError) -> None:
        """Stop the run from outside the way a FanoutError from inside stops it (see
        ``dispatch``): nothing new starts, running attempts finish and settle, and the run
        ends stopped, resumable, raising ``error``.  What a closed console asks for: unlike
        Ctrl-C it throws no running work away (a unit whose worker had done its side
        effect would be run again), and nobody is there to be kept waiting."""
        self._stop = self._stop or error
        if self._current is not None:
            self._current.stop(error)

    def secrets(self) -> dict[str, str]:
        missing = [name for name in self.spec.task.secrets if name not in self.environ]
        if missing:
            raise EnvironmentProblem(
                f"secret(s) {', '.join(missing)} not set: export them in the environment "
                "fanout runs in (task.secrets names them)"
            )
        return {name: self.environ[name] for name in self.spec.task.secrets}

    async def _prepare(self, options: Options) -> tuple[dict[str, str], bool]:
        """What a run needs before it is recorded: its secrets, whether it applies
        collected files, and the refusals (EnvironmentProblem, StateError) made before
        anything is journaled: a local worker that could not start its command (every
        attempt of every unit would fail alike), ``refuse``'s, and a disk without room
        for the journal's reserve."""
        secrets = self.secrets()
        if self.workers is not None:
            # In a thread (it probes the sandbox), awaited to its end even when
            # cancelled: its probes are bounded, and a thread left running would hold
            # the interpreter's exit just the same.
            check = asyncio.get_running_loop().run_in_executor(
                None, commands.refuse, self.spec, self.workers
            )
            try:
                await asyncio.shield(check)
            except asyncio.CancelledError:
                await asyncio.wait([check])
                if not check.cancelled():
                    check.exception()  # retrieved: the cancel is what this run raises
                raise
        apply = self.spec.collect.apply if options.apply is None else options.apply
        if self.refuse is not None and apply:
            # A run that applies nothing publishes nothing: a tree of one's own edits
            # is no reason to refuse it.
            await self.refuse(options.trigger)
        self.journal.keep_reserve()
        return secrets, apply

    def run_dir(self, run_id: str) -> Path:
        return self.spec.runtime.state_dir / "runs" / run_id

    async def execute(self, options: Options) -> Summary:
        """Start a new run (or resume the last unfinished one) and run it to its end."""
        spec = self.spec
        secrets, apply = await self._prepare(options)
        row = None if options.resume is False else self.journal.last_unfinished(spec.name)
        if row is not None and options.resume is None and not _same_trigger(row, options):
            row = None
        if row is None and options.resume:
            raise StateError(f"no unfinished run of job {spec.name!r} to resume")
        if row is not None:
            run_id, first_round, apply = row.id, row.round, row.apply
            event: dict[str, Any] = {
                "event": "run.resumed",
                "round": first_round,
                # A run still marked running whose lock we now hold: its coordinator died.
                "was": "killed" if row.state is RunState.RUNNING else str(row.state),
                "asked": options.resume is True,
            }
            # Templates render as they did before the crash: the same trigger context.
            options = replace(options, resume=True, trigger=row.trigger or options.trigger)
            self.journal.reopen_run(run_id)
        else:
            run_id = self.journal.create_run(
                job=spec.name,
                job_file=str(spec.file.resolve()),
                apply=apply,
                trigger=dict(options.trigger or {}),
            )
            first_round = 1
            event = {"event": "run.started", "job": spec.name}
        with self._event_log(run_id):
            self.events.emit(event.pop("event"), run=run_id, **event)
            return await self._rounds(run_id, first_round, apply, secrets, options)

    @contextlib.contextmanager
    def _event_log(self, run_id: str) -> Iterator[None]:
        log = EventLog(self.run_dir(run_id) / "events.jsonl")
        self.events.add(log)
        self._log = log
        try:
            yield
        finally:
            self._log = None
            self.events.sinks.remove(log)
            log.close()

    async def _rounds(
        self, run_id: str, first_round: int, apply: bool, secrets: dict[str, str], options: Options
    ) -> Summary:
        """Run the rounds, then record how the run ended.  A FanoutError from anywhere
        (the transport's start, the selection, the journal, the fleet) stops the run
        resumably: it is recorded as stopped, never finished, and raised with a hint on
        how to continue; the next ``fanout run`` picks it up where it stopped."""
        started = self.monotonic()
        error: BaseException | None = None
        unmatched: tuple[str, ...] = ()
        kept.tell(self.events, self.spec, self.gate, self.gateway)
        try:
            # Which streaks quarantine, for status and the report (they read no job file).
            self.journal.record_quarantine_after(run_id, self.spec.units.quarantine_after)
            if self.gateway is not None:
                # What the run spent before (an earlier stretch, an interrupted attempt)
                # counts toward its budget; a budget already spent stops it at once.
                self.gateway.restore({u.api: u.cost_usd for u in self.journal.usage_totals(run_id)})
                self.gateway.keep_books(functools.partial(self.journal.record_usages, run_id))
                await self.gateway.start()
            await self.transport.start()
            reason, number, unmatched = await self._loop(
                run_id, first_round, apply, secrets, options
            )
            note = reason.note(number)
        except asyncio.CancelledError as exc:
            reason, error = StopReason.INTERRUPTED, exc
            note = reason.note(0)
        except FanoutError as exc:
            reason, note, error = StopReason.STOPPED, str(exc), exc
        except Exception as exc:
            problem = storage_problem(exc)
            if problem is not None:  # a full disk where fanout writes (fan-in, reports)
                reason, note, error = StopReason.STOPPED, str(problem), problem
            else:  # a bug: still never "finished", so the next run resumes
                reason, note = StopReason.STOPPED, f"fanout internal error: {type(exc).__name__}"
                error = exc
        self._current = self._stop = None  # a stop asked for stops one run
        # The journal and the report first: whatever happens to the close (it hangs, a
        # second Ctrl-C aborts it), the run's end is recorded.
        closing = self._record_end(run_id, reason.state, note, self.monotonic() - started)
        await self._close_transport()
        if isinstance(error, FanoutError):
            error.hint = f"run {run_id} stopped; `fanout run {self.spec.file}` continues it"
        failure = error if error is not None else closing
        if failure is None and self.spec.aggregate is not None:
            await aggregate.run(
                self.spec,
                run_id=run_id,
                run_dir=self.run_dir(run_id),
                # Each unit's line of report.json.
                results=(f"{line}\n" for line in report.unit_lines(self.journal, run_id)),
                trigger=options.trigger,
                secrets=secrets,
                environ=self.environ,
                events=self.events,
                keys=self.gateway.keys if self.gateway is not None else (),
            )
        summary = self._summary(run_id, reason, note, unmatched, failure, options)
        if self.ended is not None and not isinstance(failure, asyncio.CancelledError):
            # Not for Ctrl-C or SIGTERM: someone stopped the run on purpose, and a second
            # one must not wait on a webhook.
            await self.ended(summary)
        if failure is not None:
            raise failure
        return summary

    def _summary(
        self,
        run_id: str,
        reason: StopReason,
        note: str,
        unmatched: tuple[str, ...],
        failure: BaseException | None,
        options: Options,
    ) -> Summary:
        """How the run ended, as a value.  For a run that an error stopped (``failure``,
        which is raised next) a journal that cannot be read leaves the counts empty:
        that error is the one to show."""
        stopped_by: ExitCode | None = None
        if isinstance(failure, FanoutError):
            stopped_by = failure.exit_code
        elif failure is not None and not isinstance(failure, asyncio.CancelledError):
            stopped_by = ExitCode.INTERNAL  # a bug: the CLI exits 70 with it
        counts: dict[str, int] = {}
        wall = worker = 0.0
        quarantined = 0
        try:
            counts = self.journal.unit_counts(run_id)
            wall = self.journal.run(run_id).wall
            worker = self.journal.worker_seconds(run_id)
            quarantined = self.journal.newly_quarantined(
                self.spec.name, run_id, self.spec.units.quarantine_after
            )
        except Exception:
            if failure is None:
                raise
        return Summary(
            run_id=run_id,
            reason=reason,
            counts=counts,
            report_dir=self.run_dir(run_id),
            note=note,
            unmatched=unmatched,
            wall_seconds=wall,
            worker_seconds=worker,
            quarantined=quarantined,
            stopped_by=stopped_by,
            trigger=options.trigger,
        )

    async def _loop(
        self, run_id: str, first_round: int, apply: bool, secrets: dict[str, str], options: Options
    ) -> tuple[StopReason, int, tuple[str, ...]]:
        """The rounds, to the end: why they ended, the round that was to start or had
        just run (the note of a reason names it), and for a first round that selected
        nothing, the ``inputs.files`` patterns that matched no file (see units)."""
        spec = self.spec
        last_selection: str | None = None
        number = first_round
        while True:
            ctx = self._round(run_id, number, secrets, options)
            resuming = options.resume is True and number == first_round
            tally = backlog.Tally()
            units = await backlog.units_of(
                ctx, tally, self.environ, resuming=resuming, stream=number == 1
            )
            if tally.done and tally.count == 0:
                if number == 1:
                    return StopReason.NOTHING_SELECTED, number, tally.unmatched
                return StopReason.NOTHING_REMAINS, number, ()
            if tally.done and tally.fingerprint() == last_selection:
                return StopReason.SAME_SELECTION, number, ()
            await dispatch(ctx, units)
            if number == 1 and not resuming and tally.count == 0:
                return StopReason.NOTHING_SELECTED, number, tally.unmatched
            last_selection = tally.fingerprint() if tally.done else None
            self.journal.complete_round(run_id, number)
            # What the limits learned, kept for the next run as each round ends (the
            # run's end keeps it again): a run killed later loses no more than a round.
            kept.save(self.journal, spec, self.gate, self.gateway, run_id)
            self.events.emit(
                "round.finished", round=number, **{str(k): v for k, v in ctx.counts.items()}
            )
            applied = applying.fan_in(ctx, apply=apply)
            if number >= spec.rounds.max:
                return StopReason.LAST_ROUND, number, ()
            if not apply:
                return StopReason.NOT_APPLIED, number, ()
            if not applied:
                return StopReason.NO_CHANGE, number, ()
            number += 1

    async def _close_transport(self) -> None:
        """Close the transport (sandboxes removed, connections ended), bounded by
        ``CLOSE_BOUND_S``.  It runs even when the run was cancelled (that cancel has been
        caught), but a new one, a second Ctrl-C, aborts it: the run's end is recorded
        already, so only the cleanup is cut short."""
        try:
            async with asyncio.timeout(CLOSE_BOUND_S):
                await self.transport.close()
        except TimeoutError:
            self.events.emit(
                "notice",
                message=f"the transport did not close within {CLOSE_BOUND_S:g}s; fanout"
                " stopped waiting (a sandbox or a connection may be left behind)",
            )
        finally:
            # After the workers that use it are gone; it only closes sockets, quickly.
            if self.gateway is not None:
                await self.gateway.close()

    def _record_end(
        self, run_id: str, state: RunState, note: str, wall: float
    ) -> FanoutError | None:
        """Record the run's end and write its report.  Never raises (the run's own
        error, if any, is the one to show); a failure here is returned.  When the journal
        cannot record the end (a full disk), the run stays marked running and the next
        ``fanout run`` resumes it as a killed one."""
        problem: FanoutError | None = None
        try:
            self.journal.finish_run(
                run_id,
                state=state,
                wall=wall,
                note=note,
                limits=kept.limit_stats(self.gate, self.gateway),
            )
            if self._log is not None:
                self._log.flush()
            written = report.write(self.journal, run_id, self.run_dir(run_id))
            # report.html beside it, to open in a browser; a bigger run's costs seconds
            # (bench/view.py), so there `fanout view` writes it when asked.
            if self.journal.unit_count(run_id) <= view.AT_RUN_END:
                view.write(self.journal, run_id, self.run_dir(run_id), job=self.spec)
        except FanoutError as exc:
            problem = exc
        except OSError as exc:  # the report did not fit (the journal did)
            problem = storage_problem(exc) or StateError(f"cannot write the report: {exc}")
        else:
            # A stopped or interrupted run's note is its error, which the CLI prints.
            shown = note if state is RunState.FINISHED else ""
            self.events.emit(
                "run.finished", run=run_id, state=str(state), note=shown, report=str(written)
            )
        try:
            kept.save(self.journal, self.spec, self.gate, self.gateway, run_id)
        except FanoutError as exc:
            problem = problem or exc
        return problem

    def _round(self, run_id: str, number: int, secrets: dict[str, str], options: Options) -> Round:
        concurrency = options.concurrency or limits.concurrency(self.spec)
        ctx = Round(
            spec=self.spec,
            run_id=run_id,
            number=number,
            journal=self.journal,
            transport=self.transport,
            events=self.events,
            run_dir=self.run_dir(run_id),
            concurrency=min(concurrency, self.transport.capacity),
            gate=self.gate,
            gateway=self.gateway,
            secrets=secrets,
            trigger=options.trigger,
            rng=self.rng,
            reuse=options.reuse,
            templated=invocation.templated(self.spec),
        )
        self._current = ctx
        if self._stop is not None:  # asked for between rounds: this one starts nothing
            ctx.stop(self._stop)
        return ctx

    async def retry_failed(self, previous: RunRow, options: Options) -> Summary:
        """A new run over the units that failed in ``previous`` (their latest round)."""
        spec = self.spec
        latest: dict[str, Unit] = {}
        for row in self.journal.units(previous.id):
            if row.state is UnitState.FAILED:
                latest[row.unit.id] = row.unit
            else:
                latest.pop(row.unit.id, None)
        if not latest:
            raise NothingSelected(f"run {previous.id} has no failed units")
        secrets, apply = await self._prepare(options)
        run_id = self.journal.create_run(
            job=spec.name, job_file=str(spec.file.resolve()), apply=apply, parent=previous.id
        )
        units = [
            Unit(
                id=u.id,
                index=i,
                items=u.items,
                origin=u.origin,
                group=u.group,
                fingerprint=u.fingerprint,
            )
            for i, u in enumerate(latest.values())
        ]
        self.journal.add_units(run_id, 1, units)
        self.journal.set_round(run_id, 1, records=len(units), selected=len(units))
        self.journal.selection_done(run_id, 1)
        resumed = Options(
            apply=apply, resume=True, trigger=options.trigger, concurrency=options.concurrency
        )
        with self._event_log(run_id):
            self.events.emit("run.started", run=run_id, job=spec.name, retry_of=previous.id)
            return await self._rounds(run_id, 1, apply, secrets, resumed)


def _same_trigger(row: RunRow, options: Options) -> bool:
    """Whether an automatic resume may continue ``row``: a run by hand continues any
    unfinished run; a scheduled fire only one its own trigger started (another trigger
    may render different prompts)."""
    if not options.trigger:
        return True
    return bool(row.trigger) and row.trigger.get("name") == options.trigger.get("name")
