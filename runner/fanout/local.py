"""Running attempts in sandboxes on this machine.

Each attempt gets a fresh directory under the sandbox root, its staged files copied in,
the worker started in its own process group with the prompt on stdin, then ``verify``,
then the collect step, and the directory removed in a ``finally`` that runs on
success, failure, timeout and cancellation alike.  A timeout or a cancellation kills
the worker's whole process group; under bwrap the private PID namespace and
``--die-with-parent`` also take every process down if fanout itself is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
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

_DRAIN_AFTER_KILL = 2.0
# How long a killed group's output may stay open before fanout looks for escapees.
_ESCAPES_AFTER = 0.5


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
        # Tools on PATH, and fanout's own environment (tests and jobs run its python).
        self._tools = tuple(sandbox.tool_dirs(f"{path}:{sys.prefix}/bin"))
        self._warn = warn
        self.kind: sandbox.Kind = "none"

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
        if choice.warning:
            self._warn(choice.warning)

    async def close(self) -> None:
        return None

    def _remove_orphans(self) -> None:
        """Remove sandboxes a killed coordinator left behind.  Sandbox directories carry
        their coordinator's PID; one whose coordinator is gone is garbage."""
        for leftover in self.root.glob("fanout-*-*"):
            owner = leftover.name.split("-")[1]
            if owner.isdigit() and not _alive(int(owner)):
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
            asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=directory,
                env=dict(env),
                start_new_session=True,
                preexec_fn=sandbox.preexec(self.kind),
            )
        )
        try:
            # A cancellation while the process is being set up must still find it to kill.
            process = await asyncio.shield(starting)
        except OSError as exc:
            capture.feed(f"fanout: cannot start {argv[0]}: {exc.strerror or exc}\n".encode())
            return 127
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                started = await starting
                await _stop(started, None, exited=False, pipe=_output_pipe(started.pid))
            raise
        pipe = _output_pipe(process.pid)
        _feed(process, stdin_text.encode())
        reader = asyncio.create_task(_read(process, capture))
        exited = False
        try:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    code = await process.wait()
                exited = True
                return code
            except TimeoutError:
                return None
        finally:
            await _stop(process, reader, exited=exited, pipe=pipe)


async def _stop(
    process: asyncio.subprocess.Process,
    reader: asyncio.Task[None] | None,
    *,
    exited: bool,
    pipe: str | None,
) -> None:
    """Kill the worker's process group, then wait (bounded) for its output to end and
    for it to be reaped.

    A process that still holds the output pipe a moment later escaped the group: one
    that called setsid, or bwrap's sandbox child when its monitor was killed before
    the child had armed --die-with-parent (bwrap does not close that window).  Every
    process holding the pipe is the worker's, so each is killed too.
    """
    _kill_group(process)
    waiting: set[asyncio.Future[Any]] = set() if reader is None else {reader}
    if not exited:
        waiting.add(asyncio.ensure_future(process.wait()))
    waiting = {task for task in waiting if not task.done()}
    if not waiting:
        return
    try:
        _, pending = await asyncio.wait(waiting, timeout=_ESCAPES_AFTER)
        if pending and pipe is not None:
            await asyncio.to_thread(_kill_holders, pipe)
            await asyncio.wait(pending, timeout=_DRAIN_AFTER_KILL)
    finally:
        for task in waiting:
            task.cancel()


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


def _kill_holders(pipe: str) -> None:
    """SIGKILL every other process that has ``pipe`` open."""
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != me and _holds(entry.path, pipe):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


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
