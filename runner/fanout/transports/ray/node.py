"""One attempt's sandbox on the Ray node this process runs on: the actor's side of
``transport.Sandbox``, made of the local transport's own sandbox (``local``), so a
node isolates, contains and removes a unit exactly as this machine does (bwrap where
the node has it, else a plain directory with each step in a PID namespace).

Ray runs these methods on the actor's event loop.  Every step is a child of the
actor's process behind the parent-death guard (``sandbox.guarded``), so when Ray kills
the actor (a cancelled unit, a run that ended, a lost coordinator) every step dies
with it; ``remove`` (a task Ray pins to the node) then removes what was left.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ... import __version__
from ...attempt import collecting, staging
from ...attempt.capture import OutputCapture
from ...attempt.collecting import Entry
from ...attempt.model import LAYOUT
from ...attempt.sandbox import Command, Sandbox
from ...isolation import escapees
from ...isolation import tools as sandbox
from ..local import LocalTransport, clear
from .facts import Opened, Opening, Piece, node_name

if TYPE_CHECKING:
    from ...attempt.model import Attempt

# Output goes back to the coordinator in chunks of at most this many bytes (each one a
# Ray object: fewer, larger chunks cost less), as soon as there is some.
CHUNK = 1 << 20
# What may wait on a node for the coordinator to take it (see ``Relay``).
MOST_PENDING = 16 << 20
# Files go back in pieces of this size, one at a time (never a whole file in memory).
PIECE = 4 << 20


class Relay(OutputCapture):
    """A capture that keeps what the step printed until the coordinator takes it (the
    coordinator's capture redacts, caps the log and keeps the tail).  At most ``most``
    bytes wait: a step that prints faster than a slow coordinator takes it loses the
    oldest of what waits, said on the output, rather than grow the node's memory."""

    def __init__(self, most: int = MOST_PENDING) -> None:
        super().__init__(Path(os.devnull), log_limit=0, tail_limit=0)
        self.pending = bytearray()
        self.arrived = asyncio.Event()
        self._most = most
        self._dropped = 0  # bytes dropped since the coordinator last took some

    def feed(self, data: bytes) -> None:
        self.pending += data
        excess = len(self.pending) - self._most
        if excess > 0:
            del self.pending[:excess]
            self._dropped += excess
        self.arrived.set()

    def close(self) -> None:
        return None

    def take(self) -> bytes:
        chunk = bytes(self.pending[:CHUNK])
        del self.pending[:CHUNK]
        if not self.pending:
            self.arrived.clear()
        if self._dropped:
            said = f"\n[fanout: the node dropped {self._dropped} bytes of output here: the"
            said += " coordinator had not taken them yet]\n"
            chunk, self._dropped = said.encode() + chunk, 0
        return chunk


class NodeSandbox:
    """The sandboxes an actor holds, one attempt's at a time: an actor serves attempt
    after attempt (a Ray worker process costs about a second to start), and its local
    transport (the sandbox tool chosen, the PID namespace probed) is set up once."""

    def __init__(self, node_id: str, address: str) -> None:
        self._node_id = node_id
        self._address = address
        self._stack = contextlib.AsyncExitStack()
        self._local: LocalTransport | None = None
        self._warnings: list[str] = []
        self._box: Sandbox | None = None
        self._base: Path | None = None

    async def open(self, opening: Opening) -> Opened:
        """A fresh sandbox, if this node runs the coordinator's fanout (else only the
        version, which the coordinator refuses)."""
        name = node_name(self._address, self._node_id)
        opened = Opened(version=__version__, node=name, node_id=self._node_id, pid=os.getpid())
        if opening.version != __version__:
            return opened
        if self._box is not None:  # the last attempt's, left uncleanly: never reused
            await self.close()
        if self._local is None:
            root = Path(opening.root)
            await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
            hidden = [Path(path) for path in opening.hidden] + [Path.home() / ".ssh"]
            local = LocalTransport(
                slots=1,
                sandbox_kind=opening.sandbox,
                root=root,
                path=os.environ.get("PATH", os.defpath),
                hidden=hidden,
                warn=self._warnings.append,
                network=opening.network,
            )
            await local.start()
            self._local = local
        # The local sandbox reads nothing of the attempt (every step comes with its
        # command), and the attempt, with its secrets, never leaves the coordinator.
        box = await self._stack.enter_async_context(self._local.sandbox(cast("Attempt", None)))
        self._box = box
        self._base = Path(box.place.base)
        return replace(opened, place=replace(box.place, host=name), warnings=tuple(self._warnings))

    def _sandbox(self) -> Sandbox:
        if self._box is None:
            raise RuntimeError("the sandbox is not open")
        return self._box

    async def stage(self, files: Sequence[Piece]) -> None:
        """Pieces of workspace files, in order, each file with its permission bits."""
        work = self._base_dir() / LAYOUT.work
        await asyncio.to_thread(_write, work, files)

    def _base_dir(self) -> Path:
        if self._base is None:
            raise RuntimeError("the sandbox is not open")
        return self._base

    async def run(
        self, command: Command, backstop: float
    ) -> AsyncIterator[bytes | tuple[int, bytes | None]]:
        """The step's output as it comes, then its exit status with the control file
        as the step left it (``attempt`` reads it after the last step, and nothing runs
        in between: one round trip less per unit).  ``backstop``: the
        node kills the step by itself that long after it started, should the
        coordinator stop hearing from it (Ray kills the actor when the coordinator
        dies; this covers a coordinator that is only unreachable)."""
        relay = Relay()
        box = self._sandbox()

        async def step() -> int:
            async with asyncio.timeout(backstop):
                return await box.run(command, relay, backstop=backstop)

        running = asyncio.ensure_future(step())
        try:
            while True:
                if not relay.pending and not running.done():
                    waiter = asyncio.ensure_future(relay.arrived.wait())
                    await asyncio.wait([waiter, running], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                if relay.pending:
                    yield relay.take()
                elif running.done():
                    break
            try:
                code = running.result()
            except TimeoutError:
                code = 137  # the backstop: the coordinator timed the unit out long ago
            yield code, await box.read(LAYOUT.control)
        finally:
            if not running.done():
                running.cancel()
                await asyncio.wait([running])

    async def read(self, name: str) -> bytes | None:
        return await self._sandbox().read(name)

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        return await self._sandbox().listing(roots)

    async def fetch(self, names: Sequence[str]) -> AsyncIterator[tuple[int, bytes]]:
        """The regular files ``names`` of ``work/``, each as pieces (index, bytes), an
        empty piece ending each file.  Every process of the attempt is gone and the
        names came from a listing that found no symlink on their way, so only the last
        component needs guarding (O_NOFOLLOW), as locally."""
        work = self._base_dir() / LAYOUT.work
        for index, name in enumerate(names):
            descriptor = os.open(work / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(descriptor, "rb") as source:
                if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                    raise collecting.PathRefused(f"collect: {name!r} is not a regular file")
                while piece := await asyncio.to_thread(source.read, PIECE):
                    yield index, piece
            yield index, b""

    async def close(self) -> None:
        """Remove the sandbox (its steps are over: ``run`` waits for each); the actor
        then serves the next attempt."""
        self._box = None
        self._base = None
        stack, self._stack = self._stack, contextlib.AsyncExitStack()
        await stack.aclose()


def _write(work: Path, pieces: Sequence[Piece]) -> None:
    for path, mode, first, data in pieces:
        target = work / path
        if first:
            staging.make_folders(target.parent)
        else:
            target.chmod(0o600)  # its own bits may not let it be appended to
        with target.open("wb" if first else "ab") as stream:
            stream.write(data)
        target.chmod(stat.S_IMODE(mode))


def remove(directory: str, pid: int, patience: float = 10.0) -> list[str]:
    """What a killed actor left: once its process is gone (its steps die with it, by
    the parent-death signal, a moment later), kill whatever still works in
    ``directory`` (a step that had only its process group, or one still on its way
    out) and remove it, as the next run on this machine would (``local.clear``); what
    to tell the user."""
    ends = time.monotonic() + patience
    while escapees.alive(pid) and time.monotonic() < ends:
        time.sleep(0.01)
    return clear([Path(directory)])


def facts() -> tuple[str, bool, str]:
    """This node's fanout version, whether bwrap works here, and the containment
    its sandboxes get (``fanout hosts check``)."""
    choice = sandbox.choose("auto")
    return __version__, choice.kind == "bwrap", choice.containment.value
