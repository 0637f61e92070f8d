"""One step of a local attempt as a child of fanout: spawned in a process group of its
own with a protocol that reports the moment it exits (not when its output pipe closes: a
daemon may hold the pipe forever), fed its prompt, read into the attempt's capture, and
stopped so that nothing it started is left behind (``Step.stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..attempt.capture import OutputCapture
from ..isolation import escapees
from ..isolation import tools as sandbox

# How long a finished or killed step's output may stay open before fanout looks for
# escapees holding it, and how long after that it waits before giving up on it.
_DRAIN_AFTER_KILL = 2.0


class Exits(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, plus a future set the moment the process exits."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=1 << 16, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def spawn(
    command: Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    preexec: Callable[[], None] | None,
    pass_fds: Sequence[int] = (),
) -> tuple[asyncio.subprocess.Process, Exits, asyncio.SubprocessTransport]:
    """``asyncio.create_subprocess_exec`` with a protocol that reports the exit."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: Exits(loop),
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
        preexec_fn=preexec,
        pass_fds=tuple(pass_fds),
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol, transport


class SandboxInit:
    """The first process of a bwrap sandbox's PID namespace, as bwrap's
    ``--json-status-fd`` names it (``child-pid``), held by a pidfd.

    bwrap returns as soon as the step's own process exits, before its init (which then
    dies with it, taking the namespace down): a daemon the step left runs on for that
    moment, after fanout has seen the step end.  ``gone`` waits for the init's exit,
    which comes after the kernel has killed everything else in the namespace."""

    def __init__(self, status: int) -> None:
        self._status = status  # the read end of bwrap's status pipe, non-blocking
        self._buffer = b""
        self._pidfd: int | None = None
        os.set_blocking(status, False)
        asyncio.get_running_loop().add_reader(status, self._read)

    def _read(self) -> None:
        try:
            chunk = os.read(self._status, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self._buffer += chunk
        while self._pidfd is None and b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                pid = json.loads(line).get("child-pid")
                if isinstance(pid, int):
                    with contextlib.suppress(OSError):  # gone already
                        self._pidfd = os.pidfd_open(pid)
        if not chunk:
            self._close_status()
        elif self._pidfd is not None:
            # Open until the step has ended: bwrap writes its exit code here last, and a
            # closed pipe would kill it with SIGPIPE instead.
            asyncio.get_running_loop().remove_reader(self._status)

    def _close_status(self) -> None:
        if self._status >= 0:
            asyncio.get_running_loop().remove_reader(self._status)
            os.close(self._status)
            self._status = -1

    async def gone(self, within: float) -> None:
        """Wait (at most ``within`` seconds) until the init has exited, then release it."""
        self._close_status()
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is None:
            return
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(pidfd, readable)
        try:
            await asyncio.wait_for(exited, within)
        except TimeoutError:
            pass  # the search for escapees after the drain has the last word
        finally:
            loop.remove_reader(pidfd)
            os.close(pidfd)


class Step:
    """One running step: its process, and what ``stop`` needs to leave nothing behind."""

    process: asyncio.subprocess.Process
    exits: Exits
    transport: asyncio.SubprocessTransport
    pipe: str | None = None
    init: SandboxInit | None = None  # a bwrap step's namespace init

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

        A step in unshare's namespace that is killed (a timeout, a cancellation) takes
        its namespace down with it, but a moment after: the kernel empties the namespace
        when its init dies, which is after unshare (its parent, the process fanout
        watches) has already been reaped.  So fanout searches until nothing of the step
        is found, as a run does for a dead run's sandboxes (``local.clear``), and
        ``run`` returns with nothing left (the conformance suite's escaped daemon, seen
        once in five full runs).  A step that exited had its namespace emptied before
        unshare returned.
        """
        live = self.process.returncode is None
        kill_group(self.process)
        search = functools.partial(escapees.kill, [str(self.directory)], pipe=self.pipe)
        waiting: set[asyncio.Future[Any]] = set() if reader is None else {reader}
        waiting.add(asyncio.shield(self.exits.exited))
        waiting = {task for task in waiting if not task.done()}
        try:
            if not self.namespaced:
                await asyncio.to_thread(search)
            elif self.init is not None:
                await self.init.gone(_DRAIN_AFTER_KILL)
            elif live:
                until = time.monotonic() + _DRAIN_AFTER_KILL
                await asyncio.to_thread(
                    escapees.kill_until_gone, [str(self.directory)], self.pipe, until
                )
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


def feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """Hand the prompt to the pipe and close it.  The transport writes what the pipe does
    not take at once as the worker reads, and gives up quietly if the worker exits
    without reading: no task, no drain."""
    assert process.stdin is not None
    if data:
        process.stdin.write(data)
    process.stdin.close()


async def read(process: asyncio.subprocess.Process, capture: OutputCapture) -> None:
    assert process.stdout is not None
    while chunk := await process.stdout.read(65536):
        capture.feed(chunk)


def output_pipe(pid: int) -> str | None:
    """The worker's output pipe as /proc names it (``pipe:[inode]``), None if gone."""
    try:
        return os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None


def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the worker's process group, leader gone or not (an empty group is fine)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
