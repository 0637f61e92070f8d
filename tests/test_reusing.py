"""A recurring job pays only for what changed (``run.reusing``): real ``fanout run``s of
one job over a JSONL backlog that changes between them, as a nightly cron job's does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fanout.errors import ExitCode

from helpers import cli, write_job

JOB = """
version = 1
name = "enrich"
[inputs]
jsonl = "records.jsonl"
[units]
id = "{{{{ unit.record.id }}}}"
quarantineAfter = 3
[task]
# Fails for a record whose status is "bad", as a worker that cannot enrich it would.
command = ["test", "{{{{ unit.record.status }}}}", "!=", "bad"]
prompt = "{prompt}"
[runtime]
maxConcurrentTasks = 8
sandbox = "none"
"""
PROMPT = "Enrich {{ unit.record.name }}."


def _write(directory: Path, records: dict[str, dict[str, Any]]) -> None:
    lines = (json.dumps({"id": key, **value}) for key, value in records.items())
    (directory / "records.jsonl").write_text("\n".join(lines) + "\n")


def _run(directory: Path, *args: str) -> tuple[int, dict[str, int], dict[str, Any]]:
    ran = cli("run", str(directory / "job.toml"), *args)
    assert ran.code in (0, 1, 9), ran.out + ran.err
    report = _latest(directory)
    return ran.code, report["totals"], report


def _latest(directory: Path) -> dict[str, Any]:
    """The newest run's report.json (run ids order by the second only)."""
    reports = [json.loads(p.read_text()) for p in directory.glob(".fanout/runs/*/report.json")]
    return max(reports, key=lambda report: report["started"])


@pytest.mark.slow
def test_a_nightly_job_runs_only_the_units_that_changed(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = {f"r{n:03d}": {"name": f"customer {n}", "status": "ok"} for n in range(200)}
    _write(chdir_tmp, records)
    write_job(chdir_tmp, JOB.format(prompt=PROMPT))

    # Run 1: every unit runs and succeeds.
    code, counts, _ = _run(chdir_tmp)
    assert (code, counts) == (0, {"succeeded": 200})

    # 10 records edited, 5 added, 3 removed: run 2 runs exactly the 15 that changed and
    # reuses the other 187, each from run 1.
    for n in range(10):
        records[f"r{n:03d}"]["name"] += " (moved)"
    for n in range(200, 205):
        records[f"r{n:03d}"] = {"name": f"customer {n}", "status": "ok"}
    for n in (197, 198, 199):
        del records[f"r{n:03d}"]
    _write(chdir_tmp, records)
    code, counts, report = _run(chdir_tmp)
    assert (code, counts) == (0, {"succeeded": 15, "reused": 187})
    first = min(
        (json.loads(p.read_text()) for p in chdir_tmp.glob(".fanout/runs/*/report.json")),
        key=lambda report: report["started"],
    )["run"]
    reused = [u for u in report["units"] if u["state"] == "reused"]
    assert {u["reusedFrom"] for u in reused} == {first}

    # The prompt template changed: every unit's rendered prompt did, all 202 run.
    write_job(chdir_tmp, JOB.format(prompt="Enrich {{ unit.record.name }}, briefly."))
    code, counts, _ = _run(chdir_tmp)
    assert (code, counts) == (0, {"succeeded": 202})

    # A record a worker cannot enrich: it fails the same way three runs in a row (the
    # others reused), and the fourth run does not start it (exit 9: quarantined, and
    # nothing else failed).
    records["r042"]["status"] = "bad"
    _write(chdir_tmp, records)
    for streak in (1, 2, 3):
        code, counts, _ = _run(chdir_tmp)
        assert (code, counts) == (1, {"failed": 1, "reused": 201}), streak
    code, counts, report = _run(chdir_tmp)
    assert (code, counts) == (ExitCode.QUARANTINED, {"quarantined": 1, "reused": 201})
    (unit,) = [u for u in report["units"] if u["state"] == "quarantined"]
    assert unit["unit"] == "r042"
    assert unit["reason"].startswith(
        "quarantined: failed the same way (failed) in 3 runs in a row since "
    )

    # Released, it runs again (and fails: its streak starts again from one).
    released = cli("release", str(chdir_tmp / "job.toml"), "r042")
    assert released.code == 0, released.out + released.err
    code, counts, _ = _run(chdir_tmp)
    assert (code, counts) == (1, {"failed": 1, "reused": 201})

    # Its record fixed back, it is what succeeded in run 3 again: reused from there.
    records["r042"]["status"] = "ok"
    _write(chdir_tmp, records)
    code, counts, _ = _run(chdir_tmp)
    assert (code, counts) == (0, {"reused": 202})
    # --no-reuse runs everything.
    code, counts, _ = _run(chdir_tmp, "--no-reuse")
    assert (code, counts) == (0, {"succeeded": 202})

    # fanout history shows each run with these counts.
    shown = cli("history", str(chdir_tmp / "job.toml"), "--format", "json")
    assert shown.code == 0, shown.out + shown.err
    rows = [
        {key: row["units"][key] for key in ("selected", "ran", "reused", "failed", "quarantined")}
        for row in json.loads(shown.out)
    ]
    assert rows == [
        {"selected": 200, "ran": 200, "reused": 0, "failed": 0, "quarantined": 0},
        {"selected": 202, "ran": 15, "reused": 187, "failed": 0, "quarantined": 0},
        {"selected": 202, "ran": 202, "reused": 0, "failed": 0, "quarantined": 0},
        *[{"selected": 202, "ran": 1, "reused": 201, "failed": 1, "quarantined": 0}] * 3,
        {"selected": 202, "ran": 0, "reused": 201, "failed": 0, "quarantined": 1},
        {"selected": 202, "ran": 1, "reused": 201, "failed": 1, "quarantined": 0},
        {"selected": 202, "ran": 0, "reused": 202, "failed": 0, "quarantined": 0},
        {"selected": 202, "ran": 202, "reused": 0, "failed": 0, "quarantined": 0},
    ]


FIX = """\
import pathlib, sys
path = pathlib.Path(sys.argv[1])
text = path.read_text()
if "HARD" in text:
    sys.exit("cannot fix this one")
path.write_text(text.replace("TODO", "DONE"))
"""


def test_a_later_round_does_not_run_again_a_unit_that_failed_unchanged(chdir_tmp: Path) -> None:
    """The httpie sweep: round 1 fixed some files and some exhausted their ladder; round
    2 selected those, unchanged, and ran every one again (a paid agent's second bill for
    each failure).  Now round 2 runs only what changed: here nothing, so it stops."""
    (chdir_tmp / "src").mkdir()
    for name, text in (("a", "TODO\n"), ("b", "TODO HARD\n"), ("c", "TODO HARD\n")):
        (chdir_tmp / "src" / f"{name}.txt").write_text(text)
    (chdir_tmp / "fix.py").write_text(FIX)
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "sweep"
        [inputs]
        command = ["grep", "-rl", "TODO", "src"]
        format = "lines"
        okExitCodes = [0, 1]
        [units]
        stage = ["fix.py", "{{ unit.id }}"]
        collect = ["{{ unit.id }}"]
        [task]
        command = ["python3", "fix.py", "{{ unit.id }}"]
        [runtime]
        sandbox = "none"
        [rounds]
        max = 3
        [collect]
        apply = true
        """,
    )
    ran = cli("run", "job.toml")
    assert ran.code == 1, ran.out + ran.err
    assert (chdir_tmp / "src" / "a.txt").read_text() == "DONE\n"
    report = json.loads(next((chdir_tmp / ".fanout" / "runs").glob("*/report.json")).read_text())
    assert report["attempts"] == {"failed": 2, "succeeded": 1}  # b and c ran once, not twice
    assert [(r["round"], r["units"], r["unchanged"]) for r in report["rounds"]] == [
        (1, 3, 0),
        (2, 2, 2),
    ]
    assert report["totals"] == {"failed": 2, "succeeded": 1}
    assert (
        "round 2: 0 unit(s) from 2 record(s); 2 not retried: unchanged since they failed in an"
        " earlier round"
    ) in ran.err


WRITE = """\
import pathlib, sys
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
(out / (sys.argv[1] + ".txt")).write_text("enriched " + sys.argv[1] + "\\n")
"""


def test_a_reused_unit_s_files_come_from_its_run_and_are_applied_only_if_missing(
    chdir_tmp: Path,
) -> None:
    (chdir_tmp / "write.py").write_text(WRITE)
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "enrich"
        [inputs]
        items = ["a", "b", "c"]
        [units]
        stage = ["write.py"]
        collect = ["out/{{ unit.id }}.txt"]
        [task]
        command = ["python3", "write.py", "{{ unit.id }}"]
        [runtime]
        sandbox = "none"
        [collect]
        apply = true
        """,
    )
    assert cli("run", "job.toml").code == 0
    first = next((chdir_tmp / ".fanout" / "runs").iterdir()).name
    (chdir_tmp / "out" / "b.txt").unlink()  # someone removed one result from the workspace

    ran = cli("run", "job.toml")
    assert ran.code == 0, ran.out + ran.err
    assert "finished: 3 reused" in ran.err
    assert (chdir_tmp / "out" / "b.txt").read_text() == "enriched b\n"
    units = _latest(chdir_tmp)["units"]
    assert [
        (u["unit"], u["state"], u["reusedFrom"], [c["state"] for c in u["changes"]]) for u in units
    ] == [
        ("a", "reused", first, ["unchanged"]),
        ("b", "reused", first, ["applied"]),
        ("c", "reused", first, ["unchanged"]),
    ]
