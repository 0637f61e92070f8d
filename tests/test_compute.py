"""The report's compute accounting (the seeds' cost model): each unit billed the sum of
its attempts' durations (retries, lost and interrupted attempts included) x the memory
the job allocates them, for every transport; and report.md's "Compute" section."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.backlog.units import Unit
from fanout.journal import Journal
from fanout.outcome import AttemptResult, Outcome, RunState, Status, UnitState
from fanout.report import compute
from fanout.report import document as report

from helpers import cli, places, unit_record, write_job

GIB = 2**30
# Unit a sleeps 0.3 s, c 0.1 s; b sleeps 0.2 s and fails its first attempt (rung
# "small", 512MiB), then passes on rung "big", which allocates 2GiB.
SCRIPT = (
    'case "$FANOUT_UNIT_ID" in a) s=0.3;; b) s=0.2;; *) s=0.1;; esac; sleep "$s";'
    ' [ "$FANOUT_UNIT_ID" != b ] || [ "$FANOUT_ATTEMPT" = 2 ]'
)


def _job(directory: Path, runtime_more: str = "", memory: str = 'memory = "512MiB"') -> Path:
    return write_job(
        directory,
        f"""
        version = 1
        name = "billed"
        [inputs]
        items = ["a", "b", "c"]
        [task]
        command = ["sh", "-c", {json.dumps(SCRIPT)}]
        timeout = "60s"
        {memory}
        [retry]
        backoff = {{ initial = "1ms", max = "1ms" }}
        ladder = [{{ name = "small" }}, {{ name = "big", memory = "2GiB" }}]
        [runtime]
        sandbox = "none"
        {runtime_more}
        """,
    )


def _report(directory: Path) -> tuple[dict[str, Any], str]:
    (path,) = (directory / ".fanout" / "runs").glob("*/report.json")
    return json.loads(path.read_text()), (path.parent / "report.md").read_text()


def _attempt_rows(directory: Path, run_id: str) -> list[Any]:
    journal = Journal(directory / ".fanout" / "journal.sqlite", read_only=True)
    try:
        return journal.attempts(run_id)
    finally:
        journal.close()


@pytest.mark.parametrize("where", places("local", "ssh"))
def test_each_unit_is_billed_its_journaled_attempts_times_their_memory(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    runtime = ""
    if where == "ssh":
        pool = request.getfixturevalue("ssh_pool")
        pool.inventory(tmp_path, pool.add("h1"))
        runtime = 'hosts = "hosts.toml"'
    ran = cli("run", str(_job(tmp_path, runtime)))
    assert ran.code == 0, ran.out + ran.err
    data, markdown = _report(tmp_path)
    rows = _attempt_rows(tmp_path, data["run"])
    by_unit: dict[str, list[Any]] = {}
    for row in rows:
        by_unit.setdefault(row["unit"], []).append(row)
    assert {u: [(r["n"], r["status"], r["memory"]) for r in by_unit[u]] for u in by_unit} == {
        "a": [(1, "succeeded", 512 * 2**20)],
        "b": [(1, "failed", 512 * 2**20), (2, "succeeded", 2 * GIB)],
        "c": [(1, "succeeded", 512 * 2**20)],
    }
    assert {r["host"] for r in rows} == {"h1" if where == "ssh" else "local"}
    # Each attempt ran at least as long as its worker slept (a lower bound, never timed).
    sleeps = {("a", 1): 0.3, ("b", 1): 0.2, ("b", 2): 0.2, ("c", 1): 0.1}
    assert all(r["duration"] >= sleeps[(r["unit"], r["n"])] for r in rows)
    units = {u["unit"]: u for u in data["units"]}
    assert [units[u]["attempts"] for u in "abc"] == [1, 2, 1]
    for unit, attempts in by_unit.items():
        active = sum(r["duration"] for r in attempts)
        byte_seconds = sum(r["duration"] * r["memory"] for r in attempts)
        assert units[unit]["activeSeconds"] == round(active, 3)
        assert units[unit]["gibSeconds"] == round(byte_seconds / GIB, 3)
    total = sum(r["duration"] for r in rows)
    billed = sum(r["duration"] * r["memory"] for r in rows) / GIB
    totals = data["compute"]
    assert totals == {
        "attempts": 4,
        "activeSeconds": round(total, 3),
        "gibSeconds": round(billed, 3),
        "memoryBytes": {"min": 512 * 2**20, "max": 2 * GIB},
        "note": "",
        # Every unit succeeded: the next run, nothing changed, reuses them all.
        "estimate": {
            "next": "new",
            "units": 0,
            "failed": 0,
            "unsettled": 0,
            "attempts": 0,
            "meanSeconds": 0.0,
            "memoryGib": None,
            "activeSeconds": 0.0,
            "gibSeconds": 0.0,
            "perUnit": {
                "units": 3,
                "attempts": round(4 / 3, 3),
                "activeSeconds": round(total / 3, 3),
                "gibSeconds": round(billed / 3, 3),
            },
        },
    }
    assert (
        f"| 4 | {total:,.3f} | 512MiB to 2GiB | {round(billed, 3):,.3f} |" in markdown.splitlines()
    )


def test_without_task_memory_the_report_shows_active_seconds_and_says_why(
    tmp_path: Path,
) -> None:
    ran = cli("run", str(_job(tmp_path, memory="")))
    assert ran.code == 0, ran.out + ran.err
    data, markdown = _report(tmp_path)
    rows = _attempt_rows(tmp_path, data["run"])
    # Without task.memory the rung's 2GiB is still declared: b's second attempt has it,
    # the other three ran without one, so no sum of GiB-seconds is complete.
    assert sorted((r["unit"], r["n"], r["memory"]) for r in rows) == [
        ("a", 1, None),
        ("b", 1, None),
        ("b", 2, 2 * GIB),
        ("c", 1, None),
    ]
    units = {u["unit"]: u for u in data["units"]}
    assert [units[u]["gibSeconds"] for u in "abc"] == [None, None, None]
    assert data["compute"]["gibSeconds"] is None
    assert data["compute"]["note"] == (
        "3 attempt(s) ran without a declared memory (task.memory or their rung's)"
    )
    assert (
        "No GiB-seconds: 3 attempt(s) ran without a declared memory"
        " (task.memory or their rung's)." in markdown.splitlines()
    )


RUN = "20261201T120000-0a0a"


class _Clock:
    """The journal's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1796007600.0

    def __call__(self) -> float:
        return self.now


def _settle(
    journal: Journal,
    unit: str,
    n: int,
    result: AttemptResult,
    *,
    memory: int | None,
    outcome: Outcome | None = None,
) -> None:
    journal.attempt_dispatched(RUN, 1, unit, n, "default", memory=memory)
    journal.attempt_settled(
        RUN, 1, unit, n, result, rung=0, rung_attempts=n, failures=0, last={}, outcome=outcome
    )


def _pinned_journal(path: Path, clock: _Clock, *, memory: int | None = GIB // 2) -> Journal:
    """Three units: u1 lost once (4.5 s) then succeeded (10.25 s); u2 failed (7 s), was
    throttled (1.25 s), then succeeded (9 s); u3 interrupted by Ctrl-C after 3 s."""
    journal = Journal(path, clock=clock)
    journal.create_run(job="billed", job_file="billed.toml", apply=False, run_id=RUN)
    journal.add_units(
        RUN, 1, (Unit(id=u, index=n, items=(u,), origin=f"i:{n}") for n, u in enumerate(IDS))
    )

    def result(status: Status, seconds: float) -> AttemptResult:
        return AttemptResult(status=status, reason=str(status), duration=seconds)

    def done(unit: str, attempts: int) -> Outcome:
        return Outcome(unit_id=unit, round=1, state=UnitState.SUCCEEDED, attempts=attempts)

    _settle(journal, "u1", 1, result(Status.LOST, 4.5), memory=memory)
    _settle(journal, "u1", 2, result(Status.SUCCEEDED, 10.25), memory=memory, outcome=done("u1", 2))
    _settle(journal, "u2", 1, result(Status.FAILED, 7.0), memory=memory)
    _settle(journal, "u2", 2, result(Status.THROTTLED, 1.25), memory=memory)
    _settle(journal, "u2", 3, result(Status.SUCCEEDED, 9.0), memory=memory, outcome=done("u2", 3))
    journal.attempt_dispatched(RUN, 1, "u3", 1, "default", memory=memory)
    clock.now += 3.0
    journal.unit_interrupted(RUN, 1, "u3")
    return journal


IDS = ("u1", "u2", "u3")


def test_report_json_bills_each_unit_what_its_attempts_add_up_to(tmp_path: Path) -> None:
    """report.json's units (made by SQLite, the attempts summed there) are, key for key
    and in the same order, what each unit's row and its attempts' rows say, summed here."""
    journal = _pinned_journal(tmp_path / "journal.sqlite", _Clock())
    out = io.StringIO()
    report.write_json(journal, RUN, out)
    attempts = journal.attempts(RUN)
    expected = []
    for row in journal.units(RUN):
        own = [a for a in attempts if (a["round"], a["unit"]) == (row.round, row.unit.id)]
        record = unit_record(row)
        record["activeSeconds"] = round(sum(a["duration"] for a in own), 3)
        record["gibSeconds"] = round(sum(a["duration"] * a["memory"] for a in own) / GIB, 3)
        record["changes"] = []
        if row.state is not UnitState.SUCCEEDED:
            record["outputTail"] = row.tail
        expected.append(record)
    assert [list(u.items()) for u in json.loads(out.getvalue())["units"]] == [
        list(u.items()) for u in expected
    ]
    assert [u["gibSeconds"] for u in expected] == [7.375, 8.625, 1.5]


def test_retries_lost_throttled_and_interrupted_attempts_are_all_billed(tmp_path: Path) -> None:
    journal = _pinned_journal(tmp_path / "journal.sqlite", _Clock())
    data = report.build(journal, RUN)
    assert [(u["unit"], u["activeSeconds"], u["gibSeconds"]) for u in data["units"]] == [
        ("u1", 14.75, 7.375),
        ("u2", 17.25, 8.625),
        ("u3", 3.0, 1.5),
    ]
    assert data["compute"] == {
        "attempts": 6,
        "activeSeconds": 35.0,
        "gibSeconds": 17.5,
        "memoryBytes": {"min": GIB // 2, "max": GIB // 2},
        "note": "",
        # The run did not finish: the next fanout run continues it and runs u3, priced
        # at what u1 and u2 took: (2 + 3) / 2 attempts, (14.75 + 17.25) / 2 seconds.
        "estimate": {
            "next": "resume",
            "units": 1,
            "failed": 0,
            "unsettled": 1,
            "attempts": 2.5,
            "meanSeconds": 6.4,
            "memoryGib": 0.5,
            "activeSeconds": 16.0,
            "gibSeconds": 8.0,
            "perUnit": {"units": 2, "attempts": 2.5, "activeSeconds": 16.0, "gibSeconds": 8.0},
        },
    }


def test_report_md_shows_the_compute_of_a_pinned_run(tmp_path: Path) -> None:
    journal = _pinned_journal(tmp_path / "journal.sqlite", _Clock())
    assert compute.markdown(report.build(journal, RUN)["compute"]) == [
        "### Compute",
        "",
        "| attempts | active seconds | memory per attempt | GiB-seconds |",
        "| ---: | ---: | ---: | ---: |",
        "| 6 | 35.000 | 512MiB | 17.500 |",
        "",
        "Next run: `fanout run` continues this one and runs its 1 unsettled unit(s):"
        " 2.5 attempt(s) x 6.400s mean x 0.5 GiB = 8.000 GiB-seconds. A unit that settled"
        " here took 2.5 attempt(s), 16.000 active seconds, 8.000 GiB-seconds on average.",
        "",
    ]
    markdown = report.write(journal, RUN, tmp_path / "out").read_text()
    assert "\n| 6 | 35.000 | 512MiB | 17.500 |\n" in markdown


def test_report_md_without_memory_says_there_is_nothing_to_bill(tmp_path: Path) -> None:
    journal = _pinned_journal(tmp_path / "journal.sqlite", _Clock(), memory=None)
    data = report.build(journal, RUN)
    assert all("gibSeconds" not in u for u in data["units"])
    assert [u["activeSeconds"] for u in data["units"]] == [14.75, 17.25, 3.0]
    assert compute.markdown(data["compute"]) == [
        "### Compute",
        "",
        "| attempts | active seconds | memory per attempt | GiB-seconds |",
        "| ---: | ---: | ---: | ---: |",
        "| 6 | 35.000 | not declared | n/a |",
        "",
        "No GiB-seconds: the job declares no task.memory, so there is no allocation to bill.",
        "",
        "Next run: `fanout run` continues this one and runs its 1 unsettled unit(s):"
        " 2.5 attempt(s) x 6.400s mean = 16.000 active seconds. A unit that settled here"
        " took 2.5 attempt(s), 16.000 active seconds on average.",
        "",
    ]


def test_task_memory_and_a_rungs_are_read_as_bytes_and_plan_shows_them(tmp_path: Path) -> None:
    job = _job(tmp_path)
    loaded = spec.load(job)
    assert loaded.task.memory == 512 * 2**20
    assert [r.memory for r in loaded.retry.ladder] == [None, 2 * GIB]
    ran = cli("plan", str(job))
    assert ran.code == 0, ran.out + ran.err
    lines = ran.out.splitlines()
    assert "Ladder    small x1 -> big x1 (2GiB); task timeout 1m" in lines
    assert "  memory   512MiB per attempt, billed x its active seconds" in lines
    assert '  memory = "512MiB"' in lines
    assert '      { name = "big", attempts = 1, memory = "2GiB" },' in lines


def test_a_journal_from_before_task_memory_is_reported_read_only(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _pinned_journal(path, _Clock()).close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE attempts DROP COLUMN memory")
    db.commit()
    db.close()
    journal = Journal(path, read_only=True)
    data = report.build(journal, RUN)
    assert [u["activeSeconds"] for u in data["units"]] == [14.75, 17.25, 3.0]
    assert (data["compute"]["gibSeconds"], data["compute"]["memoryBytes"]) == (None, None)


def test_attempts_that_took_no_time_and_declared_no_memory_bill_nothing(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite", clock=_Clock())
    journal.create_run(job="billed", job_file="billed.toml", apply=False, run_id=RUN)
    journal.add_units(RUN, 1, [Unit(id="u1", index=0, items=("u1",), origin="i:0")])
    lost = AttemptResult(status=Status.LOST, reason="lost", duration=0.0)
    _settle(journal, "u1", 1, lost, memory=None)
    done = AttemptResult(status=Status.SUCCEEDED, reason="ok", duration=0.0)
    outcome = Outcome(unit_id="u1", round=1, state=UnitState.SUCCEEDED, attempts=2)
    _settle(journal, "u1", 2, done, memory=None, outcome=outcome)
    totals = compute.totals(journal, RUN)
    assert (totals["activeSeconds"], totals["gibSeconds"], totals["estimate"]["memoryGib"]) == (
        0.0,
        None,
        None,
    )
    assert totals["note"] == "the job declares no task.memory, so there is no allocation to bill"


def _ended(journal: Journal, unit: str, seconds: list[float], state: UnitState) -> None:
    """``unit``'s attempts of ``seconds`` each, the last one ending it in ``state``."""
    for n, duration in enumerate(seconds, 1):
        last = n == len(seconds)
        status = Status.SUCCEEDED if last and state is UnitState.SUCCEEDED else Status.FAILED
        outcome = Outcome(unit_id=unit, round=1, state=state, attempts=n) if last else None
        result = AttemptResult(status=status, reason=str(status), duration=duration)
        _settle(journal, unit, n, result, memory=None, outcome=outcome)


def _three_units(path: Path, clock: _Clock) -> Journal:
    """u1 succeeded (2 s); u2 failed (3 s, then 5 s); u3 failed (1 s, then 1 s)."""
    journal = Journal(path, clock=clock)
    journal.create_run(job="billed", job_file="billed.toml", apply=False, run_id=RUN)
    journal.add_units(
        RUN, 1, (Unit(id=u, index=n, items=(u,), origin=f"i:{n}") for n, u in enumerate(IDS))
    )
    _ended(journal, "u1", [2.0], UnitState.SUCCEEDED)
    _ended(journal, "u2", [3.0, 5.0], UnitState.FAILED)
    _ended(journal, "u3", [1.0, 1.0], UnitState.FAILED)
    return journal


def test_a_finished_runs_next_run_runs_its_failed_units_again_at_what_they_took(
    tmp_path: Path,
) -> None:
    journal = _three_units(tmp_path / "journal.sqlite", _Clock())
    journal.finish_run(RUN, state=RunState.FINISHED, wall=12.0)
    data = report.build(journal, RUN)
    # u1 is reused; u2 and u3 run again and take what a failed unit took here: 2
    # attempts, (8 + 2) / 2 seconds.  A unit that settled here took 5 / 3 attempts.
    assert data["compute"]["estimate"] == {
        "next": "new",
        "units": 2,
        "failed": 2,
        "unsettled": 0,
        "attempts": 4.0,
        "meanSeconds": 2.5,
        "memoryGib": None,
        "activeSeconds": 10.0,
        "gibSeconds": None,
        "perUnit": {"units": 3, "attempts": 1.667, "activeSeconds": 4.0, "gibSeconds": None},
    }
    assert compute.markdown(data["compute"])[-2] == (
        "Next run, with nothing changed: 2 failed unit(s) run again unless a streak"
        " quarantines them (the successes are reused): 4 attempt(s) x 2.500s mean"
        " = 10.000 active seconds. A unit that settled here took 1.667 attempt(s), 4.000"
        " active seconds on average."
    )


def test_an_unfinished_run_a_later_one_superseded_is_priced_as_a_new_run(tmp_path: Path) -> None:
    clock = _Clock()
    journal = _three_units(tmp_path / "journal.sqlite", clock)
    journal.add_units(RUN, 1, [Unit(id="u4", index=3, items=("u4",), origin="i:3")])
    journal.finish_run(RUN, state=RunState.STOPPED, wall=12.0)
    clock.now += 60
    journal.create_run(job="billed", job_file="billed.toml", apply=False)
    # Not continued: a new run runs the failed units (as failed ones) and u4, pending,
    # at what a settled unit took (5 / 3 attempts, 12 / 3 seconds).
    estimate = report.build(journal, RUN)["compute"]["estimate"]
    assert (estimate["next"], estimate["units"], estimate["failed"], estimate["unsettled"]) == (
        "new",
        3,
        2,
        1,
    )
    assert (estimate["attempts"], estimate["activeSeconds"]) == (5.67, 14.0)
