"""What needs a person: quarantined units in ``fanout status``, report.md and
report.json, and ``fanout release``, from real runs of a tiny recurring job whose unit
"b" fails every run (two runs in a row quarantine it); report.md's recurring sections
from a fixed journal, as a golden file; reused and not-retried units."""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fanout.backlog.units import Unit
from fanout.journal import Journal, Settled
from fanout.outcome import AttemptResult, Outcome, RunState, Status, UnitState
from fanout.report import attention, skipped
from fanout.report import document as report
from fanout.run.reusing import quarantined

from helpers import DAY, NIGHT, NIGHTLY, cli, write_job

FAILED = "worker exited with status 1"
DATA = Path(__file__).parent / "data"


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC: status and release say when in local time."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _run(expected: int) -> str:
    """One real ``fanout run job.toml``, which must exit ``expected``; its run id."""
    result = cli("run", "job.toml")
    assert result.code == expected, result.err
    return _runs()[-1]


def _runs() -> list[str]:
    db = sqlite3.connect(".fanout/journal.sqlite")
    try:
        return [row[0] for row in db.execute("SELECT id FROM runs ORDER BY started, rowid")]
    finally:
        db.close()


def _pin_streaks() -> None:
    """Date every streak: first seen the first night, last seen the second."""
    db = sqlite3.connect(".fanout/journal.sqlite")
    db.execute("UPDATE streaks SET first_at = ?, last_at = ?", (NIGHT, NIGHT + DAY))
    db.commit()
    db.close()


def _quarantined(directory: Path) -> list[str]:
    """Three runs of NIGHTLY: b fails twice (the second quarantines it), then is not
    started; the run ids, oldest first."""
    write_job(directory, NIGHTLY)
    return [_run(1), _run(1), _run(9)]


def test_status_lists_what_needs_a_person_under_the_runs(chdir_tmp: Path, utc: None) -> None:
    first, second, third = _quarantined(chdir_tmp)
    _pin_streaks()
    job = chdir_tmp.resolve() / "job.toml"
    needs = [
        f"needs a person: 1 quarantined unit(s) of nightly (fanout release {job} UNIT... lets"
        " one run again)",
        f"  b  failed  2 runs  since 2026-11-30 03:00  last 2026-12-01 03:00  $0.0000  {FAILED}",
    ]
    result = cli("status")
    assert result.out == "\n".join(
        [
            "run                   job                   state        round  units",
            f"{third}  nightly               finished         1  1 quarantined, 2 reused",
            f"{second}  nightly               finished         1  1 failed, 2 reused",
            f"{first}  nightly               finished         1  1 failed, 2 succeeded",
            "",
            *needs,
            "",
        ]
    )
    detail = cli("status", third)
    # The unit's reason was written by the run, before the streak was dated.
    since = _utc_of(third, "b")
    assert detail.out == "\n".join(
        [
            f"run {third} of nightly: finished, round 1",
            "  quarantined  1",
            "    b  rung -  0 attempt(s)  quarantined: failed the same way (failed) in 2 runs"
            f" in a row since {since}, unchanged; last: worker exited with status 1",
            "  reused       2",
            f"    a  rung -  0 attempt(s)  reused from run {first}: unchanged since it succeeded",
            f"    c  rung -  0 attempt(s)  reused from run {first}: unchanged since it succeeded",
            *(f"  {line}" for line in needs),
            "",
        ]
    )


def _utc_of(run: str, unit: str) -> str:
    """When the quarantine reason of ``unit`` in ``run`` says its streak began."""
    db = sqlite3.connect(".fanout/journal.sqlite")
    (reason,) = db.execute(
        "SELECT reason FROM units WHERE run = ? AND id = ?", (run, unit)
    ).fetchone()
    db.close()
    return str(reason).split(" since ")[1].split(",")[0]


def test_the_report_of_the_run_that_quarantined_a_unit_says_so(chdir_tmp: Path) -> None:
    first, second, third = _quarantined(chdir_tmp)
    db = sqlite3.connect(".fanout/journal.sqlite")
    first_at, last_at = db.execute("SELECT first_at, last_at FROM streaks").fetchone()
    db.close()
    since, last = (
        datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M UTC") for t in (first_at, last_at)
    )
    section = (
        "### Quarantined: needs a person\n"
        "\n"
        "1 unit(s) failed the same way, unchanged, in 2 or more runs in a row: no run starts"
        " them until they change or `fanout release JOB UNIT...` lets them.{new}\n"
        "\n"
        "| unit | failure | runs | first seen | last seen | spent | last reason |\n"
        "| --- | --- | ---: | --- | --- | ---: | --- |\n"
        f"| <code>b</code>{{mark}} | failed | 2 | {since} | {last} | $0.0000 | {FAILED} |\n"
    )
    folder = chdir_tmp / ".fanout" / "runs"
    assert "Quarantined" not in (folder / first / "report.md").read_text()
    assert (
        section.format(new=" This run quarantined 1 of them (new).", mark=" (new)")
        in (folder / second / "report.md").read_text()
    )
    assert section.format(new="", mark="") in (folder / third / "report.md").read_text()
    data = json.loads((folder / third / "report.json").read_text())
    assert {k: data[k] for k in ("quarantineAfter", "quarantined", "newlyQuarantined")} == {
        "quarantineAfter": 2,
        "quarantined": 1,
        "newlyQuarantined": 0,
    }
    assert data["needsPerson"] == [
        {
            "unit": "b",
            "failure": "failed",
            "runs": 2,
            "firstRun": first,
            "firstSeen": first_at,
            "lastRun": second,
            "lastSeen": last_at,
            "reason": FAILED,
            "costUsd": 0.0,
            "new": False,
        }
    ]
    assert json.loads((folder / second / "report.json").read_text())["newlyQuarantined"] == 1
    assert data["totals"] == {"quarantined": 1, "reused": 2}
    # The same, rebuilt from the journal by fanout report.
    assert (
        json.loads(cli("report", third, "--format", "json").out)["needsPerson"]
        == data["needsPerson"]
    )


def test_release_lets_the_next_run_start_the_unit_and_its_streak_starts_again(
    chdir_tmp: Path, utc: None
) -> None:
    _quarantined(chdir_tmp)
    _pin_streaks()
    result = cli("release", "job.toml", "b")
    assert (result.code, result.out, result.err) == (
        0,
        "released b: it failed the same way (failed) in 2 runs in a row since 2026-11-30"
        f" 03:00, spending $0.0000; last: {FAILED}. The next run starts it.\n",
        "",
    )
    assert "needs a person" not in cli("status").out
    again = cli("release", "job.toml", "b")
    assert (again.code, again.out, again.err) == (
        1,
        "",
        "fanout release: b is not quarantined: it was released, and the next run starts it\n",
    )
    # Run 4 starts b again (it fails: one run of a new streak), run 5 quarantines it
    # again, run 6 does not start it.
    for expected in (1, 1, 9):
        _run(expected)
    history = json.loads(cli("history", "job.toml", "--format", "json").out)
    assert [
        (r["units"]["ran"], r["units"]["failed"], r["units"]["quarantined"]) for r in history
    ] == [
        (3, 1, 0),
        (1, 1, 0),
        (0, 0, 1),
        (1, 1, 0),
        (1, 1, 0),
        (0, 0, 1),
    ]


def test_release_refuses_a_unit_that_is_not_quarantined_and_releases_the_others(
    chdir_tmp: Path,
) -> None:
    write_job(chdir_tmp, NIGHTLY)
    _run(1)
    early = cli("release", "job.toml", "b", "nope")
    assert (early.code, early.out, early.err) == (
        1,
        "",
        "fanout release: b is not quarantined: it failed the same way in 1 run in a row,"
        " and 2 runs quarantine it\n"
        "fanout release: nope is not quarantined: nightly has no failure of it on record\n",
    )
    # Refused, its streak kept its count: the next failure quarantines it.
    _run(1)
    _run(9)
    mixed = cli("release", "job.toml", "a", "b", "b")
    assert mixed.code == 1
    assert mixed.out.startswith("released b: it failed the same way (failed) in 2 runs")
    assert mixed.out.count("\n") == 1
    assert mixed.err == (
        "fanout release: a is not quarantined: nightly has no failure of it on record\n"
    )


def test_release_where_nothing_ran_yet_writes_nothing(chdir_tmp: Path) -> None:
    write_job(chdir_tmp, NIGHTLY)
    result = cli("release", "job.toml", "b")
    assert (result.code, result.out, result.err) == (
        1,
        "",
        "fanout release: b is not quarantined: nightly has no failure of it on record\n",
    )
    assert not (chdir_tmp / ".fanout").exists()


def test_release_with_quarantine_off_says_nothing_is_quarantined(chdir_tmp: Path) -> None:
    _quarantined(chdir_tmp)
    write_job(chdir_tmp, NIGHTLY.replace("quarantineAfter = 2", "quarantineAfter = 0"))
    result = cli("release", "job.toml", "b")
    assert (result.code, result.err) == (
        1,
        "fanout release: b is not quarantined: units.quarantineAfter is 0, which"
        " quarantines nothing\n",
    )


# A lint checker for rounds: a file with a BAD line is a finding; the fixer removes it
# from a.txt, and fails on b.txt (its line says so), unchanged from round to round.
CHECKER = r"""
import pathlib
for f in sorted(pathlib.Path(".").glob("*.txt")):
    for n, line in enumerate(f.read_text().splitlines(), 1):
        if line.startswith("BAD"):
            print(f"{f}:{n}:1: E1 bad line")
"""
FIXER = r"""
import pathlib, sys
path = pathlib.Path(sys.argv[1])
text = path.read_text()
if "stuck" in text:
    sys.exit("cannot fix " + sys.argv[1])
path.write_text("fixed\n")
"""


def test_a_later_round_does_not_retry_a_unit_unchanged_since_it_failed(chdir_tmp: Path) -> None:
    (chdir_tmp / "a.txt").write_text("BAD\n")
    (chdir_tmp / "b.txt").write_text("BAD stuck\n")
    (chdir_tmp / "c.txt").write_text("BAD\n")
    (chdir_tmp / "check.py").write_text(CHECKER)
    (chdir_tmp / "fix.py").write_text(FIXER)
    write_job(
        chdir_tmp,
        f"""
        version = 1
        name = "lint"
        [inputs]
        command = ["{sys.executable}", "check.py"]
        format = "lint"
        [units]
        groupBy = "path"
        stage = ["{{{{ unit.id }}}}", "fix.py"]
        collect = ["{{{{ unit.id }}}}"]
        [task]
        command = ["{sys.executable}", "fix.py", "{{{{ unit.id }}}}"]
        [rounds]
        max = 3
        [collect]
        apply = true
        [runtime]
        sandbox = "none"
        """,
    )
    run = _run(1)
    markdown = (chdir_tmp / ".fanout" / "runs" / run / "report.md").read_text()
    assert (
        "Rounds: 1: 3 unit(s) from 3 record(s); 2: 1 unit(s) from 1 record(s)\n"
        "\n"
        "Round 2: 1 unit(s) not retried: unchanged since they failed in round 1.\n"
    ) in markdown
    data = json.loads((chdir_tmp / ".fanout" / "runs" / run / "report.json").read_text())
    assert [(r["round"], r["units"], r["unchanged"]) for r in data["rounds"]] == [
        (1, 3, 0),
        (2, 1, 1),
    ]
    (row,) = json.loads(cli("history", "job.toml", "--format", "json").out)
    assert row["units"] == {
        "selected": 3,
        "ran": 3,
        "unchanged": 1,
        "pending": 0,
        "running": 0,
        "succeeded": 2,
        "failed": 1,
        "interrupted": 0,
        "reused": 0,
        "quarantined": 0,
    }
    assert (row["rounds"], row["attempts"]) == (2, 3)


# A golden report.md of a recurring run from a fixed journal: three units reused from
# the run before, one that failed for the second run in a row (this run quarantines it),
# one quarantined three runs ago with a hostile id and reason, and a second round that
# did not retry two units.  Regenerate nothing automatically: the golden file is a
# reviewed statement of what a pull request comment says.
RUN = "20261202T030000-9c1e"
BEFORE = "20261201T030000-5b2d"
HOSTILE_ID = "evil|`id`\x1b[2J"
HOSTILE_REASON = "exit 1: </td><img src=x> **ok** \x1b[31mred\x1b[0m\nsecond line" + " long" * 60


def _recurring_journal(state_dir: Path) -> Journal:
    clock = [NIGHT]
    journal = Journal(state_dir / "journal.sqlite", clock=lambda: clock[0])
    journal.create_run(job="nightly", job_file="nightly.toml", apply=False, run_id=BEFORE)

    def unit(uid: str, n: int) -> Unit:
        return Unit(id=uid, index=n, items=({"id": uid},), origin=f"items:{n}", fingerprint=uid)

    # Three runs ago and on: the hostile unit's streak, quarantining since.
    for days in range(3):
        clock[0] = NIGHT - (3 - days) * DAY
        journal.record_failure(
            "nightly",
            f"old-{days}",
            unit(HOSTILE_ID, 9),
            failure="failed:turn-limit",
            reason=HOSTILE_REASON,
            spent_usd=0.25,
        )
    clock[0] = NIGHT - DAY
    streak = journal.record_failure(
        "nightly",
        BEFORE,
        unit("flaky", 3),
        failure="timeout",
        reason="timed out after 30s",
        spent_usd=0.0,
    )
    journal.finish_run(BEFORE, state=RunState.FINISHED, wall=60.0)
    clock[0] = NIGHT
    journal.create_run(job="nightly", job_file="nightly.toml", apply=True, run_id=RUN)
    journal.record_quarantine_after(RUN, 2)
    journal.set_round(RUN, 1, records=6, selected=6)
    journal.add_settled(
        RUN,
        1,
        [
            *(
                Settled.of(
                    unit=unit(f"ok-{n}", n),
                    state=UnitState.REUSED,
                    reason=f"reused from run {BEFORE}: unchanged since it succeeded",
                    reused_from=BEFORE,
                )
                for n in range(3)
            ),
            Settled.of(
                unit=unit(HOSTILE_ID, 5),
                state=UnitState.QUARANTINED,
                reason=quarantined(journal.streaks("nightly", [HOSTILE_ID])[HOSTILE_ID]),
            ),
        ],
    )
    journal.add_units(RUN, 1, [unit("flaky", 3), unit("new", 4)])
    for name, status, state in (
        ("flaky", Status.TIMEOUT, UnitState.FAILED),
        ("new", Status.FAILED, UnitState.FAILED),
    ):
        journal.attempt_dispatched(RUN, 1, name, 1, "default")
        journal.attempt_settled(
            RUN,
            1,
            name,
            1,
            AttemptResult(status=status, reason=str(status), duration=30.0),
            rung=0,
            rung_attempts=1,
            failures=1,
            last={"rung": "default"},
            outcome=Outcome(
                unit_id=name,
                round=1,
                state=state,
                rung="default",
                attempts=1,
                reason="timed out after 30s" if name == "flaky" else "exit 1",
            ),
        )
    assert streak.runs == 1
    journal.record_failure(
        "nightly",
        RUN,
        unit("flaky", 3),
        failure="timeout",
        reason="timed out after 30s",
        spent_usd=0.0,
    )
    journal.set_round(RUN, 2, records=2, selected=2)
    journal.count_unchanged(RUN, 2, 2)
    journal.finish_run(RUN, state=RunState.FINISHED, wall=61.0)
    return journal


def test_report_md_of_a_recurring_run_reads_as_its_golden_file(tmp_path: Path) -> None:
    journal = _recurring_journal(tmp_path / "state")
    markdown = report.write(journal, RUN, tmp_path / "out")
    expected = (DATA / "golden" / "report-recurring.md").read_text(encoding="utf-8")
    assert markdown.read_text(encoding="utf-8") == expected
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (data["quarantined"], data["newlyQuarantined"]) == (2, 1)
    assert [(p["unit"], p["new"], p["runs"]) for p in data["needsPerson"]] == [
        ("flaky", True, 2),
        (HOSTILE_ID, False, 3),
    ]
    assert [u.get("reusedFrom") for u in data["units"]][:4] == [BEFORE, BEFORE, BEFORE, None]
    # A reused unit is a success: like a succeeded one, it has no output tail.
    assert ["outputTail" in u for u in data["units"]] == [False] * 3 + [True] * 3


def test_long_lists_are_cut_and_say_how_many_more(tmp_path: Path, utc: None) -> None:
    journal = Journal(tmp_path / "journal.sqlite", clock=lambda: NIGHT)
    run = journal.create_run(job="big", job_file="big.toml", apply=False)
    journal.record_quarantine_after(run, 1)
    units = [
        Unit(id=f"u{n:03d}", index=n, items=(n,), origin="x", fingerprint="f") for n in range(230)
    ]
    journal.add_settled(
        run,
        1,
        [
            Settled.of(unit=u, state=UnitState.REUSED, reason="reused", reused_from="earlier")
            for u in units[:25]
        ],
    )
    for u in units:
        journal.record_failure("big", run, u, failure="failed", reason="exit 1", spent_usd=0.0)
    journal.finish_run(run, state=RunState.FINISHED, wall=1.0)
    data = report.markdown_data(journal, run)
    assert (data["quarantined"], data["newlyQuarantined"]) == (230, 230)
    assert len(data["needsPerson"]) == attention.SHOWN_QUARANTINED == 200
    assert len(data["reusedUnits"]) == skipped.SHOWN_REUSED == 20
    markdown = report.render_markdown(data)
    assert "\n\n30 more quarantined unit(s).\n" in markdown
    shown = ", ".join(f"<code>u{n:03d}</code>" for n in range(20))
    assert (
        "Reused, not run: 25 unit(s) unchanged since they succeeded in an earlier run (from"
        f" run <code>earlier</code>: {shown}; and 5 more in report.json).\n"
    ) in markdown
    # fanout status lists -n of them.
    lines = attention.status_lines(journal, journal.run(run), shown=2)
    assert lines[0].startswith("needs a person: 230 quarantined unit(s) of big (fanout release")
    assert lines[1:] == [
        "  u000  failed  1 run  since 2026-11-30 03:00  last 2026-11-30 03:00  $0.0000  exit 1",
        "  u001  failed  1 run  since 2026-11-30 03:00  last 2026-11-30 03:00  $0.0000  exit 1",
        "  and 228 more (-n N lists more)",
    ]
