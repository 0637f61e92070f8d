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
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ... import __version__
from ...attempt import collecting, staging
from ...attempt.capture import OutputCapture
from ...attempt.collecting import Entry
from ...attempt.model import LAYOUT
from ...attempt.sandbox import Command, Sandbox
from ...isolation import escapees
from ...isolation import tools as sandbox
from ...isolation.place import Place
from ..local import LocalSandbox, LocalTransport, clear, lay_out, unmake
from .facts import Ended, Opened, Opening, Piece, node_name, sandbox_name

if TYPE_CHECKING:
    from ...attempt.model import Attempt

# Output goes back to the coordinator in chunks of at most this many bytes (each one a
# Ray object: fewer, larger chunks cost less), as soon as there is some.
CHUNK = 1 << 20
# What may wait on a node for the coordinator to take it (see ``Relay``).
MOST_PENDING = 16 << 20
# How long a step call waits for its step to end before it answers with what it has
# and the coordinator follows the rest as a stream (``NodeSandbox.step``): most no-op
# and short units end within it, in one call.
WINDOW = 0.5
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
        self.full = asyncio.Event()  # a chunk's worth waits
        self._most = most
        self._dropped = 0  # bytes dropped since the coordinator last took some

    def feed(self, data: bytes) -> None:
        self.pending += data
        excess = len(self.pending) - self._most
        if excess > 0:
            del self.pending[:excess]
            self._dropped += excess
        self.arrived.set()
        if len(self.pending) >= CHUNK:
            self.full.set()

    def close(self) -> None:
        return None

    def take(self) -> bytes:
        chunk = bytes(self.pending[:CHUNK])
        del self.pending[:CHUNK]
        if not self.pending:
            self.arrived.clear()
        if len(self.pending) < CHUNK:
            self.full.clear()
        if self._dropped:
            said = f"\n[fanout: the node dropped {self._dropped} bytes of output here: the"
            said += " coordinator had not taken them yet]\n"
            chunk, self._dropped = said.encode() + chunk, 0
        return chunk


class NodeSandbox:
    """The sandboxes an actor holds, one attempt's at a time: an actor serves attempt
    after attempt (a Ray worker process costs about a second to start), and its local
    transport (the sandbox tool chosen, the PID namespace probed) is set up once.

    An attempt's sandbox is made by the attempt's first call (``stage`` or ``step``) at
    the name the coordinator chose (``sandbox_name``), so the coordinator knows its
    place without a call of its own, and removed by the step the coordinator marks
    ``final`` (the last one, when nothing is to be collected) before it answers, or by
    ``close``."""

    def __init__(self, node_id: str, address: str) -> None:
        self._node_id = node_id
        self._address = address
        self._local: LocalTransport | None = None
        self._warnings: list[str] = []
        self._root: Path | None = None
        self._box: Sandbox | None = None
        self._base: Path | None = None
        self._token = ""  # the open sandbox's
        self._place: Place | None = None
        # The step running (between ``step`` and ``follow``), its output, and whether
        # the sandbox goes with its end.
        self._running: asyncio.Future[int] | None = None
        self._relay = Relay()
        self._final = False

    async def open(self, opening: Opening) -> Opened:
        """The node's facts for this actor's sandboxes (``Opened.place``, whose ``base``
        is the directory they are made in), if this node runs the coordinator's fanout
        (else only the version, which the coordinator refuses).  Once per actor."""
        name = node_name(self._address, self._node_id)
        opened = Opened(version=__version__, node=name, node_id=self._node_id, pid=os.getpid())
        if opening.version != __version__:
            return opened
        if self._local is None:
            # "auto": the node chooses as a local run does (``isolation.roots``).
            root = None if opening.root == "auto" else Path(opening.root)
            if root is not None:
                await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
            hidden = [Path(path) for path in opening.hidden] + [Path.home() / ".ssh"]
            local = LocalTransport(
                slots=1,
                sandbox_kind=opening.sandbox,
                root=root,
                sandbox_root="auto",
                path=os.environ.get("PATH", os.defpath),
                hidden=hidden,
                warn=self._warnings.append,
                network=opening.network,
            )
            await local.start()
            # One sandbox the local transport's own way, for its place: every attempt's
            # is the same but for its directory.  The local sandbox reads nothing of the
            # attempt (every step comes with its command), and the attempt, with its
            # secrets, never leaves the coordinator.
            async with local.sandbox(cast("Attempt", None)) as box:
                place = box.place
            self._local = local
            self._root = Path(place.base).parent
            self._place = replace(place, base=str(self._root))
        assert self._place is not None
        place = replace(self._place, host=name)
        return replace(opened, place=place, warnings=tuple(self._warnings))

    def _sandbox(self, token: str | None = None) -> Sandbox:
        """The attempt's sandbox; made (``token``: by the attempt's first call) if none
        is open."""
        if self._box is not None:
            if token is not None and token != self._token:
                raise RuntimeError("another attempt's sandbox is open")  # never left
            return self._box
        if token is None or self._local is None or self._root is None or self._place is None:
            raise RuntimeError("the sandbox is not open")
        if not _TOKEN.fullmatch(token):
            raise ValueError(f"not a sandbox token: {token!r}")
        base = self._root / sandbox_name(os.getpid(), token)
        os.mkdir(base, 0o700)  # as mkdtemp makes it: the unit's alone
        lay_out(base)
        place = replace(self._place, base=str(base))
        self._box = LocalSandbox(place, base, self._local.containment)
        self._base, self._token = base, token
        return self._box

    async def stage(self, token: str, files: Sequence[Piece]) -> None:
        """Pieces of workspace files, in order, each file with its permission bits."""
        self._sandbox(token)
        await asyncio.to_thread(_write, self._base_dir() / LAYOUT.work, files)

    def _base_dir(self) -> Path:
        if self._base is None:
            raise RuntimeError("the sandbox is not open")
        return self._base

    async def step(
        self,
        token: str,
        command: Command,
        backstop: float,
        files: Sequence[Piece],
        final: bool,
    ) -> tuple[bytes, Ended | None]:
        """Start a step (the sandbox made and ``files`` staged first, if this is the
        attempt's first call) and wait for it up to ``WINDOW``: what it printed, and how
        it ended if it did (a no-op unit is one call).  A step still running, or that
        printed a chunk's worth, goes on through ``follow``.  ``backstop``: the node
        kills the step by itself that long after it started, should the coordinator
        stop hearing from it (Ray kills the actor when the coordinator dies; this covers
        a coordinator that is only unreachable).  ``final``: the sandbox is removed as
        the step ends (the coordinator reads nothing else of it)."""
        box = self._sandbox(token)
        if files:
            await asyncio.to_thread(_write, self._base_dir() / LAYOUT.work, files)
        relay = self._relay = Relay()
        self._final = final

        async def step() -> int:
            async with asyncio.timeout(backstop):
                return await box.run(command, relay, backstop=backstop)

        running = self._running = asyncio.ensure_future(step())
        full: asyncio.Future[Any] = asyncio.ensure_future(relay.full.wait())
        await asyncio.wait(
            [cast("asyncio.Future[Any]", running), full],
            timeout=WINDOW,
            return_when=asyncio.FIRST_COMPLETED,
        )
        full.cancel()
        if running.done() and len(relay.pending) <= CHUNK:
            return relay.take(), await self._ended()
        return relay.take(), None

    async def follow(self) -> AsyncIterator[bytes | Ended]:
        """The rest of the running step's output as it comes, then how it ended
        (``Ended``); cancelled, it kills the step."""
        running, relay = self._running, self._relay
        if running is None:
            raise RuntimeError("no step is running")
        try:
            while True:
                if not relay.pending and not running.done():
                    waiter: asyncio.Future[Any] = asyncio.ensure_future(relay.arrived.wait())
                    await asyncio.wait(
                        [waiter, cast("asyncio.Future[Any]", running)],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    waiter.cancel()
                if relay.pending:
                    yield relay.take()
                elif running.done():
                    break
            yield await self._ended()
        finally:
            if not running.done():
                running.cancel()
                await asyncio.wait([running])

    async def _ended(self) -> Ended:
        """The step's exit status, the control file as it left it (the driver reads it
        after the last step, and nothing runs in between), and, for a final step, the
        sandbox removed (what to tell the user of that)."""
        running, self._running = self._running, None
        assert running is not None
        try:
            code = running.result()
        except TimeoutError:
            code = 137  # the backstop: the coordinator timed the unit out long ago
        control = await self._sandbox().read(LAYOUT.control)
        said: tuple[str, ...] = ()
        if self._final:
            said = tuple(await self.close())
        return code, control, self._final, said

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

    async def close(self) -> list[str]:
        """Remove the sandbox (its steps are over: ``step`` and ``follow`` wait for
        each): as made, two rmdirs; else what the worker left, killed and removed as
        locally (``local.clear``).  What to tell the user; the actor then serves the
        next attempt."""
        base, self._box, self._base = self._base, None, None
        if base is None:
            return []
        if unmake(base):
            return []
        return await asyncio.to_thread(clear, [base])


# A token the coordinator chooses for each attempt's sandbox (``sandbox_name``).
_TOKEN = re.compile(r"[0-9a-f]{12}")


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
