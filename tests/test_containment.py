"""Nothing outlives its unit on this machine: each step in a PID namespace of its own
(bwrap's, or unshare's for sandbox "none"), a step that ends when its process exits
whatever holds its output, and a SIGKILLed coordinator whose workers' children die with
it.  Real processes, real bwrap, real unshare, a real `fanout run` for the SIGKILL."""

from __future__ import annotations

import asyncio
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fanout.attempt.model import Attempt
from fanout.isolation import tools as sandbox
from fanout.outcome import Status
from fanout.pacing.ceiling import INITIAL_WINDOW, RAMP_S
from fanout.transports.local import LocalTransport

from helpers import make_attempt, write_job
from procs import marker, pids_with, wait_until_gone, wait_until_present
from sshd import login_user

KINDS = ["bwrap", "none"]
FANOUT = [sys.executable, "-m", "fanout"]


def _attempt(tmp_path: Path, argv: list[str], **options: Any) -> Attempt:
    return make_attempt(tmp_path, argv, **{"tail_limit": 4096, **options})


async def _transport(
    tmp_path: Path, kind: str, warnings: list[str] | None = None
) -> LocalTransport:
    if kind == "bwrap" and shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required for these tests (scripts/system-deps installs it)")
    root = tmp_path / "sandboxes"
    root.mkdir(exist_ok=True)
    transport = LocalTransport(
        slots=20,
        sandbox_kind=kind,
        root=root,
        path=os.environ["PATH"],
        warn=(warnings if warnings is not None else []).append,
    )
    await transport.start()
    assert transport.kind == kind
    return transport


@pytest.fixture(params=["pid-namespace", "process-group only"])
def containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Sandbox "none" as this machine gives it (a PID namespace from unshare), and as a
    machine without unshare or user namespaces would."""
    if request.param == "process-group only":
        monkeypatch.setattr(sandbox, "pid_namespace", lambda: ())
    return str(request.param)


# A daemon that leaves the worker's process group and keeps the worker's output open,
# started for sure before the worker exits.
HOLDER = "setsid sh -c 'echo up > up; exec sleep {token}' & while [ ! -e up ]; do sleep 0.01; done; echo done"
# One that also closes every descriptor it had and leaves the sandbox directory: neither
# the output pipe nor the working directory leads to it.
CLOSER = (
    "setsid sh -c 'exec >/dev/null 2>&1 </dev/null; cd /; echo up > $OLDPWD/up; "
    "sleep {token}; touch side-effect' & while [ ! -e up ]; do sleep 0.01; done"
)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_daemon_holding_the_output_neither_holds_the_attempt_nor_survives_it(
    tmp_path: Path, kind: str
) -> None:
    token = marker()
    transport = await _transport(tmp_path, kind)
    script = HOLDER.format(token=token)
    result = await transport.run(_attempt(tmp_path, ["sh", "-c", script], timeout=20))
    assert (result.status, result.reason, result.output_tail) == (Status.SUCCEEDED, "ok", "done\n")
    assert pids_with(token) == []  # gone when run() returns, not eventually


@pytest.mark.parametrize("kind", KINDS)
async def test_fast_workers_leave_no_daemon_that_closed_its_descriptors(
    tmp_path: Path, kind: str
) -> None:
    token = marker()
    transport = await _transport(tmp_path, kind)
    script = CLOSER.format(token=token)
    results = await asyncio.gather(
        *(
            transport.run(_attempt(tmp_path, ["sh", "-c", script], unit_id=f"u{n}"))
            for n in range(20)
        )
    )
    assert [r.status for r in results] == [Status.SUCCEEDED] * 20
    assert pids_with(token) == []


async def test_without_a_pid_namespace_the_escapee_search_still_finds_them(
    tmp_path: Path, containment: str
) -> None:
    """The same two daemons with sandbox "none", with and without unshare: the fallback
    ends the step at the worker's exit and kills what carries the sandbox's mark."""
    warnings: list[str] = []
    transport = await _transport(tmp_path, "none", warnings)
    holder, closer = marker(), marker()
    held = await transport.run(
        _attempt(tmp_path, ["sh", "-c", HOLDER.format(token=holder)], timeout=20)
    )
    closed = await asyncio.gather(
        *(
            transport.run(
                _attempt(tmp_path, ["sh", "-c", CLOSER.format(token=closer)], unit_id=f"u{n}")
            )
            for n in range(20)
        )
    )
    assert (held.status, held.output_tail) == (Status.SUCCEEDED, "done\n")
    assert [r.status for r in closed] == [Status.SUCCEEDED] * 20
    assert (pids_with(holder), pids_with(closer)) == ([], [])
    if containment == "process-group only":
        assert transport.containment is sandbox.Containment.GROUP
        assert warnings == [sandbox.GROUP_ONLY_WARNING]
    else:
        assert transport.containment is sandbox.Containment.UNSHARE
        assert warnings == []


@pytest.mark.parametrize("kind", KINDS)
async def test_each_step_has_a_pid_namespace_whose_init_is_not_the_worker(
    tmp_path: Path, kind: str
) -> None:
    transport = await _transport(tmp_path, kind)
    result = await transport.run(
        _attempt(tmp_path, ["sh", "-c", "echo $$"], verify=["sh", "-c", "echo $$ >&2"])
    )
    assert (result.status, result.output_tail) == (Status.SUCCEEDED, "2\n2\n")


def test_containment_names_what_this_machine_gives() -> None:
    assert [c.value for c in sandbox.Containment] == [
        "pid-namespace (bwrap)",
        "pid-namespace (unshare)",
        "container (podman)",
        "process-group only",
    ]
    assert sandbox.containment("bwrap") is sandbox.Containment.BWRAP
    # Tests run as root on a machine with util-linux: unshare works here.
    assert sandbox.containment("none") is sandbox.Containment.UNSHARE
    assert sandbox.pid_namespace() == (
        shutil.which("unshare"),
        "--pid",
        "--fork",
        "--kill-child",
    )


def test_a_non_root_user_gets_a_pid_namespace_through_a_user_namespace(tmp_path: Path) -> None:
    """A user namespace that maps the user to itself: the worker keeps its own uid."""
    probe = (
        "import asyncio, pathlib, sys; from fanout.isolation import tools as sandbox; "
        "print(sandbox.containment('none').value); "
        "print(' '.join(sandbox.pid_namespace()[1:])); "
        "from fanout.isolation.place import Place; "
        "place = Place(host='local', kind='none', base='/', path='/usr/bin:/bin', "
        "namespace=sandbox.pid_namespace()); "
        "argv = sandbox.guarded(sandbox.command(place, ['sh', '-c', 'echo $$ $(id -un)'], "
        "network=False), 'sh', place); "
        "import subprocess; sys.stdout.flush(); subprocess.run(argv, check=True)"
    )
    # The system's python: the test's own may live under root's 0700 home.
    python = shutil.which("python3", path="/usr/bin:/bin")
    package = Path(sandbox.__file__).parents[2]
    if python is None:
        pytest.fail("these tests need /usr/bin/python3 for the non-root user")
    user = login_user()
    done = subprocess.run(
        ["runuser", "-u", user, "--", "env", f"PYTHONPATH={package}", python, "-c", probe],
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "pid-namespace (unshare)",
        "--user --map-current-user --pid --fork --kill-child",
        f"2 {user}",
    ]


def test_the_next_run_kills_what_works_in_a_dead_coordinator_s_sandbox(tmp_path: Path) -> None:
    """The orphan sweep: a process left in a sandbox whose coordinator is gone (as a
    machine without PID namespaces leaves them) dies before the sandbox is removed."""
    root = tmp_path / "sandboxes"
    dead = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    leftover = root / f"fanout-{dead.stdout.strip()}-abc"
    leftover.mkdir(parents=True)
    token = marker()
    orphan = subprocess.Popen(
        ["sleep", token], cwd=leftover, stdin=subprocess.DEVNULL, start_new_session=True
    )
    assert wait_until_present(token)
    asyncio.run(LocalTransport(slots=1, sandbox_kind="none", root=root).start())
    assert orphan.wait(timeout=10) == -signal.SIGKILL
    assert list(root.iterdir()) == []


KILLED = """
version = 1
name = "killed"
[inputs]
items = ["u1", "u2", "u3", "u4"]
[task]
command = ["sh", "-c", "(sleep {delay}; echo late > side-effect) & echo up > started; wait"]
[runtime]
maxConcurrentTasks = 4
sandbox = "{kind}"
"""


def _poll(condition: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_sigkilled_coordinator_takes_its_workers_children_with_it(
    tmp_path: Path, kind: str
) -> None:
    # The children's delay is long enough for all four to be running at once (a job
    # without limits slow-starts its dispatch: one start, then two, then the last one,
    # a generation every RAMP_S at most) and to SIGKILL fanout first even on a loaded
    # machine, short enough that a survivor writes its side effect within the test.
    ramp = RAMP_S * math.ceil(math.log2(4 / INITIAL_WINDOW))
    delay = f"{int(ramp) + 3}.{random.randint(100000, 999999)}"
    job = write_job(tmp_path, KILLED.format(delay=delay, kind=kind))
    sandboxes = tmp_path / "tmp"
    sandboxes.mkdir()
    coordinator = subprocess.Popen(
        [*FANOUT, "run", str(job)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(sandboxes)},
    )
    try:
        _poll(lambda: len(list(sandboxes.glob("*/work/started"))) == 4)
        assert len(pids_with(f"sleep {delay}")) >= 4
    finally:
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait()
    # The children sleep in a shell whose command line names the delay too: once no
    # process names it, no side effect can still come.
    assert wait_until_gone(delay, timeout=15) == []
    assert list(sandboxes.glob("*/work/side-effect")) == []
