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
ladder fail it.  A unit's fate is an Outcome value; only a failure of the whole fleet
(every host down) stops the round.
"""

from __future__ import annotations

import asyncio
import random
import shutil
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import fanin, invocation, ladder
from .errors import HostsUnavailable
from .events import Events
from .journal import Journal
from .ladder import Progress
from .limits import Gate, OpenGate
from .outcome import AttemptResult, Outcome, Status, UnitState
from .slots import Lane, Slots
from .spec import Spec
from .templates import RenderError
from .transport import Attempt, Transport
from .units import Unit


@dataclass(kw_only=True)
class Round:
    """Everything one round of dispatch needs, injected."""

    spec: Spec
    run_id: str
    number: int
    journal: Journal
    transport: Transport
    events: Events
    run_dir: Path
    concurrency: int
    gate: Gate = field(default_factory=OpenGate)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    trigger: Mapping[str, Any] | None = None
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    counts: Counter[UnitState] = field(default_factory=Counter)
    worker_seconds: float = 0.0


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
    """Run every unit ``units`` yields to its outcome.  Returns ``ctx`` with counts."""
    pool = Slots(ctx.concurrency)
    async with asyncio.TaskGroup() as group:
        async for unit, progress in units:
            await pool.take()
            group.create_task(_unit(ctx, unit, progress, _Slot(pool, held=True)))
        pool.backlog_closed()
    return ctx


async def _unit(ctx: Round, unit: Unit, progress: Progress, slot: _Slot) -> None:
    try:
        outcome = await _climb(ctx, unit, progress, slot)
    except (asyncio.CancelledError, HostsUnavailable):
        # Stopped from outside (Ctrl-C, every host down): --resume runs it again.
        ctx.journal.unit_interrupted(ctx.run_id, ctx.number, unit.id)
        ctx.counts[UnitState.INTERRUPTED] += 1
        ctx.events.emit("unit.interrupted", round=ctx.number, unit=unit.id)
        raise
    except Exception as exc:  # a bug in fanout must not take the other units down
        reason = f"fanout internal error: {type(exc).__name__}: {exc}"
        outcome = Outcome(unit_id=unit.id, round=ctx.number, state=UnitState.FAILED, reason=reason)
    finally:
        slot.give()
    if ctx.journal.unit_settled(ctx.run_id, outcome):
        ctx.counts[outcome.state] += 1
        ctx.events.emit(
            "unit.settled",
            round=ctx.number,
            unit=unit.id,
            state=str(outcome.state),
            rung=outcome.rung,
            attempts=outcome.attempts,
            reason=outcome.reason,
        )


async def _climb(ctx: Round, unit: Unit, progress: Progress, slot: _Slot) -> Outcome:
    spec = ctx.spec
    rungs = spec.retry.ladder
    folder = fanin.unit_folder_name(unit.id)
    collect_dir = ctx.run_dir / "units" / folder
    loop = asyncio.get_running_loop()
    lane = Lane.FRESH
    while True:
        given_up = ladder.given_up(progress, rungs, spec.retry.throttle, loop.time())
        if given_up is not None:
            return _outcome(ctx, unit, progress, UnitState.FAILED, given_up)
        rung = rungs[progress.rung]
        number = progress.attempts + 1
        progress = replace(progress, attempts=number)
        staged_hashes: dict[str, str] = {}
        try:
            task = invocation.render(
                spec,
                unit,
                rung_index=progress.rung,
                attempt=number,
                round_number=ctx.number,
                last=progress.last or invocation.NO_LAST_ATTEMPT,
                trigger=ctx.trigger,
            )
            staged = fanin.stage(spec.runtime.workspace, task.stage)
            staged_hashes = fanin.staged_hashes(staged)
        except (RenderError, fanin.PathRefused) as exc:
            reason = f"template: {exc}" if isinstance(exc, RenderError) else str(exc)
            ctx.journal.attempt_dispatched(ctx.run_id, ctx.number, unit.id, number, rung.name)
            result = AttemptResult(status=Status.FAILED, reason=reason)
        else:
            attempt = Attempt(
                run_id=ctx.run_id,
                unit_id=unit.id,
                round=ctx.number,
                number=number,
                invocation=task,
                staged=staged,
                collect_dir=collect_dir,
                log_path=ctx.run_dir / "logs" / folder / f"r{ctx.number}-a{number}.log",
                log_limit=spec.runtime.log_limit,
                tail_limit=spec.runtime.output_tail,
                network=spec.runtime.network,
                throttle_patterns=tuple(p.pattern for p in spec.task.throttle_patterns),
                secrets=ctx.secrets,
            )
            result = await _attempt(ctx, attempt, slot, lane)
        ctx.worker_seconds += result.duration
        progress = ladder.advance(progress, rungs, result, loop.time())
        lane = Lane.BACK if result.status is Status.THROTTLED else Lane.FRESH
        ctx.journal.attempt_settled(
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
        )
        ctx.gate.report(result)
        ctx.events.emit(
            "attempt.finished",
            round=ctx.number,
            unit=unit.id,
            attempt=number,
            rung=rung.name,
            status=str(result.status),
            reason=result.reason,
            duration=round(result.duration, 3),
            host=result.host,
        )
        if result.status is Status.SUCCEEDED:
            return _outcome(ctx, unit, progress, UnitState.SUCCEEDED, "ok", result, rung.name)
        if result.status.climbs_ladder and not progress.exhausted(rungs):
            await ctx.sleep(ladder.backoff_delay(progress.failures, spec.retry.backoff, ctx.rng))


async def _attempt(ctx: Round, attempt: Attempt, slot: _Slot, lane: Lane) -> AttemptResult:
    await slot.take(lane)
    try:
        await ctx.gate.acquire()
        try:
            shutil.rmtree(attempt.collect_dir, ignore_errors=True)
            ctx.journal.attempt_dispatched(
                ctx.run_id, ctx.number, attempt.unit_id, attempt.number, attempt.invocation.rung
            )
            ctx.events.emit(
                "attempt.started",
                round=ctx.number,
                unit=attempt.unit_id,
                attempt=attempt.number,
                rung=attempt.invocation.rung,
            )
            return await ctx.transport.run(attempt)
        finally:
            ctx.gate.release()
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
