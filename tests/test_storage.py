"""A full disk under the state directory, for real: a 2 MiB tmpfs filled mid-run.

fanout must stop like a drain (exit 5, one clear line), blame no unit for its own
storage, lose no settled result, and continue once space is freed.
"""

from __future__ import annotations

import errno
import os
import resource
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout.attempt.capture import OutputCapture
from fanout.errors import storage_error, storage_problem

from helpers import write_job

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="tmpfs is Linux's")

JOB = """
version = 1
name = "full"
[inputs]
items = [{items}]
[task]
command = ["sh", "-c", "while [ ! -e {gates}/$FANOUT_UNIT_ID ]; do sleep 0.02; done; echo working on $FANOUT_UNIT_ID; echo $FANOUT_UNIT_ID >> {out}"]
[runtime]
maxConcurrentTasks = 2
sandbox = "none"
stateDir = "state"
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs at ``tmp_path/state`` (needs root, or CAP_SYS_ADMIN)."""
    state = tmp_path / "state"
    state.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(state)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}); needs root")
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def _fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; the file."""
    filler = directory / "filler"
    with filler.open("wb", buffering=0) as stream:
        chunk = b"\0" * 4096
        try:
            while True:
                stream.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def _query(db: Path, sql: str) -> list[tuple[object, ...]]:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []


def _wait(condition: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_disk_that_fills_mid_run_stops_it_with_exit_5_and_the_next_run_continues(
    tmp_path: Path, small_disk: Path
) -> None:
    gates, out = tmp_path / "gates", tmp_path / "done.txt"
    gates.mkdir()
    ids = [f"u{n:02d}" for n in range(20)]
    write_job(
        tmp_path,
        JOB.format(items=", ".join(f'"{i}"' for i in ids), gates=gates, out=out),
    )
    db = small_disk / "journal.sqlite"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first = subprocess.Popen(
        [sys.executable, "-m", "fanout", "run", "job.toml"],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    for unit in ids[:5]:
        (gates / unit).touch()
    settled = "SELECT COUNT(*) FROM units WHERE state = 'succeeded'"
    _wait(lambda: _query(db, settled) == [(5,)])
    _wait(lambda: _query(db, "SELECT COUNT(*) FROM attempts WHERE status IS NULL") == [(2,)])
    filler = _fill(small_disk)
    for unit in ids[5:]:
        (gates / unit).touch()
    _, err = first.communicate(timeout=60)
    assert first.returncode == 5, err
    lines = err.rstrip("\n").split("\n")
    (run_id,) = [row[0] for row in _query(db, "SELECT id FROM runs")]
    assert lines[-2:] == [
        f"no space left on device: {small_disk}; free space and `fanout run` continues",
        f"run {run_id} stopped; `fanout run job.toml` continues it",
    ]
    assert "Traceback" not in err
    # The two attempts running when the disk filled finished and settled (their logs
    # are cut short); nothing else started, nothing is blamed on a unit.
    assert _query(db, "SELECT state, COUNT(*) FROM units GROUP BY state") == [
        ("pending", 13),
        ("succeeded", 7),
    ]
    assert _query(db, "SELECT state FROM runs") == [("stopped",)]
    assert sorted(out.read_text().split()) == ids[:7]
    # Still full (the reserve was used and cannot be put back): the next run is refused
    # before anything starts.
    again = subprocess.run(
        [sys.executable, "-m", "fanout", "run", "job.toml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 5, again.stderr
    assert again.stderr == (
        f"no space left on device: {small_disk}; free space and `fanout run` continues\n"
    )
    assert sorted(out.read_text().split()) == ids[:7]
    filler.unlink()
    resumed = subprocess.run(
        [sys.executable, "-m", "fanout", "run", "job.toml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(out.read_text().split()) == ids
    assert _query(db, "SELECT state, COUNT(*) FROM units GROUP BY state") == [("succeeded", 20)]
    assert _query(db, "PRAGMA integrity_check") == [("ok",)]


def test_a_log_that_cannot_be_written_is_recorded_not_raised(small_disk: Path) -> None:
    filler = _fill(small_disk)
    capture = OutputCapture(small_disk / "logs" / "a.log", log_limit=1 << 20, tail_limit=64)
    capture.feed(b"x" * 10000 + b"\nlast line\n")
    capture.close()
    assert capture.storage_error is not None
    assert capture.storage_error.errno == errno.ENOSPC
    assert capture.tail.endswith("last line\n")
    filler.unlink()


def test_no_file_descriptor_left_says_the_limit_not_free_space() -> None:
    # On main a coordinator out of files (a unit's 1,800 connections to the gateway)
    # stopped with "too many open files: ...; free space and `fanout run` continues".
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    for number in (errno.EMFILE, errno.ENFILE):
        problem = storage_problem(OSError(number, os.strerror(number), "/state/logs/a.log"))
        assert problem is not None
        assert (str(problem), problem.exit_code) == (
            f"{os.strerror(number)[:1].lower()}{os.strerror(number)[1:]}: /state/logs/a.log;"
            f" fanout's limit on open files (`ulimit -n`) is {soft}: raise it or lower"
            " runtime.maxConcurrentTasks, and `fanout run` continues",
            5,
        )
    # What a log that could not be opened says (verdict words the OSError the same way).
    assert str(storage_error("/state", "too many open files")).startswith(
        "too many open files: /state; fanout's limit on open files (`ulimit -n`) is"
    )
    assert str(storage_error("/state", "no space left on device")) == (
        "no space left on device: /state; free space and `fanout run` continues"
    )
    assert storage_problem(OSError(errno.EACCES, "Permission denied")) is None
