"""The journal's read-only queries over a run's units, attempts and changes: what
resume, status, the report and the exit code read, each page by page where a run may
hold 100k units."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..outcome import UnitState
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


# A unit that needs no output tail in the report: it succeeded, here or in an earlier run.
_DONE = f"('{UnitState.SUCCEEDED}', '{UnitState.REUSED}')"
# Whether a text that ``_unit_object`` extracts holds a NUL character (written
# ``\u0000`` in JSON): SQLite's ``json_extract`` returns it cut at the NUL.  No rung name
# or file path can hold one; an origin could (a JSON pointer a job file spells with
# ``\u0000``).
_NUL = r"instr(u.last, '\u0000') OR instr(u.data, '\u0000') OR instr(u.collected, '\u0000')"
_ATTEMPTS = "FROM attempts a WHERE a.run = u.run AND a.round = u.round AND a.unit = u.id"


def _unit_object(attempt_columns: set[str], with_memory: bool, *, summed: bool = True) -> str:
    """The SQL of report.json's object for the unit row ``u`` (see
    ``Queries.unit_objects``), in the key order report.json has always had; the keys
    after ``gibSeconds`` are added by the caller.  A unit reused from another run adds
    ``reusedFrom``: ``json_object`` cannot leave a key out, so that is a second object,
    chosen per row."""
    memory = "a.memory" if "memory" in attempt_columns else "NULL"  # an older fanout's journal
    head = (
        "'unit', u.id, 'round', u.round, 'state', u.state,"
        " 'rung', COALESCE(json_extract(u.last, '$.rung'), ''), 'attempts', u.attempts,"
        " 'workerSeconds', round(u.worker_seconds, 3), 'reason', u.reason,"
        " 'origin', json_extract(u.data, '$.origin'),"
        " 'collected', CASE WHEN u.collected = '[]' THEN json_array() ELSE"
        " json((SELECT json_group_array(json_extract(c.value, '$.path'))"
        " FROM json_each(u.collected) c)) END"
    )
    active = f"(SELECT COALESCE(SUM(a.duration), 0) {_ATTEMPTS})"
    if summed:  # the row's sum, or its attempts' for a row an older fanout wrote
        active = f"COALESCE(u.active_seconds, {active})"
    tail = f", 'activeSeconds', round({active}, 3)"
    if with_memory:
        # An attempt that ran (duration > 0) with no memory makes the sum unknown: null.
        tail += (
            f", 'gibSeconds', (SELECT CASE WHEN SUM({memory} IS NULL AND a.duration > 0) > 0"
            f" THEN NULL ELSE round(COALESCE(SUM(a.duration * {memory}), 0) / {2**30}.0, 3)"
            f" END {_ATTEMPTS})"
        )
    return (
        f"CASE WHEN u.reused_from IS NULL OR u.reused_from = '' THEN json_object({head}{tail})"
        f" ELSE json_object({head}, 'reusedFrom', u.reused_from{tail}) END"
    )


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

    def unit_objects(
        self,
        run_id: str,
        *,
        with_memory: bool = True,
        units: Iterable[tuple[int, str]] | None = None,
        batch: int = 500,
    ) -> Iterator[tuple[int, str, str, str | None]]:
        """Each unit as report.json lists it, made by SQLite: (round, id, the object's
        JSON text up to its ``changes``, and the output tail if the unit did not
        succeed or reuse, else None), every unit of every round in order, or those of
        ``units`` (round, id pairs, read a page a round at a time) in the order given.

        The object is ``json_object`` over the row: the rung and origin extracted, the
        collected paths, the active seconds (the row's running sum of its attempts'
        durations; a row an older fanout wrote sums its attempts in one index seek) and,
        ``with_memory``, the GiB-seconds (summed from the attempts: null if one that ran
        had no memory), the figures rounded to milliseconds.  Nothing of a unit is
        parsed or built in Python: that was two thirds of a 100k-unit report (issue 26)."""
        summed = "active_seconds" in self._columns("units")  # not in an older journal
        unit = _unit_object(self._columns("attempts"), with_memory, summed=summed)
        sql = (
            f"SELECT u.round, u.id, {unit},"  # noqa: S608 - constant SQL
            f" CASE WHEN u.state IN {_DONE} THEN NULL ELSE u.tail END, {_NUL}, u.idx"
            " FROM units u"
        )
        cursor = self.db.cursor()
        cursor.row_factory = None  # tuples: a name lookup per field was a tenth of a report
        if units is not None:
            order = {key: n for n, key in enumerate(units)}
            found = []
            for number, page, marks in unit_pages(order):
                where = f" WHERE u.run = ? AND u.round = ? AND u.id IN ({marks})"
                found += cursor.execute(sql + where, (run_id, number, *page)).fetchall()
            found.sort(key=lambda row: order[(row[0], row[1])])
            yield from (self._whole(run_id, row) for row in found)
            return
        numbers = [
            r[0]
            for r in cursor.execute(
                "SELECT DISTINCT round FROM units WHERE run = ? ORDER BY round", (run_id,)
            )
        ]
        page_sql = sql + (
            " WHERE u.run = ? AND u.round = ? AND u.idx > COALESCE(?, -1) ORDER BY u.idx LIMIT ?"
        )
        for number in numbers:
            after = None
            while True:
                rows = cursor.execute(page_sql, (run_id, number, after, batch)).fetchall()
                yield from (self._whole(run_id, row) for row in rows)
                if len(rows) < batch:
                    break
                after = rows[-1][-1]

    def _whole(self, run_id: str, row: tuple[Any, ...]) -> tuple[int, str, str, str | None]:
        """A row of ``unit_objects``, its object made again from the unit's JSON where
        SQLite's ``json_extract`` would cut a text at a NUL character (``_NUL``)."""
        number, unit_id, head, tail, nul = row[:5]
        if not nul:
            return number, unit_id, head, tail
        last, data, collected = self.db.execute(
            "SELECT last, data, collected FROM units WHERE run = ? AND round = ? AND id = ?",
            (run_id, number, unit_id),
        ).fetchone()
        record = json.loads(head)
        rung = json.loads(last).get("rung")
        record["rung"] = "" if rung is None else rung
        record["origin"] = json.loads(data).get("origin")
        record["collected"] = [c["path"] for c in json.loads(collected)]
        return number, unit_id, json.dumps(record, ensure_ascii=False, separators=(",", ":")), tail

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
