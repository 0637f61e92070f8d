"""A run's console going away (``| head``, a closed terminal) and sinks that fail: the
units never notice, the run drains and stays resumable, nothing more is written."""

from __future__ import annotations

import errno
import os
import pty
import random
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.events import Events
from fanout.run.job import Options

from fakes import FakeTransport
from helpers import make_runner, write_job

FANOUT = [sys.executable, "-m", "fanout"]
UNITS = 200


def _job(tmp_path: Path) -> tuple[Path, Path]:
    """~200 quick units, each appending its id to done.txt once its work is done."""
    done = tmp_path / "done.txt"
    items = ", ".join(f'"u{n:03d}"' for n in range(UNITS))
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "piped"
        [inputs]
        items = [{items}]
        [task]
        command = ["sh", "-c", "sleep 0.05; echo $FANOUT_UNIT_ID >> {done}"]
        timeout = "30s"
        [runtime]
        sandbox = "none"
        maxConcurrentTasks = 4
        """,
    )
    return job, done


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", **more}


def _journal_rows(tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(tmp_path / ".fanout" / "journal.sqlite")
    try:
        return list(db.execute(sql))
    finally:
        db.close()


def _assert_drained_then_resumed(tmp_path: Path, job: Path, done: Path) -> None:
    ((run_id, state, note),) = _journal_rows(tmp_path, "SELECT id, state, note FROM runs")
    # Stopped gently: no attempt was cut short, none will be paid for twice.
    assert (state, note) == ("stopped", "the console fanout reported to was closed")
    assert _journal_rows(tmp_path, "SELECT COUNT(*) FROM attempts WHERE status IS NULL") == [(0,)]
    assert _journal_rows(
        tmp_path, "SELECT COUNT(*) FROM attempts WHERE status = 'interrupted'"
    ) == [(0,)]
    reasons = _journal_rows(
        tmp_path,
        "SELECT reason FROM units WHERE reason LIKE '%Pipe%' OR reason LIKE '%Errno%'"
        " UNION ALL SELECT reason FROM attempts WHERE reason LIKE '%Pipe%'"
        " OR reason LIKE '%Errno%'",
    )
    assert reasons == []
    assert _journal_rows(tmp_path, "SELECT COUNT(*) FROM units WHERE state = 'failed'") == [(0,)]
    assert _journal_rows(tmp_path, "SELECT COUNT(*) FROM units WHERE state = 'pending'")[0][0] > 0

    resumed = subprocess.run(
        [*FANOUT, "run", str(job)], cwd=tmp_path, capture_output=True, text=True, env=_env()
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run_id} finished: {UNITS} succeeded" in resumed.stderr
    succeeded = _journal_rows(
        tmp_path, "SELECT unit FROM attempts WHERE status = 'succeeded' ORDER BY unit"
    )
    # Every unit succeeded exactly once, across both stretches of the one run.
    assert [u for (u,) in succeeded] == [f"u{n:03d}" for n in range(UNITS)]
    # And every unit's side effect happened exactly once.
    assert sorted(done.read_text().split()) == [f"u{n:03d}" for n in range(UNITS)]


@pytest.mark.slow
def test_a_closed_pipe_drains_the_run_and_resume_finishes_it(tmp_path: Path) -> None:
    """``fanout run job.toml 2>&1 | head -3``, with a real pipe."""
    job, done = _job(tmp_path)
    process = subprocess.Popen(
        [*FANOUT, "run", str(job)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_env(),
    )
    assert process.stdout is not None
    head = [process.stdout.readline() for _ in range(3)]
    process.stdout.close()
    # 130: drained as for Ctrl-C.  Not 120: Python's flush of stdout and stderr at exit
    # found nothing to raise on (the dead pipe was pointed at /dev/null).
    assert process.wait(timeout=120) == 130
    assert head[0].decode().endswith(" of piped started\n")
    _assert_drained_then_resumed(tmp_path, job, done)


@pytest.mark.slow
def test_a_closed_terminal_drains_the_live_display_s_run(tmp_path: Path) -> None:
    """The live display on a terminal whose other side closed: writes fail with EIO,
    from the main thread and from rich's refresh thread alike."""
    job, done = _job(tmp_path)
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*FANOUT, "run", str(job)],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        env=_env(TERM="xterm", COLUMNS="100"),
    )
    os.close(terminal)
    seen = b""
    # Wait until the live line counts some units done (it is drawn before any started;
    # while the selection streams it reads "N done, M selected so far").
    while not re.search(rb"\b[1-9][0-9]*(/[0-9]+)? done", seen):
        seen += os.read(controller, 4096)
    os.close(controller)
    assert process.wait(timeout=120) == 130
    assert b" running " in seen  # the live line, not plain lines: the refresh thread drew it
    _assert_drained_then_resumed(tmp_path, job, done)


def test_a_failing_sink_never_reaches_the_emitter() -> None:
    seen: list[str] = []

    def broken(record: dict[str, Any]) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    events = Events(broken, lambda record: seen.append(record["event"]))
    events.emit("one")
    events.emit("two")
    assert seen == ["one", "two"]
    ((sink, error),) = events.failures
    assert sink is broken
    assert isinstance(error, BrokenPipeError)
    assert events.sinks[0] is broken  # its owner removes it; it is just not called


def test_on_failure_decides_what_becomes_of_a_failed_sink() -> None:
    calls: list[tuple[str, str]] = []
    full = OSError(errno.ENOSPC, "No space left on device")

    def log(record: dict[str, Any]) -> None:
        raise full

    def keeper(sink: Any, exc: Exception) -> None:
        calls.append((sink.__name__, str(exc)))

    events = Events(log, on_failure=keeper)
    events.emit("a")
    events.emit("b")
    # A custom hook that keeps the sink sees every failure; nothing was dropped.
    assert calls == [("log", "[Errno 28] No space left on device")] * 2
    assert events.failures == []


async def test_a_display_that_breaks_fails_no_unit(tmp_path: Path) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "broken-display"
            [inputs]
            items = ["a", "b", "c"]
            [task]
            command = ["true"]
            """,
        )
    )

    def display(record: dict[str, Any]) -> None:
        if record["event"] == "attempt.started":
            raise BrokenPipeError(32, "Broken pipe")

    runner = make_runner(job, FakeTransport(), events=display, rng=random.Random(7))
    summary = await runner.execute(Options())
    assert summary.counts == {"succeeded": 3}
    assert summary.state == "finished"
    assert len(runner.events.failures) == 1


@pytest.mark.parametrize("command", [["schema"], ["validate", "job.toml"], ["plan", "job.toml"]])
def test_a_command_whose_console_closed_exits_141_quietly(
    tmp_path: Path, command: list[str]
) -> None:
    """`fanout plan job.toml | head -1`, with the reader gone before the first write: no
    internal error, no traceback, no crash log, exit 128 + SIGPIPE."""
    _job(tmp_path)
    reader, writer = os.pipe()
    os.close(reader)
    try:
        done = subprocess.run(
            [*FANOUT, *command],
            cwd=tmp_path,
            stdout=writer,
            stderr=subprocess.PIPE,
            env=_env(XDG_CACHE_HOME=str(tmp_path / "cache")),
        )
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (141, b"")
    assert not (tmp_path / "cache").exists()
