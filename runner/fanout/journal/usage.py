"""What the attempts' requests through the API gateway used, per attempt and API, and
its sums per unit, per API and per run (the report's tables, the run's budget on
resume)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from ..outcome import ApiUsage
from .store import Store, unit_pages

_SUMS = (
    "SUM(requests) AS requests, SUM(input_tokens) AS input_tokens,"
    " SUM(output_tokens) AS output_tokens, SUM(cache_read_tokens) AS cache_read_tokens,"
    " SUM(cache_write_tokens) AS cache_write_tokens, SUM(cost_usd) AS cost_usd,"
    " SUM(queued_seconds) AS queued_seconds, SUM(throttles) AS throttles,"
    " SUM({reserved}) AS reserved_usd"
)

# One attempt's usage as the gateway books it: (round, unit id, attempt number, usage).
Booking = tuple[int, str, int, Iterable[ApiUsage]]


class Usage(Store):
    """Writes and reads of ``usage``."""

    def record_usage(
        self, run_id: str, round_number: int, unit_id: str, n: int, usage: Iterable[ApiUsage]
    ) -> None:
        self.record_usages(run_id, [(round_number, unit_id, n, usage)])

    def record_usages(self, run_id: str, bookings: Iterable[Booking]) -> None:
        """Each attempt's usage so far, in one transaction: its rows replaced whole (the
        gateway books an attempt's running totals, never increments, so writing them
        again, at its end or from a resumed run, counts nothing twice)."""
        rows = [
            (
                run_id,
                round_number,
                unit_id,
                n,
                u.api,
                u.requests,
                u.input_tokens,
                u.output_tokens,
                u.cache_read_tokens,
                u.cache_write_tokens,
                u.cost_usd,
                u.queued_seconds,
                u.throttles,
                u.reserved_usd,
            )
            for round_number, unit_id, n, usage in bookings
            for u in usage
        ]
        if not rows:
            return
        self._atomic(
            lambda: self.db.executemany(
                "INSERT OR REPLACE INTO usage (run, round, unit, n, api, requests,"
                " input_tokens, output_tokens, cache_read_tokens, cache_write_tokens,"
                " cost_usd, queued_seconds, throttles, reserved_usd)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        )

    @property
    def _usage_sums(self) -> str:
        """``_SUMS`` over this journal: one an older fanout wrote, opened read-only
        (``fanout report``), has no ``reserved_usd`` column; it reserved nothing."""
        reserved = "reserved_usd" if "reserved_usd" in self._columns("usage") else "0.0"
        return _SUMS.format(reserved=reserved)

    def usage_totals(self, run_id: str) -> list[ApiUsage]:
        """The run's usage per API, by API name."""
        sql = f"SELECT api, {self._usage_sums} FROM usage WHERE run = ? GROUP BY api ORDER BY api"  # noqa: S608
        return [_usage(row) for row in self.db.execute(sql, (run_id,))]

    def usage_of(
        self, run_id: str, units: Iterable[tuple[int, str]]
    ) -> dict[tuple[int, str], list[ApiUsage]]:
        """The usage of each (round, unit id) of ``units`` (a page of units, for a
        report that streams) summed over its attempts, per API."""
        found: dict[tuple[int, str], list[ApiUsage]] = {}
        sums = self._usage_sums
        for number, page, marks in unit_pages(units):
            sql = (
                f"SELECT unit, api, {sums} FROM usage WHERE run = ? AND round = ?"  # noqa: S608
                f" AND unit IN ({marks}) GROUP BY unit, api ORDER BY unit, api"
            )
            for row in self.db.execute(sql, (run_id, number, *page)):
                found.setdefault((number, row["unit"]), []).append(_usage(row))
        return found

    def unit_spent(self, run_id: str, unit_id: str, rounds: int) -> float:
        """USD one unit spent in the run's rounds 1 to ``rounds``: every attempt and API,
        a resumed run's included (what ``task.budget`` is held to).  The rounds are
        listed so each is a lookup in the primary key, not a scan of the run's rows:
        this is asked before every attempt of a budgeted unit."""
        numbers = list(range(1, rounds + 1))
        marks = ", ".join("?" * len(numbers))  # placeholders only, never values
        sql = (
            "SELECT COALESCE(SUM(cost_usd), 0.0) FROM usage"  # noqa: S608
            f" WHERE run = ? AND round IN ({marks}) AND unit = ?"
        )
        row = self.db.execute(sql, (run_id, *numbers, unit_id)).fetchone()
        return float(row[0])

    def record_unit_budget(self, run_id: str, usd: float | None) -> None:
        """The run's ``task.budget`` now (a resumed run may have changed it)."""
        self._write("UPDATE runs SET unit_budget = ? WHERE id = ?", (usd, run_id))

    def unit_budget(self, run_id: str) -> float | None:
        """The run's ``task.budget`` as its last stretch had it, None without one."""
        try:
            row = self.db.execute("SELECT unit_budget FROM runs WHERE id = ?", (run_id,)).fetchone()
        except sqlite3.OperationalError:  # a journal from before, opened read-only
            return None
        return None if row is None or row[0] is None else float(row[0])

    def has_usage(self, run_id: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM usage WHERE run = ? LIMIT 1", (run_id,)).fetchone()
            is not None
        )


def _usage(row: sqlite3.Row) -> ApiUsage:
    get = row.__getitem__
    return ApiUsage(
        api=str(get("api")),
        requests=int(get("requests")),
        input_tokens=int(get("input_tokens")),
        output_tokens=int(get("output_tokens")),
        cache_read_tokens=int(get("cache_read_tokens")),
        cache_write_tokens=int(get("cache_write_tokens")),
        cost_usd=float(get("cost_usd")),
        queued_seconds=float(get("queued_seconds")),
        throttles=int(get("throttles")),
        reserved_usd=float(get("reserved_usd")),
    )
