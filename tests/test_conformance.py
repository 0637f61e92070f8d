"""One attempt, any transport: the same behaviour tests over every transport (local with
sandbox none and bwrap, SSH with none and bwrap over a real sshd, Ray with none and
bwrap over a real two-node cluster on loopback, and the fake sandboxes of ``fakes``), each building the same attempt and asserting the same outcome.
A new transport passes this file before it is merged.

Each test states exact values.  Where they differ between transports, the transport is
wrong, not the test: a transport only moves bytes, ``attempt`` decides what they mean.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from fanout.attempt.model import Attempt
from fanout.attempt.sandbox import StagedFile
from fanout.attempt.seam import Sandboxes
from fanout.isolation import spawner
from fanout.isolation.place import Containment
from fanout.outcome import AttemptResult, Status
from fanout.transports.local import LocalTransport
from fanout.transports.ssh import SshTransport
from fanout.transports.ssh.probe import GROUP_ONLY

from fakes import FakeSandboxes
from helpers import make_attempt, places
from procs import marker, pids_with

# One event loop for the module: the SSH transports are started once (see ``Sshs``).
pytestmark = pytest.mark.asyncio(loop_scope="module")

# "local-chain": sandbox none on a machine without fanout's spawner (no C compiler),
# where setpriv, unshare and an init shell start each step.
TRANSPORTS = places(
    "local-none",
    "local-chain",
    "local-bwrap",
    "ssh-none",
    "ssh-bwrap",
    "fake",
    "ray-none",
    "ray-bwrap",
)
# Small enough to keep the suite fast, large enough that starting a step under load
# (bwrap, an SSH channel) never eats the part of it a test gives its steps.
TIMEOUT = 3.0


@dataclass(frozen=True)
class Harness:
    """A started transport and what a test needs to know about where it runs."""

    name: str
    transport: Sandboxes
    root: Path  # where its sandboxes' directories appear, one per running attempt
    path: str  # the PATH its workers get
    containment: Containment

    @property
    def shell_init(self) -> bool:
        """Whether a step's PID namespace has a shell (dash) for its init: unshare's
        chain, on an SSH host or on this machine without fanout's spawner."""
        if self.containment is not Containment.UNSHARE:
            return False
        return self.name.startswith("ssh-") or spawner.spawner() is None


@dataclass(frozen=True)
class Remote:
    """A started SSH (or Ray) transport for the module, and what its workers get."""

    transport: Sandboxes
    root: Path
    path: str
    containment: Containment


class Sshs:
    """The module's SSH transports (one per sandbox kind) to one real sshd host, h1,
    started when an "ssh-*" harness first asks for them (so the tests of the other
    transports start no sshd), as one run uses one for all its attempts (so each test
    also checks the one before left it usable)."""

    def __init__(self) -> None:
        self.remotes: dict[str, Remote] = {}

    async def get(self, request: pytest.FixtureRequest, kind: str) -> Remote:
        if not self.remotes:
            await self._start(request.getfixturevalue("module_ssh_pool"))
        return self.remotes[f"ssh-{kind}"]

    async def _start(self, pool: Any) -> None:
        server = pool.add("h1")
        host = pool.host(server)
        login_path = await asyncio.to_thread(_login_path, pool, server)
        for kind in ("none", "bwrap"):
            notices: list[str] = []
            transport = SshTransport(
                [host],
                known_hosts=[pool.known_hosts],
                sandbox_kind=kind,
                keepalive_interval=1.0,
                keepalive_count=2,
                connect_timeout=3.0,
                notice=notices.append,
                rng=random.Random(3),
            )
            await transport.start()
            if kind == "bwrap":
                containment = Containment.BWRAP
            elif any(GROUP_ONLY in notice for notice in notices):
                containment = Containment.GROUP
            else:
                containment = Containment.UNSHARE
            root = Path(host.sandbox_root)
            self.remotes[f"ssh-{kind}"] = Remote(transport, root, login_path, containment)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sshs() -> AsyncIterator[Sshs]:
    holder = Sshs()
    try:
        yield holder
    finally:
        for remote in holder.remotes.values():
            await remote.transport.close()


def _login_path(pool: Any, server: Any) -> str:
    """The PATH a non-interactive login to ``server`` has, asked with OpenSSH's own
    client: what the remote agent keeps for workers."""
    ran = subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-i",
            str(pool.client_key),
            "-p",
            str(server.port),
            "-o",
            f"UserKnownHostsFile={pool.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"{pool.user}@127.0.0.1",
            'printf %s "$PATH"',
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return ran.stdout


class Rays:
    """The module's Ray transports (one per sandbox kind) over the session's two-node
    cluster (``raycluster``), each started when a "ray-*" harness first asks for it (so
    the other transports never start a cluster), its sandboxes under a directory of its
    own on the nodes (which are this machine)."""

    def __init__(self) -> None:
        self.remotes: dict[str, Remote] = {}

    async def get(self, request: pytest.FixtureRequest, kind: str) -> Remote:
        if kind in self.remotes:
            return self.remotes[kind]
        import ray

        from fanout.isolation import tools as sandbox
        from fanout.spec import Ray
        from fanout.transports.ray import RayTransport

        cluster = request.getfixturevalue("ray_cluster")  # skips without ray, but in CI
        root = cluster.root / f"conformance-{kind}"
        root.mkdir()
        transport = RayTransport(
            Ray(address=cluster.address, sandbox_root=str(root)), slots=4, sandbox_kind=kind
        )
        await transport.start()
        # The PATH Ray gives its workers, which the nodes keep for steps.
        path = await ray.remote(lambda: os.environ["PATH"]).remote()
        self.remotes[kind] = Remote(transport, root, path, sandbox.choose(kind).containment)
        return self.remotes[kind]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rays() -> AsyncIterator[Rays]:
    holder = Rays()
    try:
        yield holder
    finally:
        for remote in holder.remotes.values():
            await remote.transport.close()


@pytest_asyncio.fixture(params=TRANSPORTS, loop_scope="module")
async def harness(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    sshs: Sshs,
    rays: Rays,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Harness]:
    name: str = request.param
    path = os.environ["PATH"]
    if name == "fake":
        root = tmp_path / "sandboxes"
        root.mkdir()
        yield Harness(name, FakeSandboxes(root=root, path=path), root, path, Containment.GROUP)
        return
    if name.startswith("local-"):
        root = tmp_path / "sandboxes"
        root.mkdir()
        kind = name.removeprefix("local-")
        if kind == "chain":
            kind = "none"
            monkeypatch.setattr(spawner, "spawner", lambda: None)
        local = LocalTransport(slots=4, sandbox_kind=kind, root=root, path=path)
        await local.start()
        yield Harness(name, local, root, path, local.containment)
        await local.close()
        return
    if name.startswith("ray-"):
        ray = await rays.get(request, name.removeprefix("ray-"))
        yield Harness(name, ray.transport, ray.root, ray.path, ray.containment)
        return
    remote = await sshs.get(request, name.removeprefix("ssh-"))
    yield Harness(name, remote.transport, remote.root, remote.path, remote.containment)


def _attempt(tmp_path: Path, argv: list[str], **options: Any) -> Attempt:
    return make_attempt(tmp_path, argv, **{"timeout": TIMEOUT, **options})


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def _outcome(result: AttemptResult) -> tuple[Status, str, int | None, str]:
    return (result.status, result.reason, result.exit_code, result.output_tail)


def _sandboxes(harness: Harness) -> list[str]:
    return sorted(entry.name for entry in harness.root.iterdir())


def _collected(tmp_path: Path) -> dict[str, str]:
    """Every file under the unit folder (``collected``), relative, with its text."""
    folder = tmp_path / "collected"
    if not folder.exists():
        return {}
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() or path.is_symlink():
            found[str(path.relative_to(folder))] = path.read_text() if path.is_file() else "->"
    return found


def _assert_left_nothing(harness: Harness, token: str) -> None:
    """The sandbox directory is gone from its root and no process of the attempt is
    left, when ``run`` returned (not eventually)."""
    assert (_sandboxes(harness), pids_with(token)) == ([], [])


@contextlib.contextmanager
def _reaping(token: str) -> Iterator[None]:
    """After the test, SIGKILL what a failing transport left running with ``token`` in
    its argv (processes this test started, by their id)."""
    try:
        yield
    finally:
        for pid in pids_with(token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# --- verify gating -----------------------------------------------------------------


async def test_verify_runs_after_a_worker_that_succeeded(harness: Harness, tmp_path: Path) -> None:
    result = await harness.transport.run(
        _attempt(tmp_path, _sh("echo worker"), verify=_sh("echo verify"))
    )
    assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "worker\nverify\n")


async def test_verify_never_runs_after_a_worker_that_failed(
    harness: Harness, tmp_path: Path
) -> None:
    result = await harness.transport.run(
        _attempt(tmp_path, _sh("echo worker says no; exit 3"), verify=_sh("echo verify ran"))
    )
    assert _outcome(result) == (
        Status.FAILED,
        "worker exited with status 3: worker says no",
        3,
        "worker says no\n",
    )


async def test_a_failing_verify_fails_the_attempt(harness: Harness, tmp_path: Path) -> None:
    result = await harness.transport.run(
        _attempt(tmp_path, _sh("echo worker"), verify=_sh("echo still broken; exit 5"))
    )
    assert _outcome(result) == (
        Status.FAILED,
        "verify exited with status 5: still broken",
        5,
        "worker\nstill broken\n",
    )


# --- environment ---------------------------------------------------------------------


async def _environment(harness: Harness, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """What ``env`` prints as the worker, and the sandbox's directory it names."""
    result = await harness.transport.run(
        _attempt(
            tmp_path,
            ["env"],
            env={"NO_COLOR": "1", "JOB_VALUE": "a b $x"},
            secrets={"API_TOKEN": "s3cr3t-value"},
        )
    )
    assert (result.status, result.reason) == (Status.SUCCEEDED, "ok")
    env = dict(line.split("=", 1) for line in result.output_tail.splitlines())
    base = env["HOME"]
    assert os.path.isabs(base)
    return base, env


async def test_the_environment_is_exactly_what_the_attempt_decides(
    harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COORDINATOR_ONLY", "leak")
    base, env = await _environment(harness, tmp_path)
    # What a shell on the way sets (see the next test).
    env.pop("PWD", None)
    env.pop("OLDPWD", None)
    assert env == {
        "PATH": harness.path,
        "HOME": base,
        "TMPDIR": base,
        "FANOUT_RUN_ID": "r1",
        "FANOUT_UNIT_ID": "u1",
        "FANOUT_ROUND": "1",
        "FANOUT_ATTEMPT": "1",
        "FANOUT_RUNG": "default",
        "FANOUT_CONTROL": f"{base}/control.json",
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        "JOB_VALUE": "a b $x",
        "API_TOKEN": "[secret]",
    }


async def test_a_shell_on_the_way_adds_only_pwd(harness: Harness, tmp_path: Path) -> None:
    """A POSIX shell on the way to the worker (the local guard and the namespace init
    are sh) exports PWD, the worker's true cwd; a transport without one does not.
    Nothing else of a shell (OLDPWD, SHLVL) reaches the worker."""
    base, env = await _environment(harness, tmp_path)
    assert env.pop("PWD", f"{base}/work") == f"{base}/work"
    assert sorted(name for name in env if not name.startswith("FANOUT_")) == [
        "API_TOKEN",
        "HOME",
        "JOB_VALUE",
        "LANG",
        "NO_COLOR",
        "PATH",
        "TMPDIR",
    ]


async def test_home_and_tmpdir_are_inside_the_sandbox_and_never_collected(
    harness: Harness, tmp_path: Path
) -> None:
    script = (
        'echo cache > "$HOME/cache.md"; echo scratch > "$TMPDIR/scratch.md";'
        ' echo out > out.md; test -w "$HOME" && test -w "$TMPDIR" && pwd -P'
    )
    result = await harness.transport.run(_attempt(tmp_path, _sh(script), collect=["**"]))
    assert (result.status, result.reason) == (Status.SUCCEEDED, "ok")
    assert result.output_tail.endswith("/work\n")
    assert [c.path for c in result.collected] == ["out.md"]
    assert _collected(tmp_path) == {"out.md": "out\n"}


# --- the deadline ----------------------------------------------------------------------


@pytest.mark.slow  # it waits out TIMEOUT
async def test_one_deadline_covers_the_worker_and_verify(harness: Harness, tmp_path: Path) -> None:
    token = marker()
    part = f"{TIMEOUT * 0.6:g}"
    with _reaping(token):
        result = await harness.transport.run(
            _attempt(
                tmp_path,
                _sh(f"sleep {part}; echo worker done"),
                verify=_sh(f"echo verify started; sleep {part}; : {token}"),
            )
        )
        assert _outcome(result) == (
            Status.TIMEOUT,
            f"timed out after {TIMEOUT:g}s",
            None,
            "worker done\nverify started\n",
        )
        _assert_left_nothing(harness, token)


async def test_a_worker_exiting_124_failed_and_did_not_time_out(
    harness: Harness, tmp_path: Path
) -> None:
    result = await harness.transport.run(_attempt(tmp_path, _sh("exit 124")))
    assert _outcome(result) == (Status.FAILED, "worker exited with status 124", 124, "")


# --- teardown --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ending", "seconds", "status", "reason", "code"),
    [
        ("exit 0", TIMEOUT, Status.SUCCEEDED, "ok", 0),
        ("exit 7", TIMEOUT, Status.FAILED, "worker exited with status 7: child started", 7),
        ("wait", 1.0, Status.TIMEOUT, "timed out after 1s", None),
    ],
    ids=["success", "failure", "timeout"],
)
async def test_teardown_leaves_nothing(
    harness: Harness,
    tmp_path: Path,
    ending: str,
    seconds: float,
    status: Status,
    reason: str,
    code: int | None,
) -> None:
    token = marker()
    with _reaping(token):
        script = f"sleep {token} & echo child started; {ending}"
        result = await harness.transport.run(_attempt(tmp_path, _sh(script), timeout=seconds))
        assert _outcome(result) == (status, reason, code, "child started\n")
        _assert_left_nothing(harness, token)


async def test_teardown_on_cancel_leaves_nothing(harness: Harness, tmp_path: Path) -> None:
    token = marker()
    with _reaping(token):
        task = asyncio.create_task(
            harness.transport.run(_attempt(tmp_path, _sh(f"sleep {token} & wait"), timeout=60))
        )
        assert await asyncio.to_thread(_until_sleeping, token, 1)
        assert len(_sandboxes(harness)) == 1  # so that "gone" is not vacuous
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        _assert_left_nothing(harness, token)


async def test_a_tree_of_any_depth_shut_or_frozen_is_collected_and_removed(
    harness: Harness, tmp_path: Path
) -> None:
    """A thousand levels (shutil.rmtree's recursion stopped there), folders shut to
    their owner, and a file a root worker made immutable (where it runs as root without
    bwrap: bwrap takes the capability away, and a non-root login has none)."""
    token = marker()
    script = (
        f"sleep {token} & mkdir -p $(printf 'd/%.0s' $(seq 1000)) && echo deep > $(printf"
        " 'd/%.0s' $(seq 1000))f && mkdir -p shut/inner && chmod 000 shut/inner shut"
        " && echo x > locked && { chattr +i locked 2>/dev/null; true; }"
    )
    try:
        with _reaping(token):
            attempt = _attempt(tmp_path, _sh(script), collect=["d"], timeout=30)
            result = await harness.transport.run(attempt)
            assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "")
            assert [c.path for c in result.collected] == ["d/" * 1000 + "f"]
            assert (tmp_path / "collected" / ("d/" * 1000 + "f")).read_text() == "deep\n"
            _assert_left_nothing(harness, token)
    finally:  # pytest's own clean-up of old tmp_paths is shutil.rmtree's
        await asyncio.to_thread(subprocess.run, ["rm", "-rf", str(tmp_path / "collected")])


async def test_a_running_sandbox_is_laid_out_as_the_attempt_says(
    harness: Harness, tmp_path: Path
) -> None:
    token = marker()
    with _reaping(token):
        task = asyncio.create_task(
            harness.transport.run(
                _attempt(tmp_path, _sh(f"sleep {token}"), prompt="the prompt\n", timeout=60)
            )
        )
        try:
            assert await asyncio.to_thread(_until_sleeping, token, 1)
            (sandbox,) = _sandboxes(harness)
            assert sorted(os.listdir(harness.root / sandbox)) == ["work"]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


# A daemon the way a careless tool leaves one: its own session, every descriptor
# closed, out of the sandbox directory; started for sure before the worker goes on.
ESCAPEE = (
    'setsid sh -c \'exec >/dev/null 2>&1 </dev/null; cd /; echo up > "$OLDPWD/up";'
    ' sleep {token}; touch "$OLDPWD/side-effect"\' &'
    " while [ ! -e up ]; do sleep 0.01; done; echo daemon up; {then}"
)


@pytest.mark.parametrize(
    ("then", "status", "reason", "code"),
    [
        ("exit 0", Status.SUCCEEDED, "ok", 0),
        ("exit 3", Status.FAILED, "worker exited with status 3: daemon up", 3),
        pytest.param(
            "sleep {token}",
            Status.TIMEOUT,
            f"timed out after {TIMEOUT:g}s",
            None,
            marks=pytest.mark.slow,  # it waits out TIMEOUT
            id="timeout",
        ),
        pytest.param("sleep {token}", None, "", None, id="cancel"),  # once both sleeps are up
    ],
    ids=["success", "failure", "timeout", "cancel"],
)
async def test_an_escaped_process_does_not_survive(
    harness: Harness,
    tmp_path: Path,
    then: str,
    status: Status | None,
    reason: str,
    code: int | None,
) -> None:
    if harness.containment is Containment.GROUP:
        pytest.skip(
            f"{harness.name} contains a step by its process group only (no PID namespace):"
            " a process that calls setsid leaves it by design"
        )
    token = marker()
    script = ESCAPEE.format(token=token, then=then.format(token=token))
    with _reaping(token):
        running = asyncio.create_task(harness.transport.run(_attempt(tmp_path, _sh(script))))
        if status is None:
            assert await asyncio.to_thread(_until_sleeping, token, 2)
            running.cancel()
            with pytest.raises(asyncio.CancelledError):
                await running
        else:
            result = await running
            assert _outcome(result) == (status, reason, code, "daemon up\n")
        _assert_left_nothing(harness, token)


def _sleeping(token: str) -> list[int]:
    """The ``sleep TOKEN`` processes (not the shells whose scripts mention it)."""
    found = []
    for pid in pids_with(token):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{token}\0".encode():
                found.append(pid)
    return found


def _until_sleeping(token: str, count: int) -> bool:
    """Whether ``count`` ``sleep TOKEN`` processes run within 20 s (a loaded machine)."""
    deadline = time.monotonic() + 20
    while len(_sleeping(token)) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# --- collected names -------------------------------------------------------------------

NAMES = ["notes[draft.md", "with space.md", "ünïcødé ✓.md", "a\nb.md"]


async def test_collected_names_with_brackets_spaces_unicode_and_newlines(
    harness: Harness, tmp_path: Path
) -> None:
    script = (
        'for name in "$@"; do printf "content of %s" "$name" > "$name"; done;'
        " mkdir -p 'sub dir[1]'; echo deep > 'sub dir[1]/inner [x].md'; echo no > skip.txt"
    )
    result = await harness.transport.run(
        _attempt(tmp_path, [*_sh(script), "sh", *NAMES], collect=["*.md", "sub dir[[]1]/*.md"])
    )
    assert (result.status, result.reason, result.exit_code) == (Status.SUCCEEDED, "ok", 0)
    sizes = {c.path: c.size for c in result.collected}
    assert sizes == {
        **{name: len(f"content of {name}".encode()) for name in NAMES},
        "sub dir[1]/inner [x].md": 5,
    }
    assert len(result.collected) == len(sizes)
    assert _collected(tmp_path) == {
        **{name: f"content of {name}" for name in NAMES},
        "sub dir[1]/inner [x].md": "deep\n",
    }


async def test_collected_files_come_in_pattern_order_then_name_order(
    harness: Harness, tmp_path: Path
) -> None:
    script = (
        'for name in "$@"; do echo > "$name"; done; mkdir -p results/deep;'
        " echo > results/z.md; echo > results/.hidden; echo > results/deep/b.txt"
    )
    names = ["zeta.md", "alpha.md", "mid.md", "beta.txt"]
    result = await harness.transport.run(
        _attempt(tmp_path, [*_sh(script), "sh", *names], collect=["*.txt", "*.md", "results"])
    )
    assert (result.status, result.reason) == (Status.SUCCEEDED, "ok")
    assert [c.path for c in result.collected] == [
        "beta.txt",
        "alpha.md",
        "mid.md",
        "zeta.md",
        "results/.hidden",
        "results/deep/b.txt",
        "results/z.md",
    ]


async def test_a_bracket_escaped_in_a_pattern_collects_the_file(
    harness: Harness, tmp_path: Path
) -> None:
    """A plain ``notes[draft.md`` is an unclosed glob (refused when the job is loaded,
    on every transport alike); ``[[]`` is a literal ``[``."""
    result = await harness.transport.run(
        _attempt(tmp_path, _sh("echo draft > 'notes[draft.md'"), collect=["notes[[]draft.md"])
    )
    assert (result.status, result.reason) == (Status.SUCCEEDED, "ok")
    assert _collected(tmp_path) == {"notes[draft.md": "draft\n"}


# --- symlinks the worker planted -------------------------------------------------------


def _outside(tmp_path: Path) -> Path:
    """A directory outside the sandbox and the unit folder with a file a worker wants."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.md").write_text("untouched\n")
    return outside


async def test_a_planted_symlink_matched_by_a_glob_is_not_collected(
    harness: Harness, tmp_path: Path
) -> None:
    outside = _outside(tmp_path)
    script = (
        f"ln -s /etc/passwd leak.md; ln -s {outside} linked; ln -s {outside}/victim.md"
        " victim.md; echo real > real.md"
    )
    result = await harness.transport.run(
        _attempt(tmp_path, _sh(script), collect=["*.md", "**/*.md", "**"])
    )
    assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "")
    assert [c.path for c in result.collected] == ["real.md"]
    assert _collected(tmp_path) == {"real.md": "real\n"}
    assert sorted(p.name for p in outside.iterdir()) == ["victim.md"]
    assert (outside / "victim.md").read_text() == "untouched\n"


async def test_a_named_collect_path_through_a_planted_symlink_fails_the_unit(
    harness: Harness, tmp_path: Path
) -> None:
    outside = _outside(tmp_path)
    result = await harness.transport.run(
        _attempt(tmp_path, _sh(f"ln -s {outside} up"), collect=["up/victim.md"])
    )
    assert _outcome(result) == (
        Status.FAILED,
        "collect: 'up/victim.md' goes through a symlink the worker made ('up');"
        " fanout never follows one",
        0,
        "",
    )
    assert _collected(tmp_path) == {}
    assert (outside / "victim.md").read_text() == "untouched\n"


async def test_a_named_collect_path_that_is_a_planted_symlink_fails_the_unit(
    harness: Harness, tmp_path: Path
) -> None:
    result = await harness.transport.run(
        _attempt(tmp_path, _sh("ln -s /etc/passwd report.md"), collect=["report.md"])
    )
    assert _outcome(result) == (
        Status.FAILED,
        "collect: 'report.md' goes through a symlink the worker made ('report.md');"
        " fanout never follows one",
        0,
        "",
    )
    assert _collected(tmp_path) == {}


async def test_nothing_is_written_outside_the_unit_folder(harness: Harness, tmp_path: Path) -> None:
    """A symlink in the unit folder (fanout makes none, so something else did) is never
    written through, whatever the sandbox sends."""
    outside = _outside(tmp_path)
    folder = tmp_path / "collected"
    folder.mkdir()
    (folder / "sub").symlink_to(outside)
    result = await harness.transport.run(
        _attempt(tmp_path, _sh("mkdir sub; echo evil > sub/victim.md"), collect=["sub/*.md"])
    )
    assert _outcome(result) == (
        Status.FAILED,
        "collect: 'sub/victim.md' leaves the unit folder",
        0,
        "",
    )
    assert (outside / "victim.md").read_text() == "untouched\n"
    assert sorted(p.name for p in outside.iterdir()) == ["victim.md"]


# --- staging, stdin, output ------------------------------------------------------------


async def test_staged_files_keep_their_exec_bit(harness: Harness, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    (workspace / "bin").mkdir(parents=True)
    script = workspace / "bin" / "run me.sh"
    script.write_text("#!/bin/sh\necho staged script ran\n")
    script.chmod(0o755)
    data = workspace / "data.txt"
    data.write_text("data\n")
    data.chmod(0o644)
    result = await harness.transport.run(
        _attempt(
            tmp_path,
            _sh("'./bin/run me.sh' && stat -c '%a %n' 'bin/run me.sh' data.txt && cat data.txt"),
            staged=(
                StagedFile(path="bin/run me.sh", source=script),
                StagedFile(path="data.txt", source=data),
            ),
        )
    )
    assert _outcome(result) == (
        Status.SUCCEEDED,
        "ok",
        0,
        "staged script ran\n755 bin/run me.sh\n644 data.txt\ndata\n",
    )


async def test_the_prompt_reaches_the_worker_s_stdin(harness: Harness, tmp_path: Path) -> None:
    result = await harness.transport.run(
        _attempt(tmp_path, ["cat"], prompt="line one\nünïcødé line two\n")
    )
    assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "line one\nünïcødé line two\n")


async def test_a_prompt_larger_than_a_pipe_reaches_the_worker_whole(
    harness: Harness, tmp_path: Path
) -> None:
    prompt = "".join(f"line {n:06d}\n" for n in range(30000))  # 360 000 bytes
    result = await harness.transport.run(_attempt(tmp_path, ["wc", "-c"], prompt=prompt))
    assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "360000\n")


async def test_a_worker_that_ignores_its_prompt_is_fine(harness: Harness, tmp_path: Path) -> None:
    prompt = "x" * 360000
    result = await harness.transport.run(_attempt(tmp_path, _sh("echo not reading"), prompt=prompt))
    assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "not reading\n")


async def test_output_is_captured_and_secrets_redacted(harness: Harness, tmp_path: Path) -> None:
    script = 'echo "the key is $API_TOKEN"; echo "on stderr $API_TOKEN" >&2; exit 2'
    result = await harness.transport.run(
        _attempt(tmp_path, _sh(script), secrets={"API_TOKEN": "s3cr3t-value"})
    )
    assert _outcome(result) == (
        Status.FAILED,
        "worker exited with status 2: on stderr [secret]",
        2,
        "the key is [secret]\non stderr [secret]\n",
    )
    log = (tmp_path / "logs" / "a1.log").read_text()
    assert log == "the key is [secret]\non stderr [secret]\n"


# --- the control file ------------------------------------------------------------------


async def test_the_throttle_control_file_is_read(harness: Harness, tmp_path: Path) -> None:
    script = 'printf \'{"throttled": true, "retryAfter": 3}\' > "$FANOUT_CONTROL"; exit 75'
    result = await harness.transport.run(_attempt(tmp_path, _sh(script)))
    assert _outcome(result) == (Status.THROTTLED, "throttled (control file)", 75, "")
    assert (result.retry_after, result.throttled_limit) == (3.0, None)


async def test_a_planted_control_symlink_is_not_followed(harness: Harness, tmp_path: Path) -> None:
    """``control.json`` is outside ``work/``, but the worker can write there: a symlink
    to a file that says "throttled" is not read (it would requeue the unit forever)."""
    fake = tmp_path / "outside.json"
    fake.write_text('{"throttled": true, "retryAfter": 9}')
    fake.chmod(0o644)
    script = f'ln -s {fake} "$FANOUT_CONTROL"; exit 4'
    result = await harness.transport.run(_attempt(tmp_path, _sh(script)))
    assert _outcome(result) == (Status.FAILED, "worker exited with status 4", 4, "")


# --- what a step leaves for the next, and how it ends --------------------------------


async def test_verify_sees_what_the_worker_left_in_work_and_home(
    harness: Harness, tmp_path: Path
) -> None:
    worker = 'echo made > made.txt; echo kept > "$HOME/state"; echo "$FANOUT_CONTROL" > where'
    verify = 'cat made.txt "$HOME/state"; test "$(cat where)" = "$FANOUT_CONTROL" && echo same'
    result = await harness.transport.run(_attempt(tmp_path, _sh(worker), verify=_sh(verify)))
    assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "made\nkept\nsame\n")


async def test_a_missing_command_fails_with_127_and_says_so(
    harness: Harness, tmp_path: Path
) -> None:
    result = await harness.transport.run(_attempt(tmp_path, ["no-such-program-xyz"]))
    said = "fanout: cannot start no-such-program-xyz: command not found"
    assert _outcome(result) == (
        Status.FAILED,
        f"worker exited with status 127: {said}",
        127,
        f"{said}\n",
    )


async def test_a_worker_killed_by_a_signal_exits_128_plus_its_number(
    harness: Harness, tmp_path: Path
) -> None:
    result = await harness.transport.run(_attempt(tmp_path, _sh("echo dying; kill -KILL $$")))
    # Behind unshare's chain the step's PID namespace has a shell (dash) for its init,
    # which says how its child died on the step's output; keeping that off costs a fork
    # per step (``sandbox._INIT``), so the one difference between transports is that
    # line.  fanout's spawner, like bwrap's init, says nothing.
    said = "dying\nKilled\n" if harness.shell_init else "dying\n"
    assert _outcome(result) == (
        Status.FAILED,
        f"worker exited with status 137: {said.splitlines()[-1]}",
        137,
        said,
    )


async def test_a_named_directory_is_collected_whole_without_links_or_fifos(
    harness: Harness, tmp_path: Path
) -> None:
    script = (
        "mkdir -p results/deep; echo 1 > results/a.md; echo 2 > results/.hidden;"
        " echo 3 > results/deep/b.txt; ln -s /etc/passwd results/link;"
        " mkfifo results/fifo; echo 4 > elsewhere.md"
    )
    result = await harness.transport.run(_attempt(tmp_path, _sh(script), collect=["results"]))
    assert _outcome(result) == (Status.SUCCEEDED, "ok", 0, "")
    assert sorted(c.path for c in result.collected) == [
        "results/.hidden",
        "results/a.md",
        "results/deep/b.txt",
    ]
    assert _collected(tmp_path) == {
        "results/.hidden": "2\n",
        "results/a.md": "1\n",
        "results/deep/b.txt": "3\n",
    }


async def test_nothing_in_a_git_folder_is_collected(harness: Harness, tmp_path: Path) -> None:
    """A hook or a config a worker planted in a .git folder would run its code on the
    workspace once applied: a directory taken whole leaves .git folders out, and a
    named path into one fails the unit."""
    script = (
        "mkdir -p results/.git/hooks results/sub/.GIT .git; echo 1 > results/a.md;"
        " echo evil > results/.git/hooks/post-checkout; echo evil > results/sub/.GIT/config;"
        " echo evil > .git/config"
    )
    taken = await harness.transport.run(_attempt(tmp_path, _sh(script), collect=["results"]))
    assert _outcome(taken) == (Status.SUCCEEDED, "ok", 0, "")
    assert _collected(tmp_path) == {"results/a.md": "1\n"}
    named = await harness.transport.run(
        _attempt(tmp_path / "again", _sh(script), collect=[".git/config"])
    )
    assert _outcome(named) == (
        Status.FAILED,
        "collect: '.git/config' is in a .git folder; fanout never collects git's own files"
        " (a hook or a config a worker wrote there would run on the workspace)",
        0,
        "",
    )


async def test_a_named_fifo_fails_the_unit(harness: Harness, tmp_path: Path) -> None:
    """A path named in collect that is no regular file or folder would collect nothing
    in silence, and the unit would pass without its result."""
    script = "echo 1 > a.md; mkfifo result.txt"
    result = await harness.transport.run(
        _attempt(tmp_path, _sh(script), collect=["a.md", "result.txt"])
    )
    assert _outcome(result) == (
        Status.FAILED,
        "collect: 'result.txt' is a fifo, socket or device the worker made;"
        " fanout collects regular files only",
        0,
        "",
    )


async def test_a_name_that_is_not_utf8_fails_the_unit_naming_it(
    harness: Harness, tmp_path: Path
) -> None:
    script = "echo ok > ok.md; echo bad > \"$(printf 'bad-\\377.md')\""
    result = await harness.transport.run(_attempt(tmp_path, _sh(script), collect=["*.md"]))
    assert _outcome(result) == (
        Status.FAILED,
        "collect: b'bad-\\xff.md' is not a UTF-8 file name",
        0,
        "",
    )


async def test_a_retry_after_line_in_the_output_throttles(harness: Harness, tmp_path: Path) -> None:
    result = await harness.transport.run(
        _attempt(tmp_path, _sh("echo 'HTTP 429'; echo 'Retry-After: 7'; exit 1"))
    )
    assert _outcome(result) == (
        Status.THROTTLED,
        "throttled (Retry-After)",
        1,
        "HTTP 429\nRetry-After: 7\n",
    )
    assert result.retry_after == 7.0


async def test_a_long_output_keeps_its_tail_and_a_capped_log(
    harness: Harness, tmp_path: Path
) -> None:
    script = "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; printf no-newline"
    result = await harness.transport.run(
        _attempt(tmp_path, _sh(script), log_limit=1000, tail_limit=200)
    )
    assert (result.status, result.reason) == (Status.SUCCEEDED, "ok")
    assert result.output_tail.endswith("line-2998\nline-2999\nno-newline")
    assert len(result.output_tail) <= 200
    log = (tmp_path / "logs" / "a1.log").read_text()
    assert log.startswith("line-0\nline-1\n")
    assert log.endswith("[fanout: log truncated at 1000 bytes]\n")


async def test_attempts_at_once_each_have_a_sandbox_of_their_own(
    harness: Harness, tmp_path: Path
) -> None:
    script = 'echo "$FANOUT_UNIT_ID" > mine.txt; sleep 0.2; cat mine.txt; ls'
    results = await asyncio.gather(
        *(
            harness.transport.run(
                _attempt(tmp_path / f"u{n}", _sh(script), unit_id=f"u{n}", collect=["*.txt"])
            )
            for n in range(4)
        )
    )
    assert [_outcome(r) for r in results] == [
        (Status.SUCCEEDED, "ok", 0, f"u{n}\nmine.txt\n") for n in range(4)
    ]
    assert [_collected(tmp_path / f"u{n}") for n in range(4)] == [
        {"mine.txt": f"u{n}\n"} for n in range(4)
    ]
    assert _sandboxes(harness) == []


async def test_a_secret_is_in_no_argv_and_no_file_of_the_sandbox_root(
    harness: Harness, tmp_path: Path
) -> None:
    token = marker()
    value = f"sk-test-{token.replace('.', '')}"
    with _reaping(token):
        task = asyncio.create_task(
            harness.transport.run(
                _attempt(tmp_path, _sh(f"sleep {token}"), secrets={"API_KEY": value}, timeout=60)
            )
        )
        assert await asyncio.to_thread(_until_sleeping, token, 1)
        holding = await asyncio.to_thread(_files_holding, harness.root, value.encode())
        assert (pids_with(value), holding) == ([], [])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def _files_holding(root: Path, value: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and value in path.read_bytes():
                found.append(str(path))
    return found
