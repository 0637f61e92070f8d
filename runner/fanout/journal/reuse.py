"""What a recurring job knows of its units across runs: the results an unchanged unit
reuses, the failures it is not run again for, and the streaks that quarantine it.

- A unit's row keeps its ``fingerprint`` (``run.fingerprints``) and ``inputs`` (the
  digest of what the fingerprint is made of, before rendering).  ``successes`` keeps
  the newest success of each fingerprint of a job: what ``units.reuse = "succeeded"``
  takes instead of running a unit, found by its inputs (an unchanged unit, without
  rendering it) or its fingerprint; a reused row's ``reused_from`` names the run whose
  folder holds its files.
- Within a run, a unit's row of an earlier round says whether a later round runs it
  again: not when it failed (or succeeded) with the same fingerprint.
- ``streaks``: a unit that failed the same way in consecutive runs, one row per job and
  unit.  A failure in the run that last failed it only updates the row (a run is one
  step of a streak, whatever its rounds); a different failure or fingerprint starts it
  again; a success ends it.  ``units.quarantineAfter`` runs of it quarantine the unit
  until its fingerprint changes or it is released.

Reads go by pages of unit ids or fingerprints, one index seek each, so a run of 100,000
units never holds them all.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..outcome import CollectedFile, UnitState
from .store import Store
from .tables import unit_data

if TYPE_CHECKING:
    # Annotations only: the backlog imports the spec (see tables.unit_row).
    from ..backlog.units import Unit


class Success(NamedTuple):
    """An earlier run's success of a fingerprint: the run whose folder holds its
    collected files, and what it staged (fan-in compares the workspace with it), both
    as the journal keeps them (JSON), parsed only when asked: a run reusing 100,000
    units copies them through.  A row as the journal reads it (``Reuse.all_successes``
    reads every success of a job a round, 100,000 in 0.2 s; a dataclass each took
    twice that)."""

    inputs: str
    fingerprint: str
    unit_id: str
    run: str
    collected_json: str
    staged_json: str

    @property
    def collected(self) -> tuple[CollectedFile, ...]:
        if self.collected_json == "[]":
            return ()
        return tuple(CollectedFile(**c) for c in json.loads(self.collected_json))


class Successes:
    """Every success kept for a job (``Reuse.all_successes``): by the inputs of its
    unit (an unchanged unit is found without rendering it) and by its fingerprint."""

    def __init__(self, successes: Iterable[Success] = ()) -> None:
        self._by_fingerprint = {success.fingerprint: success for success in successes}
        self._fingerprints = {s.inputs: s.fingerprint for s in self._by_fingerprint.values()}

    def fingerprint_of(self, inputs: str) -> str | None:
        """The fingerprint of the success kept for ``inputs``, if one is."""
        return self._fingerprints.get(inputs)

    def get(self, fingerprint: str) -> Success | None:
        return self._by_fingerprint.get(fingerprint)

    def __len__(self) -> int:
        return len(self._by_fingerprint)


@dataclass(frozen=True, kw_only=True, slots=True)
class Earlier:
    """A unit's row in an earlier round of the same run."""

    round: int
    state: UnitState
    fingerprint: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Streak:
    """A unit's failures alike in consecutive runs (see the module docstring)."""

    unit: str
    fingerprint: str
    failure: str
    runs: int
    first_run: str
    first_at: float
    last_run: str
    last_at: float
    reason: str
    cost_usd: float
    released: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "failure": self.failure,
            "runs": self.runs,
            "firstRun": self.first_run,
            "firstSeen": self.first_at,
            "lastRun": self.last_run,
            "lastSeen": self.last_at,
            "reason": self.reason,
            "costUsd": round(self.cost_usd, 6),
        }


class Settled(NamedTuple):
    """A unit a round settles without running it, reused or quarantined: its row as
    the journal keeps it (``Reuse.add_settled``).  No records for a reused unit (its
    row in the run it was reused from has them): a round holds these rows until its
    selection ends (``run.selection``), 100,000 of them for a run that reuses as many,
    so they are plain tuples, made once."""

    unit_id: str
    idx: int
    origin: str
    fingerprint: str
    inputs: str
    state: UnitState
    reason: str
    reused_from: str | None = None
    # As the journal keeps them (JSON): a reused unit's are its success's.
    collected_json: str = "[]"
    staged_json: str = "{}"
    # The unit's data with its records; None for a reused unit, whose data is only
    # where it was selected from (made by the insert).
    data: str | None = None

    @classmethod
    def of(
        cls,
        unit: Unit,
        state: UnitState,
        reason: str,
        *,
        reused_from: str | None = None,
        collected_json: str = "[]",
        staged_json: str = "{}",
    ) -> Settled:
        return cls(
            unit.id,
            unit.index,
            unit.origin,
            unit.fingerprint,
            unit.inputs,
            state,
            reason,
            reused_from,
            collected_json,
            staged_json,
            None if state is UnitState.REUSED else unit_data(unit),
        )


# Values per query at most: under SQLite's limit on a statement's parameters.
_PAGE = 500
# Settled rows an insert at most, when SQLite takes their parameters (11 each; 32,766 a
# statement from SQLite 3.32 on, 999 before): 1,000 rows go in as fast as a statement
# each, without Python's lock, in 5-10 ms (``Reuse.add_settled``).
_SETTLED_ROWS = 1000


def _pages(values: Sequence[str]) -> Iterable[Sequence[str]]:
    for start in range(0, len(values), _PAGE):
        yield values[start : start + _PAGE]


def _streak(row: Any) -> Streak:
    return Streak(
        unit=row["unit"],
        fingerprint=row["fingerprint"],
        failure=row["failure"],
        runs=row["runs"],
        first_run=row["first_run"],
        first_at=row["first_at"],
        last_run=row["last_run"],
        last_at=row["last_at"],
        reason=row["reason"],
        cost_usd=row["cost_usd"],
        released=bool(row["released"]),
    )


class Reuse(Store):
    """Reads and writes of fingerprints, reused and quarantined units, and streaks."""

    def all_successes(self, job: str) -> Successes:
        """Every success kept for ``job``: read once a round, in one range of the
        table (a run that reuses 100,000 units looked each one up by a query, 8 µs a
        unit)."""
        cursor = self.db.cursor()
        cursor.row_factory = None
        rows = cursor.execute(
            "SELECT inputs, fingerprint, unit, run, collected, staged FROM successes WHERE job = ?",
            (job,),
        )
        return Successes(map(Success._make, rows))

    def refresh_inputs(self, job: str, rows: Iterable[tuple[str, str]]) -> None:
        """(fingerprint, inputs): a success reused by its fingerprint from inputs that
        have changed (the job file named another way, a record moved) is found by the
        new inputs next time, without rendering."""
        values = [(inputs, job, fingerprint) for fingerprint, inputs in rows]
        if values:
            self._atomic(
                lambda: self.db.executemany(
                    "UPDATE successes SET inputs = ? WHERE job = ? AND fingerprint = ?",
                    values,
                )
            )

    def earlier_rounds(
        self, run_id: str, round_number: int, ids: Iterable[str]
    ) -> dict[str, Earlier]:
        """Each unit's latest row in a round of ``run_id`` before ``round_number``."""
        found: dict[str, Earlier] = {}
        for page in _pages(sorted(set(ids))):
            marks = ",".join("?" * len(page))
            rows = self.db.execute(
                "SELECT id, round, state, fingerprint FROM units"  # noqa: S608 - constant SQL
                f" WHERE run = ? AND round < ? AND id IN ({marks}) ORDER BY round",
                (run_id, round_number, *page),
            )
            for row in rows:
                found[row["id"]] = Earlier(
                    round=row["round"],
                    state=UnitState(row["state"]),
                    fingerprint=row["fingerprint"],
                )
        return found

    def in_round(self, run_id: str, round_number: int, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` the round has already (a resumed round selecting again)."""
        found: set[str] = set()
        for page in _pages(sorted(set(ids))):
            marks = ",".join("?" * len(page))
            rows = self.db.execute(
                f"SELECT id FROM units WHERE run = ? AND round = ? AND id IN ({marks})",  # noqa: S608 - constant SQL
                (run_id, round_number, *page),
            )
            found.update(row[0] for row in rows)
        return found

    def streaks(self, job: str, ids: Iterable[str]) -> dict[str, Streak]:
        """The failure streaks of ``ids`` in ``job``."""
        found: dict[str, Streak] = {}
        for page in _pages(sorted(set(ids))):
            marks = ",".join("?" * len(page))
            rows = self.db.execute(
                f"SELECT * FROM streaks WHERE job = ? AND unit IN ({marks})",  # noqa: S608 - constant SQL
                (job, *page),
            )
            found.update((row["unit"], _streak(row)) for row in rows)
        return found

    def quarantined(self, job: str, after: int) -> list[Streak]:
        """The units of ``job`` a run quarantines now (``after`` runs failing alike, not
        released), the longest failing first.  None when ``after`` is 0."""
        if after <= 0:
            return []
        rows = self.db.execute(
            "SELECT * FROM streaks WHERE job = ? AND runs >= ? AND released = 0"
            " ORDER BY first_at, unit",
            (job, after),
        )
        return [_streak(row) for row in rows]

    def newly_quarantined(self, job: str, run_id: str, after: int) -> int:
        """Units of ``job`` whose failure in ``run_id`` made their streak reach ``after``
        runs: the next run leaves them quarantined."""
        if after <= 0:
            return 0
        row = self.db.execute(
            "SELECT COUNT(*) FROM streaks WHERE job = ? AND last_run = ? AND runs >= ?"
            " AND released = 0",
            (job, run_id, after),
        ).fetchone()
        return int(row[0])

    def add_settled(self, run_id: str, round_number: int, rows: Sequence[Settled]) -> None:
        """Add units a round settles without running them (reused, quarantined).

        Many rows a statement (``_SETTLED_ROWS``): SQLite inserts them without holding
        Python's lock, which a statement a row (``executemany``) took back between
        rows, waiting each time for the selection on the main thread to let it go
        (``sys.getswitchinterval``, 5 ms): the writer (``SettledWriter``) and the
        selection took turns, and 100,000 reused rows held the selection 1.5 s.  A
        transaction a statement: the journal's main connection, recording the attempts
        of the units that run, waits for one of them at most (for all 100,000 rows in
        one, 0.7 s)."""
        width = len(Settled._fields)
        limit = self.db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        per = max(1, min(_SETTLED_ROWS, (limit - 2) // width))
        row = "(" + ", ".join(["?"] * width) + ")"
        for start in range(0, len(rows), per):
            part = rows[start : start + per]
            self._atomic(
                lambda part=part: self.db.execute(  # type: ignore[misc]
                    "INSERT OR IGNORE INTO units (run, round, id, idx, data, state, reason,"  # noqa: S608 - constant SQL
                    " collected, staged, fingerprint, inputs, reused_from)"
                    " SELECT ?, ?, column1, column2,"
                    " coalesce(column11, json_object('origin', column3)), column6, column7,"
                    " column9, column10, column4, column5, column8"
                    " FROM (VALUES " + ", ".join([row] * len(part)) + ")",
                    [run_id, round_number, *(value for item in part for value in item)],
                )
            )

    def count_unchanged(self, run_id: str, round_number: int, count: int) -> None:
        """``count`` more units of the round were selected but not run: unchanged since
        an earlier round settled them."""
        if count:
            self._atomic(
                lambda: self._run(
                    "INSERT INTO rounds (run, round, unchanged) VALUES (?, ?, ?)"
                    " ON CONFLICT (run, round) DO UPDATE SET"
                    " unchanged = unchanged + excluded.unchanged",
                    (run_id, round_number, count),
                )
            )

    def record_failure(
        self,
        job: str,
        run_id: str,
        unit: Unit,
        *,
        failure: str,
        reason: str,
        spent_usd: float,
    ) -> Streak:
        """``unit`` failed in ``run_id`` (``failure``: its class); its streak after it."""

        def work() -> Streak:
            now = self.clock()
            row = self.db.execute(
                "SELECT * FROM streaks WHERE job = ? AND unit = ?", (job, unit.id)
            ).fetchone()
            same = (
                row is not None
                and row["fingerprint"] == unit.fingerprint
                and row["failure"] == failure
            )
            if same and row["last_run"] == run_id:  # a later round of the same run
                runs, first_run, first_at, prior = (
                    row["runs"],
                    row["first_run"],
                    row["first_at"],
                    row["prior_usd"],
                )
            elif same:
                runs, first_run, first_at = row["runs"] + 1, row["first_run"], row["first_at"]
                prior = row["cost_usd"]
            else:
                runs, first_run, first_at, prior = 1, run_id, now, 0.0
            released = bool(row["released"]) if same and row["last_run"] == run_id else False
            values = (
                job,
                unit.id,
                unit.fingerprint,
                failure,
                runs,
                first_run,
                first_at,
                run_id,
                now,
                reason,
                prior,
                prior + spent_usd,
                int(released),
            )
            self._run(
                "INSERT OR REPLACE INTO streaks (job, unit, fingerprint, failure, runs,"
                " first_run, first_at, last_run, last_at, reason, prior_usd, cost_usd,"
                " released) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                values,
            )
            return Streak(
                unit=unit.id,
                fingerprint=unit.fingerprint,
                failure=failure,
                runs=runs,
                first_run=first_run,
                first_at=first_at,
                last_run=run_id,
                last_at=now,
                reason=reason,
                cost_usd=prior + spent_usd,
                released=released,
            )

        return self._atomic(work)

    def release(self, job: str, unit_id: str) -> Streak | None:
        """Let a quarantined unit run again: the next run starts it, and a failure there
        starts its streak from one.  The streak released, or None if it had none."""

        def work() -> Streak | None:
            row = self.db.execute(
                "SELECT * FROM streaks WHERE job = ? AND unit = ?", (job, unit_id)
            ).fetchone()
            if row is None:
                return None
            self._run(
                "UPDATE streaks SET released = 1, runs = 0 WHERE job = ? AND unit = ?",
                (job, unit_id),
            )
            return _streak(row)

        return self._atomic(work)


class SettledWriter:
    """Writes settled rows (``Reuse.add_settled``) through a connection of its own, on a
    thread of its own, so the selection goes on while they are written: a run that
    reuses 100,000 units reaches a new one at their end without waiting for 100,000
    inserts.  The journal's main connection waits for one of its transactions at most
    (SQLite's one writer at a time, ``timeout``).  ``close`` waits for every write and
    closes the connection; a write's error is raised by its future."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fanout-journal")
        self._store: Reuse | None = None

    def submit(self, run_id: str, round_number: int, rows: Sequence[Settled]) -> Future[None]:
        return self._executor.submit(self._write, run_id, round_number, rows)

    def _write(self, run_id: str, round_number: int, rows: Sequence[Settled]) -> None:
        if self._store is None:  # opened on its thread: a connection is one thread's
            self._store = Reuse(self._path)
        self._store.add_settled(run_id, round_number, rows)

    def close(self) -> Future[None]:
        """Close once the writes submitted are done (the future of that)."""
        future = self._executor.submit(self._close)
        self._executor.shutdown(wait=False)
        return future

    def _close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
