"""A stretch of a run read back: when it began and ended, and the attempts it made, in
order, each with its unit's fate and what its requests used (what ``traces`` exports).

A stretch is the run from its start, or its last resume, to the end recorded for it.
Its attempts are those started in it, and those a killed stretch left unsettled, which
the resume settled as interrupted (``reopen_run``): they end in this stretch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .store import Store


@dataclass(frozen=True, kw_only=True, slots=True)
class Stretch:
    """The run's current stretch: ``began`` (the epoch's seconds), ``ended`` (None:
    never recorded), and per round the first start and last end of its attempts."""

    run: str
    job: str
    state: str
    began: float
    ended: float | None
    rounds: dict[int, tuple[float, float]]


@dataclass(frozen=True, kw_only=True, slots=True)
class StretchAttempt:
    """One attempt of a stretch; ``used``: whether any usage row was recorded for it
    (then the tokens and cost are its sums over the APIs it called)."""

    round: int
    unit: str
    n: int
    rung: str
    host: str
    started: float
    finished: float | None
    status: str
    reason: str
    exit_code: int | None
    kind: str
    unit_state: str
    unit_reason: str
    used: bool
    input_tokens: int
    output_tokens: int
    cost_usd: float


class Stretches(Store):
    """Reads of a run's latest stretch; none of them writes."""

    def stretch(self, run_id: str) -> Stretch:
        row = self.db.execute(
            "SELECT job, state, started, stretch, finished FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        began = row["stretch"] if row["stretch"] is not None else row["started"]
        rounds = {
            r["round"]: (float(r["first"]), float(r["last"]))
            for r in self.db.execute(
                "SELECT round, MIN(started) AS first, MAX(COALESCE(finished, started)) AS last"
                " FROM attempts WHERE run = ? AND (started >= ? OR finished >= ?)"
                " GROUP BY round",
                (run_id, began, began),
            )
        }
        return Stretch(
            run=run_id,
            job=row["job"],
            state=row["state"],
            began=float(began),
            ended=row["finished"] if row["finished"] is None else float(row["finished"]),
            rounds=rounds,
        )

    def stretch_attempts(self, stretch: Stretch) -> Iterator[StretchAttempt]:
        """The stretch's attempts by round, unit id and number, streamed from one query
        in the attempts' key order (no sort, nothing held: a 100k-unit run is read row
        by row).  The caller must not write to the journal while it reads."""
        cursor = self.db.execute(
            "SELECT a.round, a.unit, a.n, a.rung, a.host, a.started, a.finished,"
            " COALESCE(a.status, 'interrupted') AS status, a.reason, a.exit_code, a.kind,"
            " u.state AS unit_state, u.reason AS unit_reason, COUNT(g.api) AS apis,"
            " COALESCE(SUM(g.input_tokens), 0) AS input_tokens,"
            " COALESCE(SUM(g.output_tokens), 0) AS output_tokens,"
            " COALESCE(SUM(g.cost_usd), 0) AS cost_usd"
            " FROM attempts AS a"
            " JOIN units AS u ON u.run = a.run AND u.round = a.round AND u.id = a.unit"
            " LEFT JOIN usage AS g"
            " ON g.run = a.run AND g.round = a.round AND g.unit = a.unit AND g.n = a.n"
            " WHERE a.run = ? AND (a.started >= ? OR a.finished >= ?)"
            " GROUP BY a.round, a.unit, a.n ORDER BY a.round, a.unit, a.n",
            (stretch.run, stretch.began, stretch.began),
        )
        for row in cursor:
            yield StretchAttempt(
                round=row["round"],
                unit=row["unit"],
                n=row["n"],
                rung=row["rung"],
                host=row["host"],
                started=float(row["started"]),
                finished=None if row["finished"] is None else float(row["finished"]),
                status=row["status"],
                reason=row["reason"],
                exit_code=row["exit_code"],
                kind=row["kind"],
                unit_state=row["unit_state"],
                unit_reason=row["unit_reason"],
                used=row["apis"] > 0,
                input_tokens=int(row["input_tokens"]),
                output_tokens=int(row["output_tokens"]),
                cost_usd=float(row["cost_usd"]),
            )
