"""The report and status of big runs on real SQLite: the queries use their indexes,
report.json lists every unit as it streams, report.md stays bounded."""

from __future__ import annotations

import io
import json
import sqlite3
from pathlib import Path

import pytest

from fanout.backlog.units import Unit
from fanout.journal import Journal
from fanout.journal.tables import SCHEMA
from fanout.outcome import AttemptResult, CollectedFile, Outcome, RunState, Status, UnitState
from fanout.report import document as report
from fanout.report import fleet
from fanout.report.status import status_text

from helpers import unit_record


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
    assert status_text(journal, run, shown=2) == (
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
    failures = text.split("### Failed: needs a human")[1].split("### Changed files")[0]
    # The 250 units whose latest round failed, each once, under their one reason: the
    # 33 of them among the first 200 units failed in round 1 too, and are not listed twice.
    assert "\n\n250 unit(s) failed, for 1 reason(s);" in failures
    assert "\n#### 250 unit(s): failed\n" in failures
    assert failures.count("\n- <code>u") == 250
    assert (
        "\n- <code>u00003</code>: round 2, rung -, 0 attempt(s), failed in 2 rounds\n" in failures
    )
    assert all(failures.count(f"<code>{unit}</code>") == 1 for unit in data["failed"])
    assert "more" not in failures
    changed = text.split("### Changed files")[1].split("### Units")[0]
    assert changed.count("\n| <code>f") == report.SHOWN_UNITS
    assert "\n\n300 more unit(s) changed files, in report.json." in changed


class _Change:
    """A change as fan-in records it (the fields record_changes reads)."""

    def __init__(
        self, *, unit_id: str, path: str, added: int = 3, removed: int = 1, state: str = "applied"
    ) -> None:
        self.unit_id = unit_id
        self.path = path
        self.added = added
        self.removed = removed
        self.state = state


# A golden report.md from a fixed journal: real SQLite written through the journal's API
# with a fixed clock and run id, every attempt's duration fixed, and the run's event log
# (tests/data/progress/events.jsonl, the same run on three SSH hosts) for host states.
# Regenerate nothing automatically: the golden file is a reviewed statement of what a
# pull request comment says.
DATA = Path(__file__).parent / "data"
RUN = "20261130T030000-7f3a"
EVIL_ID = "evil\x1b[2J[bold]id[/]"
EVIL_REASON = (
    "exit 1: </summary><img src=x onerror=alert(1)> **LGTM** [approve](https://evil.example)"
    " \x1b[1A\x1b[2Kall tests passed"
)
EVIL_TAIL = (
    "running tests\n```\n## All checks passed\n\x1b[31mFAIL\x1b[0m test_login\r"
    "<script>alert(1)</script> | `x` ~~~\n"
)


def _attempt(
    journal: Journal,
    unit: str,
    n: int,
    result: AttemptResult,
    outcome: Outcome | None = None,
    *,
    rung: str = "default",
) -> None:
    journal.attempt_dispatched(RUN, 1, unit, n, rung, result.host)
    journal.attempt_settled(
        RUN,
        1,
        unit,
        n,
        result,
        rung=0,
        rung_attempts=n,
        failures=0,
        last=result.last_context(rung, n),
        outcome=outcome,
    )


def _fixed_journal(state_dir: Path) -> Journal:
    """An interrupted run of 9 units on hosts h1, h2 and h3 (quarantined): succeeded,
    throttled then lost then succeeded, timed out, lost then failed with a hostile
    reason, interrupted and never started; collected files applied, new and in conflict."""
    journal = Journal(state_dir / "journal.sqlite", clock=lambda: 1796007600.0)
    journal.create_run(job="triage", job_file="triage.toml", apply=True, run_id=RUN)
    ids = ["issue-101", "issue-102", "issue-103", EVIL_ID, "issue-104", "issue-105"]
    ids += ["issue-106", "issue-107", "issue-108"]
    journal.add_units(
        RUN,
        1,
        (
            Unit(id=uid, index=n, items=({"id": uid},), origin=f"issues.jsonl:{n + 1}")
            for n, uid in enumerate(ids)
        ),
    )
    journal.set_round(RUN, 1, records=10, selected=9)
    ok = Status.SUCCEEDED

    def done(unit: str, n: int, seconds: float, host: str, collected: tuple[str, ...] = ()) -> None:
        files = tuple(CollectedFile(path=p, sha256="0" * 64, size=1) for p in collected)
        result = AttemptResult(status=ok, reason="ok", exit_code=0, duration=seconds, host=host)
        outcome = Outcome(
            unit_id=unit,
            round=1,
            state=UnitState.SUCCEEDED,
            rung="default",
            attempts=n,
            reason="ok",
            collected=files,
        )
        _attempt(journal, unit, n, result, outcome)

    done("issue-101", 1, 20.0, "h1", ("notes/issue-101.md",))
    throttled = "429 Too Many Requests (Retry-After: 30)"
    _attempt(
        journal,
        "issue-102",
        1,
        AttemptResult(
            status=Status.THROTTLED,
            reason=throttled,
            exit_code=1,
            duration=21.5,
            host="h2",
            retry_after=30.0,
            throttled_limit="api",
        ),
    )
    lost = AttemptResult(
        status=Status.LOST, reason="lost h2: connection lost", duration=5.0, host="h2"
    )
    _attempt(journal, "issue-102", 2, lost)
    done("issue-102", 3, 24.0, "h1", ("src/api.py",))
    timeout = "timed out after 30s (worker and verify)"
    for n in (1, 2):
        _attempt(
            journal,
            "issue-103",
            n,
            AttemptResult(
                status=Status.TIMEOUT,
                reason=timeout,
                duration=30.0,
                host="h1",
                output_tail="step 1/3\nstep 2/3\n",
            ),
            None
            if n == 1
            else Outcome(
                unit_id="issue-103",
                round=1,
                state=UnitState.FAILED,
                rung="default",
                attempts=2,
                reason=timeout,
                output_tail="step 1/3\nstep 2/3\n",
            ),
        )
    quarantine = "h3: cannot create a sandbox in /srv/sandboxes: Permission denied"
    _attempt(
        journal,
        EVIL_ID,
        1,
        AttemptResult(status=Status.LOST, reason=quarantine, duration=0.4, host="h3"),
    )
    _attempt(
        journal,
        EVIL_ID,
        2,
        AttemptResult(
            status=Status.FAILED,
            reason=EVIL_REASON,
            exit_code=1,
            duration=26.0,
            host="h1",
            output_tail=EVIL_TAIL,
        ),
        Outcome(
            unit_id=EVIL_ID,
            round=1,
            state=UnitState.FAILED,
            rung="default",
            attempts=2,
            reason=EVIL_REASON,
            output_tail=EVIL_TAIL,
        ),
    )
    done("issue-104", 1, 22.0, "h2", ("docs/a|b `c`.md",))
    for n, unit in enumerate(("issue-105", "issue-106")):
        journal.attempt_dispatched(RUN, 1, unit, 1, "default", ("h1", "h2")[n])
        journal.unit_interrupted(RUN, 1, unit)
    journal.record_changes(
        RUN,
        1,
        [
            _Change(
                unit_id="issue-101", path="notes/issue-101.md", added=12, removed=0, state="applied"
            ),
            _Change(unit_id="issue-102", path="src/api.py", added=4, removed=2, state="conflict"),
            _Change(unit_id="issue-104", path="docs/a|b `c`.md", added=3, removed=0, state="new"),
        ],
    )
    stats = {
        "api": {
            "starts": 9,
            "achievedPerMinute": 4.576,
            "configuredPerMinute": 30.0,
            "throttles": 1,
            "pausedSeconds": 30.0,
            "learned": {"rate": 0.1, "window": 30.0, "throttles": 1, "concurrency": 1},
            "learnedText": "3.0 per 30s learned from 1 throttle, 1 at once (declared 30 per 1m)",
        },
        # What the gateway's window of an API learned: no starts of its own.
        "api:anthropic": {
            "learned": {"rate": 0.2, "window": 10.0, "throttles": 3, "concurrency": None},
            "learnedText": "2.0 per 10s learned from 3 throttles (declared 8 per 10s)",
        },
    }
    journal.finish_run(
        RUN,
        state=RunState.INTERRUPTED,
        wall=118.5,
        note="interrupted; `fanout run --resume` continues",
        limits=stats,
    )
    log = state_dir / "runs" / RUN / "events.jsonl"
    log.parent.mkdir(parents=True)
    log.write_bytes((DATA / "progress" / "events.jsonl").read_bytes())
    return journal


def test_report_md_of_a_fixed_journal_reads_as_its_golden_file(tmp_path: Path) -> None:
    journal = _fixed_journal(tmp_path / "state")
    markdown = report.write(journal, RUN, tmp_path / "out")
    expected = (DATA / "golden" / "report.md").read_text(encoding="utf-8")
    assert markdown.read_text(encoding="utf-8") == expected


def test_report_json_of_a_fixed_journal_reads_as_its_golden_file(tmp_path: Path) -> None:
    """report.json byte for byte, as fanout wrote it before its units were read as
    tuples and encoded by one reused encoder (the golden file was made then)."""
    journal = _fixed_journal(tmp_path / "state")
    out = io.StringIO()
    report.write_json(journal, RUN, out)
    assert out.getvalue() == (DATA / "golden" / "report.json").read_text(encoding="utf-8")
    written = report.write(journal, RUN, tmp_path / "out").with_name("report.json")
    assert written.read_text(encoding="utf-8") == out.getvalue()


def test_the_report_shows_what_each_limit_learned_and_a_dash_where_none(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state" / "journal.sqlite")
    run_id = journal.create_run(job="crm", job_file="crm.toml", apply=False)
    learned = {"rate": 0.2, "window": 10.0, "throttles": 3, "concurrency": 2}
    text = "2.0 per 10s learned from 3 throttles, 2 at once (none declared)"
    journal.finish_run(
        run_id,
        state=RunState.FINISHED,
        wall=60.0,
        limits={
            "*": {
                "starts": 12,
                "achievedPerMinute": 11.0,
                "configuredPerMinute": None,
                "throttles": 3,
                "pausedSeconds": 21.5,
                "learned": learned,
                "learnedText": text,
            },
            # As an older fanout recorded a limit: no learned fields.
            "search": {
                "starts": 12,
                "achievedPerMinute": 11.0,
                "configuredPerMinute": 60.0,
                "throttles": 0,
                "pausedSeconds": 0.0,
            },
        },
    )
    data = report.build(journal, run_id)
    assert data["limits"]["*"]["learned"] == learned
    assert data["limits"]["*"]["learnedText"] == text
    markdown = report.render_markdown(data)
    assert (
        "| limit | configured starts/min | achieved starts/min | throttled | paused | learned |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |\n"
        "| all dispatch | - | 11 | 3 | 22s | 2.0 per 10s |\n"
        "| search | 60 | 11 | 0 | 0.0s | - |\n"
        "\n"
        "Learned limits:\n"
        "\n"
        f"- all dispatch: {text}\n"
    ) in markdown


def test_report_json_lists_each_unit_as_its_journal_row_has_it(tmp_path: Path) -> None:
    """report.json reads only what it lists (SQLite extracts the rung and the origin);
    each record still says what the unit's full journal row says."""
    journal = _fixed_journal(tmp_path / "state")
    records = list(report.unit_records(journal, RUN))
    rows = list(journal.units(RUN))
    assert [r["unit"] for r in records] == [row.unit.id for row in rows]
    assert records[0]["collected"] == ["notes/issue-101.md"]
    assert records[3]["outputTail"] == EVIL_TAIL
    assert (records[0]["origin"], records[6]["rung"]) == ("issues.jsonl:1", "")
    for record, row in zip(records, rows, strict=True):
        tail = record.pop("outputTail", None)
        assert tail == (None if str(row.state) == "succeeded" else row.tail)
        changes = record.pop("changes")
        # The attempts' durations summed (``compute``): here the row's worker time.
        assert record.pop("activeSeconds") == record["workerSeconds"]
        assert record == unit_record(row)
        assert [c["path"] for c in changes] == [c.path for c in row.collected]


def test_a_quarantine_from_before_a_resume_lasts_until_the_host_shows_up(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    events = [
        {"event": "run.started", "run": "r"},
        {"event": "host.up", "host": "back", "slots": 2},
        {"event": "host.up", "host": "gone", "slots": 1},
        {"event": "host.quarantined", "host": "back", "slots": 2, "reason": "back: key changed"},
        {"event": "host.quarantined", "host": "gone", "slots": 1, "reason": "gone: no bwrap"},
        {"event": "run.resumed", "run": "r", "round": 1},
        {"event": "host.up", "host": "back", "slots": 2},
    ]
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    attempts = {"back": {"succeeded": 3, "lost": 1}, "gone": {"lost": 1}}
    assert [(r["host"], r["quarantined"], r["reason"]) for r in fleet.hosts(attempts, log)] == [
        ("back", False, ""),
        ("gone", True, "gone: no bwrap"),
    ]


def test_host_events_are_found_across_the_blocks_the_log_is_read_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log is skimmed a block at a time: an event cut by a block's end is still
    read, and a last line without its newline (a crash) too."""
    log = tmp_path / "events.jsonl"
    filler = [{"event": "unit.settled", "unit": f"u{n}", "reason": "ok " * n} for n in range(40)]
    events = [
        *filler[:10],
        {"event": "host.up", "host": "h1", "slots": 2},
        *filler[10:30],
        {"event": "host.lost", "host": "h1", "slots": 2, "reason": "h1: connection lost"},
        *filler[30:],
    ]
    text = "".join(json.dumps(event) + "\n" for event in events)
    last = json.dumps({"event": "host.quarantined", "host": "h2", "reason": "h2: key changed"})
    log.write_text(text + last)
    whole = fleet.hosts({"h1": {"succeeded": 2}}, log)
    assert [(r["host"], r["timesLost"], r["quarantined"]) for r in whole] == [
        ("h1", 1, False),
        ("h2", 0, True),
    ]
    for block in (7, 64, 100, 1000):
        monkeypatch.setattr(fleet, "_BLOCK", block)
        assert fleet.hosts({"h1": {"succeeded": 2}}, log) == whole


def test_report_json_units_are_compact_json_lines_whatever_their_text(tmp_path: Path) -> None:
    """SQLite writes a unit's line (``json_object``) and Python adds its tail and changes:
    each line is, byte for byte, the record Python's compact encoder would write, for
    text with quotes, backslashes, control characters, line separators and non-ASCII
    in every field that comes from a unit or a worker."""
    nasty = 'q"uo\\te \x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x1f\x7f \u2028\u2029 é 日本 🙂 </script>'
    journal = Journal(tmp_path / "journal.sqlite", clock=lambda: 1796007600.0)
    journal.create_run(job="j", job_file="j.toml", apply=False, run_id=RUN)
    ids = [f"a{nasty}", f"b{nasty}"]
    journal.add_units(
        RUN,
        1,
        (
            Unit(id=uid, index=n, items=({"id": uid},), origin=f"{nasty}:{n + 1}")
            for n, uid in enumerate(ids)
        ),
    )
    path = f"out/{nasty.replace(chr(0), '')}.md"
    files = (CollectedFile(path=path, sha256="0" * 64, size=1),)
    result = AttemptResult(status=Status.SUCCEEDED, reason=nasty, exit_code=0, duration=1.2345)
    outcome = Outcome(
        unit_id=ids[0],
        round=1,
        state=UnitState.SUCCEEDED,
        attempts=1,
        reason=nasty,
        collected=files,
    )
    _attempt(journal, ids[0], 1, result, outcome)
    failed = AttemptResult(
        status=Status.FAILED, reason=nasty, exit_code=1, duration=0.0005, output_tail=nasty
    )
    outcome = Outcome(
        unit_id=ids[1], round=1, state=UnitState.FAILED, attempts=1, reason=nasty, output_tail=nasty
    )
    _attempt(journal, ids[1], 1, failed, outcome)
    out = io.StringIO()
    report.write_json(journal, RUN, out)
    start = out.getvalue().index('  "units": [\n') + len('  "units": [\n')
    lines = out.getvalue()[start:].split("\n")[:2]
    records = [json.loads(line.strip().rstrip(",")) for line in lines]
    assert [r["unit"] for r in records] == ids
    assert records[1]["reason"] == records[1]["outputTail"] == nasty
    assert [r["origin"] for r in records] == [f"{nasty}:1", f"{nasty}:2"]
    assert records[0]["collected"] == [path]
    # SQLite rounds the decimal digits half away from zero: 1.2345 is 1.235 (Python's
    # round, of the binary 1.23449999..., would say 1.234).
    assert (records[0]["activeSeconds"], records[1]["activeSeconds"]) == (1.235, 0.001)
    for line, record in zip(lines, records, strict=True):
        compact = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        assert line.strip().rstrip(",") == compact


def _sums(journal: Journal) -> dict[str, float]:
    """Each unit's attempts' durations, summed here from the attempts' rows."""
    found: dict[str, float] = {}
    for attempt in journal.attempts(RUN):
        found[attempt["unit"]] = found.get(attempt["unit"], 0.0) + attempt["duration"]
    return {unit: round(seconds, 3) for unit, seconds in found.items()}


def _active(journal: Journal) -> dict[str, float]:
    return {r["unit"]: r["activeSeconds"] for r in report.unit_records(journal, RUN)}


def test_a_unit_s_active_seconds_count_every_attempt_however_it_ended(tmp_path: Path) -> None:
    """The units' running sums (``active_seconds``) against their attempts' rows: a
    success after a lost attempt, an attempt settled after its unit was, an attempt
    interrupted with its unit, and a unit never started."""
    now = [1796007600.0]
    journal = Journal(tmp_path / "journal.sqlite", clock=lambda: now[0])
    journal.create_run(job="j", job_file="j.toml", apply=False, run_id=RUN)
    ids = ["a", "b", "c", "d"]
    journal.add_units(
        RUN,
        1,
        (Unit(id=u, index=n, items=({"id": u},), origin=f"x:{n}") for n, u in enumerate(ids)),
    )
    lost = AttemptResult(status=Status.LOST, reason="lost", duration=4.5)
    ok = AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0, duration=10.25)

    def done(unit: str, attempts: int) -> Outcome:
        return Outcome(unit_id=unit, round=1, state=UnitState.SUCCEEDED, attempts=attempts)

    _attempt(journal, "a", 1, lost)
    _attempt(journal, "a", 2, ok, done("a", 2))
    # b: two attempts at once; the second settles after the first settled the unit.
    journal.attempt_dispatched(RUN, 1, "b", 1, "default")
    journal.attempt_dispatched(RUN, 1, "b", 2, "default")
    journal.attempt_settled(
        RUN, 1, "b", 1, ok, rung=0, rung_attempts=1, failures=0, last={}, outcome=done("b", 1)
    )
    late = AttemptResult(status=Status.FAILED, reason="late", exit_code=1, duration=2.5)
    journal.attempt_settled(RUN, 1, "b", 2, late, rung=0, rung_attempts=2, failures=1, last={})
    # c: interrupted 3 s after its attempt started.
    journal.attempt_dispatched(RUN, 1, "c", 1, "default")
    now[0] += 3.0
    journal.unit_interrupted(RUN, 1, "c")
    assert _active(journal) == {"a": 14.75, "b": 12.75, "c": 3.0, "d": 0.0}
    assert {u: s for u, s in _active(journal).items() if u != "d"} == _sums(journal)


def test_a_journal_an_older_fanout_wrote_sums_its_units_attempts(tmp_path: Path) -> None:
    """A journal without ``active_seconds``: read as it is, its report sums each unit's
    attempts; upgraded by a run, its old rows stay unknown (NULL) and are still summed,
    a later attempt of theirs included, and new units keep their own sums."""
    path = tmp_path / "journal.sqlite"
    journal = Journal(path, clock=lambda: 1796007600.0)
    journal.create_run(job="j", job_file="j.toml", apply=False, run_id=RUN)
    journal.add_units(RUN, 1, [Unit(id="old", index=0, items=({"id": "old"},), origin="x:1")])
    lost = AttemptResult(status=Status.LOST, reason="lost", duration=4.5)
    _attempt(journal, "old", 1, lost)
    journal.close()
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE units DROP COLUMN active_seconds")
    older = Journal(path, read_only=True)
    assert _active(older) == {"old": 4.5}
    older.close()
    upgraded = Journal(path, clock=lambda: 1796007600.0)
    ok = AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0, duration=10.25)
    outcome = Outcome(unit_id="old", round=1, state=UnitState.SUCCEEDED, attempts=2)
    _attempt(upgraded, "old", 2, ok, outcome)
    upgraded.add_units(RUN, 1, [Unit(id="new", index=1, items=({"id": "new"},), origin="x:2")])
    _attempt(upgraded, "new", 1, ok)
    row = upgraded.db.execute("SELECT active_seconds FROM units WHERE id = 'old'").fetchone()
    assert row[0] is None
    assert _active(upgraded) == {"old": 14.75, "new": 10.25} == _sums(upgraded)
