"""Cancellation: a Ctrl-C kills the coordinator's own commands (the input command, the
aggregate command) with their process groups at once, and the end of a run is recorded
before the transport's bounded close, which a second Ctrl-C may cut short."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fanout import spec
from fanout.errors import InputFailed
from fanout.run.job import CLOSE_BOUND_S, Options, Runner

from fakes import FakeTransport
from helpers import make_runner, write_job
from procs import group_members

FANOUT = [sys.executable, "-m", "fanout"]

# Far beyond any bound below: a command still sleeping when the test looks is one that
# nobody killed.
SLOW_COMMAND = "echo $$ > {pidfile}; sleep 60; echo late"


def _group_gone(pgid: int, timeout: float = 5.0) -> list[int]:
    """Members of ``pgid`` still alive after up to ``timeout`` seconds (a SIGKILLed
    orphan is reaped by init a moment after its parent's exit)."""
    deadline = time.monotonic() + timeout
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def _start_selecting(tmp_path: Path, name: str, command: str) -> tuple[Path, subprocess.Popen[str]]:
    """``fanout run`` started on a job whose input command is ``command`` (TOML array
    items)."""
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "{name}"
        [inputs]
        command = [{command}]
        format = "lines"
        [task]
        command = ["true"]
        [runtime]
        sandbox = "none"
        """,
    )
    coordinator = subprocess.Popen(
        [*FANOUT, "run", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return job, coordinator


def _pid_when_written(pidfile: Path, coordinator: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 30
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert coordinator.poll() is None, coordinator.communicate()
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.02)
    return int(pidfile.read_text())


def _interrupt(coordinator: subprocess.Popen[str], what: str) -> tuple[float, str]:
    """SIGINT, then the seconds until the coordinator exited, and its stderr."""
    signalled = time.monotonic()
    coordinator.send_signal(signal.SIGINT)
    try:
        _, stderr = coordinator.communicate(timeout=90)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    latency = time.monotonic() - signalled
    print(f"Ctrl-C during {what}: exited {latency:.2f}s after the signal")
    return latency, stderr


def _run_row(tmp_path: Path) -> tuple[str, str]:
    with sqlite3.connect(tmp_path / ".fanout" / "journal.sqlite") as db:
        ((run_id, state),) = db.execute("SELECT id, state FROM runs").fetchall()
    return run_id, state


@pytest.mark.slow
def test_ctrl_c_during_a_slow_input_command_kills_its_group_at_once(tmp_path: Path) -> None:
    pidfile = tmp_path / "input.pid"
    job, coordinator = _start_selecting(
        tmp_path, "slow-input", f'"sh", "-c", "{SLOW_COMMAND.format(pidfile=pidfile)}"'
    )
    pgid = _pid_when_written(pidfile, coordinator)
    assert group_members(pgid) != []
    latency, stderr = _interrupt(coordinator, "a 60s input command")
    assert coordinator.returncode == 130, stderr
    # A sanity bound, not a speed target: before, the run waited for the command's end.
    assert latency < 5, stderr
    assert _group_gone(pgid) == []
    run_id, state = _run_row(tmp_path)
    assert state == "interrupted"
    assert stderr.endswith(f"`fanout run {job} --resume` continues run {run_id}\n")


@pytest.mark.slow
def test_ctrl_c_is_prompt_when_a_daemon_outside_the_group_holds_the_output_pipe(
    tmp_path: Path,
) -> None:
    """The selection's thread must not be left reading a pipe that a process fanout
    cannot kill (it left the group with setsid) keeps open."""
    pidfile, escaped = tmp_path / "input.pid", tmp_path / "escaped.pid"
    script = tmp_path / "list.sh"
    script.write_text(
        f"setsid sh -c 'echo $$ > {escaped}; exec sleep 60' &\n"
        + SLOW_COMMAND.format(pidfile=pidfile)
        + "\n"
    )
    _, coordinator = _start_selecting(tmp_path, "escaped-input", f'"sh", "{script}"')
    pgid = _pid_when_written(pidfile, coordinator)
    outsider = _pid_when_written(escaped, coordinator)
    try:
        assert outsider not in group_members(pgid)
        latency, stderr = _interrupt(coordinator, "an input command whose daemon holds stdout")
        assert coordinator.returncode == 130, stderr
        assert latency < 5, stderr
        assert _group_gone(pgid) == []
    finally:
        os.killpg(outsider, signal.SIGKILL)


def test_ctrl_c_during_a_slow_aggregate_kills_its_group_and_keeps_the_journal(
    tmp_path: Path,
) -> None:
    pidfile = tmp_path / "aggregate.pid"
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "slow-aggregate"
        [inputs]
        items = ["a"]
        [task]
        command = ["true"]
        [runtime]
        sandbox = "none"
        [aggregate]
        command = ["sh", "-c", "echo posting; {SLOW_COMMAND.format(pidfile=pidfile)}"]
        """,
    )
    coordinator = subprocess.Popen(
        [*FANOUT, "run", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pgid = _pid_when_written(pidfile, coordinator)
    latency, stderr = _interrupt(coordinator, "a 60s aggregate command")
    assert coordinator.returncode == 130, stderr
    assert latency < 5, stderr
    assert _group_gone(pgid) == []
    run_id, state = _run_row(tmp_path)
    assert state == "finished"
    run_dir = tmp_path / ".fanout" / "runs" / run_id
    assert (run_dir / "report.md").exists()
    assert stderr.endswith(
        f"interrupted after run {run_id} finished; report: {run_dir / 'report.md'}\n"
    )
    # What it printed before the interrupt is kept, and the interrupt is said.
    assert (run_dir / "aggregate.out").read_text() == "posting\n"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [
        (e["event"], e.get("reason"), e.get("output"))
        for e in events
        if e["event"].startswith("aggregate.")
    ] == [("aggregate.failed", "interrupted", str(run_dir / "aggregate.out"))]


def _runner(tmp_path: Path, transport: FakeTransport) -> Runner:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "closing"
            [inputs]
            items = ["a"]
            [task]
            command = ["agent"]
            """,
        )
    )
    return make_runner(job, transport)


def _recorded(runner: Runner) -> tuple[str, str, bool]:
    """The run's state in the journal, its note, and whether its report exists."""
    (row,) = runner.journal.runs()
    return row.state, row.note, (runner.run_dir(row.id) / "report.md").exists()


@pytest.mark.looptime
async def test_a_close_that_hangs_is_cut_at_its_bound_after_the_journal_is_written(
    tmp_path: Path,
) -> None:
    transport = FakeTransport(delay=1.0, close_delay=3600.0)
    runner = _runner(tmp_path, transport)
    notices: list[str] = []
    runner.events.add(lambda e: notices.append(e["message"]) if e["event"] == "notice" else None)
    loop = asyncio.get_running_loop()
    started = loop.time()
    summary = await runner.execute(Options())
    # One unit of one virtual second, then the bound; not the hour the close would take.
    assert loop.time() - started == 1.0 + CLOSE_BOUND_S
    assert summary.counts == {"succeeded": 1}
    assert _recorded(runner) == ("finished", "", True)
    assert not transport.closed
    assert notices == [
        "the transport did not close within 10s; fanout stopped waiting"
        " (a sandbox or a connection may be left behind)"
    ]


@pytest.mark.looptime
async def test_a_second_cancel_aborts_the_close_but_the_journal_is_written(
    tmp_path: Path,
) -> None:
    transport = FakeTransport(delay=100.0, close_delay=3600.0)
    runner = _runner(tmp_path, transport)
    run = asyncio.create_task(runner.execute(Options()))
    await asyncio.sleep(1)
    run.cancel()  # the first Ctrl-C: during the unit
    await asyncio.sleep(1)
    assert not run.done()  # closing the transport, within its bound
    assert _recorded(runner) == (
        "interrupted",
        "interrupted; `fanout run --resume` continues",
        True,
    )
    run.cancel()  # the second: the close is cut short
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not transport.closed
    (unit,) = runner.journal.units(runner.journal.runs()[0].id)
    assert unit.state.value == "interrupted"


@pytest.mark.looptime
async def test_an_interrupted_run_s_close_is_bounded_too(tmp_path: Path) -> None:
    transport = FakeTransport(delay=100.0, close_delay=3600.0)
    runner = _runner(tmp_path, transport)
    loop = asyncio.get_running_loop()
    started = loop.time()
    run = asyncio.create_task(runner.execute(Options()))
    await asyncio.sleep(1)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    # The bound counts from the interrupt's drain, which is immediate here.
    assert loop.time() - started == 1.0 + CLOSE_BOUND_S
    assert _recorded(runner)[0] == "interrupted"


@pytest.mark.looptime
async def test_a_cancel_during_the_close_of_a_finished_run_keeps_it_finished(
    tmp_path: Path,
) -> None:
    transport = FakeTransport(delay=1.0, close_delay=3600.0)
    runner = _runner(tmp_path, transport)
    run = asyncio.create_task(runner.execute(Options()))
    await asyncio.sleep(5)
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert _recorded(runner) == ("finished", "", True)


def test_the_cancel_tests_kill_what_they_start() -> None:
    """The helper above sees the groups it claims to (so 'gone' means gone)."""
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert group_members(sleeper.pid) == [sleeper.pid]
    finally:
        os.killpg(sleeper.pid, signal.SIGKILL)
        sleeper.wait()
    assert group_members(sleeper.pid) == []


def _command_runner(tmp_path: Path, inputs: str) -> Runner:
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "listing"
            [inputs]
            {inputs}
            [task]
            command = ["agent"]
            """,
        )
    )
    return make_runner(job, FakeTransport(delay=0.0), environ={"PATH": os.environ["PATH"]})


async def test_a_run_s_input_command_times_out_located_at_inputs_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "input.pid"
    runner = _command_runner(
        tmp_path,
        f'command = ["sh", "-c", "{SLOW_COMMAND.format(pidfile=pidfile)}"]\n'
        '            format = "lines"\n'
        '            timeout = "1s"',
    )
    with pytest.raises(InputFailed) as caught:
        await runner.execute(Options())
    (run,) = runner.journal.runs()
    assert str(caught.value).splitlines() == [
        f"{runner.spec.file}:7:1: inputs.timeout: input command timed out after 1s: sh -c "
        f"'{SLOW_COMMAND.format(pidfile=pidfile)}'",
        f"run {run.id} stopped; `fanout run {runner.spec.file}` continues it",
    ]
    assert _group_gone(int(pidfile.read_text())) == []
    assert _recorded(runner)[0] == "stopped"


@pytest.mark.slow
async def test_an_input_command_held_back_by_the_run_is_not_timed_out(tmp_path: Path) -> None:
    # 2,000 lines of 3 KB: the selection reads 1,000 units, then the rest waits on the
    # pipe until they are dispatched, which takes longer than the command's 1 s.  The
    # command was killed for it ("input command timed out after 1s"): with agents, a
    # backlog of more than 1,000 units ran for an hour and stopped at unit 1,000.
    script = (
        'BEGIN { for (i = 0; i < 2000; i++) { printf "%d ", i;'
        ' for (j = 0; j < 300; j++) printf "xxxxxxxxxx"; print "" } }'
    )
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "held"
            [inputs]
            command = ["awk", {json.dumps(script)}]
            format = "lines"
            timeout = "1s"
            [units]
            id = "{{{{ unit.items[0].split(' ')[0] }}}}"
            [task]
            command = ["agent"]
            [runtime]
            maxConcurrentTasks = 4
            """,
        )
    )
    runner = make_runner(job, FakeTransport(delay=0.01), environ={"PATH": os.environ["PATH"]})
    summary = await runner.execute(Options())
    assert summary.counts == {"succeeded": 2000}


async def test_a_run_stopped_by_units_limit_kills_its_input_command(tmp_path: Path) -> None:
    pidfile = tmp_path / "input.pid"
    listing = f"echo $$ > {pidfile}; echo u1; echo u2; echo u3; sleep 60"
    runner = _command_runner(
        tmp_path,
        f'command = ["sh", "-c", "{listing}"]\n            format = "lines"\n'
        "            [units]\n            limit = 2",
    )
    summary = await runner.execute(Options())
    assert summary.counts == {"succeeded": 2}
    assert _group_gone(int(pidfile.read_text())) == []
