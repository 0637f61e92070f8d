"""The journal's tables, and the rows it returns: what a run and a unit look like once
they have been through SQLite."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..outcome import CollectedFile, RunState, UnitState

if TYPE_CHECKING:
    # Imported where used (a Unit where one is made): the backlog and pacing import the
    # spec (a fifth of a second), which a journal read (`fanout report`) never needs.
    from ..backlog.units import Unit
    from ..pacing.ceiling import Learned

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    job_file TEXT NOT NULL,
    started REAL NOT NULL,
    -- When the current stretch began (the run started or was last resumed): the wall
    -- time of a stretch a SIGKILL cut short is measured from it.
    stretch REAL,
    finished REAL,
    state TEXT NOT NULL,
    round INTEGER NOT NULL DEFAULT 1,
    apply INTEGER NOT NULL DEFAULT 0,
    parent TEXT,
    trigger TEXT NOT NULL DEFAULT '{}',
    wall REAL NOT NULL DEFAULT 0,
    note TEXT NOT NULL DEFAULT '',
    limits TEXT NOT NULL DEFAULT '{}',
    -- task.budget in USD as the run's last stretch had it (NULL: none), for the report
    unit_budget REAL,
    -- units.quarantineAfter as the run's last stretch had it (NULL: a run before it was
    -- recorded): status and the report read which streaks quarantine without the job file
    quarantine_after INTEGER
);
CREATE TABLE IF NOT EXISTS rounds (
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    records INTEGER NOT NULL DEFAULT 0,
    selected INTEGER NOT NULL DEFAULT 0,
    selection_done INTEGER NOT NULL DEFAULT 0,
    complete INTEGER NOT NULL DEFAULT 0,
    -- Selected again, but not run: unchanged since they failed in an earlier round.
    unchanged INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run, round)
);
CREATE TABLE IF NOT EXISTS units (
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    data TEXT NOT NULL,
    state TEXT NOT NULL,
    rung INTEGER NOT NULL DEFAULT 0,
    rung_attempts INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    worker_seconds REAL NOT NULL DEFAULT 0,
    -- The durations of all its attempts, summed as each is settled or interrupted (the
    -- report's active seconds, read without a seek into its attempts); NULL in a row an
    -- older fanout wrote, whose report sums its attempts instead.
    active_seconds REAL,
    reason TEXT NOT NULL DEFAULT '',
    tail TEXT NOT NULL DEFAULT '',
    last TEXT NOT NULL DEFAULT '{}',
    collected TEXT NOT NULL DEFAULT '[]',
    staged TEXT NOT NULL DEFAULT '{}',
    -- What decides the unit's result, hashed (run/fingerprints.py), and the digest of
    -- what that is made of before rendering; '' before there were any.
    fingerprint TEXT NOT NULL DEFAULT '',
    inputs TEXT NOT NULL DEFAULT '',
    -- A reused unit's result: the run it was made in (its files are in that run's folder).
    reused_from TEXT,
    PRIMARY KEY (run, round, id)
);
CREATE INDEX IF NOT EXISTS units_by_state ON units (run, round, state, idx);
-- Reading a run's units in selection order, page by page, without sorting the run.
CREATE INDEX IF NOT EXISTS units_in_order ON units (run, round, idx);
-- A unit id's latest round (what status, the report and the exit code count) by one
-- index seek, instead of a scan of the run per unit.
CREATE INDEX IF NOT EXISTS units_by_id ON units (run, id, round);
CREATE TABLE IF NOT EXISTS attempts (
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    unit TEXT NOT NULL,
    n INTEGER NOT NULL,
    rung TEXT NOT NULL,
    host TEXT NOT NULL DEFAULT '',
    started REAL NOT NULL,
    finished REAL,
    status TEXT,
    exit_code INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    duration REAL NOT NULL DEFAULT 0,
    retry_after REAL,
    -- The class its agent's output read as (agents.taxonomy.Kind), '' without an agent.
    kind TEXT NOT NULL DEFAULT '',
    -- Bytes of memory the attempt was allocated (task.memory, or its rung's), NULL if
    -- the job declared none: the report bills duration x memory (``compute``).
    memory INTEGER,
    PRIMARY KEY (run, round, unit, n)
);
-- What each attempt's requests through the gateway used, one row per API it called:
-- rewritten whole as its requests start and end (each one's reservation written before
-- it is sent, batched; see gateway/books.py), and when the attempt ends, however it
-- ends, so a resumed run's budget counts the money a killed attempt spent, its
-- requests in flight at their reservation (``reserved_usd`` of ``cost_usd``).
CREATE TABLE IF NOT EXISTS usage (
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    unit TEXT NOT NULL,
    n INTEGER NOT NULL,
    api TEXT NOT NULL,
    requests INTEGER NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL,
    cache_write_tokens INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    queued_seconds REAL NOT NULL,
    throttles INTEGER NOT NULL,
    reserved_usd REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (run, round, unit, n, api)
);
CREATE TABLE IF NOT EXISTS changes (
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    unit TEXT NOT NULL,
    path TEXT NOT NULL,
    added INTEGER NOT NULL,
    removed INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (run, round, unit, path)
);
-- The ceiling each limit learned from throttles, kept per job for its next run (a cron
-- fire starts at yesterday's pace): ``name`` is a [[limits]] entry's, '*' for all
-- dispatch or 'api:<name>' for an API of the gateway; ``learned`` is
-- ``ceiling.Learned.as_dict`` as JSON, ``text`` what fanout said of it, ``at`` when.
-- A unit of a job that failed the same way (``failure``: the class, and for an agent its
-- kind) in ``runs`` runs in a row with one ``fingerprint``, for quarantine; a success
-- deletes the row, ``fanout release`` marks it released.  ``cost_usd``: what those runs
-- spent on it, ``prior_usd`` of it before ``last_run``.
CREATE TABLE IF NOT EXISTS streaks (
    job TEXT NOT NULL,
    unit TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    failure TEXT NOT NULL,
    runs INTEGER NOT NULL,
    first_run TEXT NOT NULL,
    first_at REAL NOT NULL,
    last_run TEXT NOT NULL,
    last_at REAL NOT NULL,
    reason TEXT NOT NULL,
    prior_usd REAL NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    released INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job, unit)
);
-- The newest success of each fingerprint of a job, what reuse looks up (``reuse``): by
-- the fingerprint, or by ``inputs``, the digest of all the fingerprint is made of
-- before rendering (an unchanged unit is found without rendering it), with the run
-- whose folder holds its files and what it collected and staged.  Kept in the order of
-- its key: a round reads a job's successes in one range (100,000 of them in 0.12 s;
-- through the table's rowids, 0.31 s).
CREATE TABLE IF NOT EXISTS successes (
    job TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    inputs TEXT NOT NULL,
    unit TEXT NOT NULL,
    run TEXT NOT NULL,
    collected TEXT NOT NULL,
    staged TEXT NOT NULL,
    PRIMARY KEY (job, fingerprint)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS successes_by_inputs ON successes (job, inputs);
CREATE TABLE IF NOT EXISTS ceilings (
    job TEXT NOT NULL,
    name TEXT NOT NULL,
    learned TEXT NOT NULL,
    text TEXT NOT NULL,
    at REAL NOT NULL,
    run TEXT,
    PRIMARY KEY (job, name)
);
"""

# Columns added since the first journal format: (table, column, how to add it).
MIGRATIONS = (
    ("runs", "stretch", "ALTER TABLE runs ADD COLUMN stretch REAL"),
    ("attempts", "kind", "ALTER TABLE attempts ADD COLUMN kind TEXT NOT NULL DEFAULT ''"),
    ("runs", "unit_budget", "ALTER TABLE runs ADD COLUMN unit_budget REAL"),
    ("attempts", "memory", "ALTER TABLE attempts ADD COLUMN memory INTEGER"),
    ("usage", "reserved_usd", "ALTER TABLE usage ADD COLUMN reserved_usd REAL NOT NULL DEFAULT 0"),
    ("units", "fingerprint", "ALTER TABLE units ADD COLUMN fingerprint TEXT NOT NULL DEFAULT ''"),
    ("units", "reused_from", "ALTER TABLE units ADD COLUMN reused_from TEXT"),
    ("units", "inputs", "ALTER TABLE units ADD COLUMN inputs TEXT NOT NULL DEFAULT ''"),
    ("rounds", "unchanged", "ALTER TABLE rounds ADD COLUMN unchanged INTEGER NOT NULL DEFAULT 0"),
    ("runs", "quarantine_after", "ALTER TABLE runs ADD COLUMN quarantine_after INTEGER"),
    # No default: the rows already there stay NULL (their sum is not known here), and
    # NULL plus a duration stays NULL, so a unit that straddles the upgrade is summed.
    ("units", "active_seconds", "ALTER TABLE units ADD COLUMN active_seconds REAL"),
)
# The states of a settled unit, for SQL (``outcome.SETTLED``).
SETTLED_SQL = "('succeeded', 'failed', 'reused', 'quarantined')"


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRow:
    id: str
    job: str
    job_file: str
    started: float
    finished: float | None
    state: RunState
    round: int
    apply: bool
    parent: str | None
    trigger: dict[str, Any]
    wall: float
    note: str
    limits: dict[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class UnitRow:
    unit: Unit
    round: int
    state: UnitState
    rung: int
    rung_attempts: int
    attempts: int
    failures: int
    worker_seconds: float
    reason: str
    tail: str
    last: dict[str, Any]
    collected: tuple[CollectedFile, ...]
    staged: dict[str, str]
    # The run a reused unit's result was made in (its files are in that run's folder).
    reused_from: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class KeptCeiling:
    """One row of ``ceilings``: what a limit of a job learned, said as ``text``, ``at``
    a time (the epoch's seconds) by the run ``run``."""

    name: str
    learned: Learned
    text: str
    at: float
    run: str | None


def new_run_id(now: float | None = None) -> str:
    moment = datetime.fromtimestamp(now or time.time(), UTC)
    return f"{moment:%Y%m%dT%H%M%S}-{secrets.token_hex(2)}"


# What a limit learned, in a limit's statistics: the latest stretch's that knows any.
_LEARNED_KEYS = ("learned", "learnedText")


def merge_limits(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Limit statistics over the stretches of a resumed run: counts add up, and what a
    limit learned is the latest stretch's (an earlier one's while the latest has
    learned nothing).  An API's row ("api:<name>") has no counts, only what it learned;
    a row an older fanout wrote has no learned fields."""
    merged = dict(old)
    for name, stats in new.items():
        before = merged.get(name)
        if before is None:
            merged[name] = stats
            continue
        row = {**before, **stats}
        for key in ("starts", "throttles"):
            if key in before and key in stats:
                row[key] = before[key] + stats[key]
        if "pausedSeconds" in before and "pausedSeconds" in stats:
            row["pausedSeconds"] = round(before["pausedSeconds"] + stats["pausedSeconds"], 3)
        if stats.get("learned") is None and before.get("learned") is not None:
            row.update({key: before.get(key) for key in _LEARNED_KEYS})
        merged[name] = row
    return merged


def unit_data(unit: Unit) -> str:
    return json.dumps({"items": list(unit.items), "origin": unit.origin, "group": unit.group})


def unit_row(row: sqlite3.Row) -> UnitRow:
    from ..backlog.units import Unit

    data = json.loads(row["data"])
    unit = Unit(
        id=row["id"],
        index=row["idx"],
        items=tuple(data.get("items", ())),
        origin=data["origin"],
        group=data.get("group"),
        fingerprint=row["fingerprint"],
        inputs=row["inputs"],
    )
    return UnitRow(
        unit=unit,
        round=row["round"],
        state=UnitState(row["state"]),
        rung=row["rung"],
        rung_attempts=row["rung_attempts"],
        attempts=row["attempts"],
        failures=row["failures"],
        worker_seconds=row["worker_seconds"],
        reason=row["reason"],
        tail=row["tail"],
        last=json.loads(row["last"]),
        collected=tuple(CollectedFile(**c) for c in json.loads(row["collected"])),
        staged=json.loads(row["staged"]),
        reused_from=row["reused_from"],
    )


def run_row(row: sqlite3.Row) -> RunRow:
    return RunRow(
        id=row["id"],
        job=row["job"],
        job_file=row["job_file"],
        started=row["started"],
        finished=row["finished"],
        state=RunState(row["state"]),
        round=row["round"],
        apply=bool(row["apply"]),
        parent=row["parent"],
        trigger=json.loads(row["trigger"]),
        wall=row["wall"],
        note=row["note"],
        limits=json.loads(row["limits"]),
    )
