"""The journal's read-only queries over a run's units, attempts and changes: what
resume, status, the report and the exit code read, each page by page where a run may
hold 100k units."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .store import Store, unit_pages
from .tables import SETTLED_SQL, UnitRow, unit_row


@dataclass(frozen=True, kw_only=True, slots=True)
class FailedUnit:
    """A unit whose latest round failed, as report.md lists it: its last round's
    reason, rung and attempts, the rounds it failed in, and the units of its reason."""

    id: str
    round: int
    reason: str
    rung: str
    attempts: int
    rounds: int
    in_group: int


class Queries(Store):
    """Reads of ``units``, ``attempts`` and ``changes``; none of them writes."""

    def unsettled_units(
        self, run_id: str, round_number: int, batch: int = 500
    ) -> Iterator[UnitRow]:
        """Units of a round that have not settled, in selection order, read in pages."""
        after = -1
        while True:
            rows = self.db.execute(
                f"SELECT * FROM units WHERE run = ? AND round = ? AND state NOT IN {SETTLED_SQL}"  # noqa: S608 - constant SQL
                " AND idx > ? ORDER BY idx LIMIT ?",
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

    def unit_summaries(
        self, run_id: str, *, with_memory: bool = True, batch: int = 500
    ) -> Iterator[tuple[Any, ...]]:
        """What report.json lists of each unit, in the order of ``units``, as plain
        tuples: its row's id, round, state, rung, attempts, worker_seconds, reason,
        origin, collected (JSON text), tail and reused_from; the sums of its attempts
        (as ``Compute.compute_of`` has them): active seconds (0 without attempts) and
        byte-seconds (NULL if one that ran had no memory; None without ``with_memory``,
        a run none of whose attempts declared one); last, its idx.  SQLite
        extracts the rung and origin and sums the attempts, one index seek a unit, so
        a unit's records, last context and staged hashes are never parsed and no page
        costs a second query: ``unit_row`` was most of a 100k-unit report."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(attempts)")}
        memory = "a.memory" if "memory" in columns else "NULL"  # an older fanout's journal
        attempts = "FROM attempts a WHERE a.run = u.run AND a.round = u.round AND a.unit = u.id"
        byte_seconds = (
            f"(SELECT CASE WHEN SUM({memory} IS NULL AND a.duration > 0) > 0 THEN NULL"
            f" ELSE COALESCE(SUM(a.duration * {memory}), 0) END {attempts})"
            if with_memory
            else "NULL"
        )
        sql = (
            "SELECT u.id, u.round, u.state, COALESCE(json_extract(u.last, '$.rung'), ''),"  # noqa: S608 - constant SQL
            " u.attempts, u.worker_seconds, u.reason, json_extract(u.data, '$.origin'),"
            " u.collected, u.tail, u.reused_from,"
            f" (SELECT COALESCE(SUM(a.duration), 0) {attempts}),"
            f" {byte_seconds}, u.idx"
            " FROM units u WHERE u.run = ? AND u.round = ? AND u.idx > COALESCE(?, -1)"
            " ORDER BY u.idx LIMIT ?"
        )
        cursor = self.db.cursor()
        cursor.row_factory = None  # tuples: a name lookup per field was a tenth of a report
        numbers = [
            r[0]
            for r in cursor.execute(
                "SELECT DISTINCT round FROM units WHERE run = ? ORDER BY round", (run_id,)
            )
        ]
        for number in numbers:
            after = None
            while True:
                rows = cursor.execute(sql, (run_id, number, after, batch)).fetchall()
                yield from rows
                if len(rows) < batch:
                    break
                after = rows[-1][-1]

    def units_with_files(
        self, run_id: str, round_number: int, batch: int = 500
    ) -> Iterator[UnitRow]:
        """The round's succeeded and reused units that collected files, for fan-in, in
        selection order, read in pages (each its own query: the caller writes between
        rows); a run that reuses 100,000 units without files reads none of them."""
        after = -1
        while True:
            rows = self.db.execute(
                "SELECT * FROM units WHERE run = ? AND round = ? AND idx > ?"
                " AND state IN ('succeeded', 'reused') AND collected != '[]'"
                " ORDER BY idx LIMIT ?",
                (run_id, round_number, after, batch),
            ).fetchall()
            yield from (unit_row(row) for row in rows)
            if len(rows) < batch:
                return
            after = rows[-1]["idx"]

    # A unit counts in the latest round that selected its id: a later round's row for
    # the same id supersedes it.  One seek in units_by_id per unit.
    _LATEST = (
        "NOT EXISTS (SELECT 1 FROM units later WHERE later.run = units.run"
        " AND later.id = units.id AND later.round > units.round)"
    )

    def unit_counts(self, run_id: str) -> dict[str, int]:
        """Units of the run's latest round of each unit id, counted by state.  A run of
        one round (most runs) has no later rows to look for: its units are counted in
        the index alone, a quarter of the time at 100k units."""
        (last,) = self.db.execute(
            "SELECT MAX(round) FROM units WHERE run = ?", (run_id,)
        ).fetchone()
        latest = f"AND {self._LATEST}" if last is not None and last > 1 else ""
        rows = self.db.execute(
            f"SELECT state, COUNT(*) AS n FROM units WHERE run = ? {latest}"  # noqa: S608 - constant SQL
            " GROUP BY state",
            (run_id,),
        )
        return {r["state"]: r["n"] for r in rows}

    def unit_count(self, run_id: str) -> int:
        """Rows of the run's units over all its rounds (what report.json lists)."""
        row = self.db.execute("SELECT COUNT(*) AS n FROM units WHERE run = ?", (run_id,)).fetchone()
        return int(row["n"])

    def round_counts(self, run_id: str, round_number: int) -> dict[str, int]:
        """The units of one round, counted by state."""
        rows = self.db.execute(
            "SELECT state, COUNT(*) AS n FROM units WHERE run = ? AND round = ? GROUP BY state",
            (run_id, round_number),
        )
        return {r["state"]: r["n"] for r in rows}

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

    def failure_counts(self, run_id: str) -> tuple[int, int]:
        """How many units' latest round failed, and for how many distinct reasons."""
        row = self.db.execute(
            "SELECT COUNT(*) AS reasons, COALESCE(SUM(n), 0) AS units FROM (SELECT COUNT(*)"  # noqa: S608 - constant SQL
            f" AS n FROM units WHERE run = ? AND state = 'failed' AND {self._LATEST}"
            " GROUP BY reason)",
            (run_id,),
        ).fetchone()
        return int(row["units"]), int(row["reasons"])

    def failed_by_reason(self, run_id: str, limit: int) -> list[FailedUnit]:
        """At most ``limit`` of the units whose latest round failed, grouped by reason
        and dealt round-robin: the first unit of every reason (the reasons with most
        units first, then by their first unit), then the second of each, and so on, so
        a limit that cannot hold every unit still names every reason it can.

        SQLite numbers the failed units within their reason (a window over the failed
        units only, which carry no tail or records here) and returns ``limit`` rows;
        how many rounds each of those failed in is one index seek per returned row."""
        rows = self.db.execute(
            "SELECT failed.*, (SELECT COUNT(*) FROM units other WHERE other.run = ?"  # noqa: S608 - constant SQL
            " AND other.id = failed.id AND other.state = 'failed') AS rounds FROM ("
            " SELECT * FROM (SELECT id, round, idx, reason, attempts,"
            " COALESCE(json_extract(last, '$.rung'), '') AS rung,"
            " ROW_NUMBER() OVER (PARTITION BY reason ORDER BY round, idx) AS nth,"
            " COUNT(*) OVER (PARTITION BY reason) AS in_group,"
            " MIN(round * 4294967296 + idx) OVER (PARTITION BY reason) AS first"
            f" FROM units WHERE run = ? AND state = 'failed' AND {self._LATEST})"
            " WHERE nth <= ? ORDER BY nth, in_group DESC, first LIMIT ?) AS failed"
            " ORDER BY nth, in_group DESC, first",
            (run_id, run_id, limit, limit),
        )
        return [
            FailedUnit(
                id=r["id"],
                round=r["round"],
                reason=r["reason"],
                rung=str(r["rung"]),
                attempts=r["attempts"],
                rounds=r["rounds"],
                in_group=r["in_group"],
            )
            for r in rows
        ]

    def tails(self, run_id: str, units: Iterable[tuple[int, str]]) -> dict[tuple[int, str], str]:
        """The output tail of each (round, unit id) pair of ``units``."""
        found: dict[tuple[int, str], str] = {}
        for number, page, marks in unit_pages(units):
            sql = f"SELECT id, tail FROM units WHERE run = ? AND round = ? AND id IN ({marks})"  # noqa: S608
            for row in self.db.execute(sql, (run_id, number, *page)):
                found[(number, row["id"])] = row["tail"]
        return found

    def units_in_state(self, run_id: str, state: str, limit: int) -> list[UnitRow]:
        """The first ``limit`` units whose latest round is in ``state``, in round and
        selection order (units_by_state finds them; a superseded row costs one seek)."""
        rows = self.db.execute(
            f"SELECT * FROM units WHERE run = ? AND state = ? AND {self._LATEST}"  # noqa: S608 - constant SQL
            " ORDER BY round, idx LIMIT ?",
            (run_id, state, limit),
        )
        return [unit_row(r) for r in rows]

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

    def worker_seconds(self, run_id: str) -> float:
        row = self.db.execute(
            "SELECT COALESCE(SUM(worker_seconds), 0) AS total FROM units WHERE run = ?", (run_id,)
        ).fetchone()
        return float(row["total"])

    def attempts(self, run_id: str) -> list[sqlite3.Row]:
        return list(
            self.db.execute("SELECT * FROM attempts WHERE run = ? ORDER BY started", (run_id,))
        )

    def attempt_counts(self, run_id: str) -> dict[str, int]:
        rows = self.db.execute(
            "SELECT status, COUNT(*) AS n FROM attempts WHERE run = ? GROUP BY status", (run_id,)
        )
        return {str(r["status"]): r["n"] for r in rows}

    def attempt_kinds(self, run_id: str) -> dict[str, int]:
        """The run's attempts of an agent task counted by the class its output read as."""
        rows = self.db.execute(
            "SELECT kind, COUNT(*) AS n FROM attempts WHERE run = ? AND kind != ''"
            " GROUP BY kind ORDER BY kind",
            (run_id,),
        )
        return {str(r["kind"]): r["n"] for r in rows}

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
        for number, page, marks in unit_pages(units):
            sql = f"SELECT * FROM changes WHERE run = ? AND round = ? AND unit IN ({marks})"  # noqa: S608
            found += self.db.execute(sql + " ORDER BY unit, path", (run_id, number, *page))
        return found

    def has_changes(self, run_id: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM changes WHERE run = ? LIMIT 1", (run_id,)).fetchone()
            is not None
        )
