"""A round's units: selected, fingerprinted and sorted (``reusing``: run, reused,
quarantined, unchanged) and written to the journal as the selection streams, or read
back from the journal (a resumed round, or a later round selected in full)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Mapping
from typing import TypeVar

from ..attempt import invocation
from ..backlog import command as inputcommand
from ..backlog.units import Unit, base_context, select
from ..journal import Settled, SettledWriter, Successes
from ..outcome import UnitState
from ..pacing import limits
from .fingerprints import Fingerprints, agent_version
from .ladder import Progress
from .reusing import Reusing, Sorted
from .round import Round

# Units read from the selection per trip to a worker thread.
_BATCH = 1000
# Settled units' rows (reused, quarantined) held until the selection ends, at most:
# about 250 bytes each, without their records (``_Settling``).
_HELD = 200_000
T = TypeVar("T")


async def units_of(
    ctx: Round, tally: Tally, environ: Mapping[str, str], *, resuming: bool, stream: bool
) -> AsyncIterator[tuple[Unit, Progress]]:
    """The units to dispatch in this round.  A fresh first round streams: units are
    dispatched while the selection is still being read (and written to the journal).
    Later rounds are selected in full first, so an unchanged selection (no
    progress) is known before anything runs; a resumed round reads the journal."""
    existing = ctx.journal.round_row(ctx.run_id, ctx.number)
    if resuming and existing is not None and existing["selection_done"]:
        _started(ctx, resumed=True, streaming=False)
        _selected(ctx, existing["records"], tally.count, resumed=True)
        return _from_journal(ctx)
    if stream and not resuming:
        return _streamed(ctx, tally, environ)
    async for _ in _select_into_journal(ctx, tally, environ, resumed=resuming, streaming=False):
        pass
    return _from_journal(ctx)


def _started(ctx: Round, *, resumed: bool, streaming: bool) -> None:
    # What the display needs to say what sets the pace: the slots and the tightest limit.
    ctx.events.emit(
        "round.started",
        round=ctx.number,
        resumed=resumed,
        streaming=streaming,
        concurrency=ctx.concurrency,
        **limits.pace_fields(ctx.spec),
    )


def _selected(
    ctx: Round, records: int, units: int, *, resumed: bool, tally: Tally | None = None
) -> None:
    """The round's selection is complete: its units, and for a resumed round those an
    earlier stretch settled (read from the journal), so counts start where it stopped;
    and those it settled without running them (reused, quarantined) or left as they were
    (unchanged since they failed in an earlier round)."""
    succeeded = failed = 0
    reused = quarantined = unchanged = 0
    if resumed:
        counts = ctx.journal.round_counts(ctx.run_id, ctx.number)
        units = sum(counts.values())
        succeeded = counts.get(UnitState.SUCCEEDED, 0)
        failed = counts.get(UnitState.FAILED, 0)
        reused = counts.get(UnitState.REUSED, 0)
        quarantined = counts.get(UnitState.QUARANTINED, 0)
    elif tally is not None:
        reused, quarantined, unchanged = tally.reused, tally.quarantined, tally.unchanged
        units -= unchanged
    ctx.events.emit(
        "round.selected",
        round=ctx.number,
        units=units,
        records=records,
        succeeded=succeeded,
        failed=failed,
        reused=reused,
        quarantined=quarantined,
        unchanged=unchanged,
        remaining=units - succeeded - failed - reused - quarantined,
    )


async def _streamed(
    ctx: Round, tally: Tally, environ: Mapping[str, str]
) -> AsyncIterator[tuple[Unit, Progress]]:
    # Closed with this generator (dispatch closes it when the round stops), not left
    # to the garbage collector's task: its input command ends then, not later.
    selecting = _select_into_journal(ctx, tally, environ, resumed=False, streaming=True)
    async with contextlib.aclosing(selecting):
        async for unit in selecting:
            yield unit, Progress()


async def _select_into_journal(
    ctx: Round, tally: Tally, environ: Mapping[str, str], *, resumed: bool, streaming: bool
) -> AsyncGenerator[Unit, None]:
    _started(ctx, resumed=resumed, streaming=streaming)
    version = await asyncio.to_thread(agent_version, ctx.spec, environ)
    successes = ctx.journal.all_successes(ctx.spec.name)
    batches = _Batches(
        Fingerprints(ctx.spec, trigger=ctx.trigger, agent_version=version), successes
    )
    reusing = Reusing.of_round(ctx, successes, resumed=resumed)
    settling = _Settling(ctx)
    try:
        async with _input_command(ctx, environ) as command:
            selection = select(
                ctx.spec,
                environ=environ,
                trigger=ctx.trigger,
                command=command,
                stage_paths=functools.partial(
                    invocation.stage_paths, ctx.spec, round_number=ctx.number, trigger=ctx.trigger
                ),
            )
            batches.stream = iter(selection)
            warned = 0
            while True:
                batch = await batches.take(_BATCH)
                for warning in selection.warnings[warned:]:
                    ctx.events.emit("notice", message=warning)
                warned = len(selection.warnings)
                ended = len(batch) < _BATCH  # _take stops short only at the stream's end
                sorted_ = reusing.sort(batch)
                if sorted_.run:
                    ctx.journal.add_units(ctx.run_id, ctx.number, sorted_.run)
                await settling.add(sorted_)
                ctx.journal.refresh_inputs(ctx.spec.name, sorted_.refreshed)
                tally.sorted(sorted_)
                for unit in batch:
                    tally.add(unit)
                if batch:
                    # Units selected so far (in the journal, or about to be, so queued for
                    # real): the display's count while the total is not known yet.
                    ctx.events.emit("round.selecting", round=ctx.number, units=tally.count)
                _settled_unrun(ctx, sorted_.settled)
                if ended:  # the total is known: said before the last batch is dispatched
                    tally.done = True
                    tally.unmatched = tuple(selection.unmatched)
                    _selected(ctx, selection.records, tally.count, resumed=resumed, tally=tally)
                for unit in sorted_.run:
                    yield unit
                if ended:
                    # Every unit is in the journal once the settled ones are written (a
                    # stop from here on resumes from the journal; one before, in the last
                    # batch's dispatch, selects again).  Written after the last batch
                    # went to dispatch: a new unit last among 100,000 reused starts
                    # without waiting for their rows.
                    await settling.flush()
                    ctx.journal.set_round(
                        ctx.run_id,
                        ctx.number,
                        records=selection.records,
                        selected=selection.selected,
                    )
                    ctx.journal.selection_done(ctx.run_id, ctx.number)
                    break
    finally:
        # After the input command's end (above), which wakes a thread still reading it.
        await batches.close()
        await settling.close()


def _input_command(
    ctx: Round, environ: Mapping[str, str]
) -> contextlib.AbstractAsyncContextManager[inputcommand.Started | None]:
    """The round's input command, owned here so that a round that stops (cancelled,
    failed, at ``units.limit``) kills it at once; nothing for the other sources."""
    if ctx.spec.inputs.source != "command":
        return contextlib.nullcontext()
    context = base_context(ctx.spec, ctx.trigger)
    return inputcommand.running(ctx.spec, environ, context)


class _Settling:
    """The units the selection settles without running them (reused, quarantined) and
    the count it leaves unchanged, for the journal.  Their rows (``Settled``: no
    records) wait until the selection ends, up to ``_HELD`` of them, and are written
    then by a writer of its own (``SettledWriter``), after the last batch went to
    dispatch: a run that reuses 100,000 units starts its first new one without their
    writes taking turns with the selection (1.7 s to it with them held, 2.2-2.6 s with
    them written as it went).  Beyond ``_HELD`` they are written as the selection goes
    on, one write pending at most.  A selection stopped before its end is selected
    again when the run resumes: what was not written is decided again."""

    def __init__(self, ctx: Round) -> None:
        self._ctx = ctx
        self._rows: list[Settled] = []
        self._unchanged = 0
        self._writer: SettledWriter | None = None
        self._pending: list[concurrent.futures.Future[None]] = []

    async def add(self, batch: Sorted) -> None:
        self._rows += batch.settled
        self._unchanged += batch.unchanged
        if len(self._rows) >= _HELD:
            await self._submit()

    async def _submit(self) -> None:
        ctx = self._ctx
        if self._writer is None:
            self._writer = SettledWriter(ctx.journal.path)
        self._pending.append(self._writer.submit(ctx.run_id, ctx.number, self._rows))
        self._rows = []
        while len(self._pending) > 1:
            await asyncio.wrap_future(self._pending.pop(0))

    async def flush(self) -> None:
        """Write the rest, and wait for every write: the round's rows are all in."""
        if self._rows:
            await self._submit()
        while self._pending:
            await asyncio.wrap_future(self._pending.pop(0))
        ctx = self._ctx
        ctx.journal.count_unchanged(ctx.run_id, ctx.number, self._unchanged)
        self._unchanged = 0

    async def close(self) -> None:
        """Wait for the writes in flight (their errors are the round's to raise from
        ``flush``; here, a stop's, they are dropped) and close the writer."""
        if self._writer is None:
            return
        pending = [asyncio.wrap_future(f) for f in [*self._pending, self._writer.close()]]
        self._pending, self._writer = [], None
        await asyncio.gather(*pending, return_exceptions=True)


def _settled_unrun(ctx: Round, settled: list[Settled]) -> None:
    """Units the round settled without running them: counted and said, a quarantined
    one as one that ran, the reused ones of a batch in one ``units.reused`` event (a
    run may reuse 100,000: an event each was most of its time to its first new unit)."""
    reused = 0
    for item in settled:
        ctx.counts[item.state] += 1
        if item.state is UnitState.REUSED:
            reused += 1
            continue
        ctx.events.emit(
            "unit.settled",
            round=ctx.number,
            unit=item.unit_id,
            state=str(item.state),
            rung="",
            attempts=0,
            reason=item.reason,
        )
    if reused:
        ctx.events.emit("units.reused", round=ctx.number, count=reused)


class _Batches:
    """The selection, read and fingerprinted a batch at a time in a worker thread (a
    unit whose inputs match a success's has its fingerprint, found in ``known``: see
    ``fingerprints``).  A cancel while a batch is read does not leave the thread
    behind: ``close`` waits for it (the input command's end has woken it by then), then
    closes the selection's generators."""

    def __init__(self, prints: Fingerprints, known: Successes) -> None:
        self.stream: Iterator[Unit] = iter(())
        self._prints = prints
        self._known = known
        self._pending: asyncio.Future[list[Unit]] | None = None

    async def take(self, count: int) -> list[Unit]:
        loop = asyncio.get_running_loop()
        self._pending = loop.run_in_executor(
            None, _take, self.stream, count, self._prints, self._known
        )
        # Shielded: a cancel leaves the thread's future to ``close``, which awaits it.
        batch = await asyncio.shield(self._pending)
        self._pending = None
        return batch

    async def close(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            await asyncio.wait([pending])
            if not pending.cancelled():
                pending.exception()  # the round is ending for another reason: not raised
        if isinstance(self.stream, Generator):
            self.stream.close()


async def _from_journal(ctx: Round) -> AsyncIterator[tuple[Unit, Progress]]:
    for row in ctx.journal.unsettled_units(ctx.run_id, ctx.number):
        yield (
            row.unit,
            Progress(
                rung=row.rung,
                rung_attempts=row.rung_attempts,
                attempts=row.attempts,
                failures=row.failures,
                last=row.last,
            ),
        )


def _take(stream: Iterator[Unit], count: int, prints: Fingerprints, known: Successes) -> list[Unit]:
    """Up to ``count`` units of the selection, each with its inputs and fingerprint: a
    success's whose inputs were its, else rendered."""
    batch = []
    for unit in stream:
        batch.append(prints.found(unit, known))
        if len(batch) >= count:
            break
    return batch


class Tally:
    """Counts and fingerprints a selection as it streams past (never holding it)."""

    def __init__(self) -> None:
        self.count = 0
        # Of them, settled without running (reused, quarantined), and not added to the
        # round at all: unchanged since they failed in an earlier round.
        self.reused = self.quarantined = self.unchanged = 0
        self.done = False
        # The selection's inputs.files patterns that matched no file (once done).
        self.unmatched: tuple[str, ...] = ()
        self._digest = hashlib.sha256()

    def sorted(self, batch: Sorted) -> None:
        for item in batch.settled:
            if item.state is UnitState.REUSED:
                self.reused += 1
            else:
                self.quarantined += 1
        self.unchanged += batch.unchanged

    @property
    def to_run(self) -> int:
        """The units the round dispatches."""
        return self.count - self.reused - self.quarantined - self.unchanged

    def add(self, unit: Unit) -> None:
        self.count += 1
        # Its inputs hold its id and records (and what they render from): a digest of
        # them, already made, not another of the records.
        self._digest.update(
            unit.inputs.encode()
            or json.dumps([unit.id, list(unit.items)], sort_keys=True, default=str).encode()
        )

    def fingerprint(self) -> str:
        return self._digest.hexdigest()
