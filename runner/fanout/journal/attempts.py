"""The journal's units and attempts as a run writes them: units added by the
selection, each attempt dispatched and settled, a unit settled at most once, and the
file changes fan-in recorded.

An attempt is written as dispatched before its worker starts and as settled when it
ends, each in its own short transaction.  An attempt that settles its unit (a success,
or the last failure of the ladder) settles the unit in the same transaction, so no crash
can leave a succeeded attempt beside an unsettled unit.  A unit is settled at most once:
the update only matches a unit that is not settled yet, so an attempt that finishes late
(a lost host coming back) cannot settle it twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..outcome import AttemptResult, Outcome, UnitState
from .store import Store
from .tables import SETTLED_SQL, unit_data

if TYPE_CHECKING:
    # Annotations only: the backlog imports the spec (see tables.unit_row).
    from ..backlog.units import Unit


class Attempts(Store):
    """The writes to ``units``, ``attempts`` and ``changes`` while a run goes on."""

    def add_units(self, run_id: str, round_number: int, units: Iterable[Unit]) -> None:
        rows = [
            (
                run_id,
                round_number,
                u.id,
                u.index,
                unit_data(u),
                str(UnitState.PENDING),
                u.fingerprint,
                u.inputs,
            )
            for u in units
        ]
        self._atomic(
            lambda: self.db.executemany(
                "INSERT OR IGNORE INTO units (run, round, id, idx, data, state, fingerprint,"
                " inputs, active_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
                rows,
            )
        )

    def attempt_dispatched(
        self,
        run_id: str,
        round_number: int,
        unit_id: str,
        n: int,
        rung: str,
        host: str = "",
        *,
        memory: int | None = None,
    ) -> None:
        def work() -> None:
            self._run(
                "INSERT OR REPLACE INTO attempts (run, round, unit, n, rung, host, started,"
                " memory) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, round_number, unit_id, n, rung, host, self.clock(), memory),
            )
            self._run(
                "UPDATE units SET state = 'running', attempts = ?"  # noqa: S608 - constant SQL (SETTLED_SQL)
                " WHERE run = ? AND round = ? AND id = ? AND state NOT IN " + SETTLED_SQL,
                (n, run_id, round_number, unit_id),
            )

        self._atomic(work)

    def attempt_settled(
        self,
        run_id: str,
        round_number: int,
        unit_id: str,
        n: int,
        result: AttemptResult,
        *,
        rung: int,
        rung_attempts: int,
        failures: int,
        last: dict[str, Any],
        staged: dict[str, str] | None = None,
        outcome: Outcome | None = None,
        job: str = "",
    ) -> bool:
        """Record an attempt's end (and, for a success, the hashes of what it staged);
        with ``outcome`` (the attempt decided the unit's fate) settle the unit in the
        same transaction, and if it succeeded, record the success for ``job`` there too
        (``_record_success``).  False if the attempt had already been settled (or
        interrupted), or the unit had."""

        def work() -> bool:
            settled = self._run(
                "UPDATE attempts SET finished = ?, status = ?, exit_code = ?, reason = ?,"
                " duration = ?, retry_after = ?, host = ?, kind = ?"
                " WHERE run = ? AND round = ? AND unit = ? AND n = ? AND status IS NULL",
                (
                    self.clock(),
                    str(result.status),
                    result.exit_code,
                    result.reason,
                    result.duration,
                    result.retry_after,
                    result.host,
                    result.kind,
                    run_id,
                    round_number,
                    unit_id,
                    n,
                ),
            )
            if not settled:
                return False
            # Whatever the unit's state: a late attempt was paid for too.
            self._run(
                "UPDATE units SET active_seconds = active_seconds + ?"
                " WHERE run = ? AND round = ? AND id = ?",
                (result.duration, run_id, round_number, unit_id),
            )
            self._run(
                "UPDATE units SET rung = ?, rung_attempts = ?, failures = ?,"  # noqa: S608 - constant SQL (SETTLED_SQL)
                " worker_seconds = worker_seconds + ?, reason = ?, tail = ?, last = ?,"
                " staged = COALESCE(?, staged) WHERE run = ? AND round = ? AND id = ?"
                " AND state NOT IN " + SETTLED_SQL,
                (
                    rung,
                    rung_attempts,
                    failures,
                    result.duration,
                    result.reason,
                    result.output_tail,
                    json.dumps(last),
                    None if staged is None else json.dumps(staged),
                    run_id,
                    round_number,
                    unit_id,
                ),
            )
            if outcome is None:
                return True
            if not self._settle(run_id, outcome):
                return False
            if job and outcome.state is UnitState.SUCCEEDED:
                self._record_success(job, run_id, round_number, unit_id)
            return True

        return self._atomic(work)

    def _record_success(self, job: str, run_id: str, round_number: int, unit_id: str) -> None:
        """The unit succeeded in ``run_id``: no streak of failures any more, and its
        fingerprint's newest success is this one (what it collected and staged copied
        from its row).  Inside the transaction that settles it: a crash cannot leave a
        settled success that a later run would not reuse."""
        self._run("DELETE FROM streaks WHERE job = ? AND unit = ?", (job, unit_id))
        self._run(
            "INSERT OR REPLACE INTO successes"
            " (job, fingerprint, inputs, unit, run, collected, staged)"
            " SELECT ?, fingerprint, inputs, id, run, collected, staged FROM units"
            " WHERE run = ? AND round = ? AND id = ? AND fingerprint != ''",
            (job, run_id, round_number, unit_id),
        )

    def unit_settled(self, run_id: str, outcome: Outcome) -> bool:
        """Settle a unit once; False if it was already settled."""
        return self._atomic(lambda: self._settle(run_id, outcome))

    def _settle(self, run_id: str, outcome: Outcome) -> bool:
        return (
            self._run(
                "UPDATE units SET state = ?, reason = ?, tail = ?, collected = ?"  # noqa: S608 - constant SQL (SETTLED_SQL)
                " WHERE run = ? AND round = ? AND id = ? AND state NOT IN " + SETTLED_SQL,
                (
                    str(outcome.state),
                    outcome.reason,
                    outcome.output_tail,
                    json.dumps([c.as_dict() for c in outcome.collected]),
                    run_id,
                    outcome.round,
                    outcome.unit_id,
                ),
            )
            == 1
        )

    def unit_interrupted(self, run_id: str, round_number: int, unit_id: str) -> None:
        def work() -> None:
            self._run(
                "UPDATE units SET state = 'interrupted' WHERE run = ? AND round = ? AND id = ?"  # noqa: S608 - constant SQL (SETTLED_SQL)
                " AND state NOT IN " + SETTLED_SQL,
                (run_id, round_number, unit_id),
            )
            # Its worker ran (and was paid for) from dispatch until now: the duration
            # the report's active seconds count, as the journal's clock measured it.
            now = self.clock()
            self._run(
                "UPDATE units SET active_seconds = active_seconds + (SELECT"
                " COALESCE(SUM(MAX(0, ? - started)), 0) FROM attempts WHERE run = ?"
                " AND round = ? AND unit = ? AND status IS NULL)"
                " WHERE run = ? AND round = ? AND id = ?",
                (now, run_id, round_number, unit_id, run_id, round_number, unit_id),
            )
            self._run(
                "UPDATE attempts SET status = 'interrupted', finished = ?, reason = 'interrupted',"
                " duration = MAX(0, ? - started)"
                " WHERE run = ? AND round = ? AND unit = ? AND status IS NULL",
                (now, now, run_id, round_number, unit_id),
            )

        self._atomic(work)

    def record_changes(self, run_id: str, round_number: int, changes: Iterable[Any]) -> None:
        rows = [
            (run_id, round_number, c.unit_id, c.path, c.added, c.removed, c.state) for c in changes
        ]
        self._atomic(
            lambda: self.db.executemany(
                "INSERT OR REPLACE INTO changes (run, round, unit, path, added, removed, state)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        )
