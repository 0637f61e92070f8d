"""``fanout status``, ``report`` and ``retry``'s look-up read the journal and write
nothing; ``fanout status RUN`` lists the units by state, the failures first."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest

from fanout.backlog.units import Unit
from fanout.journal import Journal
from fanout.journal.tables import SCHEMA
from fanout.outcome import Outcome, RunState, UnitState
from fanout.pacing.ceiling import Learned
from fanout.report.status import status_text

from helpers import cli, write_job

NO_STATE = "no fanout state in .fanout (no runs yet here; --state-dir names another)\n"


@pytest.mark.parametrize(
    "argv",
    [
        ("status",),
        ("status", "20260101T000000-abcd"),
        ("report", "20260101T000000-abcd"),
        ("report", "20260101T000000-abcd", "--format", "json"),
        ("retry", "20260101T000000-abcd"),
    ],
)
def test_read_only_commands_in_an_empty_folder_create_nothing(
    chdir_tmp: Path, argv: tuple[str, ...]
) -> None:
    result = cli(*argv)
    assert (result.code, result.out, result.err) == (5, "", NO_STATE)
    assert os.listdir(chdir_tmp) == []


def test_the_message_names_the_state_directory_asked_for(chdir_tmp: Path) -> None:
    result = cli("status", "--state-dir", "elsewhere/state")
    assert (result.code, result.err) == (
        5,
        "no fanout state in elsewhere/state (no runs yet here; --state-dir names another)\n",
    )
    assert os.listdir(chdir_tmp) == []


def _old_journal(path: Path) -> None:
    """A journal as the first fanout wrote it: no ``stretch`` column, none of the
    indexes added since."""
    path.parent.mkdir(parents=True)
    db = sqlite3.connect(path)
    db.executescript(
        SCHEMA.replace("    stretch REAL,\n", "")
        .replace("CREATE INDEX IF NOT EXISTS units_in_order", "-- ")
        .replace("CREATE INDEX IF NOT EXISTS units_by_id", "-- ")
    )
    db.execute(
        "INSERT INTO runs (id, job, job_file, started, state) VALUES"
        " ('20250101T000000-0001', 'old', 'old.toml', 1735689600, 'finished')"
    )
    db.execute(
        "INSERT INTO units (run, round, id, idx, data, state, reason, attempts) VALUES"
        " ('20250101T000000-0001', 1, 'a', 0, ?, 'failed', 'exit 2', 3)",
        (json.dumps({"items": ["a"], "origin": "x:1", "group": ""}),),
    )
    db.commit()
    db.close()


def _schema(path: Path) -> list[tuple[str, str]]:
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return sorted(db.execute("SELECT type, name FROM sqlite_master"))
    finally:
        db.close()


def test_a_journal_from_an_older_fanout_is_read_as_it_is(chdir_tmp: Path) -> None:
    journal = chdir_tmp / ".fanout" / "journal.sqlite"
    _old_journal(journal)
    before = _schema(journal)
    listing = cli("status")
    assert (listing.code, listing.out) == (
        0,
        "run                   job                   state        round  units\n"
        "20250101T000000-0001  old                   finished         1  1 failed\n",
    )
    detail = cli("status", "20250101T000000-0001")
    assert (detail.code, detail.out) == (
        0,
        "run 20250101T000000-0001 of old: finished, round 1\n"
        "  failed       1\n"
        "    a  rung -  3 attempt(s)  exit 2\n",
    )
    assert cli("report", "20250101T000000-0001").code == 0
    # Nothing was added: no column, no index, no reserve.
    assert _schema(journal) == before
    db = sqlite3.connect(journal)
    assert "stretch" not in {row[1] for row in db.execute("PRAGMA table_info(runs)")}
    db.close()
    assert not (chdir_tmp / ".fanout" / "journal.reserve").exists()


def test_a_file_that_is_not_a_journal_is_refused(chdir_tmp: Path) -> None:
    (chdir_tmp / ".fanout").mkdir()
    (chdir_tmp / ".fanout" / "journal.sqlite").write_text("not a database, " * 100)
    result = cli("status")
    assert (result.code, result.err) == (
        5,
        "cannot read the journal .fanout/journal.sqlite: file is not a database\n",
    )


def _unit(n: int, name: str) -> Unit:
    return Unit(id=name, index=n, items=(name,), origin=f"files:{name}")


def _detailed_run(journal: Journal) -> tuple[str, str]:
    """A stopped run with units in every state, and a retry of it."""
    run = journal.create_run(
        job="sweep", job_file="sweep.toml", apply=False, run_id="20260301T120000-aaaa"
    )
    names = ["src/ok.py", "src/bad\x1b[2J.py", "src/slow.py", "src/x.py", "src/y.py"]
    names += [f"src/f{n}.py" for n in range(5)]
    journal.add_units(run, 1, (_unit(n, name) for n, name in enumerate(names)))
    settled = {
        "src/ok.py": ("succeeded", "ok", 1, "default"),
        "src/bad\x1b[2J.py": ("failed", "exit 1: \x1b[31mE501\x1b[0m line too long", 3, "opus"),
        "src/slow.py": ("interrupted", "fanout stopped before it settled", 1, "default"),
        "src/x.py": ("running", "", 2, "sonnet"),
        **{
            f"src/f{n}.py": ("failed", f"worker exited with status {n + 1}", 4, "opus")
            for n in range(5)
        },
    }
    for name, (state, reason, attempts, rung) in settled.items():
        journal.db.execute(
            "UPDATE units SET state = ?, reason = ?, attempts = ?, last = ? WHERE id = ?",
            (state, reason, attempts, json.dumps({"rung": rung}), name),
        )
    journal.finish_run(run, state=RunState.STOPPED, wall=60.0, note="no space left on device")
    retry = journal.create_run(
        job="sweep",
        job_file="sweep.toml",
        apply=False,
        parent=run,
        run_id="20260301T130000-bbbb",
    )
    journal.add_units(retry, 1, [_unit(0, "src/f0.py")])
    journal.unit_settled(
        retry, Outcome(unit_id="src/f0.py", round=1, state=UnitState.SUCCEEDED, reason="ok")
    )
    journal.finish_run(retry, state=RunState.FINISHED, wall=5.0)
    return run, retry


def test_status_of_a_run_lists_its_units_by_state_failures_first(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    run, retry = _detailed_run(journal)
    assert status_text(journal, run, shown=4) == (
        "run 20260301T120000-aaaa of sweep: stopped, round 1 (no space left on device)\n"
        "  retried in 20260301T130000-bbbb\n"
        "  failed       6\n"
        "    src/bad\\x1b[2J.py  rung opus  3 attempt(s)  exit 1: \\x1b[31mE501\\x1b[0m line too long\n"
        "    src/f0.py          rung opus  4 attempt(s)  worker exited with status 1\n"
        "    src/f1.py          rung opus  4 attempt(s)  worker exited with status 2\n"
        "    src/f2.py          rung opus  4 attempt(s)  worker exited with status 3\n"
        "    and 2 more: fanout report 20260301T120000-aaaa\n"
        "  interrupted  1\n"
        "    src/slow.py  rung default  1 attempt(s)  fanout stopped before it settled\n"
        "  running      1\n"
        "    src/x.py  rung sonnet  2 attempt(s)\n"
        "  pending      1\n"
        "    src/y.py  rung -  0 attempt(s)\n"
        "  succeeded    1\n"
        "    src/ok.py  rung default  1 attempt(s)  ok\n"
    )
    assert status_text(journal, retry) == (
        "run 20260301T130000-bbbb of sweep: finished, round 1\n"
        "  retry of 20260301T120000-aaaa\n"
        "  succeeded    1\n"
        "    src/f0.py  rung -  0 attempt(s)  ok\n"
    )
    assert status_text(journal, None) == (
        "run                   job                   state        round  units\n"
        "20260301T130000-bbbb  sweep                 finished         1  1 succeeded"
        "  (retry of 20260301T120000-aaaa)\n"
        "20260301T120000-aaaa  sweep                 stopped          1"
        "  6 failed, 1 interrupted, 1 pending, 1 running, 1 succeeded\n"
    )


def test_the_cli_names_the_state_dir_in_its_pointer_to_the_report(chdir_tmp: Path) -> None:
    journal = Journal(chdir_tmp / "state dir" / "journal.sqlite")
    run, _ = _detailed_run(journal)
    journal.close()
    result = cli("status", run, "--state-dir", "state dir", "-n", "1")
    assert result.code == 0
    assert result.out.splitlines()[3:6] == [
        "    src/bad\\x1b[2J.py  rung opus  3 attempt(s)  exit 1: \\x1b[31mE501\\x1b[0m line too long",
        "    and 5 more: fanout report --state-dir 'state dir' 20260301T120000-aaaa",
        "  interrupted  1",
    ]


def test_a_long_reason_is_cut_on_the_terminal(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite")
    run = journal.create_run(job="j", job_file="j.toml", apply=False, run_id="r")
    journal.add_units(run, 1, [_unit(0, "u")])
    journal.unit_settled(
        run, Outcome(unit_id="u", round=1, state=UnitState.FAILED, reason="why " * 100)
    )
    (line,) = [x for x in status_text(journal, run).splitlines() if x.startswith("    u")]
    assert line == "    u  rung -  0 attempt(s)  " + ("why " * 40)[:157] + "..."


def test_status_shows_a_long_job_name_whole(chdir_tmp: Path) -> None:
    # Two jobs whose names share their first 21 characters (a name may have 64): cut
    # there, the two were one job in the listing.
    names = ["nightly-dependency-upgrade-api", "nightly-dependency-upgrade-web-frontend"]
    for name in names:
        write_job(
            chdir_tmp,
            f"""
            version = 1
            name = "{name}"
            [inputs]
            items = ["a"]
            [task]
            command = ["true"]
            [runtime]
            sandbox = "none"
            """,
            name=f"{name}.toml",
        )
        ran = cli("run", f"{name}.toml")
        assert ran.code == 0, ran.out + ran.err
    listing = cli("status")
    assert listing.code == 0
    header, *rows = listing.out.splitlines()
    assert header == (
        "run                   job                                     state        round  units"
    )
    assert [re.sub(r"^\d{8}T\d{6}-[0-9a-f]{4}", "R", row) for row in rows] == [
        "R  nightly-dependency-upgrade-web-frontend finished         1  1 succeeded",
        "R  nightly-dependency-upgrade-api          finished         1  1 succeeded",
    ]


def test_status_says_what_a_run_s_limits_learned_and_what_each_job_keeps(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.sqlite", clock=lambda: 1796007600.0)
    done = journal.create_run(job="crm", job_file="crm.toml", apply=False, run_id="r-done")
    text = "2.0 per 10s learned from 3 throttles, 2 at once (none declared)"
    journal.finish_run(
        done,
        state=RunState.FINISHED,
        wall=1.0,
        limits={
            "*": {"starts": 3, "throttles": 3, "learned": {"rate": 0.2}, "learnedText": text},
            "api:anthropic\x1b[2J": {"learned": {"rate": 1.0}, "learnedText": "60.0 per 1m"},
            "quiet": {"starts": 3, "throttles": 0, "learned": None, "learnedText": None},
        },
    )
    assert status_text(journal, done).endswith(
        f"  learned limits\n    all dispatch: {text}\n    api anthropic\\x1b[2J: 60.0 per 1m\n"
    )
    # A run still going (or killed) has recorded nothing yet: what its rounds kept.
    going = journal.create_run(job="crm", job_file="crm.toml", apply=False, run_id="r-going")
    later = Learned(rate=0.3, window=10.0, throttles=4)
    journal.save_ceilings("crm", {"*": (later, "3.0 per 10s learned")}, run_id=going)
    assert status_text(journal, going).endswith(
        "  learned limits\n    all dispatch: 3.0 per 10s learned\n"
    )
    assert "learned limits" not in status_text(
        journal, journal.create_run(job="new", job_file="n.toml", apply=False)
    )
    # Resumed, the finished stretch's record is overtaken by what the rounds keep now.
    journal.reopen_run(done)
    journal.save_ceilings("crm", {"*": (later, "3.0 per 10s, resumed")}, run_id=done)
    assert status_text(journal, done).endswith(
        "  learned limits\n"
        "    all dispatch: 3.0 per 10s, resumed\n"
        "    api anthropic\\x1b[2J: 60.0 per 1m\n"
    )
    # The runs, then what each job's next run starts from.
    assert status_text(journal, None).endswith(
        "\nlearned limits (kept for each job's next run)\n"
        "  crm  all dispatch: 3.0 per 10s, resumed\n"
    )
