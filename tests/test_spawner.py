"""fanout's spawner (isolation/spawner.c): built once into a private cache, refused where
it could be swapped, and, as the real binary, the checks the chain of setpriv, unshare
and an init shell made.  The conformance suite runs every behaviour of a step through it
("local-none", "ray-none") and through the chain ("local-chain")."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout.isolation import spawner
from fanout.isolation import tools as sandbox
from fanout.isolation.place import Place

from procs import marker, pids_with, wait_until_gone
from sshd import login_user


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache, and ``spawner.spawner`` unremembered, before and after."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spawner.spawner.cache_clear()
    yield tmp_path / "cache" / "fanout" / "bin"
    spawner.spawner.cache_clear()


@pytest.fixture(scope="module")
def built() -> str:
    """The spawner, built for this module's direct runs (in the tests' own cache)."""
    path = spawner.spawner()
    if path is None:
        pytest.fail("this machine has a C compiler and PID namespaces: the spawner builds")
    return path


def test_the_spawner_is_built_once_into_a_private_cache(cache: Path) -> None:
    path = spawner.spawner()
    assert path is not None
    built = Path(path)
    assert built.parent == cache
    assert built.name.startswith("fanout-spawner-")
    assert stat.S_IMODE(built.stat().st_mode) == 0o700
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert [p.name for p in cache.iterdir()] == [built.name]  # no scratch left
    first = built.stat()
    spawner.spawner.cache_clear()
    assert spawner.spawner() == path
    again = built.stat()
    assert (again.st_ino, again.st_mtime_ns) == (first.st_ino, first.st_mtime_ns)


def test_a_changed_source_is_a_new_build(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = spawner.spawner()
    changed = tmp_path / "spawner.c"
    changed.write_text(spawner.SOURCE.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(spawner, "SOURCE", changed)
    spawner.spawner.cache_clear()
    second = spawner.spawner()
    assert first is not None
    assert second not in (None, first)
    assert sorted(p.name for p in cache.iterdir()) == sorted([Path(first).name, Path(second).name])


def test_a_cache_another_user_could_write_is_not_used(cache: Path) -> None:
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    assert spawner.spawner() is None
    assert list(cache.iterdir()) == []


def test_a_spawner_another_user_could_replace_is_built_again(cache: Path) -> None:
    path = spawner.spawner()
    assert path is not None
    Path(path).chmod(0o722)
    spawner.spawner.cache_clear()
    assert spawner.spawner() == path
    assert stat.S_IMODE(Path(path).stat().st_mode) == 0o700


def test_without_a_c_compiler_steps_start_behind_the_chain(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    assert spawner.spawner() is None
    place = Place(
        host="local",
        kind="none",
        base="/",
        path="/usr/bin:/bin",
        namespace=sandbox.pid_namespace(),
        lifeline=os.getpid(),
    )
    argv = sandbox.command(place, ["true"], network=False)
    assert argv[: len(place.namespace)] == list(place.namespace)
    assert sandbox.guarded(argv, "true", place)[:4] == [
        sandbox.SETPRIV,
        "--pdeathsig",
        "KILL",
        "--",
    ]


def _run(built: str, *argv: str, lifeline: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [built, str(os.getpid() if lifeline is None else lifeline), "--", *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_program_runs_in_a_pid_namespace_of_its_own_not_as_its_init(built: str) -> None:
    done = _run(built, "sh", "-c", 'echo "$$ $(cat /proc/self/status | grep -c NSpid)"; exit 3')
    assert (done.returncode, done.stdout, done.stderr) == (3, "2 1\n", "")


def test_a_parent_that_is_not_its_lifeline_runs_nothing(built: str, tmp_path: Path) -> None:
    done = _run(built, "touch", str(tmp_path / "ran"), lifeline=1)
    assert done.returncode == 137
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("program", "code", "said"),
    [
        ("no-such-program-xyz", 127, "command not found"),
        ("/etc/passwd", 126, "Permission denied"),
    ],
)
def test_a_program_that_cannot_start_says_so_in_fanout_s_words(
    built: str, program: str, code: int, said: str
) -> None:
    done = _run(built, program)
    assert (done.returncode, done.stdout) == (code, "")
    assert done.stderr == f"fanout: cannot start {program}: {said}\n"


def test_a_program_killed_by_a_signal_is_128_plus_its_number(built: str) -> None:
    done = _run(built, "sh", "-c", "kill -TERM $$")
    assert (done.returncode, done.stdout, done.stderr) == (128 + signal.SIGTERM, "", "")


def test_nothing_the_program_started_outlives_it(built: str) -> None:
    token = marker()
    done = _run(built, "sh", "-c", f"setsid sleep {token} & sleep {token} & echo started")
    assert (done.returncode, done.stdout) == (0, "started\n")
    # Gone by the time the spawner returned: the kernel empties the namespace first.
    assert wait_until_gone(token, timeout=0) == []


def test_the_program_dies_with_the_spawner_s_lifeline(built: str) -> None:
    """The lifeline (fanout) SIGKILLed: its spawner dies (parent-death signal), and with
    it the namespace's init and everything in the namespace."""
    token = marker()
    script = (
        "import subprocess, sys, os, time; "
        f"subprocess.Popen([{built!r}, str(os.getpid()), '--', 'sh', '-c', "
        f"'setsid sleep {token} & sleep {token}']); time.sleep(60)"
    )
    lifeline = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 10
        while len(pids_with(token)) < 2:  # both sleeps, the one in a session of its own too
            assert time.monotonic() < deadline, "the program did not start"
            time.sleep(0.02)
    finally:
        lifeline.send_signal(signal.SIGKILL)
        lifeline.wait()
    assert wait_until_gone(token, timeout=10) == []


def test_a_non_root_user_s_program_keeps_its_uid_in_a_user_namespace(built: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs as root to start the spawner as another user")
    user = login_user()
    folder = Path(tempfile.mkdtemp(prefix="fanout-spawner-test-", dir="/var/tmp"))
    try:
        folder.chmod(0o755)
        copy = folder / "spawner"
        shutil.copy(built, copy)
        copy.chmod(0o755)
        python = shutil.which("python3", path="/usr/bin:/bin")
        if python is None:
            pytest.fail("these tests need /usr/bin/python3 for the non-root user")
        probe = (
            "import os, subprocess; subprocess.run("
            f"[{str(copy)!r}, str(os.getpid()), '--', 'sh', '-c', 'echo $$ $(id -un)'], check=True)"
        )
        done = subprocess.run(
            ["runuser", "-u", user, "--", python, "-c", probe],
            capture_output=True,
            text=True,
            cwd="/",
            timeout=30,
            check=False,
        )
    finally:
        shutil.rmtree(folder)
    assert (done.returncode, done.stdout) == (0, f"2 {user}\n"), done.stderr
