"""The report and status of big runs on real SQLite: the queries use their indexes,
report.json lists every unit as it streams, report.md stays bounded."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from fanout import report
from fanout.journal import Journal
from fanout.journal.tables import SCHEMA
from fanout.outcome import Outcome, RunState, UnitState
from fanout.units import Unit


def _settled_run(journal: Journal, units: int, failed_every: int = 0) -> str:
    """A finished run of ``units`` units in round 1; every ``failed_every``-th failed
    and went on to round 2, where it succeeded unless its number is odd."""
    run = journal.create_run(job="big", job_file="big.toml", apply=False)
    journal.add_units(
        run,
        1,
        (Unit(id=f"u{n:05d}", index=n, items=({"n": n},), origin=f"x:{n}") for n in range(units)),
    )
    journal.db.execute(
        "UPDATE units SET state = 'succeeded', reason = 'ok', attempts = 1, worker_seconds = 0.5"
        " WHERE run = ?",
        (run,),
    )
    if failed_every:
        again = [n for n in range(units) if n % failed_every == 0]
        journal.db.executemany(
            "UPDATE units SET state = 'failed', reason = 'exit 1', tail = 'boom'"
            " WHERE run = ? AND id = ?",
            [(run, f"u{n:05d}") for n in again],
        )
        journal.add_units(
            run,
            2,
            (
                Unit(id=f"u{n:05d}", index=i, items=({"n": n},), origin=f"x:{n}")
                for i, n in enumerate(again)
            ),
        )
        for n in again:
            state = UnitState.FAILED if n % 2 else UnitState.SUCCEEDED
            journal.unit_settled(
                run, Outcome(unit_id=f"u{n:05d}", round=2, state=state, reason=str(state))
            )
    journal.finish_run(run, state=RunState.FINISHED, wall=10.0)
    return run


def test_counting_a_run_seeks_each_unit_s_latest_round_in_an_index(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = _settled_run(journal, 10)
    plan = [
        row["detail"]
        for row in journal.db.execute(
            "EXPLAIN QUERY PLAN SELECT state, COUNT(*) AS n FROM units WHERE run = ? AND "
            + Journal._LATEST
            + " GROUP BY state",
            (run,),
        )
    ]
    assert "SEARCH later USING COVERING INDEX units_by_id (run=? AND id=? AND round>?)" in plan
    pages = [
        row["detail"]
        for row in journal.db.execute(
            "EXPLAIN QUERY PLAN SELECT * FROM units WHERE run = ? AND round = ?"
            " AND idx > COALESCE(?, -1) ORDER BY idx LIMIT ?",
            (run, 1, None, 500),
        )
    ]
    assert pages == ["SEARCH units USING INDEX units_in_order (run=? AND round=? AND idx>?)"]


def test_a_journal_from_before_the_indexes_gets_them_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(
        SCHEMA.replace("CREATE INDEX IF NOT EXISTS units_in_order", "-- ").replace(
            "CREATE INDEX IF NOT EXISTS units_by_id", "-- "
        )
    )
    old.close()

    def indexes() -> list[str]:
        db = sqlite3.connect(path)
        try:
            return sorted(
                name
                for (name,) in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'units'"
                    " AND name NOT LIKE 'sqlite_%'"
                )
            )
        finally:
            db.close()

    assert indexes() == ["units_by_state"]
    Journal(path).close()
    assert indexes() == ["units_by_id", "units_by_state", "units_in_order"]


def test_counts_and_failures_are_of_each_unit_s_latest_round(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = _settled_run(journal, 1500, failed_every=3)
    # 500 units went to round 2; the 250 odd ones of them failed there too.
    assert journal.unit_counts(run) == {"failed": 250, "succeeded": 1250}
    assert report.status_text(journal, run, shown=2) == (
        f"run {run} of big: finished, round 1\n"
        "  failed       250\n"
        "    u00003  rung -  0 attempt(s)  failed\n"
        "    u00009  rung -  0 attempt(s)  failed\n"
        f"    and 248 more: fanout report {run}\n"
        "  succeeded    1250\n"
        "    u00001  rung -  1 attempt(s)  ok\n"
        "    u00002  rung -  1 attempt(s)  ok\n"
        f"    and 1248 more: fanout report {run}\n"
    )
    failed = list(journal.failed_ids(run))
    assert failed == [f"u{n:05d}" for n in range(0, 1500, 3) if n % 2]


def test_report_json_lists_every_unit_and_report_md_at_most_shown_units(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = _settled_run(journal, 1500, failed_every=3)
    journal.record_changes(
        run, 1, [_Change(unit_id=f"u{n:05d}", path=f"f{n}.txt") for n in range(1, 1500, 3)]
    )
    markdown = report.write(journal, run, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    # Every unit of both rounds, in round and selection order, as build() has them.
    assert len(data["units"]) == 2000
    assert [(u["round"], u["unit"]) for u in data["units"][:2]] == [(1, "u00000"), (1, "u00001")]
    assert [(u["round"], u["unit"]) for u in data["units"][1500:1502]] == [
        (2, "u00000"),
        (2, "u00003"),
    ]
    assert data == report.build(journal, run)
    assert data["totals"] == {"failed": 250, "succeeded": 1250}
    assert len(data["failed"]) == 250
    assert sum(len(u["changes"]) for u in data["units"]) == 500
    assert data["units"][1]["changes"] == [
        {"path": "f1.txt", "added": 3, "removed": 1, "state": "applied"}
    ]
    text = markdown.read_text()
    units_table = text.split("### Units")[1]
    assert units_table.count("\n| <code>u") == report.SHOWN_UNITS
    assert "1800 more unit(s) in report.json." in units_table
    failures = text.split("### Failed: needs a human")[1].split("### Units")[0]
    # The first 200 of the 250 units whose latest round failed, each with its round-2
    # failure, and the 33 of them among the first 200 units with their round-1 one too.
    assert failures.count("<details>") == 233
    assert "\n\n50 more unit(s) in report.json." in failures
    changed = text.split("### Changed files")[1].split("### Failed")[0]
    assert changed.count("\n| <code>f") == report.SHOWN_UNITS
    assert "\n\n300 more unit(s) in report.json." in changed


class _Change:
    """A change as fan-in records it (the fields record_changes reads)."""

    def __init__(self, *, unit_id: str, path: str) -> None:
        self.unit_id = unit_id
        self.path = path
        self.added = 3
        self.removed = 1
        self.state = "applied"
