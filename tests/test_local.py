"""Local sandboxes with real processes and real bubblewrap: isolation, timeouts,
cancellation, and a teardown that leaves nothing behind in every outcome."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fanout.attempt.collecting import Collect, PathRefused
from fanout.attempt.model import Attempt
from fanout.attempt.sandbox import StagedFile
from fanout.isolation import removal
from fanout.isolation.place import Kind
from fanout.outcome import Status
from fanout.transports import local
from fanout.transports.local import LocalTransport
from fanout.transports.steps import SandboxInit

from helpers import cli, make_attempt, wrapped, write_job
from procs import marker, pids_with, wait_until_gone, wait_until_present

KINDS = ["bwrap", "none"]
BWRAP = shutil.which("bwrap")


def _attempt(tmp_path: Path, argv: list[str], **options: Any) -> Attempt:
    return make_attempt(tmp_path, argv, **{"tail_limit": 4096, **options})


async def _transport(tmp_path: Path, kind: str) -> LocalTransport:
    if kind == "bwrap" and BWRAP is None:
        pytest.fail("bubblewrap is required for these tests (scripts/system-deps installs it)")
    root = tmp_path / "sandboxes"
    root.mkdir(exist_ok=True)
    transport = LocalTransport(slots=4, sandbox_kind=kind, root=root, path=os.environ["PATH"])
    await transport.start()
    assert transport.kind == kind
    return transport


def _assert_torn_down(tmp_path: Path) -> None:
    assert list((tmp_path / "sandboxes").iterdir()) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_stage_run_verify_collect(tmp_path: Path, kind: str) -> None:
    workspace = tmp_path / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "a b.py").write_text("x = 1\n")
    script = 'read line; printf "%s\\n" "$line" >> "src/a b.py"; echo "prompt was: $line"; echo made > new.txt'
    transport = await _transport(tmp_path, kind)
    result = await transport.run(
        _attempt(
            tmp_path,
            ["sh", "-c", script],
            verify=["grep", "-q", "hello", "src/a b.py"],
            prompt="hello\n",
            staged=(StagedFile(path="src/a b.py", source=workspace / "src" / "a b.py"),),
            collect=("src/a b.py", "*.txt"),
        )
    )
    assert result.status is Status.SUCCEEDED, result
    assert result.output_tail == "prompt was: hello\n"
    assert sorted(c.path for c in result.collected) == ["new.txt", "src/a b.py"]
    assert (tmp_path / "collected" / "src" / "a b.py").read_text() == "x = 1\nhello\n"
    assert (workspace / "src" / "a b.py").read_text() == "x = 1\n"
    _assert_torn_down(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
async def test_environment_is_only_what_the_job_declares(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COORDINATOR_ONLY", "leak")
    transport = await _transport(tmp_path, kind)
    result = await transport.run(
        _attempt(tmp_path, ["env"], env={"NO_COLOR": "1"}, secrets={"API_TOKEN": "s3cr3t-value"})
    )
    names = {line.split("=", 1)[0] for line in result.output_tail.splitlines()}
    assert "COORDINATOR_ONLY" not in names
    assert {"NO_COLOR", "API_TOKEN", "PATH", "HOME", "FANOUT_UNIT_ID", "FANOUT_CONTROL"} <= names
    assert "s3cr3t-value" not in result.output_tail
    assert "API_TOKEN=[secret]" in result.output_tail
    assert "s3cr3t-value" not in (tmp_path / "logs" / "a1.log").read_text()


async def test_bwrap_sandbox_is_read_only_private_and_offline(tmp_path: Path, repo: Path) -> None:
    outside_dir = repo / ".pytest_cache" / f"outside-{marker()}"
    outside_dir.mkdir(parents=True)
    (tmp_path / "host-file.txt").write_text("host /tmp is not visible")
    script = (
        f"touch {outside_dir}/x 2>/dev/null && echo wrote-outside; "
        f"test -e {tmp_path}/host-file.txt && echo host-tmp-visible; "
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9), 1)' 2>/dev/null || echo no-network; "
        "touch inside.txt && echo wrote-inside"
    )
    try:
        transport = await _transport(tmp_path, "bwrap")
        result = await transport.run(_attempt(tmp_path, ["sh", "-c", script]))
        assert result.output_tail.split() == ["no-network", "wrote-inside"]
        assert list(outside_dir.iterdir()) == []
    finally:
        shutil.rmtree(outside_dir)


async def test_bwrap_hides_the_state_directory(tmp_path: Path, repo: Path) -> None:
    state = repo / ".pytest_cache" / f"state-{marker()}"  # not below the private /tmp
    state.mkdir(parents=True)
    try:
        (state / "journal.sqlite").write_text("private")
        root = tmp_path / "sandboxes"
        root.mkdir()
        transport = LocalTransport(
            slots=1, sandbox_kind="bwrap", root=root, hidden=[state], path=os.environ["PATH"]
        )
        await transport.start()
        result = await transport.run(_attempt(tmp_path, ["ls", "-A", str(state)]))
        assert result.status is Status.SUCCEEDED
        assert result.output_tail == ""
    finally:
        shutil.rmtree(state)


async def test_bwrap_s_private_tmp_shows_no_path_of_what_it_hides(tmp_path: Path) -> None:
    """A hidden directory below /tmp is hidden by the private /tmp already: a mount on
    it (an empty tmpfs, /dev/null on a file) would only make its path show there."""
    state = tmp_path / "jobs" / ".fanout"
    state.mkdir(parents=True)
    (state / "journal.sqlite").write_text("private")
    secrets = tmp_path / "secrets.env"
    secrets.write_text("KEY=1")
    root = tmp_path / "sandboxes"
    root.mkdir()
    transport = LocalTransport(
        slots=1,
        sandbox_kind="bwrap",
        root=root,
        hidden=[state, secrets],
        path=os.environ["PATH"],
    )
    await transport.start()
    script = 'echo "$HOME"; find /tmp /var/tmp'
    result = await transport.run(_attempt(tmp_path, ["sh", "-c", script]))
    assert result.status is Status.SUCCEEDED, result
    home, *shown = result.output_tail.splitlines()
    base = Path(home)  # the sandbox directory
    assert base.parent == root
    # The way to the sandbox, and what is in it: nothing of the state dir or the file.
    outside = [path for path in shown if not Path(path).is_relative_to(base)]
    assert sorted(outside) == sorted(
        [*(str(parent) for parent in base.parents if parent.is_relative_to("/tmp")), "/var/tmp"]
    )
    assert f"{base}/work" in shown


@pytest.mark.parametrize("kind", KINDS)
async def test_timeout_kills_the_whole_process_tree(tmp_path: Path, kind: str) -> None:
    token = marker()
    transport = await _transport(tmp_path, kind)
    result = await transport.run(
        _attempt(
            tmp_path, ["sh", "-c", f"sleep {token} & sleep {token} & echo started; wait"], timeout=1
        )
    )
    assert result.status is Status.TIMEOUT
    assert result.reason == "timed out after 1s"
    assert result.output_tail == "started\n"
    assert wait_until_gone(token) == []
    _assert_torn_down(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_process_that_left_the_group_but_holds_the_output_is_killed_too(
    tmp_path: Path, kind: str
) -> None:
    token = marker()
    transport = await _transport(tmp_path, kind)
    result = await transport.run(
        _attempt(tmp_path, ["sh", "-c", f"setsid sleep {token} & sleep {token}"], timeout=1)
    )
    assert result.status is Status.TIMEOUT
    assert pids_with(token) == []  # gone when run() returns, not eventually
    _assert_torn_down(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
async def test_cancellation_kills_and_tears_down(tmp_path: Path, kind: str) -> None:
    token = marker()
    transport = await _transport(tmp_path, kind)
    task = asyncio.create_task(
        transport.run(_attempt(tmp_path, ["sh", "-c", f"sleep {token} & wait"]))
    )
    assert await asyncio.to_thread(wait_until_present, token)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_until_gone(token) == []
    _assert_torn_down(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
async def test_failures_keep_a_tail_and_a_capped_log(tmp_path: Path, kind: str) -> None:
    transport = await _transport(tmp_path, kind)
    script = "i=0; while [ $i -lt 3000 ]; do echo line-$i; i=$((i+1)); done; exit 3"
    result = await transport.run(
        _attempt(tmp_path, ["sh", "-c", script], log_limit=1000, tail_limit=200)
    )
    assert (result.status, result.exit_code, result.reason) == (
        Status.FAILED,
        3,
        "worker exited with status 3: line-2999",
    )
    assert result.output_tail.endswith("line-2999\n")
    assert len(result.output_tail) <= 200
    log = (tmp_path / "logs" / "a1.log").read_text()
    assert log.startswith("line-0\n")
    assert log.endswith("[fanout: log truncated at 1000 bytes]\n")
    _assert_torn_down(tmp_path)


async def test_an_agents_result_past_the_logs_cut_is_read_from_the_tail(tmp_path: Path) -> None:
    # claude's stream-json ends in its `result` line; a session longer than logLimit
    # pushes that line past the log's cut.  Here a 429 the CLI gave up on.
    result = (
        Path(__file__).parent / "data" / "agents" / "claude" / "rate_limit_429.out"
    ).read_text()
    (tmp_path / "result.out").write_text(result)
    script = f'i=0; while [ $i -lt 300 ]; do echo \'{{"type":"user"}}\'; i=$((i+1)); done; cat {tmp_path}/result.out; exit 1'
    attempt = replace(
        _attempt(tmp_path, ["sh", "-c", script], log_limit=1000, tail_limit=2048), agent="claude"
    )
    transport = await _transport(tmp_path, "none")
    done = await transport.run(attempt)
    assert (done.status, done.kind, done.reason) == (
        Status.THROTTLED,
        "rate-limited",
        "claude: rate-limited: API Error: Request rejected (429) · mock limit",
    )
    _assert_torn_down(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
async def test_verify_failure_fails_the_attempt(tmp_path: Path, kind: str) -> None:
    transport = await _transport(tmp_path, kind)
    result = await transport.run(
        _attempt(tmp_path, ["true"], verify=["sh", "-c", "echo still broken; exit 1"])
    )
    assert (result.status, result.reason) == (
        Status.FAILED,
        "verify exited with status 1: still broken",
    )
    assert result.output_tail == "still broken\n"


@pytest.mark.parametrize("kind", KINDS)
async def test_collected_files_never_escape(tmp_path: Path, kind: str) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    transport = await _transport(tmp_path, kind)
    script = f"ln -s {secret} link.txt; mkdir d; ln -s {tmp_path} d/up; echo ok > real.txt"
    result = await transport.run(_attempt(tmp_path, ["sh", "-c", script], collect=("*.txt", "d")))
    assert result.status is Status.SUCCEEDED
    assert [c.path for c in result.collected] == ["real.txt"]
    with pytest.raises(PathRefused) as refused:  # dispatch fails the attempt with it
        Collect.compile(("../secret.txt",))
    assert str(refused.value) == (
        "collect: '../secret.txt' leaves the workspace ('..' is not allowed)"
    )
    escaping = await transport.run(
        _attempt(tmp_path, ["sh", "-c", f"ln -s {tmp_path} up"], collect=("up/secret.txt",))
    )
    assert escaping.status is Status.FAILED
    assert escaping.reason == (
        "collect: 'up/secret.txt' goes through a symlink the worker made ('up');"
        " fanout never follows one"
    )
    _assert_torn_down(tmp_path)


@pytest.mark.parametrize("kind", KINDS)
async def test_secrets_never_reach_argv(tmp_path: Path, kind: str) -> None:
    token = marker()
    value = f"sk-test-{token}"
    transport = await _transport(tmp_path, kind)
    task = asyncio.create_task(
        transport.run(
            _attempt(
                tmp_path, ["sh", "-c", f"sleep {token}"], secrets={"API_KEY": value}, timeout=30
            )
        )
    )
    assert await asyncio.to_thread(wait_until_present, token)
    assert pids_with(value) == []
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_missing_command_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    transport = await _transport(tmp_path, "none")
    result = await transport.run(_attempt(tmp_path, ["no-such-program-xyz"]))
    assert (result.status, result.exit_code) == (Status.FAILED, 127)
    assert "fanout: cannot start no-such-program-xyz: " in result.output_tail


async def test_sandbox_bwrap_required_but_missing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fanout.errors import EnvironmentProblem

    monkeypatch.setenv("PATH", str(tmp_path))
    transport = LocalTransport(slots=1, sandbox_kind="bwrap", root=tmp_path)
    with pytest.raises(EnvironmentProblem, match="bubblewrap is not installed"):
        await transport.start()
    warnings: list[str] = []
    auto = LocalTransport(slots=1, sandbox_kind="auto", root=tmp_path, warn=warnings.append)
    await auto.start()
    assert auto.kind == "none"
    assert warnings == [
        "bubblewrap (bwrap) not found: units run in plain directories without isolation"
    ]


async def test_tools_installed_under_tmp_stay_visible_in_bwrap(tmp_path: Path) -> None:
    """A checkout and its virtualenv under /tmp (CI, scratch clones) must still run."""
    prefix = tmp_path / "venv"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    (prefix / "lib" / "data.txt").write_text("from the prefix\n")
    tool = prefix / "bin" / "my-tool"
    tool.write_text(f"#!/bin/sh\ncat {prefix}/lib/data.txt\n")
    tool.chmod(0o755)
    root = tmp_path / "sandboxes"
    root.mkdir()
    transport = LocalTransport(
        slots=1, sandbox_kind="bwrap", root=root, path=f"{prefix}/bin:{os.environ['PATH']}"
    )
    await transport.start()
    result = await transport.run(_attempt(tmp_path, ["my-tool"]))
    assert (result.status, result.output_tail) == (Status.SUCCEEDED, "from the prefix\n")


def test_tool_dirs_bring_a_bin_directory_s_prefix() -> None:
    from fanout.isolation.tools import tool_dirs

    assert tool_dirs("/tmp/ci/.venv/bin:/usr/bin:/var/tmp/tools:/tmp:relative") == [
        Path("/tmp/ci/.venv"),
        Path("/var/tmp/tools"),
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_whose_parent_is_not_fanout_never_starts(tmp_path: Path, kind: Kind) -> None:
    # fanout SIGKILLed while spawning a worker: the worker's parent is no longer fanout by
    # the time the parent-death signal is set, so the signal would never come.  A second
    # process between fanout and the wrapped argv stands in for that reparenting.
    ran = tmp_path / "ran"
    argv = wrapped(kind, ["touch", str(ran)], tmp_path)
    direct = subprocess.run(argv, check=False)
    assert (direct.returncode, ran.exists()) == (0, True)
    ran.unlink()
    reparented = subprocess.run(["sh", "-c", '"$@"', "sh", *argv], check=False)
    assert (reparented.returncode, ran.exists()) == (137, False)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_large_prompt_reaches_a_slow_reader_and_a_non_reader_is_fine(
    tmp_path: Path, kind: str
) -> None:
    transport = await _transport(tmp_path, kind)
    prompt = "x" * (1 << 20) + "\n"  # sixteen times what a pipe holds
    slow = await transport.run(
        _attempt(tmp_path, ["sh", "-c", "sleep 0.2; wc -c"], prompt=prompt, unit_id="slow")
    )
    deaf = await transport.run(_attempt(tmp_path, ["true"], prompt=prompt, unit_id="deaf"))
    assert (slow.status, slow.output_tail.strip()) == (Status.SUCCEEDED, str(len(prompt)))
    assert deaf.status is Status.SUCCEEDED
    _assert_torn_down(tmp_path)


async def test_a_stopped_bwrap_step_waits_for_its_namespace_init() -> None:
    # bwrap exits as soon as the step's own process does, before the namespace's init
    # has taken the rest of the namespace down; the step counts as stopped only once the
    # init (named on bwrap's status pipe) is gone.  A process stands in for the init.
    init = await asyncio.create_subprocess_exec("sleep", "60")
    read, write = os.pipe()
    os.write(write, b'{ "child-pid": %d }\n' % init.pid)
    watch = SandboxInit(read)
    await asyncio.sleep(0.05)  # the status is read as it comes
    killed: list[bool] = []

    def kill() -> None:
        killed.append(True)
        init.kill()

    asyncio.get_running_loop().call_later(0.2, kill)
    try:
        await watch.gone(30)
        assert killed == [True]
        assert await init.wait() == -9
    finally:
        if init.returncode is None:
            init.kill()
            await init.wait()
        os.close(write)


async def test_a_bwrap_status_without_a_pid_waits_for_nothing() -> None:
    read, write = os.pipe()
    watch = SandboxInit(read)
    os.close(write)  # the guard refused the step: bwrap never ran
    await asyncio.sleep(0.05)
    await watch.gone(30)
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(read)  # released


# --- what an attempt leaves, and what a run finds left ----------------------------------


def _dead_pid() -> int:
    """The PID of a process that has exited (a coordinator that was killed)."""
    ran = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    return int(ran.stdout)


def _scrub(folder: Path) -> None:
    """Remove ``folder`` whatever a failing test left there (pytest's own clean-up is
    shutil.rmtree's, which stops at a deep tree or an immutable file)."""
    subprocess.run(["chattr", "-R", "-i", "-a", str(folder)], capture_output=True, check=False)
    subprocess.run(["chmod", "-R", "u+rwx", str(folder)], check=False)
    subprocess.run(["rm", "-rf", str(folder)], check=True)


@contextlib.contextmanager
def _left_by_a_killed_run(root: Path, outside: Path) -> Iterator[Path]:
    """In ``root``, two sandboxes of a coordinator that was killed: one a root worker
    without bwrap left a thousand levels deep, with a folder shut to its owner and an
    immutable file (removable), and one with ``outside`` mounted in it (not); where the
    second is set aside."""
    dead = _dead_pid()
    left = root / f"fanout-{dead}-left"
    (left / "work").mkdir(parents=True)
    subprocess.run(
        [
            "sh",
            "-c",
            "mkdir -p $(printf 'work/d/%.0s' $(seq 1000)) work/shut/inner"
            " && chmod 000 work/shut/inner work/shut && echo x > work/locked"
            " && chattr +i work/locked",
        ],
        cwd=left,
        check=True,
    )
    mounted = root / f"fanout-{dead}-mounted"
    (mounted / "work" / "m").mkdir(parents=True)
    aside = root / f"fanout-unremovable-{dead}-mounted"
    subprocess.run(["mount", "--bind", str(outside), str(mounted / "work" / "m")], check=True)
    try:
        yield aside
    finally:  # the mount moved with its folder
        moved = aside if aside.exists() else mounted
        subprocess.run(["umount", str(moved / "work" / "m")], check=True)


def test_a_run_removes_what_ended_runs_left_and_sets_aside_what_it_cannot(
    tmp_path: Path,
) -> None:
    """Sandboxes whose coordinator is gone: one of any depth, shut and frozen is
    removed; one with a mount in it is set aside, said once, and never touched again
    (nothing behind the mount is removed); another user's is left to them."""
    from sshd import login_user

    root = tmp_path / "sandboxes"
    theirs = root / f"fanout-{_dead_pid()}-theirs"
    theirs.mkdir(parents=True)
    shutil.chown(theirs, login_user())
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("kept")
    try:
        with _left_by_a_killed_run(root, outside) as aside:
            said: list[str] = []
            for _ in range(2):
                asyncio.run(
                    LocalTransport(
                        slots=1, sandbox_kind="none", root=root, warn=said.append
                    ).start()
                )
                left = sorted(path.name for path in root.iterdir())
                assert left == sorted([aside.name, theirs.name])
        assert said == [
            f"cannot remove {aside}: 'work/m' is a mount point; no fanout run touches it"
            f" again, remove it with: umount {aside}/work/m && rm -rf {aside}"
        ]
        assert (outside / "precious").read_text() == "kept"
    finally:
        _scrub(root)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_sandbox_a_worker_filled_is_removed_off_the_loop(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox left as it was made costs two rmdirs, on the loop; one the worker
    filled, a walk whose length the worker chose, in a thread: the loop (the gateway,
    the other units' pacing) goes on meanwhile."""
    threads: list[bool] = []
    dispose = removal.dispose

    def watched(path: Path, aside: Path, *, deadline: float) -> str | None:
        threads.append(threading.current_thread() is threading.main_thread())
        return dispose(path, aside, deadline=deadline)

    monkeypatch.setattr(removal, "dispose", watched)
    transport = await _transport(tmp_path, kind)
    script = "mkdir -p $(printf 'd/%.0s' $(seq 1000)) shut/inner && chmod 000 shut/inner shut"
    for argv in (["true"], ["sh", "-c", script]):
        result = await transport.run(_attempt(tmp_path, argv))
        assert (result.status, result.reason) == (Status.SUCCEEDED, "ok")
        _assert_torn_down(tmp_path)
    assert threads == [False]


async def test_a_cancellation_while_a_thread_makes_a_sandbox_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a disk a thread makes each sandbox.  A cancellation that comes meanwhile (Ctrl-C
    as a unit starts, its deadline) does not stop the thread: the directory it makes is
    removed before the cancellation goes on.  Before, it was left behind (for the next
    run's sweep), after a Ctrl-C whose message says the sandboxes were removed."""
    transport = await _transport(tmp_path, "none")
    transport._memory = False  # a disk's way, wherever this test's folder is
    go, made = threading.Event(), threading.Event()
    make = local._make

    def slow(root: Path) -> Path:
        go.wait(10)
        try:
            return make(root)
        finally:
            made.set()

    monkeypatch.setattr(local, "_make", slow)

    async def enter() -> None:
        async with transport.sandbox(_attempt(tmp_path, ["true"])):
            pytest.fail("the sandbox was entered")

    task = asyncio.ensure_future(enter())
    await asyncio.sleep(0.1)  # the thread waits in _make
    task.cancel()
    await asyncio.sleep(0.05)
    go.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert made.wait(10)
    _assert_torn_down(tmp_path)


DEEP = """
version = 1
name = "{name}"
[inputs]
items = ["u1", "u2"]
[task]
command = ["sh", "-c", "{script}"]
[runtime]
sandbox = "{kind}"
"""


@pytest.mark.slow
def test_no_run_is_blocked_by_a_sandbox_another_unit_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: a worker's thousand-level tree failed its unit with a
    RecursionError and left the sandbox, and every later run of any job on the same
    TMPDIR exited 70.  Here, with a killed coordinator's sandboxes left as well (one
    removable, one that is not), four runs of two jobs: none is blocked (the figure),
    and what cannot be removed is said once, by the first."""
    sandboxes = tmp_path / "tmp"
    sandboxes.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(sandboxes))
    monkeypatch.chdir(tmp_path)
    deep = "mkdir -p $(printf 'd/%.0s' $(seq 1000)) shut && chmod 000 shut"
    jobs = [
        write_job(tmp_path, DEEP.format(name="deep", script=deep, kind="bwrap"), "deep.toml"),
        write_job(tmp_path, DEEP.format(name="other", script="true", kind="none"), "other.toml"),
    ]
    outside = tmp_path / "outside"
    outside.mkdir()
    try:
        with _left_by_a_killed_run(sandboxes, outside) as aside:
            runs = [cli("run", "--fresh", str(job)) for job in jobs * 2]
    finally:
        leftovers = sorted(
            path.name for path in sandboxes.iterdir() if path.name.startswith("fanout-")
        )
        _scrub(sandboxes)
    blocked = [run.code for run in runs if run.code != 0]
    assert blocked == [], [run.out + run.err for run in runs]
    said = f"cannot remove {aside}: 'work/m' is a mount point"
    assert [(run.out + run.err).count(said) for run in runs] == [1, 0, 0, 0]
    assert leftovers == [aside.name]


def test_what_is_not_removed_in_time_is_left_for_a_later_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removal is bounded (``removal.PATIENCE``): past it, a sandbox's teardown and a
    run's sweep stop and say so, and what is left stays where a later run's sweep finds
    it (here with no patience at all)."""
    monkeypatch.setattr(removal, "PATIENCE", 0.0)
    root = tmp_path / "sandboxes"
    dead = _dead_pid()
    for name in ("a", "b"):
        (root / f"fanout-{dead}-{name}" / "work").mkdir(parents=True)
        (root / f"fanout-{dead}-{name}" / "work" / "file").write_text("x")
    said: list[str] = []
    transport = LocalTransport(slots=1, sandbox_kind="none", root=root, warn=said.append)
    asyncio.run(transport.start())
    assert said == [
        f"{root}/fanout-{dead}-a (and 1 more sandbox) could not be removed within 0s:"
        " the next run removes the rest"
    ]
    said.clear()
    result = asyncio.run(transport.run(_attempt(tmp_path, ["sh", "-c", "echo x > file"])))
    assert result.status is Status.SUCCEEDED
    (mine,) = [path for path in root.iterdir() if not path.name.startswith(f"fanout-{dead}-")]
    assert said == [
        f"{mine} could not be removed within 0s: the next run removes the rest, once this"
        " one has ended"
    ]
    monkeypatch.setattr(removal, "PATIENCE", 60.0)
    said.clear()
    asyncio.run(LocalTransport(slots=1, sandbox_kind="none", root=root, warn=said.append).start())
    assert (said, sorted(root.iterdir())) == ([], [mine])  # this process's: still running


ROUNDS = """
version = 1
name = "deep-rounds"
[inputs]
command = ["sh", "-c", "echo u1; if test -e marker; then echo u2; fi"]
format = "lines"
[units]
collect = ["d", "marker"]
stage = ["**"]
[task]
command = ["sh", "-c", "{script}"]
[runtime]
sandbox = "none"
[rounds]
max = 2
[collect]
apply = true
"""


@pytest.mark.slow
def test_a_deep_tree_is_collected_applied_staged_and_collected_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's thousand levels, all the way: listed and collected, written back to
    the workspace, staged from it by a glob in round 2 (its marker selects u2), and
    collected again over what u1's first attempt collected.  Each step recursed as deep
    as the tree (the listing, Path.mkdir's parents, os.walk, shutil.rmtree)."""
    monkeypatch.chdir(tmp_path)
    deep = "$(printf 'd/%.0s' $(seq 1000))"
    script = f"mkdir -p {deep} && echo deep > {deep}f && touch marker"
    job = write_job(tmp_path, ROUNDS.format(script=script), "rounds.toml")
    try:
        ran = cli("run", str(job))
        assert ran.code == 0, ran.out + ran.err
        assert (tmp_path / ("d/" * 1000 + "f")).read_text() == "deep\n"
        assert "round 2: 2 unit(s) from 2 record(s)" in ran.out + ran.err
    finally:
        _scrub(tmp_path / "d")
        _scrub(tmp_path / ".fanout")


@pytest.mark.skipif(not shutil.which("setpriv"), reason="the guard is setpriv's")
def test_in_a_pid_namespace_setpriv_execs_unshare_and_the_init_checks_the_lifeline(
    tmp_path: Path,
) -> None:
    # One shell per step (the namespace's init), not two: the init checks that unshare's
    # parent is fanout, as the guard shell did (issue 26).
    from fanout.isolation import tools

    if not tools.pid_namespace():
        pytest.skip("no PID namespace for workers here")
    ran = tmp_path / "ran"
    argv = wrapped("none", ["touch", str(ran)], tmp_path)
    assert argv[: len(tools.pid_namespace()) + 4] == [
        tools.SETPRIV,
        "--pdeathsig",
        "KILL",
        "--",
        *tools.pid_namespace(),
    ]
    assert argv.count("/bin/sh") == 1
    # Another process's lifeline: unshare's parent (this test) is not it.
    other = [str(os.getppid()) if arg == str(os.getpid()) else arg for arg in argv]
    assert other != argv
    refused = subprocess.run(other, check=False)
    assert (refused.returncode, ran.exists()) == (137, False)
    assert subprocess.run(argv, check=False).returncode == 0
    assert ran.exists()
