"""The coordinator's own commands (the input command, the aggregate command) as asyncio
subprocesses, each in a process group of its own that is killed with it.

A child is started without pipes managed by asyncio: its stdout and stderr are files or
descriptors its caller owns.  That is what makes a kill prompt: Python 3.11's
``Process.wait`` also waits for the child's pipes to close, so a daemon the command left
behind in another session, holding a pipe, would keep a waiting run waiting.  Here the
exit is known from the child watcher alone, and the caller decides when to stop reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO


class Child(asyncio.SubprocessProtocol):
    """A started command: its pid, and its exit status once it is known, both on the
    event loop (``wait``) and to a worker thread (``wait_in_thread``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Never awaited bare: a cancel of the waiting task would cancel the future, and
        # with it the record of the exit (see ``wait``).
        self._exited: asyncio.Future[int] = loop.create_future()
        self._known = threading.Event()
        self._transport: asyncio.SubprocessTransport | None = None
        self.pid = 0
        self.returncode: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._transport = transport
        self.pid = transport.get_pid()

    def process_exited(self) -> None:
        assert self._transport is not None
        returncode = self._transport.get_returncode()
        assert returncode is not None
        self.returncode = returncode
        self._exited.set_result(returncode)
        self._known.set()

    async def wait(self) -> int:
        """The exit status, once the command has exited."""
        return await asyncio.shield(self._exited)

    def kill(self) -> None:
        """SIGKILL the command's process group, unless the command has been reaped (its
        pid, and so its group's id, may then belong to another process)."""
        if self.returncode is None and self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def wait_in_thread(self) -> int | None:
        """The exit status, for a worker thread; None if ``release`` came first."""
        self._known.wait()
        return self.returncode

    def release(self) -> None:
        """Wake a worker thread waiting for the status (the caller is leaving)."""
        self._known.set()

    async def reaped(self) -> int:
        """Wait until the command has exited, then free its transport."""
        try:
            return await self.wait()
        finally:
            if self._transport is not None:
                self._transport.close()


async def start(
    argv: list[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: IO[bytes] | int,
    stdout: IO[bytes] | int,
    stderr: IO[bytes] | int,
) -> Child:
    """Start ``argv`` in a new session (so a process group of its own).  Raises OSError
    when it cannot start."""
    loop = asyncio.get_running_loop()
    _, child = await loop.subprocess_exec(
        lambda: Child(loop),
        *argv,
        cwd=cwd,
        env=dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
    )
    return child


@dataclass(frozen=True, kw_only=True, slots=True)
class Ran:
    """A command run to its end by ``ran``: its exit status (None: killed at its
    deadline), and its stdout and stderr as the files it wrote them to."""

    code: int | None
    stdout: IO[bytes]
    stderr: IO[bytes]


@contextlib.asynccontextmanager
async def ran(
    argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], stdin: bytes, deadline_s: float
) -> AsyncIterator[Ran]:
    """Run ``argv`` with ``stdin`` to its exit, or kill its group at ``deadline_s``, and
    give its output for the caller to read (how much, and what of it to keep, is the
    caller's: publishing reads git's whole listing, notify keeps an end).  Its stdin,
    stdout and stderr are temporary files, not pipes: a command that never reads its
    stdin, or a daemon it left holding a pipe, cannot keep the coordinator waiting past
    the deadline.  Raises OSError when it cannot start, and CancelledError only after
    killing its group."""
    with (
        tempfile.TemporaryFile() as given,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        given.write(stdin)
        given.seek(0)
        proc = await start(list(argv), cwd=cwd, env=env, stdin=given, stdout=stdout, stderr=stderr)
        code: int | None = None
        try:
            async with asyncio.timeout(deadline_s):
                code = await proc.wait()
        except TimeoutError:
            code = None
        finally:
            proc.kill()  # its whole group, unless it exited by itself
            await proc.reaped()  # prompt: SIGKILL
        yield Ran(code=code, stdout=stdout, stderr=stderr)
