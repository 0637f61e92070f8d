"""``fanout history``: a job's runs one row each, from real runs of a tiny recurring job,
as a table and as JSON; the query's counts against ``unit_counts`` on multi-round runs,
and the number of statements it takes, whatever the number of runs."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout.backlog.units import Unit
from fanout.journal import Journal
from fanout.journal.tables import SCHEMA
from fanout.outcome import ApiUsage, AttemptResult, Outcome, RunState, Status, UnitState

from helpers import DAY, NIGHT, NIGHTLY, cli, write_job


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC: the table shows when runs started in local time."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _runs(directory: Path, times: int) -> list[str]:
    """``times`` real runs of NIGHTLY in ``directory``, their ids oldest first, each then
    dated a night apart with a wall time of 2 minutes (what the table shows of time)."""
    write_job(directory, NIGHTLY)
    codes = [cli("run", "job.toml").code for _ in range(times)]
    assert codes == [1, 1, 9, 9][:times]
    db = sqlite3.connect(directory / ".fanout" / "journal.sqlite")
    ids = [row[0] for row in db.execute("SELECT id FROM runs ORDER BY started, rowid")]
    for n, run in enumerate(ids):
        db.execute(
            "UPDATE runs SET started = ?, finished = ?, wall = 120 WHERE id = ?",
            (NIGHT + n * DAY, NIGHT + n * DAY + 120, run),
        )
    db.commit()
    db.close()
    return ids


def test_history_shows_each_run_of_a_recurring_job_oldest_first(chdir_tmp: Path, utc: None) -> None:
    _runs(chdir_tmp, 3)
    result = cli("history", "job.toml")
    assert (result.code, result.err) == (0, "")
    assert result.out == (
        "started           trigger  units  ran  reused  succeeded  failed  quarantined  wall"
        "  attempts  units/min\n"
        "2026-11-30 03:00  manual       3    3       0          2       1            0    2m"
        "         3        1.5\n"
        "2026-12-01 03:00  manual       3    1       2          0       1            0    2m"
        "         1        0.5\n"
        "2026-12-02 03:00  manual       3    0       2          0       0            1    2m"
        "         0          0\n"
        "(left out, nothing in any run shown: unchanged, tokens in/out, spend)\n"
    )


def test_history_as_json_has_every_key_and_exact_counts(chdir_tmp: Path) -> None:
    ids = _runs(chdir_tmp, 3)
    result = cli("history", "job.toml", "--format", "json")
    assert result.code == 0
    records = json.loads(result.out)
    assert [r["run"] for r in records] == ids

    def expected(n: int, **units: int) -> dict[str, object]:
        ran = units.pop("ran")
        counts = {state: units.get(state, 0) for state in map(str, UnitState)}
        return {
            "run": ids[n],
            "started": NIGHT + n * DAY,
            "finished": NIGHT + n * DAY + 120,
            "state": "finished",
            "trigger": None,
            "retryOf": None,
            "rounds": 1,
            "wallSeconds": 120.0,
            "units": {"selected": 3, "ran": ran, "unchanged": 0, **counts},
            "attempts": ran,
            "tokens": {"input": 0, "cacheRead": 0, "cacheWrite": 0, "output": 0},
            "costUsd": 0.0,
            "unitsPerMinute": ran / 2,
        }

    assert records == [
        expected(0, ran=3, succeeded=2, failed=1),
        expected(1, ran=1, reused=2, failed=1),
        expected(2, ran=0, reused=2, quarantined=1),
    ]


def test_last_shows_the_newest_runs_and_says_how_many_there_are(chdir_tmp: Path, utc: None) -> None:
    ids = _runs(chdir_tmp, 3)
    result = cli("history", "job.toml", "--last", "1")
    assert result.out.splitlines()[1:] == [
        "2026-12-02 03:00  manual       3    0       2          0       0            1    2m"
        "         0          0",
        "(left out, nothing in any run shown: unchanged, tokens in/out, spend)",
        "the last 1 of 3 runs of nightly: --last N shows more, --last 0 all",
    ]
    shown = json.loads(cli("history", "job.toml", "--format", "json", "-n", "2").out)
    assert [r["run"] for r in shown] == ids[1:]
    assert len(json.loads(cli("history", "job.toml", "--format", "json", "--last", "0").out)) == 3


def test_a_job_that_never_ran_has_no_history(chdir_tmp: Path) -> None:
    write_job(chdir_tmp, NIGHTLY)
    result = cli("history", "job.toml")
    assert (result.code, result.out, result.err) == (0, "no runs of nightly yet\n", "")
    assert cli("history", "job.toml", "--format", "json").out == "[]\n"
    assert not (chdir_tmp / ".fanout").exists()  # read-only: nothing was created


def test_tokens_spend_trigger_retries_and_unfinished_runs_have_columns(
    tmp_path: Path, utc: None
) -> None:
    journal = Journal(tmp_path / "journal.sqlite", clock=lambda: NIGHT)
    first = journal.create_run(
        job="crm", job_file="crm.toml", apply=False, trigger={"name": "nightly"}
    )
    journal.add_units(first, 1, [Unit(id="u1", index=0, items=("x",), origin="x")])
    journal.attempt_dispatched(first, 1, "u1", 1, "default")
    journal.record_usage(
        first,
        1,
        "u1",
        1,
        [
            ApiUsage(
                api="anthropic",
                requests=2,
                input_tokens=1500,
                cache_read_tokens=120_000,
                output_tokens=2300,
                cost_usd=0.4321,
            )
        ],
    )
    journal.finish_run(first, state=RunState.STOPPED, wall=30.0)
    retry = journal.create_run(job="crm", job_file="crm.toml", apply=False, parent=first)
    journal.finish_run(retry, state=RunState.FINISHED, wall=0.0)
    from fanout.report import history

    assert history.text(journal, "crm", 0) == (
        "started           trigger  units  ran  succeeded  failed  wall  attempts"
        "  tokens in/out    spend  units/min\n"
        "2026-11-30 03:00  nightly      1    1          0       0   30s         1"
        "      122k/2.3k  $0.4321          2  stopped\n"
        f"2026-11-30 03:00  manual       0    0          0       0  0.0s         0"
        f"            0/0  $0.0000          -  retry of {first}\n"
        "(left out, nothing in any run shown: reused, quarantined, unchanged)\n"
    )
    (record,) = history.records(journal, "crm", 1)
    assert (record["retryOf"], record["unitsPerMinute"], record["state"]) == (
        first,
        None,
        "finished",
    )
    assert history.records(journal, "crm", 2)[0]["tokens"] == {
        "input": 1500,
        "cacheRead": 120_000,
        "cacheWrite": 0,
        "output": 2300,
    }


def _multi_round_run(journal: Journal, job: str, units: int) -> str:
    """A run of ``units`` units over three rounds: every third fails in round 1 and runs
    again in round 2, where every other of those fails again and runs in round 3 (and
    succeeds there); every fifth is reused in round 1, and of the reused ones one in
    seven is selected again in round 2 and reused there too."""
    run = journal.create_run(job=job, job_file=f"{job}.toml", apply=True)
    ids = [f"u{n:04d}" for n in range(units)]
    journal.add_units(
        run, 1, [Unit(id=i, index=n, items=(i,), origin=i) for n, i in enumerate(ids)]
    )
    journal.set_round(run, 1, records=units, selected=units)

    def settle(round_number: int, unit: str, state: UnitState) -> None:
        if state is UnitState.REUSED:
            journal.db.execute(
                "UPDATE units SET state = 'reused', reused_from = 'earlier'"
                " WHERE run = ? AND round = ? AND id = ?",
                (run, round_number, unit),
            )
            return
        journal.attempt_dispatched(run, round_number, unit, 1, "default")
        status = Status.SUCCEEDED if state is UnitState.SUCCEEDED else Status.FAILED
        journal.attempt_settled(
            run,
            round_number,
            unit,
            1,
            AttemptResult(status=status, reason=str(state)),
            rung=0,
            rung_attempts=1,
            failures=0,
            last={},
            outcome=Outcome(unit_id=unit, round=round_number, state=state, attempts=1),
        )

    second, third = [], []
    for n, unit in enumerate(ids):
        if n % 5 == 0:
            settle(1, unit, UnitState.REUSED)
            if n % 7 == 0:
                second.append((unit, UnitState.REUSED))
        elif n % 3 == 0:
            settle(1, unit, UnitState.FAILED)
            failing = n % 2 == 0
            second.append((unit, UnitState.FAILED if failing else UnitState.SUCCEEDED))
            if failing:
                third.append(unit)
        else:
            settle(1, unit, UnitState.SUCCEEDED)
    journal.add_units(
        run, 2, [Unit(id=u, index=n, items=(u,), origin=u) for n, (u, _) in enumerate(second)]
    )
    journal.set_round(run, 2, records=units, selected=len(second))
    for unit, state in second:
        settle(2, unit, state)
    journal.set_round(run, 3, records=units, selected=len(third))
    journal.add_units(
        run, 3, [Unit(id=u, index=n, items=(u,), origin=u) for n, u in enumerate(third)]
    )
    for unit in third:
        settle(3, unit, UnitState.SUCCEEDED)
    journal.finish_run(run, state=RunState.FINISHED, wall=60.0)
    return run


def test_counts_are_each_unit_s_latest_round_as_unit_counts_has_them(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    runs = [_multi_round_run(journal, "job", units) for units in (10, 300, 1000)]
    _multi_round_run(journal, "other", 50)  # another job's run counts nowhere
    found = journal.history("job")
    assert [h.run for h in found] == runs
    for run, row in zip(runs, found, strict=True):
        expected = {UnitState(s): n for s, n in journal.unit_counts(run).items()}
        assert {s: n for s, n in row.states.items() if n} == expected
        attempted = journal.db.execute(
            "SELECT COUNT(DISTINCT id) FROM units WHERE run = ? AND attempts > 0", (run,)
        ).fetchone()[0]
        assert (row.ran, row.selected) == (attempted, sum(expected.values()))
    # 1000 units: 200 reused (29 of them again in round 2); of the 800 that ran, 267
    # failed in round 1 and ran again in round 2, where 133 failed again and ran in
    # round 3: 800 + 267 + 133 attempts.
    assert found[2].states[UnitState.REUSED] == 200
    assert found[2].states[UnitState.SUCCEEDED] == 800
    assert (found[2].ran, found[2].attempts, found[2].rounds) == (800, 1200, 3)


def test_history_asks_sqlite_the_same_few_statements_for_one_run_or_many(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    statements: list[str] = []
    journal.db.set_trace_callback(statements.append)
    counts = []
    for _ in range(3):
        _multi_round_run(journal, "job", 30)
        statements.clear()
        journal.history("job")
        counts.append(len([s for s in statements if s.lstrip().upper().startswith("SELECT")]))
    # runs, units, rounds (and its columns), attempts, usage: however many runs.
    assert counts == [counts[0]] * 3
    assert counts[0] <= 5


def test_history_of_a_job_file_that_is_invalid_says_why(chdir_tmp: Path) -> None:
    write_job(chdir_tmp, "version = 1\n")
    result = cli("history", "job.toml")
    assert (result.code, result.out, result.err) == (
        2,
        "",
        "job.toml:1:1: missing required key 'name'\n"
        "job.toml:1:1: missing required key 'inputs'\n"
        "job.toml:1:1: missing required key 'task'\n",
    )


def test_a_journal_from_before_recurring_jobs_is_read_as_it_is(chdir_tmp: Path, utc: None) -> None:
    """No rounds.unchanged, no runs.quarantine_after, no streaks: history and status read
    it read-only, as it is (the next run adds them)."""
    write_job(chdir_tmp, NIGHTLY)
    path = chdir_tmp / ".fanout" / "journal.sqlite"
    path.parent.mkdir()
    old = (
        SCHEMA.replace("    unchanged INTEGER NOT NULL DEFAULT 0,\n", "")
        .replace(",\n    quarantine_after INTEGER\n", "\n")
        .split("CREATE TABLE IF NOT EXISTS streaks")[0]
    )
    db = sqlite3.connect(path)
    db.executescript(old)
    db.execute(
        "INSERT INTO runs (id, job, job_file, started, state, wall) VALUES"
        " ('20261130T030000-0001', 'nightly', 'job.toml', ?, 'finished', 60)",
        (NIGHT,),
    )
    db.execute(
        "INSERT INTO rounds (run, round, records, selected) VALUES (?, 1, 1, 1)",
        ("20261130T030000-0001",),
    )
    db.execute(
        "INSERT INTO units (run, round, id, idx, data, state, attempts) VALUES"
        " ('20261130T030000-0001', 1, 'a', 0, '{}', 'succeeded', 1)"
    )
    db.commit()
    db.close()
    result = cli("history", "job.toml")
    assert (result.code, result.err) == (0, "")
    assert result.out.splitlines()[1] == (
        "2026-11-30 03:00  manual       1    0          1       0    1m         0          0"
    )
    assert cli("status").code == 0
    columns = {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(rounds)")}
    assert "unchanged" not in columns  # nothing was migrated
