"""What a job's units took in its earlier runs, for the estimate of its next run
(``report.estimate``): per rung, the attempts on it and their durations and costs; per
unit, its attempts, active seconds, byte-seconds and spend, summed by how it ended; per
API, what a unit's requests used.

The units are the unit rows (a round's unit) of the given runs that settled after they
were selected to run: succeeded or failed, with the attempts they made (none for one
that failed before a worker started).  Reused and quarantined units ran nothing, and an
interrupted or pending unit's cost is not known until it settles, so neither counts.

A sample of about ``SAMPLE_UNITS`` of them is read (``History.sample``), each way a
unit ended (succeeded, failed) sampled on its own: all of its units when there are few
enough, else those whose hash of their round and index falls in the first part of the
hash's range.  So the same units every time (a plan says the same twice), spread evenly
over the runs and the backlog whatever its order, and a few failed units among 100,000
successes are all in it.  Each sampled unit stands for ``settled / sampled`` units of
its kind (its weight), so sums, means and percentiles are the whole's, estimated: exact
when nothing was left out.  A bounded sample keeps the reads fast: five runs of 100,000
units take about 0.3 s where reading all 650,000 of their attempts took 12 s
(bench/estimate.py).

Every read is a grouped query that returns a row per rung, state or API; percentiles
are nearest-rank by weight (the smallest value at or below which at least p% of the
weight is), picked by SQLite's window functions, so no unit's row leaves the database.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .store import Store

# The percentiles the estimate shows.
P50, P90 = 50, 90
# About the most units an estimate reads (see the module docstring).
SAMPLE_UNITS = 10_000
# A unit is in a sample when this hash of its round and index (Fibonacci hashing:
# key x 2^32 / golden ratio, mod 2^32) is below its kind's threshold.
_HASH = "(((idx + 1 + round * 1000003) * 2654435761) % 4294967296)"
_RANGE = 2**32
STATES = ("succeeded", "failed")


@dataclass(frozen=True, kw_only=True, slots=True)
class Stratum:
    """The units of one kind (how they ended): ``sampled`` of the ``settled``, those
    whose hash is below ``threshold``."""

    settled: int
    sampled: int
    threshold: int = _RANGE

    @property
    def weight(self) -> float:
        return self.settled / self.sampled if self.sampled else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """The units an estimate reads of ``runs``, by how they ended."""

    runs: tuple[str, ...]
    strata: Mapping[str, Stratum] = field(default_factory=dict)

    @property
    def settled(self) -> int:
        return sum(stratum.settled for stratum in self.strata.values())

    @property
    def units(self) -> int:
        """The units read."""
        return sum(stratum.sampled for stratum in self.strata.values())


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
    """Values by their mean and nearest-rank percentiles."""

    mean: float
    p50: float
    p90: float


@dataclass(frozen=True, kw_only=True, slots=True)
class RungHistory:
    """One rung: the units that made an attempt on it, their attempts there, and an
    attempt's duration and cost (over every API)."""

    rung: str
    units: float
    attempts: float
    seconds: Spread
    cost_usd: Spread


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitSums:
    """Sums over units (those that ended one way, or all)."""

    units: float = 0.0
    attempts: float = 0.0
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
    """What units used of one API, summed over the units: each usage field, and the sum
    of each unit's spend on it squared."""

    requests: float = 0.0
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    cache_read_tokens: float = 0.0
    cache_write_tokens: float = 0.0
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
    """The units: sums by how they ended (``succeeded``, ``failed``), a unit's spend
    spread over all of them, how many spent ``budget_usd`` or more, and the APIs' sums
    by how the units ended."""

    by_state: dict[str, UnitSums]
    spend: Spread
    over_budget: float
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


def _sampled(sample: Sample) -> tuple[str, tuple[object, ...]]:
    """The sample as a common table expression (each unit with its weight ``w``), and
    its parameters."""
    strata = [(state, sample.strata.get(state, Stratum(settled=0, sampled=0))) for state in STATES]
    sql = (
        "sampled AS (SELECT run, round, id, state,"  # noqa: S608 - constant SQL
        " CASE state WHEN 'failed' THEN ? ELSE ? END AS w FROM units"
        f" WHERE run IN ({_marks(sample.runs)}) AND state IN ('succeeded', 'failed')"
        f" AND {_HASH} < CASE state WHEN 'failed' THEN ? ELSE ? END)"
    )
    weights = (strata[1][1].weight, strata[0][1].weight)
    thresholds = (strata[1][1].threshold, strata[0][1].threshold)
    return sql, (*weights, *sample.runs, *thresholds)


def _percentile(p: int, value: str, cumulative: str, total: str) -> str:
    """Nearest-rank percentile ``p`` by weight, as an aggregate over ranked rows."""
    return f"MIN(CASE WHEN {cumulative} * 100 >= {p} * {total} * (1 - 1e-9) THEN {value} END)"


class Past(Store):
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

    def sample(self, runs: Sequence[str], limit: int = SAMPLE_UNITS) -> Sample:
        """The units of ``runs`` an estimate reads (see the module docstring): the
        failed ones up to half of ``limit``, the succeeded ones up to the rest."""
        runs = tuple(runs)
        if not runs:
            return Sample(runs=runs)
        where = f"run IN ({_marks(runs)}) AND state = ?"
        count = f"SELECT COUNT(*) FROM units WHERE {where}"  # noqa: S608 - constant SQL
        counts = {
            state: int(self.db.execute(count, (*runs, state)).fetchone()[0]) for state in STATES
        }
        room = {"failed": min(counts["failed"], limit // 2)}
        room["succeeded"] = limit - room["failed"]
        strata = {}
        for state, settled in counts.items():
            if settled <= room[state]:
                strata[state] = Stratum(settled=settled, sampled=settled)
                continue
            threshold = _RANGE * room[state] // settled
            sql = f"SELECT COUNT(*) FROM units WHERE {where} AND {_HASH} < ?"  # noqa: S608 - constant SQL
            sampled = int(self.db.execute(sql, (*runs, state, threshold)).fetchone()[0])
            strata[state] = Stratum(settled=settled, sampled=sampled, threshold=threshold)
        return Sample(runs=runs, strata=strata)

    def rung_history(self, sample: Sample) -> list[RungHistory]:
        """Per rung name, the units' attempts on it, in the order the rungs were first
        used."""
        if not sample.units:
            return []
        sampled, parameters = _sampled(sample)
        cumulative = "SUM(w) OVER (PARTITION BY rung ORDER BY {} ROWS UNBOUNDED PRECEDING)"
        sql = (
            f"WITH {sampled}, per_attempt AS (SELECT a.rung, a.duration, a.started, s.w,"  # noqa: S608 - constant SQL
            " a.run || ':' || a.round || ':' || a.unit AS unit,"
            " (SELECT COALESCE(SUM(cost_usd), 0) FROM usage u WHERE u.run = a.run"
            " AND u.round = a.round AND u.unit = a.unit AND u.n = a.n) AS cost"
            # CROSS JOIN: the sample drives, each unit's attempts found by its key.
            " FROM sampled s CROSS JOIN attempts a ON a.run = s.run AND a.round = s.round"
            " AND a.unit = s.id),"
            " ranked AS (SELECT *, SUM(w) OVER (PARTITION BY rung) AS total,"
            f" {cumulative.format('duration')} AS by_seconds,"
            f" {cumulative.format('cost')} AS by_cost FROM per_attempt),"
            " reached AS (SELECT rung, SUM(w) AS units FROM (SELECT DISTINCT rung, unit, w"
            " FROM per_attempt) GROUP BY rung)"
            " SELECT ranked.rung, SUM(w) AS attempts, reached.units, MIN(started) AS first,"
            " SUM(w * duration) / SUM(w) AS seconds_mean, SUM(w * cost) / SUM(w) AS cost_mean,"
            f" {_percentile(P50, 'duration', 'by_seconds', 'total')} AS seconds_p50,"
            f" {_percentile(P90, 'duration', 'by_seconds', 'total')} AS seconds_p90,"
            f" {_percentile(P50, 'cost', 'by_cost', 'total')} AS cost_p50,"
            f" {_percentile(P90, 'cost', 'by_cost', 'total')} AS cost_p90"
            " FROM ranked JOIN reached ON reached.rung = ranked.rung"
            " GROUP BY ranked.rung ORDER BY first, ranked.rung"
        )
        return [
            RungHistory(
                rung=r["rung"],
                units=float(r["units"]),
                attempts=float(r["attempts"]),
                seconds=Spread(mean=r["seconds_mean"], p50=r["seconds_p50"], p90=r["seconds_p90"]),
                cost_usd=Spread(mean=r["cost_mean"], p50=r["cost_p50"], p90=r["cost_p90"]),
            )
            for r in self.db.execute(sql, parameters)
        ]

    def unit_history(self, sample: Sample, *, budget_usd: float | None) -> UnitHistory:
        """The units, summed by how they ended (see the module docstring), their spend's
        spread, and how many spent ``budget_usd`` or more."""
        if not sample.units:
            return UnitHistory(
                by_state={}, spend=Spread(mean=0.0, p50=0.0, p90=0.0), over_budget=0.0, apis={}
            )
        sampled, parameters = _sampled(sample)
        memory = "a.memory" if "memory" in self._columns("attempts") else "NULL"
        sql = (
            f"WITH {sampled},"  # noqa: S608 - constant SQL
            " tried AS (SELECT s.run, s.round, s.id, s.state, s.w, COUNT(a.n) AS attempts,"
            " COALESCE(SUM(a.duration), 0) AS seconds,"
            f" COALESCE(SUM({memory} IS NULL AND a.duration > 0), 0) AS unallocated,"
            f" COALESCE(SUM(a.duration * {memory}), 0) AS byte_seconds"
            " FROM sampled s LEFT JOIN attempts a ON a.run = s.run AND a.round = s.round"
            " AND a.unit = s.id GROUP BY s.run, s.round, s.id),"
            " per_unit AS (SELECT *, (SELECT COALESCE(SUM(cost_usd), 0) FROM usage u"
            " WHERE u.run = tried.run AND u.round = tried.round AND u.unit = tried.id)"
            " AS spend FROM tried),"
            " ranked AS (SELECT *, SUM(w) OVER () AS total,"
            " SUM(w) OVER (ORDER BY spend ROWS UNBOUNDED PRECEDING) AS by_spend FROM per_unit)"
            " SELECT state, SUM(w) AS units, SUM(w * attempts) AS attempts,"
            " SUM(w * seconds) AS seconds, SUM(w * byte_seconds) AS byte_seconds,"
            " SUM(unallocated) AS unallocated, SUM(w * spend) AS spend,"
            " SUM(w * spend * spend) AS squares, SUM(w * (spend >= ?)) AS over,"
            # The percentiles are of every unit: each one is in a state's row.
            f" {_percentile(P50, 'spend', 'by_spend', 'total')} AS p50,"
            f" {_percentile(P90, 'spend', 'by_spend', 'total')} AS p90"
            " FROM ranked GROUP BY state ORDER BY state DESC"
        )
        by_state: dict[str, UnitSums] = {}
        over = 0.0
        p50: float | None = None
        p90: float | None = None
        for r in self.db.execute(sql, (*parameters, budget_usd)):
            by_state[r["state"]] = UnitSums(
                units=float(r["units"]),
                attempts=float(r["attempts"]),
                seconds=float(r["seconds"]),
                byte_seconds=None if r["unallocated"] else float(r["byte_seconds"]),
                spend_usd=float(r["spend"]),
                spend_squares=float(r["squares"]),
            )
            over += float(r["over"] or 0.0)
            # A state's row holds a percentile only if it is reached within the state's
            # units: the least such value is the one of all units.
            p50 = r["p50"] if p50 is None or (r["p50"] is not None and r["p50"] < p50) else p50
            p90 = r["p90"] if p90 is None or (r["p90"] is not None and r["p90"] < p90) else p90
        total = sum(sums.units for sums in by_state.values())
        mean = sum(sums.spend_usd for sums in by_state.values()) / total if total else 0.0
        return UnitHistory(
            by_state=by_state,
            spend=Spread(mean=mean, p50=p50 or 0.0, p90=p90 or 0.0),
            over_budget=over,
            apis=self._api_sums(sample),
        )

    def _api_sums(self, sample: Sample) -> dict[str, dict[str, ApiSums]]:
        used = f"SELECT 1 FROM usage WHERE run IN ({_marks(sample.runs)}) LIMIT 1"  # noqa: S608 - constant SQL
        if self.db.execute(used, sample.runs).fetchone() is None:
            return {}  # no gateway: the sample's scan below would find nothing (0.04 s at 100k)
        sampled, parameters = _sampled(sample)
        sql = (
            f"WITH {sampled},"  # noqa: S608 - constant SQL
            " used AS (SELECT s.state, s.w, u.api, SUM(u.requests) AS requests,"
            " SUM(u.input_tokens) AS input_tokens, SUM(u.output_tokens) AS output_tokens,"
            " SUM(u.cache_read_tokens) AS cache_read_tokens,"
            " SUM(u.cache_write_tokens) AS cache_write_tokens, SUM(u.cost_usd) AS cost"
            " FROM sampled s CROSS JOIN usage u ON u.run = s.run AND u.round = s.round"
            " AND u.unit = s.id GROUP BY s.run, s.round, s.id, u.api)"
            " SELECT state, api, SUM(w * requests) AS requests,"
            " SUM(w * input_tokens) AS input_tokens, SUM(w * output_tokens) AS output_tokens,"
            " SUM(w * cache_read_tokens) AS cache_read_tokens,"
            " SUM(w * cache_write_tokens) AS cache_write_tokens, SUM(w * cost) AS cost,"
            " SUM(w * cost * cost) AS squares FROM used GROUP BY state, api"
            " ORDER BY api, state DESC"
        )
        found: dict[str, dict[str, ApiSums]] = {}
        for r in self.db.execute(sql, parameters):
            found.setdefault(r["api"], {})[r["state"]] = ApiSums(
                requests=float(r["requests"]),
                input_tokens=float(r["input_tokens"]),
                output_tokens=float(r["output_tokens"]),
                cache_read_tokens=float(r["cache_read_tokens"]),
                cache_write_tokens=float(r["cache_write_tokens"]),
                cost_usd=float(r["cost"]),
                cost_squares=float(r["squares"]),
            )
        return found
