"""The journal's runs and rounds: a run's row from its start to its end (and its
resumption), the rounds it went through, and the runs retried from it."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from ..errors import StateError
from ..outcome import RunState
from .store import Store
from .tables import RunRow, merge_limits, new_run_id, run_row


class Runs(Store):
    """The rows of ``runs`` and ``rounds``."""

    def create_run(
        self,
        *,
        job: str,
        job_file: str,
        apply: bool,
        parent: str | None = None,
        trigger: dict[str, Any] | None = None,
        run_id: str | None = None,
    ) -> str:
        run_id = run_id or new_run_id()
        self._write(
            "INSERT INTO runs (id, job, job_file, started, stretch, state, apply, parent, trigger)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                job,
                job_file,
                now := self.clock(),
                now,
                str(RunState.RUNNING),
                int(apply),
                parent,
                json.dumps(trigger or {}),
            ),
        )
        return run_id

    def run(self, run_id: str) -> RunRow:
        row = self.db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            known = [r.id for r in self.runs(limit=5)]
            hint = f"; recent runs: {', '.join(known)}" if known else "; no runs yet"
            raise StateError(f"no run {run_id!r} in {self.path}{hint}")
        return run_row(row)

    def runs(self, job: str | None = None, limit: int = 20) -> list[RunRow]:
        if job is None:
            rows = self.db.execute("SELECT * FROM runs ORDER BY started DESC LIMIT ?", (limit,))
        else:
            rows = self.db.execute(
                "SELECT * FROM runs WHERE job = ? ORDER BY started DESC LIMIT ?", (job, limit)
            )
        return [run_row(r) for r in rows]

    def last_unfinished(self, job: str) -> RunRow | None:
        """The job's latest run if it did not finish (crashed, interrupted, stopped).
        An older unfinished run is superseded by any run started after it."""
        row = self.db.execute(
            "SELECT * FROM runs WHERE job = ? ORDER BY started DESC, rowid DESC LIMIT 1", (job,)
        ).fetchone()
        return None if row is None or row["state"] == RunState.FINISHED else run_row(row)

    def record_quarantine_after(self, run_id: str, after: int) -> None:
        """The run's ``units.quarantineAfter`` now (a resumed run may have changed it)."""
        self._write("UPDATE runs SET quarantine_after = ? WHERE id = ?", (after, run_id))

    def quarantine_after(self, run_id: str) -> int | None:
        """The ``units.quarantineAfter`` the run's last stretch had; None for a run an
        older fanout recorded (its journal, opened read-only, may lack the column)."""
        try:
            row = self.db.execute(
                "SELECT quarantine_after FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
        except sqlite3.OperationalError:
            return None
        return None if row is None or row[0] is None else int(row[0])

    def retries_of(self, run_id: str) -> list[str]:
        """The runs started as retries of ``run_id`` (``fanout retry``), oldest first."""
        rows = self.db.execute(
            "SELECT id FROM runs WHERE parent = ? ORDER BY started, rowid", (run_id,)
        )
        return [r["id"] for r in rows]

    def finish_run(
        self,
        run_id: str,
        *,
        state: RunState,
        wall: float,
        note: str = "",
        limits: dict[str, Any] | None = None,
    ) -> None:
        """Close a run (this stretch of it: a resumed run adds its wall time)."""

        def work() -> None:
            row = self.db.execute("SELECT limits FROM runs WHERE id = ?", (run_id,)).fetchone()
            merged = merge_limits(json.loads(row["limits"]) if row else {}, limits or {})
            self._run(
                "UPDATE runs SET state = ?, finished = ?, wall = wall + ?, note = ?, limits = ?"
                " WHERE id = ?",
                (str(state), self.clock(), wall, note, json.dumps(merged), run_id),
            )

        self._atomic(work)

    def reopen_run(self, run_id: str) -> None:
        """A resumed run is running again; attempts left dispatched were interrupted.

        A run still marked running was killed (SIGKILL, a crash, a power cut): its last
        stretch never reached ``finish_run``, so its wall time is taken from the journal,
        from the stretch's start to the last attempt it recorded (a start or a settle),
        which is as late as anything is known to have happened in it."""

        def work() -> None:
            row = self.db.execute(
                "SELECT state, stretch FROM runs WHERE id = ?", (run_id,)
            ).fetchone()
            running = row is not None and row["state"] == RunState.RUNNING
            if running and row["stretch"] is not None:
                last = self.db.execute(
                    "SELECT MAX(MAX(started), COALESCE(MAX(finished), 0)) AS last"
                    " FROM attempts WHERE run = ? AND started >= ?",
                    (run_id, row["stretch"]),
                ).fetchone()["last"]
                killed = max(0.0, float(last) - row["stretch"]) if last is not None else 0.0
                self._run("UPDATE runs SET wall = wall + ? WHERE id = ?", (killed, run_id))
            now = self.clock()
            self._run(
                "UPDATE runs SET state = ?, stretch = ? WHERE id = ?",
                (str(RunState.RUNNING), now, run_id),
            )
            self._run(
                "UPDATE attempts SET status = 'interrupted', finished = ?,"
                " reason = 'fanout stopped before it settled' WHERE run = ? AND status IS NULL",
                (now, run_id),
            )
            self._run(
                "UPDATE units SET state = 'interrupted' WHERE run = ? AND state = 'running'",
                (run_id,),
            )

        self._atomic(work)

    def set_round(self, run_id: str, round_number: int, *, records: int, selected: int) -> None:
        def work() -> None:
            self._run("UPDATE runs SET round = ? WHERE id = ?", (round_number, run_id))
            self._run(
                "INSERT INTO rounds (run, round, records, selected) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (run, round) DO UPDATE SET records = excluded.records,"
                " selected = excluded.selected",
                (run_id, round_number, records, selected),
            )

        self._atomic(work)

    def selection_done(self, run_id: str, round_number: int) -> None:
        self._write(
            "UPDATE rounds SET selection_done = 1 WHERE run = ? AND round = ?",
            (run_id, round_number),
        )

    def complete_round(self, run_id: str, round_number: int) -> None:
        self._write(
            "UPDATE rounds SET complete = 1 WHERE run = ? AND round = ?", (run_id, round_number)
        )

    def rounds(self, run_id: str) -> list[sqlite3.Row]:
        return list(self.db.execute("SELECT * FROM rounds WHERE run = ? ORDER BY round", (run_id,)))

    def round_row(self, run_id: str, round_number: int) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.db.execute(
            "SELECT * FROM rounds WHERE run = ? AND round = ?", (run_id, round_number)
        ).fetchone()
        return row
