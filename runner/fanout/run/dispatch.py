"""Dispatching one round's units to workers.

A pool of ``concurrency`` worker slots bounds everything: the producer waits for a
slot after each unit it reads, so the coordinator holds at most ``concurrency + 1``
units in hand (plus units waiting out a backoff or re-queued after a throttle), however
long the backlog.  Each unit then climbs the retry ladder attempt by attempt; for every
attempt it takes a worker slot, then rate capacity from the gate (so units queued for a
slot hold no tokens and a throttle pause reaches them), records the attempt as
dispatched, runs it on the transport, and records it as settled.  A throttled attempt
gives its slot back like any other and the unit queues for the next one behind the
whole backlog (see ``slots`` for the order and why), until the throttle caps of the
ladder fail it.  A unit's fate is an Outcome value.

Stopping: a FanoutError from anywhere but a unit's own work (the selection feeding the
round, the journal, a full disk, the whole fleet down) stops the round the same way,
like a drain: no new unit or attempt starts, units waiting (for a slot, a backoff, a
throttle pause) are interrupted at once, attempts whose workers run are let finish and
settle (so no paid work is thrown away), and ``dispatch`` then raises that first error,
alone, never in an ExceptionGroup.  Every unit left unsettled is picked up by the next
``fanout run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from pathlib import Path

from ..agents.taxonomy import Kind
from ..attempt.model import Attempt
from ..backlog.units import Unit
from ..errors import FanoutError, Parked, SpendStopped, storage_error, storage_problem
from ..isolation import removal
from ..outcome import AttemptResult, Outcome, Status, UnitState
from ..pacing.slots import Lane, Slots
from . import ladder, preparing, reusing, spending
from .ladder import Progress
from .round import Round


class _Stopped(Exception):
    """A unit's next attempt is not started: the round is stopping."""


class _Slot:
    """One unit's hold on a worker slot: taken for each attempt, given back between."""

    def __init__(self, pool: Slots, held: bool) -> None:
        self.pool = pool
        self.held = held

    async def take(self, lane: Lane = Lane.FRESH) -> None:
        if not self.held:
            await self.pool.take(lane)
            self.held = True

    def give(self) -> None:
        if self.held:
            self.pool.give()
            self.held = False


async def dispatch(ctx: Round, units: AsyncIterator[tuple[Unit, Progress]]) -> Round:
    """Run every unit ``units`` yields to its outcome.  Returns ``ctx`` with counts;
    raises the FanoutError that stopped the round once every unit has stopped."""
    pool = Slots(ctx.concurrency)
    # For the report: the budget each unit of this stretch was held to.
    ctx.journal.record_unit_budget(ctx.run_id, ctx.spec.task.budget_usd)
    try:
        async with ctx.units:
            try:
                async for unit, progress in units:
                    await pool.take()
                    if ctx.journal.storage_error is not None:  # a selection write used the reserve
                        ctx.stop(ctx.journal.storage_error)
                    if ctx.stopped is not None:
                        break
                    slot = _Slot(pool, held=True)
                    ctx.units.start(functools.partial(_unit, ctx, unit, progress, slot))
            except Exception as exc:  # the selection failed (a bad record, the input command)
                ctx.stop(storage_problem(exc) or exc)
            finally:
                pool.backlog_closed()
                if isinstance(units, AsyncGenerator):
                    await units.aclose()  # ends the input command of a stopped selection
    except ExceptionGroup as group:
        # Only a bug gets here (``_unit`` keeps every error of a unit a value): the first
        # error, unwrapped, is what the outermost handler reports.
        raise group.exceptions[0] from None
    if ctx.stopped is not None:
        raise ctx.stopped
    return ctx


async def _unit(ctx: Round, unit: Unit, progress: Progress, slot: _Slot) -> None:
    try:
        await _climb(ctx, unit, progress, slot)
    except asyncio.CancelledError:
        # Stopped from outside (Ctrl-C, or a stop while it waited): it runs again later.
        _interrupted(ctx, unit)
        if ctx.stopped is None:
            raise
    except _Stopped:
        _interrupted(ctx, unit)
    except Exception as exc:
        problem = storage_problem(exc) or exc
        if isinstance(problem, FanoutError):
            # fanout's own trouble (hosts, journal, a full disk), never the unit's.
            ctx.stop(problem)
            _interrupted(ctx, unit)
        else:  # a bug in fanout must not take the other units down
            _internal_error(ctx, unit, exc)
    finally:
        slot.give()


def _internal_error(ctx: Round, unit: Unit, exc: Exception) -> None:
    reason = f"fanout internal error: {type(exc).__name__}: {exc}"
    outcome = Outcome(unit_id=unit.id, round=ctx.number, state=UnitState.FAILED, reason=reason)
    try:
        settled = ctx.journal.unit_settled(ctx.run_id, outcome)
    except FanoutError as journal_error:
        ctx.stop(journal_error)
        return
    if settled:
        _settled(ctx, outcome)


def _interrupted(ctx: Round, unit: Unit) -> None:
    try:
        ctx.journal.unit_interrupted(ctx.run_id, ctx.number, unit.id)
    except FanoutError as exc:  # left running in the journal: the next run still resumes it
        ctx.stop(exc)
    ctx.counts[UnitState.INTERRUPTED] += 1
    ctx.events.emit("unit.interrupted", round=ctx.number, unit=unit.id)


def _settled(ctx: Round, outcome: Outcome) -> None:
    ctx.counts[outcome.state] += 1
    ctx.events.emit(
        "unit.settled",
        round=ctx.number,
        unit=outcome.unit_id,
        state=str(outcome.state),
        rung=outcome.rung,
        attempts=outcome.attempts,
        reason=outcome.reason,
    )


def _exhausted(ctx: Round, unit: Unit, progress: Progress) -> Outcome | None:
    """The unit's failed outcome if the ladder has nothing left for it."""
    retry = ctx.spec.retry
    now = asyncio.get_running_loop().time()
    reason = ladder.given_up(progress, retry.ladder, retry.throttle, now)
    if reason is None:
        return None
    return _outcome(ctx, unit, progress, UnitState.FAILED, reason)


async def _climb(ctx: Round, unit: Unit, progress: Progress, slot: _Slot) -> Outcome:
    """The unit's attempts, one after another up the retry ladder, until one of them (or
    the ladder, or the unit's budget) decides its fate."""
    rungs = ctx.spec.retry.ladder
    loop = asyncio.get_running_loop()
    lane = Lane.FRESH
    while True:
        failed = _failed_before_attempt(ctx, unit, progress)
        if failed is not None:  # resumed with nothing left (killed before it settled)
            if ctx.journal.unit_settled(ctx.run_id, failed):
                _settled(ctx, failed)
                reusing.record(ctx, unit, failed, None)
            return failed
        if ctx.stopped is not None:
            raise _Stopped
        rung = rungs[progress.rung]
        number = progress.attempts + 1
        progress = replace(progress, attempts=number)
        result, staged_hashes = await _prepared_and_run(ctx, unit, progress, rung.name, slot, lane)
        result, spent = _held_to_budget(ctx, unit, result)
        progress = ladder.advance(progress, rungs, result, loop.time())
        lane = Lane.BACK if result.status is Status.THROTTLED else Lane.FRESH
        final = _fate(ctx, unit, progress, result, spent, rung.name)
        accepted = _settle_attempt(ctx, unit, number, result, progress, staged_hashes, final)
        _stop_for(ctx, result)
        _finished(ctx, unit, number, rung.name, result)
        if final is not None:
            if accepted:
                _settled(ctx, final)
                reusing.record(ctx, unit, final, result)
            return final
        if ctx.stopped is not None:
            raise _Stopped
        if result.status.climbs_ladder:
            await ctx.sleep(
                ladder.backoff_delay(progress.failures, ctx.spec.retry.backoff, ctx.rng)
            )


def _failed_before_attempt(ctx: Round, unit: Unit, progress: Progress) -> Outcome | None:
    """The unit's failed outcome if it may not have another attempt: the ladder has
    nothing left for it, or its budget is spent."""
    failed = _exhausted(ctx, unit, progress)
    if failed is None and (spent := spending.budget_spent(ctx, unit)) is not None:
        # Resumed (or selected again in a later round) with its budget gone.
        failed = _outcome(ctx, unit, progress, UnitState.FAILED, spent)
    return failed


async def _prepared_and_run(
    ctx: Round, unit: Unit, progress: Progress, rung: str, slot: _Slot, lane: Lane
) -> tuple[AttemptResult, dict[str, str]]:
    """The result of the unit's next attempt, and the hashes of the files staged for it.
    An attempt that cannot be prepared is journaled as dispatched and fails unrun."""
    prepared = await preparing.prepare(ctx, unit, progress)
    if isinstance(prepared, preparing.Unprepared):
        ctx.journal.attempt_dispatched(ctx.run_id, ctx.number, unit.id, progress.attempts, rung)
        return AttemptResult(status=Status.FAILED, reason=prepared.reason), {}
    return await _attempt(ctx, prepared.attempt, slot, lane), prepared.staged_hashes


def _held_to_budget(
    ctx: Round, unit: Unit, result: AttemptResult
) -> tuple[AttemptResult, str | None]:
    """The result, failed if the unit's budget is spent by now (its usage is journaled),
    and why: whatever else the attempt came to, the unit fails at once, with no further
    attempt or rung, since each would only spend more.  A success stays one: its work is
    done and verified, and failing it would throw away what the money bought."""
    spent = spending.budget_spent(ctx, unit) if result.status is not Status.SUCCEEDED else None
    if spent is not None:
        result = replace(result, status=Status.FAILED, reason=spent)
    return result, spent


def _fate(
    ctx: Round,
    unit: Unit,
    progress: Progress,
    result: AttemptResult,
    spent: str | None,
    rung: str,
) -> Outcome | None:
    """The unit's outcome if this attempt decides it.  It is settled in the attempt's own
    transaction: a crash cannot leave a succeeded attempt beside an unsettled unit."""
    if result.status is Status.SUCCEEDED:
        return _outcome(ctx, unit, progress, UnitState.SUCCEEDED, "ok", result, rung)
    if spent is not None:
        return _outcome(ctx, unit, progress, UnitState.FAILED, spent, result, rung)
    return _exhausted(ctx, unit, progress)


def _settle_attempt(
    ctx: Round,
    unit: Unit,
    number: int,
    result: AttemptResult,
    progress: Progress,
    staged_hashes: dict[str, str],
    final: Outcome | None,
) -> bool:
    """Journal the attempt's end, the ladder's progress, and the unit's fate if ``final``
    decides it.  False if the attempt or the unit had been settled (or interrupted)."""
    return ctx.journal.attempt_settled(
        ctx.run_id,
        ctx.number,
        unit.id,
        number,
        result,
        rung=progress.rung,
        rung_attempts=progress.rung_attempts,
        failures=progress.failures,
        last=progress.last,
        staged=staged_hashes if result.status is Status.SUCCEEDED else None,
        outcome=final,
        job=ctx.spec.name,
    )


def _stop_for(ctx: Round, result: AttemptResult) -> None:
    """Stop the round if the attempt's result, or the journal recording it, says so."""
    if result.storage_error:
        ctx.stop(storage_error(ctx.spec.runtime.state_dir, result.storage_error))
    if result.halt:  # the agent's account: out of money, or parked until a reset
        ctx.stop(
            SpendStopped(result.halt)
            if result.kind == Kind.SPEND_CAP
            else Parked(result.halt, resume_at=result.resume_at)
        )
    if ctx.journal.storage_error is not None:  # the journal used its reserve
        ctx.stop(ctx.journal.storage_error)


def _finished(ctx: Round, unit: Unit, number: int, rung: str, result: AttemptResult) -> None:
    usage: dict[str, object] = {"kind": result.kind} if result.kind else {}
    if result.usage:
        usage["usage"] = [u.as_dict() for u in result.usage]
    ctx.events.emit(
        "attempt.finished",
        round=ctx.number,
        unit=unit.id,
        attempt=number,
        rung=rung,
        status=str(result.status),
        reason=result.reason,
        duration=round(result.duration, 3),
        host=result.host,
        **usage,
    )


def _clear(folder: Path) -> None:
    """Remove what an earlier attempt collected into ``folder``, as deep as its worker
    made it.  fanout wrote every file there itself: one it cannot remove in time is
    left, as ever, and this attempt's collection names its own files."""
    with contextlib.suppress(removal.Unremovable, removal.OutOfTime):
        removal.remove(folder, deadline=time.monotonic() + removal.PATIENCE)


async def _attempt(ctx: Round, attempt: Attempt, slot: _Slot, lane: Lane) -> AttemptResult:
    await slot.take(lane)
    try:
        start = await ctx.gate.acquire()
        result: AttemptResult | None = None
        try:
            if attempt.collect_dir.exists():  # what an earlier attempt collected
                await removal.off_loop(functools.partial(_clear, attempt.collect_dir))
            ctx.journal.attempt_dispatched(
                ctx.run_id,
                ctx.number,
                attempt.unit_id,
                attempt.number,
                attempt.invocation.rung,
                memory=attempt.invocation.memory,
            )
            ctx.events.emit(
                "attempt.started",
                round=ctx.number,
                unit=attempt.unit_id,
                attempt=attempt.number,
                rung=attempt.invocation.rung,
            )
            result = await spending.run(ctx, attempt)
            return result
        finally:
            ctx.gate.finish(start, result)
    finally:
        slot.give()


def _outcome(
    ctx: Round,
    unit: Unit,
    progress: Progress,
    state: UnitState,
    reason: str,
    result: AttemptResult | None = None,
    rung: str = "",
) -> Outcome:
    rungs = ctx.spec.retry.ladder
    return Outcome(
        unit_id=unit.id,
        round=ctx.number,
        state=state,
        rung=rung or str(progress.last.get("rung", rungs[min(progress.rung, len(rungs) - 1)].name)),
        attempts=progress.attempts,
        reason=reason,
        output_tail=(result.output_tail if result else str(progress.last.get("outputTail", ""))),
        collected=result.collected if result else (),
    )
