"""What a job's units took in its earlier runs, for the estimate of its next run
(``report.estimate``): per rung, the attempts on it and their durations and costs; per
unit, its attempts, active seconds, byte-seconds and spend, summed by how it ended; per
API, what a unit's requests used.

The sample is every unit row (a round's unit) of the given runs that settled after it
was selected to run: succeeded or failed, with the attempts it made (none for one
failed before a worker started).  Reused and quarantined units ran nothing, and an
interrupted or pending unit's cost is not known until it settles, so neither is in it.

Every read is a grouped query that returns a row per rung, state or API, whatever the
number of units; percentiles are nearest-rank (the smallest value at least p% of the
sample is at or below), picked by SQLite's window functions, so no unit's row leaves
the database.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from .store import Store

# The percentiles the estimate shows.
P50, P90 = 50, 90


@dataclass(frozen=True, kw_only=True, slots=True)
class PastRun:
    """An earlier run of a job that made attempts: its wall time and attempts."""

    id: str
    state: str
    started: float
    wall: float
    attempts: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Spread:
    """A sample of values by its mean and nearest-rank percentiles."""

    mean: float
    p50: float
    p90: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RungHistory:
    """One rung: the units that made an attempt on it, their attempts there, and an
    attempt's duration and cost (over every API)."""

    rung: str
    units: int
    attempts: int
    seconds: Spread
    cost_usd: Spread


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitSums:
    """Sums over the units of a sample (those that ended one way, or all)."""

    units: int = 0
    attempts: int = 0
    seconds: float = 0.0
    # None: an attempt that ran had no memory declared, so no byte-seconds are known.
    byte_seconds: float | None = 0.0
    spend_usd: float = 0.0
    # The sum of each unit's spend squared: its variance, with the mean.
    spend_squares: float = 0.0

    def plus(self, other: UnitSums) -> UnitSums:
        byte_seconds = (
            None
            if self.byte_seconds is None or other.byte_seconds is None
            else self.byte_seconds + other.byte_seconds
        )
        return UnitSums(
            units=self.units + other.units,
            attempts=self.attempts + other.attempts,
            seconds=self.seconds + other.seconds,
            byte_seconds=byte_seconds,
            spend_usd=self.spend_usd + other.spend_usd,
            spend_squares=self.spend_squares + other.spend_squares,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiSums:
    """What the units of a sample used of one API, summed over the units: each usage
    field, and the sum of each unit's spend on it squared."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    cost_squares: float = 0.0

    def plus(self, other: ApiSums) -> ApiSums:
        return ApiSums(
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            cost_squares=self.cost_squares + other.cost_squares,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitHistory:
    """The sample's units: sums by how they ended (``succeeded``, ``failed``), a unit's
    spend spread over all of them, how many spent ``budget_usd`` or more, and the APIs'
    sums by how the units ended."""

    by_state: dict[str, UnitSums]
    spend: Spread
    over_budget: int
    apis: dict[str, dict[str, ApiSums]]

    @property
    def all(self) -> UnitSums:
        total = UnitSums()
        for sums in self.by_state.values():
            total = total.plus(sums)
        return total

    def api_all(self, api: str) -> ApiSums:
        total = ApiSums()
        for sums in self.apis.get(api, {}).values():
            total = total.plus(sums)
        return total


def _marks(values: Sequence[str]) -> str:
    return ", ".join("?" * len(values))  # placeholders only, never values


def _rank(p: int) -> str:
    """The nearest rank of percentile ``p`` among ``n`` values, in SQL: ceil(p n / 100)."""
    return f"(({p} * n + 99) / 100)"


class History(Store):
    """Reads of a job's earlier runs for the next run's estimate."""

    def past_runs(self, job: str, limit: int) -> list[PastRun]:
        """The latest ``limit`` runs of ``job`` that made at least one attempt, newest
        first."""
        rows = self.db.execute(
            "SELECT id, state, started, wall, (SELECT COUNT(*) FROM attempts"
            " WHERE attempts.run = runs.id) AS attempts FROM runs WHERE job = ?"
            " AND EXISTS (SELECT 1 FROM attempts WHERE attempts.run = runs.id)"
            " ORDER BY started DESC, rowid DESC LIMIT ?",
            (job, limit),
        )
        return [
            PastRun(
                id=r["id"],
                state=r["state"],
                started=float(r["started"]),
                wall=float(r["wall"]),
                attempts=int(r["attempts"]),
            )
            for r in rows
        ]

    def has_fingerprints(self) -> bool:
        """Whether units carry fingerprints (a journal an older fanout wrote, opened
        read-only, has no such column: nothing in it can be reused)."""
        return "fingerprint" in self._columns("units")

    def rung_history(self, runs: Sequence[str]) -> list[RungHistory]:
        """Per rung name, the sampled units' attempts on it, in the order the rungs were
        first used."""
        if not runs:
            return []
        marks = _marks(runs)
        sql = (
            f"WITH {self._sampled(marks)}, {self._attempt_costs(marks)},"  # noqa: S608 - constant SQL
            " ranked AS (SELECT a.rung, a.duration, a.started,"
            " a.run || ':' || a.round || ':' || a.unit AS unit, COALESCE(c.cost, 0) AS cost,"
            " COUNT(*) OVER (PARTITION BY a.rung) AS n,"
            " ROW_NUMBER() OVER (PARTITION BY a.rung ORDER BY a.duration) AS by_seconds,"
            " ROW_NUMBER() OVER (PARTITION BY a.rung ORDER BY COALESCE(c.cost, 0)) AS by_cost"
            " FROM attempts a JOIN sampled s ON s.run = a.run AND s.round = a.round"
            " AND s.id = a.unit LEFT JOIN costs c ON c.run = a.run AND c.round = a.round"
            " AND c.unit = a.unit AND c.n = a.n)"
            " SELECT rung, COUNT(*) AS attempts, COUNT(DISTINCT unit) AS units,"
            " MIN(started) AS first, AVG(duration) AS seconds_mean, AVG(cost) AS cost_mean,"
            f" MAX(CASE WHEN by_seconds = {_rank(P50)} THEN duration END) AS seconds_p50,"
            f" MAX(CASE WHEN by_seconds = {_rank(P90)} THEN duration END) AS seconds_p90,"
            f" MAX(CASE WHEN by_cost = {_rank(P50)} THEN cost END) AS cost_p50,"
            f" MAX(CASE WHEN by_cost = {_rank(P90)} THEN cost END) AS cost_p90"
            " FROM ranked GROUP BY rung ORDER BY first, rung"
        )
        return [
            RungHistory(
                rung=r["rung"],
                units=int(r["units"]),
                attempts=int(r["attempts"]),
                seconds=Spread(mean=r["seconds_mean"], p50=r["seconds_p50"], p90=r["seconds_p90"]),
                cost_usd=Spread(mean=r["cost_mean"], p50=r["cost_p50"], p90=r["cost_p90"]),
            )
            for r in self.db.execute(sql, (*runs, *runs))
        ]

    def unit_history(self, runs: Sequence[str], *, budget_usd: float | None) -> UnitHistory:
        """The sampled units of ``runs``, summed by how they ended (see the module
        docstring), their spend's spread, and how many spent ``budget_usd`` or more."""
        if not runs:
            return UnitHistory(
                by_state={}, spend=Spread(mean=0.0, p50=0.0, p90=0.0), over_budget=0, apis={}
            )
        marks = _marks(runs)
        memory = "a.memory" if "memory" in self._columns("attempts") else "NULL"
        per_unit = (
            f"WITH {self._sampled(marks)},"  # noqa: S608 - constant SQL
            " tried AS (SELECT s.run, s.round, s.id, s.state, COUNT(a.n) AS attempts,"
            " COALESCE(SUM(a.duration), 0) AS seconds,"
            f" COALESCE(SUM({memory} IS NULL AND a.duration > 0), 0) AS unallocated,"
            f" COALESCE(SUM(a.duration * {memory}), 0) AS byte_seconds"
            " FROM sampled s LEFT JOIN attempts a ON a.run = s.run AND a.round = s.round"
            " AND a.unit = s.id GROUP BY s.run, s.round, s.id),"
            f" spent AS (SELECT run, round, unit, SUM(cost_usd) AS spend FROM usage"
            f" WHERE run IN ({marks}) GROUP BY run, round, unit),"
            " per_unit AS (SELECT t.*, COALESCE(p.spend, 0) AS spend FROM tried t"
            " LEFT JOIN spent p ON p.run = t.run AND p.round = t.round AND p.unit = t.id)"
        )
        by_state: dict[str, UnitSums] = {}
        over = 0
        sums = (
            f"{per_unit} SELECT state, COUNT(*) AS units, SUM(attempts) AS attempts,"  # noqa: S608 - constant SQL
            " SUM(seconds) AS seconds, SUM(byte_seconds) AS byte_seconds,"
            " SUM(unallocated) AS unallocated, SUM(spend) AS spend,"
            " SUM(spend * spend) AS squares, SUM(spend >= ?) AS over"
            " FROM per_unit GROUP BY state ORDER BY state"
        )
        for r in self.db.execute(sums, (*runs, *runs, budget_usd)):
            by_state[r["state"]] = UnitSums(
                units=int(r["units"]),
                attempts=int(r["attempts"]),
                seconds=float(r["seconds"]),
                byte_seconds=None if r["unallocated"] else float(r["byte_seconds"]),
                spend_usd=float(r["spend"]),
                spend_squares=float(r["squares"]),
            )
            over += int(r["over"] or 0)
        spread = (
            f"{per_unit}, ranked AS (SELECT spend, COUNT(*) OVER () AS n,"  # noqa: S608 - constant SQL
            " ROW_NUMBER() OVER (ORDER BY spend) AS k FROM per_unit)"
            f" SELECT AVG(spend) AS mean, MAX(CASE WHEN k = {_rank(P50)} THEN spend END) AS p50,"
            f" MAX(CASE WHEN k = {_rank(P90)} THEN spend END) AS p90 FROM ranked"
        )
        row = self.db.execute(spread, (*runs, *runs)).fetchone()
        spend = Spread(mean=row["mean"] or 0.0, p50=row["p50"] or 0.0, p90=row["p90"] or 0.0)
        return UnitHistory(
            by_state=by_state, spend=spend, over_budget=over, apis=self._api_sums(runs)
        )

    def _api_sums(self, runs: Sequence[str]) -> dict[str, dict[str, ApiSums]]:
        marks = _marks(runs)
        sql = (
            f"WITH {self._sampled(marks)},"  # noqa: S608 - constant SQL
            " used AS (SELECT run, round, unit, api, SUM(requests) AS requests,"
            " SUM(input_tokens) AS input_tokens, SUM(output_tokens) AS output_tokens,"
            " SUM(cache_read_tokens) AS cache_read_tokens,"
            " SUM(cache_write_tokens) AS cache_write_tokens, SUM(cost_usd) AS cost"
            f" FROM usage WHERE run IN ({marks}) GROUP BY run, round, unit, api)"
            " SELECT s.state, u.api, SUM(u.requests) AS requests,"
            " SUM(u.input_tokens) AS input_tokens, SUM(u.output_tokens) AS output_tokens,"
            " SUM(u.cache_read_tokens) AS cache_read_tokens,"
            " SUM(u.cache_write_tokens) AS cache_write_tokens, SUM(u.cost) AS cost,"
            " SUM(u.cost * u.cost) AS squares FROM used u JOIN sampled s ON s.run = u.run"
            " AND s.round = u.round AND s.id = u.unit GROUP BY s.state, u.api"
            " ORDER BY u.api, s.state"
        )
        found: dict[str, dict[str, ApiSums]] = {}
        for r in self.db.execute(sql, (*runs, *runs)):
            found.setdefault(r["api"], {})[r["state"]] = ApiSums(
                requests=int(r["requests"]),
                input_tokens=int(r["input_tokens"]),
                output_tokens=int(r["output_tokens"]),
                cache_read_tokens=int(r["cache_read_tokens"]),
                cache_write_tokens=int(r["cache_write_tokens"]),
                cost_usd=float(r["cost"]),
                cost_squares=float(r["squares"]),
            )
        return found

    @staticmethod
    def _sampled(marks: str) -> str:
        """The sample (see the module docstring), as a common table expression."""
        return (
            "sampled AS (SELECT run, round, id, state FROM units"  # noqa: S608 - constant SQL
            f" WHERE run IN ({marks}) AND state IN ('succeeded', 'failed'))"
        )

    @staticmethod
    def _attempt_costs(marks: str) -> str:
        """Each attempt's cost over every API, as a common table expression."""
        return (
            "costs AS (SELECT run, round, unit, n, SUM(cost_usd) AS cost FROM usage"  # noqa: S608 - constant SQL
            f" WHERE run IN ({marks}) GROUP BY run, round, unit, n)"
        )

    def _columns(self, table: str) -> set[str]:
        try:
            return {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
        except sqlite3.Error:
            return set()
