"""What the attempts used of the workers: their active seconds and, where the job
declared ``task.memory``, their byte-seconds (duration x allocated memory), summed per
unit and per run, every attempt counted (retries, lost and interrupted attempts: they
were paid for)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from .store import Store, unit_pages

# An attempt that ran (duration > 0) with no memory declared makes a sum of
# byte-seconds unknown rather than smaller: NULL, never a bill that looks complete.
_SUMS = (
    "COUNT(*) AS attempts, COALESCE(SUM(duration), 0) AS active_seconds,"
    " CASE WHEN SUM({memory} IS NULL AND duration > 0) > 0 THEN NULL"
    " ELSE COALESCE(SUM(duration * {memory}), 0) END AS byte_seconds,"
    " SUM({memory} IS NULL AND duration > 0) AS unallocated,"
    " MIN({memory}) AS memory_min, MAX({memory}) AS memory_max"
)


class Compute(Store):
    """Reads of ``attempts`` as the report's compute accounting sees them."""

    @property
    def _sums(self) -> str:
        """``_SUMS`` over this journal: one an older fanout wrote, opened read-only
        (``fanout report``), has no ``memory`` column; its attempts declared none."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(attempts)")}
        return _SUMS.format(memory="memory" if "memory" in columns else "NULL")

    def compute_totals(self, run_id: str) -> sqlite3.Row:
        """The run's attempts, active seconds, byte-seconds (NULL: unknown), attempts
        that ran without a memory, the smallest and largest memory, and its units."""
        sql = (
            f"SELECT {self._sums}, COUNT(DISTINCT round || ':' || unit) AS units"  # noqa: S608
            " FROM attempts WHERE run = ?"
        )
        row: sqlite3.Row = self.db.execute(sql, (run_id,)).fetchone()
        return row

    def compute_of(
        self, run_id: str, units: Iterable[tuple[int, str]]
    ) -> dict[tuple[int, str], sqlite3.Row]:
        """The sums of each (round, unit id) of ``units`` (a page of units, for a report
        that streams); a unit without attempts is absent."""
        found: dict[tuple[int, str], sqlite3.Row] = {}
        sums = self._sums
        for number, page, marks in unit_pages(units):
            sql = (
                f"SELECT unit, {sums} FROM attempts WHERE run = ? AND round = ?"  # noqa: S608
                f" AND unit IN ({marks}) GROUP BY unit"
            )
            for row in self.db.execute(sql, (run_id, number, *page)):
                found[(number, row["unit"])] = row
        return found
