"""Whole runs on this machine: rounds, fan-in, resume after SIGKILL, Ctrl-C, retry."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.errors import Interrupted, StateError
from fanout.outcome import AttemptResult, Status, UnitState
from fanout.run.job import Options, Runner
from fanout.run.selection import _BATCH
from fanout.transports.local import LocalTransport

from helpers import MINIMAL, cli, make_runner, write_job
from procs import wait_until_gone

FANOUT = [sys.executable, "-m", "fanout"]

CHECKER = r"""
import pathlib, sys
files = sorted(pathlib.Path("mod").glob("*.txt"))
provided = {l.split()[1] for f in files for l in f.read_text().splitlines() if l.startswith("provides ")}
for f in files:
    for n, line in enumerate(f.read_text().splitlines(), 1):
        if line == "BAD":
            print(f"{f}:{n}:1: E1 bad line")
        if line.startswith("needs ") and line.split()[1] not in provided:
            print(f"{f}:{n}:1: E2 unresolved {line.split()[1]}")
"""

FIXER = r"""
import pathlib, sys
path = pathlib.Path(sys.argv[1])
lines = [l for l in path.read_text().splitlines() if l != "BAD"]
lines = [l.replace("provides foo", "provides bar").replace("needs foo", "needs bar") for l in lines]
path.write_text("".join(l + "\n" for l in lines))
"""


def _runner(job: spec.Spec, root: Path, events: list[dict[str, object]] | None = None) -> Runner:
    root.mkdir(exist_ok=True)
    return make_runner(
        job,
        LocalTransport(
            slots=4, sandbox_kind=job.runtime.sandbox, root=root, path=os.environ["PATH"]
        ),
        environ=dict(os.environ),
        events=events.append if events is not None else lambda e: None,
    )


async def test_rounds_pick_up_breakage_in_files_no_unit_touched(tmp_path: Path) -> None:
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "a.txt").write_text("provides foo\nBAD\n")
    (tmp_path / "mod" / "b.txt").write_text("BAD\nok\n")
    (tmp_path / "mod" / "c.txt").write_text("needs foo\n")
    (tmp_path / "check.py").write_text(CHECKER)
    (tmp_path / "fix.py").write_text(FIXER)
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "downstream"
            [inputs]
            command = ["{sys.executable}", "check.py"]
            format = "lint"
            [units]
            groupBy = "path"
            stage = ["{{{{ unit.id }}}}", "fix.py"]
            collect = ["{{{{ unit.id }}}}"]
            [task]
            command = ["{sys.executable}", "fix.py", "{{{{ unit.id }}}}"]
            verify = ["sh", "-c", "! grep -qx BAD \\"$1\\"", "sh", "{{{{ unit.id }}}}"]
            [rounds]
            max = 5
            [collect]
            apply = true
            """,
        )
    )
    runner = _runner(job, tmp_path / "sandboxes")
    summary = await runner.execute(Options())
    assert summary.exit_code == 0
    rounds = [(r["round"], r["selected"]) for r in runner.journal.rounds(summary.run_id)]
    assert rounds == [(1, 2), (2, 1), (3, 0)]
    round_two = runner.journal.units(summary.run_id, 2)
    assert [u.unit.id for u in round_two] == ["mod/c.txt"]
    assert summary.note == "nothing remains after round 2"
    assert (tmp_path / "mod" / "c.txt").read_text() == "needs bar\n"
    assert (tmp_path / "mod" / "a.txt").read_text() == "provides bar\n"
    report = json.loads((summary.report_dir / "report.json").read_text())
    assert [c["path"] for u in report["units"] for c in u["changes"]] == [
        "mod/a.txt",
        "mod/b.txt",
        "mod/c.txt",
    ]
    assert list((tmp_path / "sandboxes").iterdir()) == []


async def test_without_apply_collected_files_wait_in_the_run_folder(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("old\n")
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "noapply"
            [inputs]
            files = ["*.txt"]
            [units]
            stage = ["{{ unit.id }}"]
            collect = ["{{ unit.id }}"]
            [task]
            command = ["sh", "-c", "echo new > f.txt"]
            [rounds]
            max = 3
            """,
        )
    )
    runner = _runner(job, tmp_path / "sandboxes")
    summary = await runner.execute(Options())
    assert summary.note == "more rounds need collected files applied (collect.apply or --apply)"
    assert (tmp_path / "f.txt").read_text() == "old\n"
    (folder,) = (summary.report_dir / "units").iterdir()
    assert (folder / "f.txt").read_text() == "new\n"
    changes = runner.journal.changes(summary.run_id)
    assert [(c["path"], c["added"], c["removed"], c["state"]) for c in changes] == [
        ("f.txt", 1, 1, "changed")
    ]


async def test_a_workspace_file_changed_since_staging_is_a_conflict(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("old\n")
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "conflict"
            [inputs]
            files = ["*.txt"]
            [units]
            stage = ["{{{{ unit.id }}}}"]
            collect = ["{{{{ unit.id }}}}"]
            [task]
            command = ["sh", "-c", "echo mine > f.txt; echo edited-by-human > {tmp_path}/f.txt"]
            [runtime]
            sandbox = "none"
            [collect]
            apply = true
            """,
        )
    )
    events: list[dict[str, object]] = []
    runner = _runner(job, tmp_path / "sandboxes", events)
    summary = await runner.execute(Options())
    assert (tmp_path / "f.txt").read_text() == "edited-by-human\n"
    assert [c["state"] for c in runner.journal.changes(summary.run_id)] == ["conflict"]
    assert {"event": "file.conflict", "round": 1, "unit": "f.txt", "path": "f.txt"}.items() <= next(
        e for e in events if e["event"] == "file.conflict"
    ).items()


async def test_aggregate_gets_the_results_jsonl(tmp_path: Path) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "agg"
            [inputs]
            items = ["a", "b"]
            [task]
            command = ["sh", "-c", "test $FANOUT_UNIT_ID = a"]
            [aggregate]
            command = ["sh", "-c", "cat > results.jsonl"]
            """,
        )
    )
    runner = _runner(job, tmp_path / "sandboxes")
    summary = await runner.execute(Options())
    assert summary.exit_code == 1
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(line["unit"], line["state"], line["reason"]) for line in lines] == [
        ("a", "succeeded", "ok"),
        ("b", "failed", "worker exited with status 1"),
    ]


async def test_missing_secret_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from fanout.errors import EnvironmentProblem

    job = spec.load(
        write_job(
            tmp_path,
            'version = 1\nname = "s"\n[inputs]\nitems = ["a"]\n[task]\ncommand = ["true"]\nsecrets = ["NOT_SET_ANYWHERE"]\n',
        )
    )
    with pytest.raises(EnvironmentProblem, match="secret\\(s\\) NOT_SET_ANYWHERE not set"):
        await _runner(job, tmp_path / "sandboxes").execute(Options())


# Runs of the real CLI in a subprocess: SIGKILL, Ctrl-C, resume and retry.

GATED = """
version = 1
name = "gated"
[inputs]
items = [{items}]
[task]
command = ["sh", "-c", "while [ ! -e $1/$FANOUT_UNIT_ID ]; do sleep 0.02; done; test ! -e $1/fail-$FANOUT_UNIT_ID && echo $FANOUT_UNIT_ID >> $OUT", "worker", "{gates}"]
env = {{ OUT = "{out}" }}
[runtime]
maxConcurrentTasks = 4
sandbox = "none"
[retry]
backoff = {{ initial = "10ms", max = "10ms" }}
"""


def _gated_job(tmp_path: Path, count: int) -> tuple[Path, Path, Path]:
    gates, out = tmp_path / "gates", tmp_path / "done.txt"
    gates.mkdir()
    items = ", ".join(f'"u{n:02d}"' for n in range(count))
    job = write_job(tmp_path, GATED.format(items=items, gates=gates, out=out))
    return job, gates, out


def _settled(tmp_path: Path) -> int:
    db = tmp_path / ".fanout" / "journal.sqlite"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM units WHERE state IN ('succeeded', 'failed')"
            ).fetchone()
    except sqlite3.OperationalError:  # the coordinator has not created its tables yet
        return 0
    return int(row[0])


def _running(tmp_path: Path) -> int:
    db = tmp_path / ".fanout" / "journal.sqlite"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT COUNT(*) FROM attempts WHERE status IS NULL").fetchone()
    except sqlite3.OperationalError:
        return 0
    return int(row[0])


def _wait(condition: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def _start(job: Path, *args: str, tmpdir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    return subprocess.Popen(
        [*FANOUT, "run", str(job), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
@pytest.mark.parametrize("resume", [["--resume"], []], ids=["--resume", "by-default"])
def test_sigkill_then_resume_finishes_every_unit_exactly_once(
    tmp_path: Path, resume: list[str]
) -> None:
    job, gates, out = _gated_job(tmp_path, 30)
    sandboxes = tmp_path / "tmp"
    sandboxes.mkdir()
    coordinator = _start(job, tmpdir=sandboxes)
    for n in range(10):
        (gates / f"u{n:02d}").touch()
        _wait(lambda n=n: _settled(tmp_path) == n + 1)
    _wait(lambda: _running(tmp_path) == 4)
    coordinator.send_signal(signal.SIGKILL)
    coordinator.wait()
    assert wait_until_gone(str(gates)) == []
    for n in range(30):
        (gates / f"u{n:02d}").touch()
    resumed = subprocess.run(
        [*FANOUT, "run", str(job), *resume],
        capture_output=True,
        text=True,
        env={**os.environ, "TMPDIR": str(sandboxes)},
    )
    assert resumed.returncode == 0, resumed.stderr
    if not resume:
        assert "did not finish (killed): resuming it at round 1; --fresh starts" in resumed.stderr
    done = out.read_text().split()
    assert sorted(done) == [f"u{n:02d}" for n in range(30)]
    with sqlite3.connect(tmp_path / ".fanout" / "journal.sqlite") as conn:
        assert conn.execute("SELECT state, COUNT(*) FROM units GROUP BY state").fetchall() == [
            ("succeeded", 30)
        ]
        interrupted = conn.execute(
            "SELECT COUNT(*) FROM attempts WHERE status = 'interrupted'"
        ).fetchone()[0]
        assert interrupted == 4
    # The killed coordinator could not remove its sandboxes; the resumed run did.
    assert list(sandboxes.iterdir()) == []


@pytest.mark.slow
def test_ctrl_c_drains_then_resume_completes(tmp_path: Path) -> None:
    job, gates, out = _gated_job(tmp_path, 8)
    sandboxes = tmp_path / "tmp"
    sandboxes.mkdir()
    coordinator = _start(job, tmpdir=sandboxes)
    (gates / "u00").touch()
    _wait(lambda: _settled(tmp_path) == 1)
    _wait(lambda: _running(tmp_path) == 4)
    coordinator.send_signal(signal.SIGINT)
    _, stderr = coordinator.communicate(timeout=20)
    assert coordinator.returncode == 130, stderr
    db = sqlite3.connect(tmp_path / ".fanout" / "journal.sqlite")
    ((run_id,),) = db.execute("SELECT id FROM runs")
    db.close()
    report_md = tmp_path / ".fanout" / "runs" / run_id / "report.md"
    # One line: what happened, where the report is, how to continue.
    assert [line for line in stderr.splitlines() if "interrupt" in line] == [
        "interrupted: running units were stopped and their sandboxes removed;"
        f" report: {report_md}; `fanout run {job} --resume` continues run {run_id}"
    ]
    assert stderr.endswith(f"continues run {run_id}\n")
    assert "interrupted" in report_md.read_text()
    assert list(sandboxes.iterdir()) == []
    assert wait_until_gone(str(gates)) == []
    status = subprocess.run(
        [*FANOUT, "status"], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert "interrupted" in status
    for n in range(8):
        (gates / f"u{n:02d}").touch()
    resumed = subprocess.run([*FANOUT, "run", str(job), "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(out.read_text().split()) == [f"u{n:02d}" for n in range(8)]


@pytest.mark.slow
def test_retry_failed_reruns_only_the_failed_units(tmp_path: Path) -> None:
    job, gates, out = _gated_job(tmp_path, 4)
    for n in range(4):
        (gates / f"u{n:02d}").touch()
    (gates / "fail-u02").touch()
    first = subprocess.run([*FANOUT, "run", str(job)], capture_output=True, text=True)
    assert first.returncode == 1
    run_id = json.loads(max((tmp_path / ".fanout" / "runs").glob("*/report.json")).read_text())[
        "run"
    ]
    report = subprocess.run(
        [*FANOUT, "report", run_id], capture_output=True, text=True, check=True, cwd=tmp_path
    ).stdout
    assert "### Failed: needs a human" in report
    assert "#### 1 unit(s): worker exited with status 1\n\n- <code>u02</code>: round 1" in report
    (gates / "fail-u02").unlink()
    again = subprocess.run([*FANOUT, "retry", run_id], capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert sorted(out.read_text().split()) == ["u00", "u01", "u02", "u03"]


@pytest.mark.slow
def test_a_second_run_of_a_job_is_skipped_or_queued(tmp_path: Path) -> None:
    job, gates, out = _gated_job(tmp_path, 2)
    first = _start(job, tmpdir=tmp_path)
    _wait(lambda: _running(tmp_path) == 2)
    second = subprocess.run([*FANOUT, "run", str(job)], capture_output=True, text=True)
    assert second.returncode == 6
    assert (
        f"job 'gated' is already running (pid {first.pid}, started by fanout run" in second.stderr
    )
    assert "this run was skipped (overlap = skip)" in second.stderr
    queued = _start(job, "--overlap", "queue", "--no-reuse", tmpdir=tmp_path)
    time.sleep(0.5)
    assert queued.poll() is None  # waiting for the lock
    for n in range(2):
        (gates / f"u{n:02d}").touch()
    assert first.wait(timeout=30) == 0
    assert queued.wait(timeout=30) == 0
    assert sorted(out.read_text().split()) == ["u00", "u00", "u01", "u01"]


# A job error or a failing input found while the selection streams stops the run
# resumably: the documented exit code, a located message, no ExceptionGroup, and the
# next `fanout run` continues without running any settled unit again.

APPEND = """
version = 1
name = "stream"
[inputs]
{inputs}
[units]
{units}
[task]
command = ["sh", "-c", "echo $FANOUT_UNIT_ID >> {out}"]
[runtime]
maxConcurrentTasks = 4
sandbox = "none"
"""


def _append_job(directory: Path, inputs: str, units: str = "") -> Path:
    return write_job(
        directory, APPEND.format(inputs=inputs, units=units, out=directory / "done.txt")
    )


def _done(directory: Path) -> list[str]:
    path = directory / "done.txt"
    return path.read_text().split() if path.exists() else []


def _run_states(directory: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(directory / ".fanout" / "journal.sqlite") as conn:
        return conn.execute("SELECT id, state FROM runs").fetchall()


def _tail(err: str, lines: int) -> list[str]:
    return err.rstrip("\n").split("\n")[-lines:]


@pytest.mark.slow
def test_a_duplicate_id_mid_backlog_stops_the_run_and_the_next_run_continues(
    chdir_tmp: Path,
) -> None:
    # A batch of the selection (``_BATCH`` units) and 100 more; the duplicate is in the
    # second batch.
    total, at = _BATCH + 100, _BATCH + 50
    ids = [f"u{n}" for n in range(1, total + 1)]
    ids[at] = "u12"  # it repeats record 12
    data = chdir_tmp / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    _append_job(chdir_tmp, 'jsonl = "data.jsonl"')
    first = cli("run", "job.toml")
    assert first.code == 2
    ((run_id, state),) = _run_states(chdir_tmp)
    assert state == "stopped"
    expected = [
        f"data.jsonl:{at + 1}: duplicate unit id 'u12' (first at data.jsonl:12)",
        f"run {run_id} stopped; `fanout run job.toml` continues it",
    ]
    assert _tail(first.err, 2) == expected
    assert "Traceback" not in first.err
    assert "ExceptionGroup" not in first.err
    # The first batch had been selected: those units ran, once, and settled, but for
    # those still in hand when the stop came (at most a slot's worth: waiting for a
    # slot or rendering their templates, which is no paid work to keep).
    done = _done(chdir_tmp)
    assert len(done) == len(set(done))
    assert set(done) <= set(ids[:_BATCH])
    assert len(done) >= _BATCH - 4
    # The duplicate is still there: it stops again at the same record, running nothing
    # that had settled (what was left in hand may run now).
    again = cli("run", "job.toml")
    assert (again.code, _tail(again.err, 2)) == (2, expected)
    done = _done(chdir_tmp)
    assert len(done) == len(set(done))
    assert set(done) <= set(ids[:_BATCH])
    # Fixed: the same run continues and runs only what had not settled.
    ids[at] = f"u{at + 1}"
    data.write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    fixed = cli("run", "job.toml")
    assert fixed.code == 0, fixed.err
    assert _run_states(chdir_tmp) == [(run_id, "finished")]
    done = _done(chdir_tmp)
    assert sorted(done) == sorted(ids)
    assert len(done) == total


@pytest.mark.slow
def test_an_input_command_that_fails_mid_stream_stops_the_run_with_exit_4(
    chdir_tmp: Path,
) -> None:
    script = (
        "import sys\n"
        'for i in range(250): print(\'{"id": "c%d"}\' % i)\n'
        "print('boom', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    (chdir_tmp / "list.py").write_text(script)
    _append_job(
        chdir_tmp, f'command = ["{sys.executable}", "list.py"]\nformat = "jsonl"\ntimeout = "1m"'
    )
    first = cli("run", "job.toml")
    ((run_id, state),) = _run_states(chdir_tmp)
    assert (first.code, state) == (4, "stopped")
    assert _tail(first.err, 5) == [
        f"job.toml:5:1: inputs.command: input command exited with status 3: {sys.executable} list.py:",
        "boom",
        "status 3 is not in inputs.okExitCodes [0, 1]; if it means the command worked (linters"
        " exit non-zero when they find something), this line under [inputs] accepts it:",
        "    okExitCodes = [0, 1, 3]",
        f"run {run_id} stopped; `fanout run job.toml` continues it",
    ]
    # The first page of 200 was selected before the command failed: what had started of
    # it ran (slow start opens the flight as units get through, so maybe not all of it),
    # and nothing past it.
    first_page = {f"c{n}" for n in range(200)}
    assert set(_done(chdir_tmp)) <= first_page
    # Run again, the command fails again before the resumed round dispatches: exit 4
    # again, and nothing starts (what slow start had not started of the page waits for
    # a command that works).
    done = sorted(_done(chdir_tmp))
    again = cli("run", "job.toml")
    assert again.code == 4
    assert sorted(_done(chdir_tmp)) == done


def test_a_units_id_render_error_is_a_located_job_error_and_the_run_stops(
    chdir_tmp: Path,
) -> None:
    (chdir_tmp / "data.jsonl").write_text('{"name": "a"}\n{"name": "b"}\n{"other": 1}\n')
    _append_job(chdir_tmp, 'jsonl = "data.jsonl"', 'id = "{{ unit.record.name }}"')
    ran = cli("run", "job.toml")
    ((run_id, state),) = _run_states(chdir_tmp)
    assert (ran.code, state) == (2, "stopped")
    assert _tail(ran.err, 2) == [
        "job.toml:7:1: units.id: the value has no attribute 'name' (rendering for data.jsonl:3)",
        f"run {run_id} stopped; `fanout run job.toml` continues it",
    ]


def test_file_names_with_a_newline_or_non_utf8_bytes_are_skipped_with_a_warning(
    chdir_tmp: Path,
) -> None:
    for name in (b"a.txt", b"b\nc.txt", b"d\xff.txt"):
        with open(os.path.join(os.fsencode(chdir_tmp), name), "wb") as stream:
            stream.write(b"x\n")
    _append_job(chdir_tmp, 'files = ["*.txt"]')
    ran = cli("run", "job.toml")
    assert ran.code == 0, ran.err
    assert _done(chdir_tmp) == ["a.txt"]
    assert "job.toml:5:1: inputs.files: skipped 'b\\nc.txt': its name holds a line break" in ran.err
    assert "job.toml:5:1: inputs.files: skipped 'd\\udcff.txt': its name is not UTF-8" in ran.err


class _Scripted:
    """A transport whose attempts take a per-unit time (virtual) and end per unit."""

    capacity = 10

    def __init__(self) -> None:
        self.started: list[tuple[str, int, float]] = []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def run(self, attempt: Any) -> AttemptResult:
        loop = asyncio.get_running_loop()
        self.started.append((attempt.unit_id, attempt.number, loop.time()))
        if attempt.unit_id == "u0":
            await asyncio.sleep(1)
            return AttemptResult(status=Status.FAILED, reason="exit 1", exit_code=1)
        if attempt.unit_id == "u1":
            await asyncio.sleep(5)
            return AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0)
        await asyncio.sleep(2)
        raise StateError("the journal's disk is gone")


@pytest.mark.looptime
async def test_a_stop_interrupts_waiting_units_at_once_and_lets_running_attempts_settle(
    tmp_path: Path,
) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "drain"
            [inputs]
            items = ["u0", "u1", "u2"]
            [task]
            command = ["agent"]
            [runtime]
            maxConcurrentTasks = 3
            [retry]
            backoff = { initial = "10s", max = "10s", jitter = "none" }
            [[retry.ladder]]
            name = "default"
            attempts = 2
            """,
        )
    )
    transport = _Scripted()
    runner = make_runner(job, transport)
    loop = asyncio.get_running_loop()
    begun = loop.time()
    with pytest.raises(StateError) as caught:
        await runner.execute(Options())
    (run,) = runner.journal.runs()
    assert str(caught.value) == (
        f"the journal's disk is gone\nrun {run.id} stopped; `fanout run {job.file}` continues it"
    )
    # u0 waited out its backoff when u2 stopped the round at 2 s: interrupted then, never
    # retried; u1's attempt was running: it finished at 5 s and settled.
    assert [(unit, n, t - begun) for unit, n, t in transport.started] == [
        ("u0", 1, 0.0),
        ("u1", 1, 0.0),
        ("u2", 1, 0.0),
    ]
    assert loop.time() - begun == 5.0
    assert (run.state, run.note) == ("stopped", "the journal's disk is gone")
    states = {row.unit.id: (row.state, row.attempts) for row in runner.journal.units(run.id)}
    assert states == {
        "u0": (UnitState.INTERRUPTED, 1),
        "u1": (UnitState.SUCCEEDED, 1),
        "u2": (UnitState.INTERRUPTED, 1),
    }
    # Resumed, the stopped run runs u0 and u2 only.
    transport.started.clear()
    with pytest.raises(StateError):
        await runner.execute(Options(resume=True))
    assert sorted(unit for unit, _, _ in transport.started) == ["u0", "u2"]


async def test_a_full_disk_where_a_worker_starts_blames_no_unit(tmp_path: Path) -> None:
    from fakes import FakeTransport

    def full(attempt: Any) -> AttemptResult:
        raise OSError(errno.ENOSPC, "No space left on device", "/var/tmp/fanout-1-x")

    job = spec.load(write_job(tmp_path, MINIMAL))
    runner = make_runner(job, FakeTransport(script=full, delay=0))
    with pytest.raises(StateError) as caught:
        await runner.execute(Options())
    (run,) = runner.journal.runs()
    assert str(caught.value) == (
        "no space left on device: /var/tmp/fanout-1-x; free space and `fanout run` continues\n"
        f"run {run.id} stopped; `fanout run {job.file}` continues it"
    )
    assert runner.journal.unit_counts(run.id) == {"interrupted": 2}


class _Slow:
    """A transport whose every attempt takes 5 virtual seconds and succeeds."""

    capacity = 10

    def __init__(self) -> None:
        self.started: list[tuple[str, float]] = []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def run(self, attempt: Any) -> AttemptResult:
        loop = asyncio.get_running_loop()
        self.started.append((attempt.unit_id, loop.time()))
        await asyncio.sleep(5)
        return AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0)


@pytest.mark.looptime
async def test_a_stop_from_outside_starts_nothing_new_and_lets_running_attempts_settle(
    tmp_path: Path,
) -> None:
    """What a closed console asks for: unlike Ctrl-C, no running work is thrown away."""
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "closed"
            [inputs]
            items = ["u0", "u1", "u2", "u3"]
            [task]
            command = ["agent"]
            [runtime]
            maxConcurrentTasks = 2
            """,
        )
    )
    transport = _Slow()
    runner = make_runner(job, transport)
    loop = asyncio.get_running_loop()
    begun = loop.time()
    loop.call_later(1, runner.stop, Interrupted("the console closed"))
    with pytest.raises(Interrupted) as caught:
        await runner.execute(Options())
    (run,) = runner.journal.runs()
    assert caught.value.exit_code == 130
    assert str(caught.value) == (
        f"the console closed\nrun {run.id} stopped; `fanout run {job.file}` continues it"
    )
    assert [(unit, t - begun) for unit, t in transport.started] == [("u0", 0.0), ("u1", 0.0)]
    assert loop.time() - begun == 5.0
    states = {row.unit.id: row.state for row in runner.journal.units(run.id)}
    assert states == {
        "u0": UnitState.SUCCEEDED,
        "u1": UnitState.SUCCEEDED,
        "u2": UnitState.PENDING,
        "u3": UnitState.PENDING,
    }
    assert (run.state, run.note) == ("stopped", "the console closed")
    # The next run continues with the two units that never started.
    transport.started.clear()
    await runner.execute(Options(resume=True))
    assert sorted(unit for unit, _ in transport.started) == ["u2", "u3"]
