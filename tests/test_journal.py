"""The journal on real SQLite: settle-once, resume bookkeeping and paging."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fanout.backlog.units import Unit
from fanout.errors import StateError
from fanout.journal import Journal
from fanout.journal.tables import SCHEMA, merge_limits
from fanout.outcome import ApiUsage, AttemptResult, Outcome, RunState, Status, UnitState
from fanout.pacing.ceiling import Learned

from helpers import write_job


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
    journal.finish_run(run, state=RunState.FINISHED, wall=1.5)
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


# The crash the old two-transaction settle allowed: the attempt's success committed, the
# unit's settle not yet.  The coordinator dies at the first statement after the commit
# that recorded a succeeded attempt; the resumed run must not run the unit again.
CRASH_AFTER_SETTLE = """
import os, sys
from fanout import journal

original = journal.Journal.__init__

def init(self, *args, **kwargs):
    original(self, *args, **kwargs)
    seen = {"succeeded": False, "committed": False}

    def trace(sql):
        if seen["committed"]:
            os._exit(9)
        if sql.startswith("UPDATE attempts SET finished"):
            seen["succeeded"] = True
        elif sql == "COMMIT" and seen["succeeded"]:
            seen["committed"] = True

    self.db.set_trace_callback(trace)

journal.Journal.__init__ = init
from fanout.cli import main
sys.argv = ["fanout", "run", sys.argv[1]]
main()
"""


@pytest.mark.slow
def test_a_crash_right_after_a_unit_s_attempt_settled_does_not_run_it_again(
    tmp_path: Path,
) -> None:
    out = tmp_path / "done.txt"
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "once"
        [inputs]
        items = ["a"]
        [task]
        command = ["sh", "-c", "echo $FANOUT_UNIT_ID >> {out}"]
        [runtime]
        sandbox = "none"
        """,
    )
    (tmp_path / "crash.py").write_text(CRASH_AFTER_SETTLE)
    crashed = subprocess.run(
        [sys.executable, str(tmp_path / "crash.py"), str(job)], capture_output=True, text=True
    )
    assert crashed.returncode == 9, crashed.stderr
    assert out.read_text() == "a\n"
    resumed = subprocess.run(
        [sys.executable, "-m", "fanout", "run", str(job)], capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr
    assert out.read_text() == "a\n"
    with sqlite3.connect(tmp_path / ".fanout" / "journal.sqlite") as conn:
        assert conn.execute("SELECT id, state, attempts FROM units").fetchall() == [
            ("a", "succeeded", 1)
        ]


def test_a_killed_stretch_counts_in_the_wall_time_up_to_its_last_attempt(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    journal = Journal(tmp_path / "j.sqlite", clock=lambda: now[0])
    run = journal.create_run(job="j", job_file="j.toml", apply=False)
    journal.add_units(run, 1, _units(2))
    now[0] = 1010.0
    journal.attempt_dispatched(run, 1, "u0", 1, "default")
    now[0] = 1070.0
    ok = AttemptResult(status=Status.SUCCEEDED, reason="ok", duration=60)
    journal.attempt_settled(run, 1, "u0", 1, ok, rung=0, rung_attempts=0, failures=0, last={})
    now[0] = 1075.0
    journal.attempt_dispatched(run, 1, "u1", 1, "default")
    # SIGKILL here; the next run resumes an hour later and runs for 20 s.
    now[0] = 4600.0
    journal.reopen_run(run)
    assert journal.run(run).wall == 75.0
    now[0] = 4620.0
    journal.finish_run(run, state=RunState.FINISHED, wall=20.0)
    assert journal.run(run).wall == 95.0
    # A stopped (not killed) stretch already recorded its wall time: nothing is added.
    journal.finish_run(run, state=RunState.STOPPED, wall=5.0)
    journal.reopen_run(run)
    assert journal.run(run).wall == 100.0


def test_a_journal_from_before_stretches_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA.replace("    stretch REAL,\n", ""))
        conn.execute(
            "INSERT INTO runs (id, job, job_file, started, state) VALUES ('r', 'j', 'j', 1, 'running')"
        )
    journal = Journal(path)
    journal.reopen_run("r")
    assert journal.run("r").state == "running"


def test_a_journal_from_before_reservations_reads_as_reserving_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    journal = Journal(path)
    run_id = journal.create_run(job="old", job_file="old.toml", apply=False)
    journal.record_usage(run_id, 1, "u1", 1, [ApiUsage(api="a", requests=2, cost_usd=0.5)])
    journal.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE usage DROP COLUMN reserved_usd")
    old = Journal(path, read_only=True)
    assert old.usage_totals(run_id) == [ApiUsage(api="a", requests=2, cost_usd=0.5)]
    assert old.usage_of(run_id, [(1, "u1")]) == {
        (1, "u1"): [ApiUsage(api="a", requests=2, cost_usd=0.5)]
    }
    old.close()
    # The next run migrates it: a reservation is kept.
    journal = Journal(path)
    reserved = ApiUsage(api="a", requests=1, cost_usd=0.25, reserved_usd=0.25)
    journal.record_usage(run_id, 1, "u1", 2, [reserved])
    assert journal.usage_totals(run_id) == [
        ApiUsage(api="a", requests=3, cost_usd=0.75, reserved_usd=0.25)
    ]


def test_learned_ceilings_are_kept_per_job_and_name_the_latest_replacing_the_last(
    tmp_path: Path,
) -> None:
    clock = iter([1000.0, 2000.0])
    journal = Journal(tmp_path / "j.sqlite", clock=lambda: next(clock))
    slow = Learned(rate=0.2, window=10.0, throttles=3, concurrency=2)
    api = Learned(rate=0.5, window=60.0, throttles=1)
    journal.save_ceilings(
        "nightly",
        {"*": (slow, "2.0 per 10s learned"), "api:anthropic": (api, "30.0 per 1m learned")},
        run_id="r1",
    )
    faster = Learned(rate=0.3, window=10.0, throttles=4, concurrency=3)
    journal.save_ceilings("nightly", {"*": (faster, "3.0 per 10s learned")}, run_id="r2")
    journal.save_ceilings("other", {})  # nothing learned: nothing written
    assert journal.kept_ceilings("nightly") == {"*": faster, "api:anthropic": api}
    assert [(r.name, r.text, r.at, r.run) for r in journal.kept_ceiling_rows("nightly")] == [
        ("*", "3.0 per 10s learned", 2000.0, "r2"),
        # A name the later run learned nothing of keeps what the earlier one learned.
        ("api:anthropic", "30.0 per 1m learned", 1000.0, "r1"),
    ]
    assert journal.kept_ceilings("other") == {}
    journal.close()
    # Read back as another process, read-only (status and plan), it is the same.
    assert Journal(tmp_path / "j.sqlite", read_only=True).kept_ceilings("nightly") == {
        "*": faster,
        "api:anthropic": api,
    }


@pytest.mark.parametrize(
    "learned",
    [
        "not json",
        "[1, 2]",
        "{}",
        '{"rate": 0, "window": 10, "throttles": 1}',
        '{"rate": 0.2, "window": -1, "throttles": 1}',
        '{"rate": "fast", "window": 10, "throttles": 1}',
        '{"rate": NaN, "window": 10, "throttles": 1}',
        '{"rate": 0.2, "window": 10}',
    ],
)
def test_a_kept_ceiling_fanout_did_not_write_is_left_out(tmp_path: Path, learned: str) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    journal.save_ceilings("j", {"ok": (Learned(rate=1.0, window=1.0, throttles=1), "1.0 per 1s")})
    journal.db.execute(
        "INSERT INTO ceilings (job, name, learned, text, at) VALUES ('j', 'junk', ?, 'x', 1)",
        (learned,),
    )
    assert list(journal.kept_ceilings("j")) == ["ok"]


def test_a_journal_from_before_ceilings_keeps_none_read_only_and_gets_the_table(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.sqlite"
    Journal(path).close()
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE ceilings")
    assert Journal(path, read_only=True).kept_ceiling_rows("j") == []
    journal = Journal(path)  # the next run adds the table
    journal.save_ceilings("j", {"*": (Learned(rate=1.0, window=1.0, throttles=1), "t")})
    assert list(journal.kept_ceilings("j")) == ["*"]


def test_a_resumed_run_adds_up_its_counts_and_keeps_the_latest_learned(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite")
    run = journal.create_run(job="j", job_file="j.toml", apply=False)
    first = {"starts": 4, "throttles": 2, "pausedSeconds": 12.5, "configuredPerMinute": None}
    journal.finish_run(
        run,
        state=RunState.STOPPED,
        wall=1.0,
        limits={
            # A row an older fanout wrote: no learned fields.
            "old": {"starts": 1, "throttles": 0, "pausedSeconds": 0.0},
            "*": {**first, "learned": {"rate": 0.2}, "learnedText": "2.0 per 10s"},
            "api:a": {"learned": {"rate": 1.0}, "learnedText": "60.0 per 1m"},
        },
    )
    second = {"starts": 6, "throttles": 1, "pausedSeconds": 3.25, "configuredPerMinute": None}
    journal.finish_run(
        run,
        state=RunState.FINISHED,
        wall=1.0,
        limits={
            "old": {
                "starts": 2,
                "throttles": 1,
                "pausedSeconds": 1.0,
                "learned": None,
                "learnedText": None,
            },
            "*": {**second, "learned": {"rate": 0.3}, "learnedText": "3.0 per 10s"},
            # The gateway learned nothing more in this stretch: no row.
        },
    )
    assert journal.run(run).limits == {
        "old": {
            "starts": 3,
            "throttles": 1,
            "pausedSeconds": 1.0,
            "learned": None,
            "learnedText": None,
        },
        "*": {
            "starts": 10,
            "throttles": 3,
            "pausedSeconds": 15.75,
            "configuredPerMinute": None,
            "learned": {"rate": 0.3},
            "learnedText": "3.0 per 10s",
        },
        "api:a": {"learned": {"rate": 1.0}, "learnedText": "60.0 per 1m"},
    }
    merged = merge_limits(
        {"*": {**second, "learned": {"rate": 0.3}, "learnedText": "3.0 per 10s"}},
        {"*": {**first, "learned": None, "learnedText": None}},
    )
    # A stretch that learned nothing (a run resumed without its kept ceiling) keeps the last.
    assert (merged["*"]["learned"], merged["*"]["learnedText"]) == ({"rate": 0.3}, "3.0 per 10s")


def test_a_success_ends_its_streak_and_is_kept_for_reuse_in_the_transaction_that_settles_it(
    tmp_path: Path,
) -> None:
    # One transaction, not two: a crash between them left a settled success that the
    # next run would not reuse, and it was a third transaction per unit (issue 26).
    journal = Journal(tmp_path / "j.sqlite")
    first = journal.create_run(job="j", job_file="j.toml", apply=False)
    unit = Unit(id="u0", index=0, items=("a",), origin="x:1", fingerprint="f" * 32, inputs="i")
    journal.add_units(first, 1, [unit])
    journal.record_failure("j", first, unit, failure="failed", reason="exit 1", spent_usd=0)
    assert set(journal.streaks("j", ["u0"])) == {"u0"}
    second = journal.create_run(job="j", job_file="j.toml", apply=False)
    journal.add_units(second, 1, [unit])
    journal.attempt_dispatched(second, 1, "u0", 1, "default")
    assert journal.attempt_settled(
        second,
        1,
        "u0",
        1,
        AttemptResult(status=Status.SUCCEEDED, reason="ok"),
        rung=0,
        rung_attempts=1,
        failures=0,
        last={},
        outcome=Outcome(unit_id="u0", round=1, state=UnitState.SUCCEEDED, reason="ok"),
        job="j",
    )
    assert journal.streaks("j", ["u0"]) == {}
    (kept,) = journal.db.execute("SELECT unit, run FROM successes WHERE job = 'j'").fetchall()
    assert tuple(kept) == ("u0", second)
