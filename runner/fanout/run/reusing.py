"""What a round does with a selected unit once its fingerprint is known: run it, reuse an
earlier run's success, leave it quarantined, or leave it be, unchanged since it failed
in an earlier round of the run; and the streak a unit's failure adds to.

- **Unchanged since it failed.**  A unit that exhausted its ladder in an earlier round of
  this run and is selected again with the same fingerprint is not run again: the same
  inputs would fail the same way (each round paid for it again before).  It is not
  added to the round: its failed row stays its result, and the round counts it.
- **Quarantined.**  A unit whose streak (``journal.reuse``) reached
  ``units.quarantineAfter`` runs, not released, with this fingerprint, is added
  settled as quarantined, with its streak as the reason.
- **Reused.**  With ``units.reuse = "succeeded"`` (and no ``--no-reuse``), a unit with
  the fingerprint of a success in an earlier run of the job is added settled as
  reused: that run's result counts, its collected files are fan-in's from that run's
  folder (applied only if the workspace does not hold them yet).  A success whose files
  are gone from its folder is not reused.
- Everything else runs.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..attempt import staging
from ..backlog.units import Unit
from ..errors import FanoutError
from ..journal import Journal, Settled, Streak, Success
from ..outcome import AttemptResult, Outcome, UnitState
from ..spec import Spec
from .round import Round


@dataclass
class Sorted:
    """One batch of a round's selected units, sorted."""

    run: list[Unit] = field(default_factory=list)
    settled: list[Settled] = field(default_factory=list)
    unchanged: int = 0
    # In the journal already: a resumed round's units that an earlier stretch added.
    known: int = 0
    # Reused by fingerprint from new inputs: (fingerprint, inputs) for the journal.
    refreshed: list[tuple[str, str]] = field(default_factory=list)


class Reusing:
    """Sorts a round's units (see the module docstring); ``reuse``: whether earlier
    runs' successes count; ``successes`` and ``inputs``: every success of the job kept,
    by fingerprint, and the inputs they are kept by (``Journal.all_successes``).

    It reads the journal only, never a ``Round``: ``fanout plan`` sorts the selection of
    a run that has not started (``run_id`` "", round 1) the very same way."""

    def __init__(
        self,
        spec: Spec,
        journal: Journal,
        successes: Mapping[str, Success],
        inputs: Container[str],
        *,
        run_id: str,
        round_number: int,
        reuse: bool,
        resumed: bool = False,
    ) -> None:
        self._spec = spec
        self._journal = journal
        self._successes = successes
        self._inputs = inputs
        self._run_id = run_id
        self._round = round_number
        # A resumed round selects again: the units it has already are the journal's.
        self._resumed = resumed
        self._reuse = reuse and spec.units.reuse == "succeeded"
        self._quarantine = {
            streak.unit: streak
            for streak in journal.quarantined(spec.name, spec.units.quarantine_after)
        }

    @classmethod
    def of_round(
        cls,
        ctx: Round,
        successes: Mapping[str, Success],
        inputs: Container[str],
        *,
        resumed: bool,
    ) -> Reusing:
        return cls(
            ctx.spec,
            ctx.journal,
            successes,
            inputs,
            run_id=ctx.run_id,
            round_number=ctx.number,
            reuse=ctx.reuse,
            resumed=resumed,
        )

    def sort(self, units: Sequence[Unit]) -> Sorted:
        """Sort a batch of fingerprinted units."""
        journal = self._journal
        ids = [unit.id for unit in units]
        earlier = journal.earlier_rounds(self._run_id, self._round, ids) if self._round > 1 else {}
        had = journal.in_round(self._run_id, self._round, ids) if self._resumed else set()
        successes = self._successes if self._reuse else {}
        batch = Sorted()
        for unit in units:
            if unit.id in had:
                batch.known += 1
                continue
            before = earlier.get(unit.id)
            if (
                before is not None
                and before.state is UnitState.FAILED
                and before.fingerprint == unit.fingerprint
            ):
                batch.unchanged += 1
                continue
            streak = self._quarantine.get(unit.id)
            if streak is not None and streak.fingerprint == unit.fingerprint:
                batch.settled.append(
                    Settled(unit=unit, state=UnitState.QUARANTINED, reason=quarantined(streak))
                )
                continue
            success = successes.get(unit.fingerprint)
            if success is not None and self._files_kept(success):
                if unit.inputs not in self._inputs:  # found by rendering it: next time not
                    batch.refreshed.append((unit.fingerprint, unit.inputs))
                batch.settled.append(
                    Settled(
                        unit=unit,
                        state=UnitState.REUSED,
                        reason=f"reused from run {success.run}: unchanged since it succeeded",
                        reused_from=success.run,
                        collected_json=success.collected_json,
                        staged_json=success.staged_json,
                    )
                )
                continue
            batch.run.append(unit)
        return batch

    def _files_kept(self, success: Success) -> bool:
        if success.collected_json == "[]":
            return True
        folder = (
            self._spec.runtime.state_dir
            / "runs"
            / success.run
            / "units"
            / staging.unit_folder_name(success.unit_id)
        )
        return all((folder / item.path).is_file() for item in success.collected)


def quarantined(streak: Streak) -> str:
    """Why a quarantined unit does not run, in one line."""
    since = datetime.fromtimestamp(streak.first_at, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"quarantined: failed the same way ({streak.failure}) in {streak.runs} runs in a row"
        f" since {since}, unchanged; last: {streak.reason}"
    )


def failure_class(result: AttemptResult | None) -> str:
    """How a unit failed, for a streak: its last attempt's status, and its agent's kind
    when it has one ("failed:turn-limit"); "unprepared" without an attempt result (a
    template, a budget, a ladder given up before another attempt)."""
    if result is None:
        return "unprepared"
    return f"{result.status}:{result.kind}" if result.kind else str(result.status)


def record(ctx: Round, unit: Unit, outcome: Outcome, result: AttemptResult | None) -> None:
    """Add the unit's end in this run to its streak: a failure extends it (or starts
    one), a success ends it.  Said when the failure quarantines the unit from the next
    run on.  A journal error stops the round, as every journal error does."""
    job = ctx.spec.name
    try:
        if outcome.state is UnitState.SUCCEEDED:
            ctx.journal.record_success(job, ctx.run_id, ctx.number, unit.id)
            return
        if outcome.state is not UnitState.FAILED or not unit.fingerprint:
            return
        streak = ctx.journal.record_failure(
            job,
            ctx.run_id,
            unit,
            failure=failure_class(result),
            reason=outcome.reason,
            spent_usd=ctx.journal.unit_spent(ctx.run_id, unit.id, ctx.number),
        )
    except FanoutError as exc:
        ctx.stop(exc)
        return
    after = ctx.spec.units.quarantine_after
    if after and streak.runs == after and not streak.released:
        ctx.events.emit(
            "unit.quarantined",
            round=ctx.number,
            unit=unit.id,
            runs=streak.runs,
            failure=streak.failure,
            reason=outcome.reason,
        )
