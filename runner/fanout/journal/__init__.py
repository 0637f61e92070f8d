"""The crash-safe journal: every run, unit and attempt in SQLite under the state dir.

An attempt is written as dispatched before its worker starts and as settled when it
ends, each in its own short transaction (WAL mode), so a coordinator killed with
SIGKILL loses nothing: ``--resume`` finds the units that had not settled and runs them
again, never one that had.  An attempt that settles its unit (a success, or the last
failure of the ladder) settles the unit in the same transaction, so no crash can leave
a succeeded attempt beside an unsettled unit.  A unit is settled at most once: the
update only matches a unit that is not settled yet, so an attempt that finishes late (a
lost host coming back) cannot settle it twice.

Storage: every write goes through ``_atomic``, the one place sqlite3's errors become
StateError.  A full disk is met with a reserve: ``journal.reserve`` (a few hundred KiB
kept beside the journal) is deleted the first time a write finds the disk full and the
write is retried, so the settles of the attempts still running and the run's "stopped"
record still fit; ``storage_error`` then tells dispatch to stop starting units.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StateError, storage_error
from ..outcome import AttemptResult, Outcome, RunState, UnitState
from ..units import Unit
from .tables import (
    MIGRATIONS,
    SCHEMA,
    RunRow,
    UnitRow,
    merge_limits,
    new_run_id,
    run_row,
    unit_data,
    unit_row,
)

T = TypeVar("T")

# Room kept free for the writes that let a run stop cleanly on a full disk: a settle is
# a few 4 KiB WAL frames, so this holds the settles of a few dozen running attempts.
RESERVE_BYTES = 256 * 1024
# sqlite3's primary result codes (the low byte of an extended code).
_SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL = 8, 10, 13


class Journal:
    """One SQLite file per state directory, shared by every job that uses it."""

    def __init__(
        self, path: Path, *, clock: Callable[[], float] = time.time, read_only: bool = False
    ) -> None:
        self.path = path
        self.clock = clock
        self.reserve = path.parent / "journal.reserve"
        # Set once a write found the disk full (and used the reserve): the run must stop.
        self.storage_error: StateError | None = None
        if read_only:
            self.db = _open_read_only(path)
            self.db.row_factory = sqlite3.Row
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(path, isolation_level=None, timeout=30)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            columns = {row[1] for row in self.db.execute("PRAGMA table_info(runs)")}
            for column, sql in MIGRATIONS:
                if column not in columns:
                    self.db.execute(sql)
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"cannot open the journal {path}: {exc}") from None
        self.db.row_factory = sqlite3.Row

    def close(self) -> None:
        self.db.close()

    def keep_reserve(self) -> None:
        """Make sure the reserve is there before a run dispatches anything (put it back
        if an earlier run used it).  A disk without room for it refuses the run before
        any unit starts, rather than running units whose results may not fit."""
        if self.reserve.exists():
            return
        try:
            with self.reserve.open("wb") as stream:
                stream.write(b"\0" * RESERVE_BYTES)
        except OSError as exc:
            self.reserve.unlink(missing_ok=True)
            raise storage_error(self.path.parent, _lower(exc.strerror or str(exc))) from None

    def _atomic(self, work: Callable[[], T]) -> T:
        """Run ``work`` (some statements) as one write transaction and commit it.  On a
        full disk the reserve is given up and ``work`` is tried once more."""
        for last_try in (False, True):
            try:
                self.db.execute("BEGIN IMMEDIATE")
                try:
                    value = work()
                    self.db.execute("COMMIT")
                finally:
                    if self.db.in_transaction:
                        with contextlib.suppress(sqlite3.Error):
                            self.db.execute("ROLLBACK")
                return value
            except sqlite3.Error as exc:
                full = _code(exc) == _SQLITE_FULL
                if full and not last_try and self.reserve.exists():
                    self.reserve.unlink(missing_ok=True)
                    self.storage_error = self._state_error(exc)
                    continue
                raise self._state_error(exc) from None
        raise AssertionError("unreachable")

    def _state_error(self, exc: sqlite3.Error) -> StateError:
        code = _code(exc)
        if code == _SQLITE_FULL:
            return storage_error(self.path.parent, "no space left on device")
        if code == _SQLITE_READONLY:
            return storage_error(self.path, f"the journal is read-only ({exc})")
        if code == _SQLITE_IOERR:
            return storage_error(self.path, f"the journal cannot be written ({exc})")
        return StateError(f"journal write failed ({self.path}): {exc}")

    def _write(self, sql: str, parameters: Iterable[Any] = ()) -> int:
        """One statement in its own transaction; the number of rows it changed."""
        return self._atomic(lambda: self._run(sql, parameters))

    def _run(self, sql: str, parameters: Iterable[Any] = ()) -> int:
        """One statement inside a transaction ``_atomic`` holds."""
        return self.db.execute(sql, tuple(parameters)).rowcount

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
            "INSERT INTO runs (id, job, job_file, started, stretch, state, apply, parent, trigger)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                job,
                job_file,
                now := self.clock(),
                now,
                str(RunState.RUNNING),
                int(apply),
                parent,
                json.dumps(trigger or {}),
            ),
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
        return None if row is None or row["state"] == RunState.FINISHED else run_row(row)

    def worker_seconds(self, run_id: str) -> float:
        row = self.db.execute(
            "SELECT COALESCE(SUM(worker_seconds), 0) AS total FROM units WHERE run = ?", (run_id,)
        ).fetchone()
        return float(row["total"])

    def set_round(self, run_id: str, round_number: int, *, records: int, selected: int) -> None:
        def work() -> None:
            self._run("UPDATE runs SET round = ? WHERE id = ?", (round_number, run_id))
            self._run(
                "INSERT INTO rounds (run, round, records, selected) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run, round) DO UPDATE SET records = excluded.records,"
                " selected = excluded.selected",
                (run_id, round_number, records, selected),
            )

        self._atomic(work)

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
        state: RunState,
        wall: float,
        note: str = "",
        limits: dict[str, Any] | None = None,
    ) -> None:
        """Close a run (this stretch of it: a resumed run adds its wall time)."""

        def work() -> None:
            row = self.db.execute("SELECT limits FROM runs WHERE id = ?", (run_id,)).fetchone()
            merged = merge_limits(json.loads(row["limits"]) if row else {}, limits or {})
            self._run(
                "UPDATE runs SET state = ?, finished = ?, wall = wall + ?, note = ?, limits = ?"
                " WHERE id = ?",
                (str(state), self.clock(), wall, note, json.dumps(merged), run_id),
            )

        self._atomic(work)

    def reopen_run(self, run_id: str) -> None:
        """A resumed run is running again; attempts left dispatched were interrupted.

        A run still marked running was killed (SIGKILL, a crash, a power cut): its last
        stretch never reached ``finish_run``, so its wall time is taken from the journal,
        from the stretch's start to the last attempt it recorded (a start or a settle),
        which is as late as anything is known to have happened in it."""

        def work() -> None:
            row = self.db.execute(
                "SELECT state, stretch FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
            running = row is not None and row["state"] == RunState.RUNNING
            if running and row["stretch"] is not None:
                last = self.db.execute(
                    "SELECT MAX(MAX(started), COALESCE(MAX(finished), 0)) AS last"
                    " FROM attempts WHERE run = ? AND started >= ?",
                    (run_id, row["stretch"]),
                ).fetchone()["last"]
                killed = max(0.0, float(last) - row["stretch"]) if last is not None else 0.0
                self._run("UPDATE runs SET wall = wall + ? WHERE id = ?", (killed, run_id))
            now = self.clock()
            self._run(
                "UPDATE runs SET state = ?, stretch = ? WHERE id = ?",
                (str(RunState.RUNNING), now, run_id),
            )
            self._run(
                "UPDATE attempts SET status = 'interrupted', finished = ?,"
                " reason = 'fanout stopped before it settled' WHERE run = ? AND status IS NULL",
                (now, run_id),
            )
            self._run(
                "UPDATE units SET state = 'interrupted' WHERE run = ? AND state = 'running'",
                (run_id,),
            )

        self._atomic(work)

    # Units --------------------------------------------------------------------

    def add_units(self, run_id: str, round_number: int, units: Iterable[Unit]) -> None:
        rows = [
            (run_id, round_number, u.id, u.index, unit_data(u), str(UnitState.PENDING))
            for u in units
        ]
        self._atomic(
            lambda: self.db.executemany(
                "INSERT OR IGNORE INTO units (run, round, id, idx, data, state)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
        )

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

    def unit_summaries(self, run_id: str, *, batch: int = 500) -> Iterator[sqlite3.Row]:
        """What a report lists of each unit, in the order of ``units``: id, round, idx,
        state, rung, attempts, worker_seconds, reason, origin, collected (JSON text) and
        tail.  SQLite extracts the rung and origin, so a unit's records, last context and
        staged hashes are never parsed: ``unit_row`` was most of a 100k-unit report."""
        numbers = [
            r["round"]
            for r in self.db.execute(
                "SELECT DISTINCT round FROM units WHERE run = ? ORDER BY round", (run_id,)
            )
        ]
        for number in numbers:
            after = None
            while True:
                rows = self.db.execute(
                    "SELECT id, round, idx, state, COALESCE(json_extract(last, '$.rung'), '')"
                    " AS rung, attempts, worker_seconds, reason,"
                    " json_extract(data, '$.origin') AS origin, collected, tail"
                    " FROM units WHERE run = ? AND round = ?"
                    " AND idx > COALESCE(?, -1) ORDER BY idx LIMIT ?",
                    (run_id, number, after, batch),
                ).fetchall()
                yield from rows
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

    def units_in_state(self, run_id: str, state: str, limit: int) -> list[UnitRow]:
        """The first ``limit`` units whose latest round is in ``state``, in round and
        selection order (units_by_state finds them; a superseded row costs one seek)."""
        rows = self.db.execute(
            f"SELECT * FROM units WHERE run = ? AND state = ? AND {self._LATEST}"  # noqa: S608 - constant SQL
            " ORDER BY round, idx LIMIT ?",
            (run_id, state, limit),
        )
        return [unit_row(r) for r in rows]

    def retries_of(self, run_id: str) -> list[str]:
        """The runs started as retries of ``run_id`` (``fanout retry``), oldest first."""
        rows = self.db.execute(
            "SELECT id FROM runs WHERE parent = ? ORDER BY started, rowid", (run_id,)
        )
        return [r["id"] for r in rows]

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

    def round_counts(self, run_id: str, round_number: int) -> dict[str, int]:
        """The units of one round, counted by state."""
        rows = self.db.execute(
            "SELECT state, COUNT(*) AS n FROM units WHERE run = ? AND round = ? GROUP BY state",
            (run_id, round_number),
        )
        return {r["state"]: r["n"] for r in rows}

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
        def work() -> None:
            self._run(
                "INSERT OR REPLACE INTO attempts (run, round, unit, n, rung, host, started)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, round_number, unit_id, n, rung, host, self.clock()),
            )
            self._run(
                "UPDATE units SET state = 'running', attempts = ?"
                " WHERE run = ? AND round = ? AND id = ? AND state NOT IN ('succeeded', 'failed')",
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
    ) -> bool:
        """Record an attempt's end (and, for a success, the hashes of what it staged);
        with ``outcome`` (the attempt decided the unit's fate) settle the unit in the
        same transaction.  False if the attempt had already been settled (or
        interrupted), or the unit had."""

        def work() -> bool:
            settled = self._run(
                "UPDATE attempts SET finished = ?, status = ?, exit_code = ?, reason = ?,"
                " duration = ?, retry_after = ?, host = ?"
                " WHERE run = ? AND round = ? AND unit = ? AND n = ? AND status IS NULL",
                (
                    self.clock(),
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
            if not settled:
                return False
            self._run(
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
            return outcome is None or self._settle(run_id, outcome)

        return self._atomic(work)

    def unit_settled(self, run_id: str, outcome: Outcome) -> bool:
        """Settle a unit once; False if it was already settled."""
        return self._atomic(lambda: self._settle(run_id, outcome))

    def _settle(self, run_id: str, outcome: Outcome) -> bool:
        return (
            self._run(
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
        def work() -> None:
            self._run(
                "UPDATE units SET state = 'interrupted' WHERE run = ? AND round = ? AND id = ?"
                " AND state NOT IN ('succeeded', 'failed')",
                (run_id, round_number, unit_id),
            )
            self._run(
                "UPDATE attempts SET status = 'interrupted', finished = ?, reason = 'interrupted'"
                " WHERE run = ? AND round = ? AND unit = ? AND status IS NULL",
                (self.clock(), run_id, round_number, unit_id),
            )

        self._atomic(work)

    def attempts(self, run_id: str) -> list[sqlite3.Row]:
        return list(
            self.db.execute("SELECT * FROM attempts WHERE run = ? ORDER BY started", (run_id,))
        )

    def attempt_counts(self, run_id: str) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT status, COUNT(*) AS n FROM attempts WHERE run = ? GROUP BY status", (run_id,)
        )
        return {str(r["status"]): r["n"] for r in rows}

    def host_attempts(self, run_id: str) -> dict[str, dict[str, int]]:
        """Per host, the run's attempts counted by status."""
        rows = self.db.execute(
            "SELECT host, status, COUNT(*) AS n FROM attempts WHERE run = ? GROUP BY host, status",
            (run_id,),
        )
        found: dict[str, dict[str, int]] = {}
        for r in rows:
            found.setdefault(str(r["host"]), {})[str(r["status"])] = r["n"]
        return found

    # Changes ------------------------------------------------------------------

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


__all__ = [
    "Journal",
    "RunRow",
    "UnitRow",
    "new_run_id",
    "no_state",
]


def no_state(state_dir: Path) -> StateError:
    """What a read-only command says where no run ever wrote a journal."""
    return StateError(
        f"no fanout state in {state_dir} (no runs yet here; --state-dir names another)"
    )


def _open_read_only(path: Path) -> sqlite3.Connection:
    """Open the journal for reading only (status, report, retry's look-up): nothing is
    created, neither the state directory, nor the journal, its tables, its indexes or
    the reserve, and no migration runs.  (Beside an existing journal, SQLite's WAL
    mode may leave its ``-wal`` and ``-shm`` files, as any reader does: they hold no
    data of fanout's and a run has them anyway.)  A journal an older fanout wrote is read as it
    is: the reads select columns by name and none of them needs a migrated column (a
    missing index only makes them slower); the next ``fanout run`` upgrades it."""
    if not path.is_file():
        raise no_state(path.parent)
    try:
        db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)
        # The journal is a database with runs in it, not any file of that name.
        db.execute("SELECT 1 FROM runs LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise StateError(f"cannot read the journal {path}: {exc}") from None
    return db


def _code(exc: sqlite3.Error) -> int:
    return int(getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]
