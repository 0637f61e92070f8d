"""One attempt's sandbox on an SSH host: ``transport.Sandbox`` spoken to the agent on
one channel in its wire format (``wire``).

Writes and round trips are what a remote unit costs, so commands that need no answer
are not waited for: ``open``, the staged tar (all of a small one, the last chunk of a
large one) and the first step go out in one write, and only the step's answer is read
(an ``error`` from ``open`` arrives there); the control file comes back with the
step's answer.  The attempt's last step, when nothing is collected after it, closes
the sandbox too (its answer says it is gone): nothing is asked of a sandbox after
that step but the control file.  A no-op attempt is one round trip.
Any command whose answer did not arrive whole (a lost channel, a cancellation, a
deadline) leaves the channel in an unknown state: the sandbox is then left by retiring
the agent (its lifeline cut: it kills everything and removes the sandbox itself),
never by talking to it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import asyncssh

from ...attempt.capture import OutputCapture
from ...attempt.collecting import Entry
from ...attempt.model import LAYOUT
from ...attempt.sandbox import Command, Lost, StagedFile
from ...isolation.place import Containment, Place
from . import wire
from .agent import Agent
from .failures import describe

if TYPE_CHECKING:
    from .pool import HostPool, HostState


class SshSandbox:
    """``$root/fanout-$TOKEN`` on one host, through one agent."""

    def __init__(
        self,
        pool: HostPool,
        state: HostState,
        agent: Agent,
        token: str,
        place: Place,
        *,
        steps: int,
        collects: bool,
    ) -> None:
        self.place = place
        self._pool = pool
        self._state = state
        self._agent = agent
        # What goes out with the next write: ``open`` first, the staged tar after it.
        self._pending = wire.open_sandbox(token, LAYOUT.directories)
        self._opened = False  # something was written: there is a sandbox to close
        self._unsure = False  # a command's answer did not arrive whole
        # The control file as the last step left it, once read along with its answer.
        self._control: tuple[bytes | None] | None = None
        # The steps still to run (the driver runs them in order, stopping at a failed
        # gate); the last one closes the sandbox when nothing is collected after it.
        self._steps = steps
        self._collects = collects
        self._closed = False  # the sandbox is gone: its agent is the next attempt's

    # The Sandbox protocol -------------------------------------------------------

    async def stage(self, files: Sequence[StagedFile]) -> None:
        """The staged tar, streamed as the files are read.  Nothing is written here for
        a tar of one chunk: it goes out with the first step, with ``open``, in one
        write; a larger one keeps only its last chunk for that write."""
        if not files:
            return
        # OSError (a file gone, unreadable, changed): nothing is on its way yet.
        tar, chunks, first = await asyncio.to_thread(_begin, files)
        self._unsure = True
        self._pending += f"put {tar.size}\n".encode() + first
        sent = len(first)
        while sent < tar.size:
            chunk = await asyncio.to_thread(next, chunks)  # OSError: a changed file
            async with self._talking():
                await self._send(b"")
            self._pending += chunk
            sent += len(chunk)
        self._unsure = False

    async def run(self, command: Command, capture: OutputCapture, *, backstop: float) -> int:
        """The step on the host; its output comes on stderr up to an end mark only this
        call knows.  Cancelled (fanout's deadline, Ctrl-C), it retires the agent, which
        kills the step, and returns when the host has cleaned up (bounded)."""
        self._still_open()
        mark = secrets.token_hex(8)
        self._steps -= 1
        last = self._steps <= 0 and not self._collects
        try:
            message = wire.run(
                command,
                backstop=math.ceil(backstop),
                mark=mark,
                then=(LAYOUT.control_limit, LAYOUT.control),
                ending=_ENDING[self.place.containment] if last else None,
            )
        except ValueError as exc:
            capture.feed(f"fanout: {exc}\n".encode())
            return 126
        process = self._agent.process
        self._unsure = True
        pump = asyncio.create_task(wire.read_output(process.stderr, mark, capture))
        try:
            async with self._talking():
                await self._send(message)
                code = await wire.status(process.stdout)
                await pump  # the end mark was printed before the answer
                # The control file, read along with the answer: ``attempt`` reads it
                # after the last step, and nothing runs in between.
                self._control = (await wire.data(process.stdout),)
                if last:
                    left = await wire.done(process.stdout)
                    self._closed = True
                    if left is not None:
                        self._pool.unremovable(self._state, left)
        except asyncio.CancelledError:
            await asyncio.shield(self._pool.retire(self._agent))
            raise
        finally:
            if not pump.done():
                pump.cancel()
                await asyncio.wait([pump])
        self._unsure = False
        return code

    async def read(self, name: str) -> bytes | None:
        if self._unsure or self._agent.retired:
            return None  # after a deadline: the agent took the sandbox down
        if name == LAYOUT.control and self._control is not None:
            return self._control[0]
        if self._closed:
            return None
        self._unsure = True
        async with self._talking():
            await self._send(wire.cat(name, LAYOUT.control_limit))
            data = await wire.data(self._agent.process.stdout)
        self._unsure = False
        return data

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        self._still_open()
        self._unsure = True
        async with self._talking():
            await self._send(wire.listing(roots))
            found = await wire.entries(self._agent.process.stdout)
        self._unsure = False
        return found  # in the host's order: ``Collect.select`` decides the order

    async def fetch(self, names: Sequence[str], destination: Path) -> None:
        self._still_open()
        # Spooled to a file beside the collected files, never held in memory whole.
        with tempfile.TemporaryFile(dir=destination, prefix=".fetch-") as spool:
            self._unsure = True
            async with self._talking():
                await self._send(wire.get(names))
                await wire.data_to(self._agent.process.stdout, spool)
            self._unsure = False
            spool.seek(0)
            await asyncio.to_thread(wire.extract, spool, names, destination)

    def _still_open(self) -> None:
        if self._closed:  # a driver that ran more than its attempt's steps
            closed = f"{self._state.name}: the sandbox closed with the attempt's last step"
            raise Lost(closed, host=self._state.name)

    # Leaving --------------------------------------------------------------------

    async def leave(self, clean: bool) -> None:
        """Back to idle after a ``close`` the agent confirmed; otherwise the agent is
        retired and its teardown awaited (bounded).  Never raises, but for a
        cancellation while it waits."""
        agent = self._agent
        if clean and not self._unsure and agent.usable():
            if not self._opened or self._closed:
                # Nothing reached the host, or the last step's answer said it is gone.
                self._pool.idle(self._state, agent)
                return
            try:
                await self._send(wire.close(_ENDING[self.place.containment]))
                left = await wire.done(agent.process.stdout)
            except (Lost, wire.Closed, wire.Refused, OSError, asyncssh.Error, EOFError):
                pass
            else:
                if left is not None:
                    self._pool.unremovable(self._state, left)
                self._pool.idle(self._state, agent)
                return
            if not agent.connection_alive():
                await self._pool.lost(self._state, "the connection closed")
        await asyncio.shield(self._pool.retire(agent))

    # The channel ----------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        """``data`` after what is pending, in one write."""
        if self._pending:
            data, self._pending = self._pending + data, b""
        self._opened = True
        stdin = self._agent.process.stdin
        try:
            stdin.write(data)
            await stdin.drain()
        except (OSError, asyncssh.Error) as exc:
            raise Lost(describe(exc)) from None

    @contextlib.asynccontextmanager
    async def _talking(self) -> AsyncIterator[None]:
        """The agent's failures as ``transport.Lost``, the host's bookkeeping done."""
        agent, state = self._agent, self._state
        try:
            yield
        except wire.Refused as exc:
            await self._pool.quarantine(state, f"{state.name}: {exc}")
            raise Lost(f"{state.name} cannot run units: {exc}", host=state.name) from None
        except (Lost, wire.Closed, OSError, asyncssh.Error, EOFError) as exc:
            if isinstance(exc, wire.Closed | EOFError):
                reason = (
                    "the channel closed during the unit"
                    f" (agent exit status {agent.process.exit_status})"
                )
            else:
                reason = str(exc) if isinstance(exc, Lost) else describe(exc)
            if agent.connection_alive():
                # An agent that could not open the sandbox said why and exited, maybe
                # while the staged tar was still on its way.
                refusal = await _refusal(agent)
                if refusal is not None:
                    await self._pool.quarantine(state, f"{state.name}: {refusal}")
                    refused = f"{state.name} cannot run units: {refusal}"
                    raise Lost(refused, host=state.name) from None
                stopped = f"the agent on {state.name} stopped: {reason}"
                raise Lost(stopped, host=state.name) from None
            await self._pool.lost(state, reason)
            raise Lost(f"lost {state.name}: {reason}", host=state.name) from None


# What a step's end leaves to wait for (``wire.close``): a PID namespace that unshare
# ended is empty when unshare returns; bwrap returns on its init's word, maybe before
# the kernel has emptied it; a process group holds nothing a setsid'd process left.
_ENDING: dict[Containment, wire.Ending] = {
    Containment.GROUP: "sweep",
    Containment.BWRAP: "settle",
    Containment.UNSHARE: "ended",
    Containment.PODMAN: "settle",  # not on SSH hosts
}


def _begin(files: Sequence[StagedFile]) -> tuple[wire.StagedTar, Iterator[bytes], bytes]:
    """The staged tar and its first chunk, in one trip to a thread."""
    tar = wire.StagedTar(files)
    chunks = tar.chunks()
    return tar, chunks, next(chunks)


# How long a stopped agent's last words may take to arrive.
_LAST_WORDS = 2.0


async def _refusal(agent: Agent) -> str | None:
    """The ``error`` an agent said before its channel closed, if it said one."""
    try:
        async with asyncio.timeout(_LAST_WORDS):
            while line := await agent.process.stdout.readline():
                words = line.decode(errors="replace").split()
                if words[:1] == ["error"]:
                    return " ".join(words[1:])
    except (TimeoutError, OSError, asyncssh.Error, EOFError):
        pass
    return None
