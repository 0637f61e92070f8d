"""What a run's page reads (``view``): its units as their latest round left them, its
attempts in start order, each unit's spend, one unit's row and attempts, and the
requests each attempt made per API; plain rows, read-only, bounded by the run."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

from .queries import Queries


class Pages(Queries):
    def latest_units(self, run_id: str) -> Iterator[sqlite3.Row]:
        """Each unit in the latest round that selected its id (as report.json counts
        it), in round and selection order: id, round, state, rung, attempts,
        worker_seconds, reason."""
        return self.db.execute(
            "SELECT id, round, state, COALESCE(json_extract(last, '$.rung'), '') AS rung,"  # noqa: S608 - constant SQL
            f" attempts, worker_seconds, reason FROM units WHERE run = ? AND {self._LATEST}"
            " ORDER BY round, idx",
            (run_id,),
        )

    def attempt_rows(self, run_id: str) -> Iterator[sqlite3.Row]:
        """The run's attempts in start order."""
        return self.db.execute(
            "SELECT unit, round, n, rung, host, started, finished, status, exit_code, kind,"
            " reason FROM attempts WHERE run = ? ORDER BY started, unit, n",
            (run_id,),
        )

    def unit_costs(self, run_id: str) -> dict[tuple[int, str], float]:
        """What each (round, unit) spent over every API."""
        return {
            (r["round"], r["unit"]): r["usd"]
            for r in self.db.execute(
                "SELECT round, unit, SUM(cost_usd) AS usd FROM usage WHERE run = ?"
                " GROUP BY round, unit",
                (run_id,),
            )
        }

    def unit_page_row(self, run_id: str, number: int, unit_id: str) -> sqlite3.Row | None:
        """A unit's row in round ``number``, with what its page shows."""
        row: sqlite3.Row | None = self.db.execute(
            "SELECT idx, data, last, reason, tail, collected FROM units"
            " WHERE run = ? AND round = ? AND id = ?",
            (run_id, number, unit_id),
        ).fetchone()
        return row

    def unit_attempts(self, run_id: str, number: int, unit_id: str) -> Iterator[sqlite3.Row]:
        """A unit's attempts in round ``number``, in order."""
        return self.db.execute(
            "SELECT * FROM attempts WHERE run = ? AND round = ? AND unit = ? ORDER BY n",
            (run_id, number, unit_id),
        )

    def attempt_requests(self, run_id: str) -> Iterator[sqlite3.Row]:
        """Each attempt's requests per API: round, unit, n, api, requests."""
        return self.db.execute(
            "SELECT round, unit, n, api, requests FROM usage WHERE run = ?", (run_id,)
        )
