"""The journal on real SQLite: settle-once, resume bookkeeping and paging."""

from __future__ import annotations

from pathlib import Path

import pytest

from fanout.errors import StateError
from fanout.journal import Journal
from fanout.outcome import AttemptResult, Outcome, Status, UnitState
from fanout.units import Unit


def _units(count: int) -> list[Unit]:
    return [Unit(id=f"u{n}", index=n, items=({"n": n},), origin=f"x:{n}") for n in range(count)]


def test_a_unit_settles_at_most_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = journal.create_run(job="j", job_file="j.toml", apply=False)
    journal.add_units(run, 1, _units(1))
    journal.attempt_dispatched(run, 1, "u0", 1, "default")
    ok = AttemptResult(status=Status.SUCCEEDED, reason="ok")
    assert journal.attempt_settled(
        run, 1, "u0", 1, ok, rung=0, rung_attempts=0, failures=0, last={}
    )
    assert not journal.attempt_settled(
        run, 1, "u0", 1, ok, rung=0, rung_attempts=0, failures=0, last={}
    )
    first = Outcome(unit_id="u0", round=1, state=UnitState.SUCCEEDED, reason="ok")
    late = Outcome(unit_id="u0", round=1, state=UnitState.FAILED, reason="late loser")
    assert journal.unit_settled(run, first)
    assert not journal.unit_settled(run, late)
    (row,) = journal.units(run)
    assert (row.state, row.reason) == (UnitState.SUCCEEDED, "ok")


def test_reopening_marks_unsettled_attempts_interrupted(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = journal.create_run(job="j", job_file="j.toml", apply=True)
    journal.add_units(run, 1, _units(3))
    journal.attempt_dispatched(run, 1, "u1", 1, "default")
    assert journal.last_unfinished("j") is not None
    journal.reopen_run(run)
    (attempt,) = journal.attempts(run)
    assert attempt["status"] == "interrupted"
    assert [r.unit.id for r in journal.unsettled_units(run, 1, batch=2)] == ["u0", "u1", "u2"]
    assert journal.unit_counts(run) == {"interrupted": 1, "pending": 2}
    journal.finish_run(run, state="finished", wall=1.5)
    assert journal.last_unfinished("j") is None


def test_unit_data_survives_the_round_trip(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = journal.create_run(job="j", job_file="j.toml", apply=False)
    unit = Unit(
        id="a/b c.py", index=0, items=({"x": [1, "é"]}, {"y": None}), origin="o:1", group="a/b c.py"
    )
    journal.add_units(run, 1, [unit])
    (row,) = journal.units(run)
    assert row.unit == unit


def test_unknown_run_names_recent_ones(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = journal.create_run(job="j", job_file="j.toml", apply=False, run_id="20260101T000000-abcd")
    with pytest.raises(StateError, match=f"no run 'nope' in .*; recent runs: {run}"):
        journal.run("nope")


def test_an_unusable_state_directory_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(StateError, match="cannot open the journal"):
        Journal(tmp_path / "file" / "j.sqlite")
