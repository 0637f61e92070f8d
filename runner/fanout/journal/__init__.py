"""The crash-safe journal: every run, unit and attempt in SQLite under the state dir.

An attempt is written as dispatched before its worker starts and as settled when it
ends, each in its own short transaction (WAL mode), so a coordinator killed with
SIGKILL loses nothing: ``--resume`` finds the units that had not settled and runs them
again, never one that had (``attempts`` holds how a settle stays one transaction).

The parts, each owning its rows: ``store`` the connection, the one write transaction,
the full-disk reserve and the mapping of sqlite3's errors; ``runs`` the runs and
rounds; ``attempts`` the units and attempts as a run writes them; ``usage`` what
the attempts used of the APIs through the gateway; ``compute`` their active
seconds and memory-seconds; ``ceilings`` what the limits learned, kept for the job's
next run; ``queries`` the read-only queries of resume, status and the report;
``reuse`` fingerprints across runs: reused results, quarantine streaks;
``history`` a job over time: its runs one row each, its quarantined units;
``past`` what a job's units took in its earlier runs, for the next run's estimate;
``pages`` what a run's page reads (``view``);
``stretches`` a run's latest stretch and its attempts, for the spans ``traces`` exports;
``tables`` the schema and the rows it returns.  ``Journal`` is all of them over one
connection.
"""

from __future__ import annotations

from .attempts import Attempts
from .ceilings import Ceilings
from .history import History, NeedsPerson, RunHistory
from .pages import Pages
from .past import Past
from .queries import FailedUnit
from .reuse import (
    Earlier,
    Reuse,
    Settled,
    SettledWriter,
    Streak,
    Success,
    Successes,
)
from .runs import Runs
from .store import no_state
from .stretches import Stretch, StretchAttempt, Stretches
from .tables import KeptCeiling, RunRow, UnitRow, new_run_id
from .usage import Usage
from .worktime import Compute

__all__ = [
    "Earlier",
    "FailedUnit",
    "Journal",
    "KeptCeiling",
    "NeedsPerson",
    "RunHistory",
    "RunRow",
    "Settled",
    "SettledWriter",
    "Streak",
    "Stretch",
    "StretchAttempt",
    "Success",
    "Successes",
    "UnitRow",
    "new_run_id",
    "no_state",
]


class Journal(Runs, Attempts, Pages, Usage, Compute, Ceilings, Reuse, History, Past, Stretches):
    """One SQLite file per state directory, shared by every job that uses it."""
