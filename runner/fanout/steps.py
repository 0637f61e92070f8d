"""One step of a local attempt as a child of fanout: spawned in a process group of its
own with a protocol that reports the moment it exits (not when its output pipe closes: a
daemon may hold the pipe forever), fed its prompt, read into the attempt's capture, and
stopped so that nothing it started is left behind (``Step.stop``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import escapees, sandbox
from .capture import OutputCapture

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
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol, transport


class Step:
    """One running step: its process, and what ``stop`` needs to leave nothing behind."""

    process: asyncio.subprocess.Process
    exits: Exits
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
        kill_group(self.process)
        search = functools.partial(escapees.kill, [str(self.directory)], pipe=self.pipe)
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
