"""A job over time as a person reads it: its runs, one row each (``fanout history``),
and its units that need a person (quarantined: ``fanout status``, the report).

A run's row says what it selected, ran, reused, settled and left quarantined or
unchanged, its attempts, tokens and spend.  A nightly job has years of runs of up to
100k units each, so nothing here is asked per run or per unit: the runs are one query,
and each table they draw on (units, rounds, attempts, usage) one grouped query over
those runs, whose rows SQLite reads by the run's index prefix.  A unit counts in its
latest round, as ``Queries.unit_counts`` counts it; it "ran" if any of its rounds had
an attempt.

The quarantined units are the rows of ``streaks`` (``reuse`` writes them) that reached
the threshold and were not released.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from ..outcome import RunState, UnitState
from .reuse import Streak, _streak
from .store import Store

# The runs asked about: the job's newest ``?`` (-1: all), as a subquery each grouped
# query filters on (no list of ids as parameters, however many runs a job has).
_RUNS = "SELECT id FROM runs WHERE job = ? ORDER BY started DESC, rowid DESC LIMIT ?"


@dataclass(frozen=True, kw_only=True, slots=True)
class NeedsPerson:
    """A job's quarantined units as a person sees them: how many, how many of them a
    given run quarantined, and the first few (see ``History.needs_person``)."""

    count: int
    new: int
    shown: tuple[Streak, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunHistory:
    """One run of a job as ``fanout history`` shows it."""

    run: str
    started: float
    finished: float | None
    state: RunState
    # The name of the cron trigger that started it; None: started by hand.
    trigger: str | None
    retry_of: str | None
    rounds: int
    wall_seconds: float
    # Units by the state of their latest round (every UnitState present, 0 if none).
    states: dict[UnitState, int]
    # Units with at least one attempt in any round.
    ran: int
    # Selected again in a later round but not run: unchanged since they failed.
    unchanged: int
    attempts: int
    # What its attempts used through the gateway, summed over APIs (0 without one).
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    used_apis: bool = False

    @property
    def selected(self) -> int:
        """Distinct units the run selected (over its rounds)."""
        return sum(self.states.values())

    @property
    def units_per_minute(self) -> float | None:
        """Units run per minute of wall time; None for a run without wall time."""
        return self.ran * 60 / self.wall_seconds if self.wall_seconds > 0 else None


# Units by the state of their latest round, as ``Queries.unit_counts`` counts them, in
# one statement that reads no unit row of a run's first round: every row counted by
# state (the covering index units_by_state), less each row a later round superseded,
# found from that later row (a unit's row in round r > 1 supersedes exactly one, its
# row of the round before it that selected it).  Most runs have one round, and later
# rounds are what failed: a tenth of the units, not all of them.  (Seeking each unit's
# later rows instead, as ``unit_counts`` does for one run, took twice as long.)
_UNITS = (
    "SELECT run, state, SUM(n) AS n FROM ("  # noqa: S608 - constant SQL
    "SELECT run, state, COUNT(*) AS n FROM units WHERE run IN (" + _RUNS + ")"
    " GROUP BY run, state"
    " UNION ALL SELECT earlier.run, earlier.state, -COUNT(*) FROM units later"
    " JOIN units earlier ON earlier.run = later.run AND earlier.id = later.id"
    " AND earlier.round = (SELECT MAX(before.round) FROM units before"
    " WHERE before.run = later.run AND before.id = later.id AND before.round < later.round)"
    " WHERE later.run IN (" + _RUNS + ") AND later.round > 1"
    " GROUP BY earlier.run, earlier.state"
    ") GROUP BY run, state HAVING SUM(n) > 0"
)


class History(Store):
    """Reads of a job's runs over time and of its quarantined units; none writes."""

    def needs_person(
        self, job: str, after: int, *, limit: int, run_id: str | None = None
    ) -> NeedsPerson:
        """The units of ``job`` quarantined now (``after`` runs failing alike, not
        released): how many, how many of them ``run_id`` quarantined (its failure made
        their streak reach ``after``), and the first ``limit``: those first, then the
        longest failing.  None when ``after`` is 0, or in a journal from before streaks
        (an older fanout's, opened read-only: it has no such table)."""
        if after <= 0 or not self._has_streaks():
            return NeedsPerson(count=0, new=0, shown=())
        where = "FROM streaks WHERE job = ? AND runs >= ? AND released = 0"
        counts = self.db.execute(
            f"SELECT COUNT(*), COALESCE(SUM(last_run = ?), 0) {where}",
            (run_id, job, after),
        ).fetchone()
        rows = self.db.execute(
            f"SELECT * {where} ORDER BY last_run = ? DESC, first_at, unit LIMIT ?",
            (job, after, run_id, limit),
        )
        return NeedsPerson(
            count=int(counts[0]), new=int(counts[1]), shown=tuple(_streak(row) for row in rows)
        )

    def _has_streaks(self) -> bool:
        row = self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'streaks'"
        ).fetchone()
        return row is not None

    def run_count(self, job: str) -> int:
        """How many runs of ``job`` the journal holds."""
        row = self.db.execute("SELECT COUNT(*) FROM runs WHERE job = ?", (job,)).fetchone()
        return int(row[0])

    def history(self, job: str, last: int | None = None) -> list[RunHistory]:
        """The newest ``last`` runs of ``job`` (None: all), oldest first."""
        limit = -1 if last is None else last
        scope = (job, limit)
        runs = list(
            self.db.execute(
                "SELECT id, started, finished, state, trigger, parent, round, wall FROM runs"  # noqa: S608 - constant SQL
                " WHERE id IN (" + _RUNS + ") ORDER BY started, rowid",
                scope,
            )
        )
        if not runs:
            return []
        states: dict[str, dict[UnitState, int]] = {}
        for row in self.db.execute(_UNITS, scope * 2):
            states.setdefault(row["run"], {})[UnitState(row["state"])] = row["n"]
        rounds = {
            row["run"]: row
            for row in self.db.execute(
                f"SELECT run, COUNT(*) AS rounds, SUM({self._unchanged}) AS unchanged"  # noqa: S608 - constant SQL
                " FROM rounds WHERE run IN (" + _RUNS + ") GROUP BY run",
                scope,
            )
        }
        # The units that ran: those with an attempt, in any round.
        attempts = {
            row["run"]: row
            for row in self.db.execute(
                "SELECT run, COUNT(*) AS attempts, COUNT(DISTINCT unit) AS ran"  # noqa: S608 - constant SQL
                " FROM attempts WHERE run IN (" + _RUNS + ") GROUP BY run",
                scope,
            )
        }
        usage = {
            row["run"]: row
            for row in self.db.execute(
                "SELECT run, SUM(input_tokens) AS input_tokens,"  # noqa: S608 - constant SQL
                " SUM(cache_read_tokens) AS cache_read_tokens,"
                " SUM(cache_write_tokens) AS cache_write_tokens,"
                " SUM(output_tokens) AS output_tokens, SUM(cost_usd) AS cost_usd"
                " FROM usage WHERE run IN (" + _RUNS + ") GROUP BY run",
                scope,
            )
        }
        return [
            _history(
                row,
                states=states.get(row["id"], {}),
                rounds=rounds.get(row["id"]),
                attempts=attempts.get(row["id"]),
                usage=usage.get(row["id"]),
            )
            for row in runs
        ]

    @property
    def _unchanged(self) -> str:
        """``rounds.unchanged``, or 0 in a journal from before it (opened read-only)."""
        return "unchanged" if "unchanged" in self._columns("rounds") else "0"


def _history(
    row: sqlite3.Row,
    *,
    states: dict[UnitState, int],
    rounds: sqlite3.Row | None,
    attempts: sqlite3.Row | None,
    usage: sqlite3.Row | None,
) -> RunHistory:
    trigger = json.loads(row["trigger"] or "{}")
    name = trigger.get("name") if isinstance(trigger, dict) else None
    return RunHistory(
        run=row["id"],
        started=row["started"],
        finished=row["finished"],
        state=RunState(row["state"]),
        trigger=str(name) if name else None,
        retry_of=row["parent"],
        rounds=int(rounds["rounds"]) if rounds is not None else 0,
        wall_seconds=float(row["wall"]),
        states={state: states.get(state, 0) for state in UnitState},
        ran=int(attempts["ran"]) if attempts is not None else 0,
        unchanged=int(rounds["unchanged"] or 0) if rounds is not None else 0,
        attempts=int(attempts["attempts"]) if attempts is not None else 0,
        input_tokens=int(usage["input_tokens"]) if usage is not None else 0,
        cache_read_tokens=int(usage["cache_read_tokens"]) if usage is not None else 0,
        cache_write_tokens=int(usage["cache_write_tokens"]) if usage is not None else 0,
        output_tokens=int(usage["output_tokens"]) if usage is not None else 0,
        cost_usd=float(usage["cost_usd"]) if usage is not None else 0.0,
        used_apis=usage is not None,
    )
