"""The crash-safe journal: every run, unit and attempt in SQLite under the state dir.

An attempt is written as dispatched before its worker starts and as settled when it
ends, each in its own short transaction (WAL mode), so a coordinator killed with
SIGKILL loses nothing: ``--resume`` finds the units that had not settled and runs them
again, never one that had.  A unit is settled at most once: the update only matches a
unit that is not settled yet, so an attempt that finishes late (a lost host coming
back) cannot settle it twice.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import StateError
from ..outcome import AttemptResult, Outcome, Status, UnitState
from ..units import Unit
from .tables import (
    FINAL_RUN_STATES,
    SCHEMA,
    RunRow,
    UnitRow,
    merge_limits,
    new_run_id,
    run_row,
    unit_data,
    unit_row,
)


class Journal:
    """One SQLite file per state directory, shared by every job that uses it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"cannot open the journal {path}: {exc}") from None
        self.db.row_factory = sqlite3.Row

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One short write transaction (a commit is the costly part of a write)."""
        self._write("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self._write("COMMIT")

    def _write(self, sql: str, parameters: Iterable[Any] = ()) -> int:
        try:
            return self.db.execute(sql, tuple(parameters)).rowcount
        except sqlite3.Error as exc:
            raise StateError(f"journal write failed ({self.path}): {exc}") from None

    # Runs ---------------------------------------------------------------------

    def create_run(
        self,
        *,
        job: str,
        job_file: str,
        apply: bool,
        parent: str | None = None,
        trigger: dict[str, Any] | None = None,
        run_id: str | None = None,
    ) -> str:
        run_id = run_id or new_run_id()
        self._write(
            "INSERT INTO runs (id, job, job_file, started, state, apply, parent, trigger)"
            " VALUES (?, ?, ?, ?, 'running', ?, ?, ?)",
            (run_id, job, job_file, time.time(), int(apply), parent, json.dumps(trigger or {})),
        )
        return run_id

    def run(self, run_id: str) -> RunRow:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            known = [r.id for r in self.runs(limit=5)]
            hint = f"; recent runs: {', '.join(known)}" if known else "; no runs yet"
            raise StateError(f"no run {run_id!r} in {self.path}{hint}")
        return run_row(row)

    def runs(self, job: str | None = None, limit: int = 20) -> list[RunRow]:
        if job is None:
            rows = self.db.execute("SELECT * FROM runs ORDER BY started DESC LIMIT ?", (limit,))
        else:
            rows = self.db.execute(
                "SELECT * FROM runs WHERE job = ? ORDER BY started DESC LIMIT ?", (job, limit)
            )
        return [run_row(r) for r in rows]

    def last_unfinished(self, job: str) -> RunRow | None:
        """The job's latest run if it did not finish (crashed, interrupted, stopped).
        An older unfinished run is superseded by any run started after it."""
        row = self.db.execute(
            "SELECT * FROM runs WHERE job = ? ORDER BY started DESC, rowid DESC LIMIT 1", (job,)
        ).fetchone()
        return None if row is None or row["state"] == "finished" else run_row(row)

    def worker_seconds(self, run_id: str) -> float:
        row = self.db.execute(
            "SELECT COALESCE(SUM(worker_seconds), 0) AS total FROM units WHERE run = ?", (run_id,)
        ).fetchone()
        return float(row["total"])

    def set_round(self, run_id: str, round_number: int, *, records: int, selected: int) -> None:
        self._write("UPDATE runs SET round = ? WHERE id = ?", (round_number, run_id))
        self._write(
            "INSERT INTO rounds (run, round, records, selected) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (run, round) DO UPDATE SET records = excluded.records,"
            " selected = excluded.selected",
            (run_id, round_number, records, selected),
        )

    def complete_round(self, run_id: str, round_number: int) -> None:
        self._write(
            "UPDATE rounds SET complete = 1 WHERE run = ? AND round = ?", (run_id, round_number)
        )

    def rounds(self, run_id: str) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM rounds WHERE run = ? ORDER BY round", (run_id,)))

    def finish_run(
        self,
        run_id: str,
        *,
        state: str,
        wall: float,
        note: str = "",
        limits: dict[str, Any] | None = None,
    ) -> None:
        """Close a run (this stretch of it: a resumed run adds its wall time)."""
        with self._transaction():
            row = self.db.execute("SELECT limits FROM runs WHERE id = ?", (run_id,)).fetchone()
            merged = merge_limits(json.loads(row["limits"]) if row else {}, limits or {})
            self._write(
                "UPDATE runs SET state = ?, finished = ?, wall = wall + ?, note = ?, limits = ?"
                " WHERE id = ?",
                (state, time.time(), wall, note, json.dumps(merged), run_id),
            )

    def reopen_run(self, run_id: str) -> None:
        """A resumed run is running again; attempts left dispatched were interrupted."""
        self._write("UPDATE runs SET state = 'running' WHERE id = ?", (run_id,))
        self._write(
            "UPDATE attempts SET status = 'interrupted', finished = ?,"
            " reason = 'fanout stopped before it settled' WHERE run = ? AND status IS NULL",
            (time.time(), run_id),
        )
        self._write(
            "UPDATE units SET state = 'interrupted' WHERE run = ? AND state = 'running'", (run_id,)
        )

    # Units --------------------------------------------------------------------

    def add_units(self, run_id: str, round_number: int, units: Iterable[Unit]) -> None:
        rows = [
            (run_id, round_number, u.id, u.index, unit_data(u), str(UnitState.PENDING))
            for u in units
        ]
        try:
            with self.db:
                self.db.execute("BEGIN")
                self.db.executemany(
                    "INSERT OR IGNORE INTO units (run, round, id, idx, data, state)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    rows,
                )
        except sqlite3.Error as exc:
            raise StateError(f"journal write failed ({self.path}): {exc}") from None

    def unsettled_units(
        self, run_id: str, round_number: int, batch: int = 500
    ) -> Iterator[UnitRow]:
        """Units of a round that have not settled, in selection order, read in pages."""
        after = -1
        while True:
            rows = self.db.execute(
                "SELECT * FROM units WHERE run = ? AND round = ? AND state NOT IN"
                " ('succeeded', 'failed') AND idx > ? ORDER BY idx LIMIT ?",
                (run_id, round_number, after, batch),
            ).fetchall()
            if not rows:
                return
            for row in rows:
                yield unit_row(row)
            after = rows[-1]["idx"]

    def units(
        self, run_id: str, round_number: int | None = None, *, batch: int = 500
    ) -> Iterator[UnitRow]:
        """The run's units (or one round's) in round and selection order, read in pages
        of ``batch`` so a 100k-unit run is never in memory at once.  Each page is its own
        query: the caller may write to the journal between rows."""
        if round_number is None:
            numbers = [
                r["round"]
                for r in self.db.execute(
                    "SELECT DISTINCT round FROM units WHERE run = ? ORDER BY round", (run_id,)
                )
            ]
        else:
            numbers = [round_number]
        for number in numbers:
            after = None
            while True:
                rows = self.db.execute(
                    "SELECT * FROM units WHERE run = ? AND round = ?"
                    " AND idx > COALESCE(?, -1) ORDER BY idx LIMIT ?",
                    (run_id, number, after, batch),
                ).fetchall()
                yield from (unit_row(row) for row in rows)
                if len(rows) < batch:
                    break
                after = rows[-1]["idx"]

    # A unit counts in the latest round that selected its id: a later round's row for
    # the same id supersedes it.  One seek in units_by_id per unit.
    _LATEST = (
        "NOT EXISTS (SELECT 1 FROM units later WHERE later.run = units.run"
        " AND later.id = units.id AND later.round > units.round)"
    )

    def unit_counts(self, run_id: str) -> dict[str, int]:
        """Units of the run's latest round of each unit id, counted by state."""
        rows = self.db.execute(
            f"SELECT state, COUNT(*) AS n FROM units WHERE run = ? AND {self._LATEST}"  # noqa: S608 - constant SQL
            " GROUP BY state",
            (run_id,),
        )
        return {r["state"]: r["n"] for r in rows}

    def unit_count(self, run_id: str) -> int:
        """Rows of the run's units over all its rounds (what report.json lists)."""
        row = self.db.execute("SELECT COUNT(*) AS n FROM units WHERE run = ?", (run_id,)).fetchone()
        return int(row["n"])

    def failed_ids(self, run_id: str) -> Iterator[str]:
        """Ids of the units whose latest round failed, sorted."""
        rows = self.db.execute(
            f"SELECT id FROM units WHERE run = ? AND state = 'failed' AND {self._LATEST}"  # noqa: S608 - constant SQL
            " ORDER BY id",
            (run_id,),
        )
        return (r["id"] for r in rows)

    def failed_units(self, run_id: str, limit: int) -> tuple[int, list[UnitRow]]:
        """How many units' latest round failed, and the first ``limit`` of them in round
        and selection order."""
        where = f"FROM units WHERE run = ? AND state = 'failed' AND {self._LATEST}"
        count = self.db.execute(f"SELECT COUNT(*) AS n {where}", (run_id,)).fetchone()["n"]
        rows = self.db.execute(f"SELECT * {where} ORDER BY round, idx LIMIT ?", (run_id, limit))
        return int(count), [unit_row(r) for r in rows]

    def changed_units(self, run_id: str, limit: int) -> tuple[int, list[UnitRow]]:
        """How many units (per round) recorded file changes, and the first ``limit``."""
        count = self.db.execute(
            "SELECT COUNT(*) AS n FROM (SELECT DISTINCT round, unit FROM changes WHERE run = ?)",
            (run_id,),
        ).fetchone()["n"]
        rows = self.db.execute(
            "SELECT units.* FROM units JOIN (SELECT DISTINCT round, unit FROM changes"
            " WHERE run = ?) AS changed ON units.run = ? AND units.round = changed.round"
            " AND units.id = changed.unit ORDER BY units.round, units.idx LIMIT ?",
            (run_id, run_id, limit),
        )
        return int(count), [unit_row(r) for r in rows]

    def selection_done(self, run_id: str, round_number: int) -> None:
        self._write(
            "UPDATE rounds SET selection_done = 1 WHERE run = ? AND round = ?",
            (run_id, round_number),
        )

    def round_row(self, run_id: str, round_number: int) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.db.execute(
            "SELECT * FROM rounds WHERE run = ? AND round = ?", (run_id, round_number)
        ).fetchone()
        return row

    # Attempts -----------------------------------------------------------------

    def attempt_dispatched(
        self, run_id: str, round_number: int, unit_id: str, n: int, rung: str, host: str = ""
    ) -> None:
        with self._transaction():
            self._write(
                "INSERT OR REPLACE INTO attempts (run, round, unit, n, rung, host, started)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, round_number, unit_id, n, rung, host, time.time()),
            )
            self._write(
                "UPDATE units SET state = 'running', attempts = ?"
                " WHERE run = ? AND round = ? AND id = ? AND state NOT IN ('succeeded', 'failed')",
                (n, run_id, round_number, unit_id),
            )

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
    ) -> bool:
        """Record an attempt's end (and, for a success, the hashes of what it staged);
        False if it had already been settled (or interrupted)."""
        with self._transaction():
            settled = self._write(
                "UPDATE attempts SET finished = ?, status = ?, exit_code = ?, reason = ?,"
                " duration = ?, retry_after = ?, host = ?"
                " WHERE run = ? AND round = ? AND unit = ? AND n = ? AND status IS NULL",
                (
                    time.time(),
                    str(result.status),
                    result.exit_code,
                    result.reason,
                    result.duration,
                    result.retry_after,
                    result.host,
                    run_id,
                    round_number,
                    unit_id,
                    n,
                ),
            )
            if settled:
                self._write(
                    "UPDATE units SET rung = ?, rung_attempts = ?, failures = ?,"
                    " worker_seconds = worker_seconds + ?, reason = ?, tail = ?, last = ?,"
                    " staged = COALESCE(?, staged) WHERE run = ? AND round = ? AND id = ?"
                    " AND state NOT IN ('succeeded', 'failed')",
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
        return settled == 1

    def unit_settled(self, run_id: str, outcome: Outcome) -> bool:
        """Settle a unit once; False if it was already settled."""
        return (
            self._write(
                "UPDATE units SET state = ?, reason = ?, tail = ?, collected = ?"
                " WHERE run = ? AND round = ? AND id = ? AND state NOT IN ('succeeded', 'failed')",
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
        self._write(
            "UPDATE units SET state = 'interrupted' WHERE run = ? AND round = ? AND id = ?"
            " AND state NOT IN ('succeeded', 'failed')",
            (run_id, round_number, unit_id),
        )
        self._write(
            "UPDATE attempts SET status = 'interrupted', finished = ?, reason = 'interrupted'"
            " WHERE run = ? AND round = ? AND unit = ? AND status IS NULL",
            (time.time(), run_id, round_number, unit_id),
        )

    def attempts(self, run_id: str) -> list[sqlite3.Row]:
        return list(
            self.db.execute("SELECT * FROM attempts WHERE run = ? ORDER BY started", (run_id,))
        )

    def attempt_counts(self, run_id: str) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT status, COUNT(*) AS n FROM attempts WHERE run = ? GROUP BY status", (run_id,)
        )
        return {str(r["status"]): r["n"] for r in rows}

    # Changes ------------------------------------------------------------------

    def record_changes(self, run_id: str, round_number: int, changes: Iterable[Any]) -> None:
        for change in changes:
            self._write(
                "INSERT OR REPLACE INTO changes (run, round, unit, path, added, removed, state)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    run_id,
                    round_number,
                    change.unit_id,
                    change.path,
                    change.added,
                    change.removed,
                    change.state,
                ),
            )

    def changes(
        self, run_id: str, units: Iterable[tuple[int, str]] | None = None
    ) -> list[sqlite3.Row]:
        """The run's recorded file changes, or those of the (round, unit id) pairs in
        ``units`` (a page of units, for a report that streams)."""
        if units is None:
            return list(
                self.db.execute(
                    "SELECT * FROM changes WHERE run = ? ORDER BY round, unit, path", (run_id,)
                )
            )
        found: list[sqlite3.Row] = []
        by_round: dict[int, list[str]] = {}
        for number, unit_id in units:
            by_round.setdefault(number, []).append(unit_id)
        for number, ids in sorted(by_round.items()):
            for start in range(0, len(ids), 500):  # under SQLite's limit on parameters
                page = ids[start : start + 500]
                marks = ", ".join("?" * len(page))  # placeholders only, never values
                sql = f"SELECT * FROM changes WHERE run = ? AND round = ? AND unit IN ({marks})"  # noqa: S608
                found += self.db.execute(sql + " ORDER BY unit, path", (run_id, number, *page))
        return found

    def has_changes(self, run_id: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM changes WHERE run = ? LIMIT 1", (run_id,)).fetchone()
            is not None
        )


__all__ = ["FINAL_RUN_STATES", "Journal", "RunRow", "Status", "UnitRow", "new_run_id"]
