"""Running attempts in sandboxes on this machine.

Each attempt gets a fresh directory under the sandbox root, its staged files copied in,
the worker started in its own process group (and PID namespace: see ``sandbox``) with
the prompt on stdin, then ``verify``, then the collect step, and the directory removed
in a ``finally`` that runs on success, failure, timeout and cancellation alike.

A step ends when its main process exits, not when its output pipe closes (a daemon may
hold the pipe forever): then its process group is killed, which takes its PID
namespace down with it, and its output is drained for a bounded time.  Where this
machine gives no PID namespace, fanout also looks for the step's escapees (processes
holding its output, working in its sandbox or carrying its ``FANOUT_CONTROL``) and kills
them; the next run does the same for sandboxes a killed coordinator left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import fanin, sandbox, throttle
from .capture import OutputCapture
from .outcome import AttemptResult, Status
from .transport import Attempt
from .verdict import Verdict

# How long a finished or killed step's output may stay open before fanout looks for
# escapees holding it, and how long after that it waits before giving up on it.
_DRAIN_AFTER_KILL = 2.0


class LocalTransport:
    """Attempts on this machine, ``slots`` at once."""

    def __init__(
        self,
        *,
        slots: int,
        sandbox_kind: str = "auto",
        image: str | None = None,
        root: Path | None = None,
        path: str = os.defpath,
        hidden: Sequence[Path] = (),
        warn: Callable[[str], None] = lambda message: None,
    ) -> None:
        self._slots = slots
        self._requested = sandbox_kind
        self._image = image
        self.root = root or Path(tempfile.gettempdir())
        self._path = path
        self._hidden = tuple(hidden)
        self._tools = sandbox.bound_tools(path)
        self._warn = warn
        self.kind: sandbox.Kind = "none"
        self.containment = sandbox.Containment.GROUP

    @property
    def capacity(self) -> int:
        return self._slots

    async def start(self) -> None:
        if sys.version_info < (3, 12) and hasattr(os, "pidfd_open"):
            # Python 3.11 watches each child with a thread of its own; a pidfd is cheaper
            # (and is what 3.12 does by default).
            watcher = asyncio.PidfdChildWatcher()
            watcher.attach_loop(asyncio.get_running_loop())
            asyncio.set_child_watcher(watcher)
        await asyncio.to_thread(self._remove_orphans)
        choice = await asyncio.to_thread(sandbox.choose, self._requested, self._image)
        self.kind = choice.kind
        self.containment = choice.containment
        if choice.warning:
            self._warn(choice.warning)

    async def close(self) -> None:
        return None

    def _remove_orphans(self) -> None:
        """Remove sandboxes a killed coordinator left behind, and kill what still works
        in them.  Sandbox directories carry their coordinator's PID; one whose
        coordinator is gone is garbage.  In a PID namespace nothing can be left running;
        without one (or in the instant between unshare's fork and its child arming the
        parent-death signal) a worker's children may be, and must not do their work
        beside the resumed run."""
        leftovers = []
        for leftover in self.root.glob("fanout-*-*"):
            owner = leftover.name.split("-")[1]
            if owner.isdigit() and not _alive(int(owner)):
                leftovers.append(leftover)
        if leftovers:
            _kill_escapees([str(path) for path in leftovers], pipe=None)
        for leftover in leftovers:
            shutil.rmtree(leftover, ignore_errors=True)

    async def run(self, attempt: Attempt) -> AttemptResult:
        started = time.monotonic()
        directory = Path(tempfile.mkdtemp(prefix=f"fanout-{os.getpid()}-", dir=self.root))
        try:
            return await self._attempt(attempt, directory, started)
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    async def _attempt(self, attempt: Attempt, directory: Path, started: float) -> AttemptResult:
        invocation = attempt.invocation
        work = directory  # one directory per sandbox: directory creation is the hot path

        verdict = Verdict(attempt)
        try:
            try:
                for item in attempt.staged:
                    target = work / item.path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(item.source, target)
            except OSError as exc:
                return verdict.result(
                    Status.FAILED, f"stage: {exc.strerror or exc}: {exc.filename}"
                )
            control = work / throttle.CONTROL_FILE
            env = {
                "PATH": self._path,
                # Under bwrap /tmp is a private tmpfs; without a sandbox, the unit's own dir.
                "HOME": "/tmp" if self.kind == "bwrap" else str(work),
                "TMPDIR": "/tmp" if self.kind == "bwrap" else str(work),
                **attempt.base_env(),
                "FANOUT_CONTROL": str(control),
                **invocation.env,
                **attempt.secrets,
            }
            deadline = started + invocation.timeout
            capture = verdict.capture
            code = await self._exec(
                invocation.argv,
                directory,
                env,
                invocation.prompt,
                deadline,
                capture,
                attempt.network,
            )
            stage = "worker"
            if code == 0 and invocation.verify:
                stage = "verify"
                code = await self._exec(
                    invocation.verify, directory, env, "", deadline, capture, attempt.network
                )
            return verdict.decide(
                code=code,
                stage=stage,
                control=control.read_text() if control.is_file() else None,
                collect=lambda: fanin.copy_collected(
                    work, invocation.collect, attempt.collect_dir, skip=[throttle.CONTROL_FILE]
                ),
            )
        finally:
            verdict.close()

    async def _exec(
        self,
        argv: Sequence[str],
        directory: Path,
        env: Mapping[str, str],
        stdin_text: str,
        deadline: float,
        capture: OutputCapture,
        network: bool,
    ) -> int | None:
        """Run one command in the sandbox; its exit code, or None if the deadline passed.
        On timeout and on cancellation the whole process group is killed."""
        command = sandbox.wrap(
            self.kind,
            argv,
            sandbox=directory,
            network=network,
            hidden=self._hidden,
            image=self._image,
            env_names=list(env),
            tools=self._tools,
        )
        starting = asyncio.ensure_future(
            _spawn(command, cwd=directory, env=env, preexec=sandbox.preexec(self.kind))
        )
        step = _Step(directory, self.containment)
        try:
            # A cancellation while the process is being set up must still find it to kill.
            step.process, step.exits, step.transport = await asyncio.shield(starting)
        except OSError as exc:
            capture.feed(f"fanout: cannot start {argv[0]}: {exc.strerror or exc}\n".encode())
            return 127
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                step.process, step.exits, step.transport = await starting
                await step.stop(None)
            raise
        step.pipe = _output_pipe(step.process.pid)
        _feed(step.process, stdin_text.encode())
        reader = asyncio.create_task(_read(step.process, capture))
        try:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    # The process's exit, not asyncio's wait(), which also waits for the
                    # pipes: a daemon holding the output would hold the attempt.
                    await asyncio.shield(step.exits.exited)
                return step.process.returncode
            except TimeoutError:
                return None
        finally:
            await step.stop(reader)


class _Exits(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, plus a future set the moment the process exits."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=1 << 16, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _spawn(
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    preexec: Callable[[], None] | None,
) -> tuple[asyncio.subprocess.Process, _Exits, asyncio.SubprocessTransport]:
    """``asyncio.create_subprocess_exec`` with a protocol that reports the exit."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _Exits(loop),
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
        preexec_fn=preexec,
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol, transport


class _Step:
    """One running step: its process, and what ``stop`` needs to leave nothing behind."""

    process: asyncio.subprocess.Process
    exits: _Exits
    transport: asyncio.SubprocessTransport
    pipe: str | None = None

    def __init__(self, directory: Path, containment: sandbox.Containment) -> None:
        self.directory = directory
        self.namespaced = containment is not sandbox.Containment.GROUP

    async def stop(self, reader: asyncio.Task[None] | None) -> None:
        """Kill the step's process group, then wait (bounded) for its exit and for its
        output to end.

        In a PID namespace, killing the group kills the namespace's first process (or
        it has exited already), and with it everything else in the namespace.  Without
        one, a process that called setsid survives the group: fanout kills every process
        that holds the output pipe, works in the sandbox or carries this sandbox's
        ``FANOUT_CONTROL``, at once.  In either case output still open after a moment
        means such an escapee (or bwrap's sandbox process when bwrap was killed before
        it armed --die-with-parent), so fanout searches again and gives it a last moment.
        """
        _kill_group(self.process)
        search = functools.partial(_kill_escapees, [str(self.directory)], pipe=self.pipe)
        waiting: set[asyncio.Future[Any]] = set() if reader is None else {reader}
        waiting.add(asyncio.shield(self.exits.exited))
        waiting = {task for task in waiting if not task.done()}
        try:
            if not self.namespaced:
                await asyncio.to_thread(search)
            if not waiting:
                return
            _, pending = await asyncio.wait(waiting, timeout=_DRAIN_AFTER_KILL)
            if pending:
                await asyncio.to_thread(search)
                await asyncio.wait(pending, timeout=_DRAIN_AFTER_KILL)
        finally:
            for task in waiting:
                task.cancel()
            # Closes fanout's ends of the pipes even if something outside still holds
            # them (it cannot keep the attempt's file descriptors alive).
            self.transport.close()


def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Hand the prompt to the pipe and close it.  The transport writes what the pipe does
    not take at once as the worker reads, and gives up quietly if the worker exits
    without reading: no task, no drain."""
    assert process.stdin is not None
    if data:
        process.stdin.write(data)
    process.stdin.close()


async def _read(process: asyncio.subprocess.Process, capture: OutputCapture) -> None:
    assert process.stdout is not None
    while chunk := await process.stdout.read(65536):
        capture.feed(chunk)


def _output_pipe(pid: int) -> str | None:
    """The worker's output pipe as /proc names it (``pipe:[inode]``), None if gone."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None


def _kill_escapees(directories: Sequence[str], *, pipe: str | None) -> None:
    """SIGKILL every other process that holds ``pipe`` open, has its cwd in one of
    ``directories`` (sandboxes) or inherited a ``FANOUT_CONTROL`` that points into one.
    A daemon that closed its output and changed directory still has its environment."""
    me = os.getpid()
    inside = tuple(directory.rstrip("/") + "/" for directory in directories)
    controls = tuple(b"FANOUT_CONTROL=" + os.fsencode(prefix) for prefix in inside)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        if _works_in(entry.path, inside, controls) or (pipe and _holds(entry.path, pipe)):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def _works_in(process_dir: str, inside: tuple[str, ...], controls: tuple[bytes, ...]) -> bool:
    try:
        cwd = os.readlink(f"{process_dir}/cwd") + "/"
        if cwd.startswith(inside):
            return True
        with open(f"{process_dir}/environ", "rb") as stream:
            environ = stream.read()
    except OSError:  # gone, a kernel thread, or another user's
        return False
    return any(entry.startswith(controls) for entry in environ.split(b"\0"))


def _holds(process_dir: str, pipe: str) -> bool:
    try:
        with os.scandir(f"{process_dir}/fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) == pipe:
                        return True
    except OSError:  # gone, or another user's
        pass
    return False


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the worker's process group, leader gone or not (an empty group is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
