"""The ceilings a job's limits learned from throttles (``ceiling``), kept for its next
run: a cron fire starts at yesterday's pace and probes from there instead of
stampeding.  One row per job and name, the latest learned replacing the one before; a
name the run learned nothing about keeps what an earlier run learned.

A name is a ``[[limits]]`` entry's, ``*`` for all dispatch (a job without limits), or
``api:<name>`` for an API of the gateway.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .store import Store
from .tables import KeptCeiling

if TYPE_CHECKING:
    # Imported where used: pacing imports the spec (a fifth of a second), which a
    # journal read (`fanout report`, `status`) never needs.
    from ..pacing.ceiling import Learned

API = "api:"


def label(name: str) -> str:
    """How output names a kept name: ``all dispatch``, ``api anthropic``, ``search``."""
    from ..pacing.limits import ALL

    if name == ALL:
        return "all dispatch"
    if name.startswith(API):
        return f"api {name.removeprefix(API)}"
    return name


class Ceilings(Store):
    """Writes and reads of ``ceilings``."""

    def save_ceilings(
        self, job: str, mapping: Mapping[str, tuple[Learned, str]], *, run_id: str | None = None
    ) -> None:
        """Keep what ``job``'s limits learned (name -> the ceiling and its text), in one
        transaction, stamped now and with the run that learned it."""
        if not mapping:
            return
        now = self.clock()
        rows = [
            (job, name, json.dumps(learned.as_dict()), text, now, run_id)
            for name, (learned, text) in mapping.items()
        ]
        self._atomic(
            lambda: self.db.executemany(
                "INSERT INTO ceilings (job, name, learned, text, at, run)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job, name) DO UPDATE SET"
                " learned = excluded.learned, text = excluded.text, at = excluded.at,"
                " run = excluded.run",
                rows,
            )
        )

    def kept_ceiling_rows(self, job: str) -> list[KeptCeiling]:
        """What earlier runs of ``job`` learned, by name.  A row this fanout cannot read
        (written by another version, edited by hand) is left out, and so is everything in
        a journal an older fanout wrote, opened read-only (it has no such table)."""
        try:
            rows = self.db.execute(
                "SELECT name, learned, text, at, run FROM ceilings WHERE job = ? ORDER BY name",
                (job,),
            ).fetchall()
        except sqlite3.OperationalError:
            return []
        from ..pacing.ceiling import Learned

        found = []
        for row in rows:
            try:
                data = json.loads(row["learned"])
            except (TypeError, ValueError):
                continue
            learned = Learned.from_dict(data) if isinstance(data, dict) else None
            if learned is not None:
                found.append(
                    KeptCeiling(
                        name=row["name"],
                        learned=learned,
                        text=str(row["text"]),
                        at=float(row["at"]),
                        run=row["run"],
                    )
                )
        return found

    def kept_ceilings(self, job: str) -> dict[str, Learned]:
        """What earlier runs of ``job`` learned: name -> its ceiling."""
        return {row.name: row.learned for row in self.kept_ceiling_rows(job)}
