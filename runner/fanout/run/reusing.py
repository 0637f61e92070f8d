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

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..attempt import staging
from ..backlog.units import Unit
from ..errors import FanoutError
from ..journal import Journal, Settled, Streak, Success, Successes
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
    runs' successes count; ``successes``: every success of the job kept
    (``Journal.all_successes``).

    It reads the journal only, never a ``Round``: ``fanout plan`` sorts the selection of
    a run that has not started (``run_id`` "", round 1) the very same way."""

    def __init__(
        self,
        spec: Spec,
        journal: Journal,
        successes: Successes,
        *,
        run_id: str,
        round_number: int,
        reuse: bool,
        resumed: bool = False,
    ) -> None:
        self._spec = spec
        self._journal = journal
        self._successes = successes
        self._run_id = run_id
        self._round = round_number
        # A resumed round selects again: the units it has already are the journal's.
        self._resumed = resumed
        self._reuse = reuse and spec.units.reuse == "succeeded"
        self._reasons: dict[str, str] = {}
        self._quarantine = {
            streak.unit: streak
            for streak in journal.quarantined(spec.name, spec.units.quarantine_after)
        }

    @classmethod
    def of_round(
        cls,
        ctx: Round,
        successes: Successes,
        *,
        resumed: bool,
    ) -> Reusing:
        return cls(
            ctx.spec,
            ctx.journal,
            successes,
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
        successes = self._successes if self._reuse else Successes()
        batch = Sorted()
        # Looked up once a batch, not once a unit: a round may sort 100,000 units.
        quarantine, settled, refreshed = self._quarantine, batch.settled, batch.refreshed
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
            streak = quarantine.get(unit.id)
            if streak is not None and streak.fingerprint == unit.fingerprint:
                settled.append(Settled.of(unit, UnitState.QUARANTINED, quarantined(streak)))
                continue
            success = successes.get(unit.fingerprint)
            if success is not None and (
                success.collected_json == "[]" or self._files_kept(success)
            ):
                if success.inputs != unit.inputs:  # found by rendering: next time not
                    refreshed.append((unit.fingerprint, unit.inputs))
                run = success.run
                settled.append(  # Settled.of, made directly: once a unit reused
                    Settled(
                        unit.id,
                        unit.index,
                        unit.origin,
                        unit.fingerprint,
                        unit.inputs,
                        UnitState.REUSED,
                        self._reasons.get(run) or self._reused_from(run),
                        run,
                        success.collected_json,
                        success.staged_json,
                    )
                )
                continue
            batch.run.append(unit)
        return batch

    def _reused_from(self, run: str) -> str:
        # Made once a run, then found in ``_reasons``: not one string a unit.
        reason = self._reasons[run] = f"reused from run {run}: unchanged since it succeeded"
        return reason

    def _files_kept(self, success: Success) -> bool:
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
    """Add the unit's failure in this run to its streak (or start one).  Said when the
    failure quarantines the unit from the next run on.  A success ends the streak in
    the transaction that settles it (``journal.attempt_settled``).  A journal error
    stops the round, as every journal error does."""
    job = ctx.spec.name
    try:
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
