"""The Ray transport on the coordinator: ``transport.Sandboxes`` on a Ray cluster.

Each running unit holds one Ray actor (``rayapi.SandboxActor``) asked for the job's
resources (``runtime.ray``: cpus, custom resources, node labels, and ``task.memory`` as
Ray's ``memory``), so Ray (and its autoscaler, which sees pending actors as demand)
decides where units run, while fanout's own dispatcher still decides when each one
starts (at most ``maxConcurrentTasks`` actors exist at once).  The actor makes a local
sandbox on its node (``node``) and serves the attempt's commands as
``attempt.execute`` drives them, in as few calls as the attempt allows: a new actor's
first call asks its node's facts (``Opened``: the place every sandbox of it gets, but
for its directory); then each step is one call, the first one making the sandbox at a
name chosen here (so the coordinator knows its place without asking) with the staged
files, and the final one (``driver.last_look``) removing it before it answers, the
control file in its answer.  A no-op unit on a warm actor is one call.  A step that
runs past the node's window (or prints a chunk) streams the rest of its output (a Ray
generator; the coordinator's capture redacts it and caps the log).  Collecting files
adds the listing, the files back a piece at a time, and the removal.  An actor serves
one attempt at a time, attempt after attempt, like an SSH agent per slot: a Ray worker
process costs about a second to start.  An attempt takes the first actor free (one
another attempt left, or a new one once it is in), never waiting on its own actor's
start while another is free (``_open``).

Leaving the sandbox: cleanly, the sandbox is gone (or the actor removes it) and the
actor waits ``IDLE_KEEP`` for the next attempt (then it is killed, freeing its node);
after a cancellation or deadline (or anything unsure), the actor is killed with force
at once (``ray.kill``: its process exits and every step dies with it by the
parent-death signal) and a task pinned to its node removes the directory, awaited
(bounded), so a unit's next rung or a resumed run never starts beside its leftovers.
A node, worker or actor Ray reports gone makes the attempt ``lost``: it runs again
elsewhere, no rung used; its actor is killed, so nothing of it can report late.  (An
idle actor whose node died while it waited is found so by the attempt's first call:
that attempt is lost too, before anything of it ran.)
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import stat
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, BinaryIO, Literal

from ... import __version__
from ...attempt import collecting
from ...attempt.capture import OutputCapture
from ...attempt.collecting import Entry
from ...attempt.driver import execute, last_look
from ...attempt.model import LAYOUT, Attempt
from ...attempt.sandbox import Command, Lost, Sandbox, StagedFile
from ...errors import EnvironmentProblem, HostsUnavailable
from ...isolation.exposure import NOTHING, Handed
from ...isolation.place import Place
from ...outcome import AttemptResult
from .facts import Gone, NodeReport, Opened, Opening, Piece, sandbox_name

if TYPE_CHECKING:
    from ...spec import Ray
    from .rayapi import Actor

EXTRA = "pip install 'fanout[ray]'"
# How long leaving a sandbox may take (the node's clean-up included) before fanout
# stops waiting: a node that stopped answering must not hold the run.
LEAVE_TIMEOUT = 20.0
# How long an actor left idle by a finished attempt waits for the next one before it
# is killed: long enough to bridge the dispatcher's next start, short enough that the
# tail of a run frees its nodes for an autoscaler to remove.
IDLE_KEEP = 5.0
# Staged files go to the node in pieces of at most this many bytes, sent in batches of
# about this many (one call each).
STAGE_BATCH = 8 << 20


def load() -> ModuleType:
    """``rayapi`` (which imports ray), or EnvironmentProblem naming the extra."""
    try:
        from . import rayapi
    except ImportError as exc:
        if exc.name == "ray":
            raise EnvironmentProblem(
                f"runtime.ray needs Ray, which is not installed here: {EXTRA}"
            ) from None
        raise EnvironmentProblem(f"runtime.ray needs Ray, which fails to import: {exc}") from None
    return rayapi


class RayTransport:
    """Attempts on a Ray cluster, ``slots`` at once."""

    def __init__(
        self,
        ray: Ray,
        *,
        slots: int,
        sandbox_kind: str = "auto",
        hidden: Sequence[Path] = (),
        network: bool | Literal["apis"] = False,
        gateway_port: int | None = None,
        # Bytes: the most memory an attempt is allocated (task.memory or a rung's), which
        # a node must offer for ``start`` to find the cluster fit; each actor asks Ray
        # for its own attempt's (``Invocation.memory``).
        memory: int | None = None,
        notice: Callable[[str], None] = lambda message: None,
        emit: Callable[..., None] | None = None,
        handed: Handed = NOTHING,
    ) -> None:
        self._ray = ray
        self._slots = slots
        self._requested = sandbox_kind
        # What workers get that a node's sandboxes must hide from its other units: then
        # auto means bwrap, and a node without it is refused like one under "bwrap".
        self._handed = handed
        self._kind = "bwrap" if sandbox_kind == "auto" and handed else sandbox_kind
        self._hidden = tuple(str(path) for path in hidden)
        self._network = network
        self._gateway = (
            None if gateway_port is None else f"http://{_url_host(ray.gateway_host)}:{gateway_port}"
        )
        self._memory = memory
        self._notice = notice
        self._emit = emit
        self._api: ModuleType | None = None
        self._joined = False  # this transport holds one of the process's connections
        self._warned: set[str] = set()
        # Actors a clean attempt left, waiting for the next one (the last one first),
        # with the memory Ray gave each (an attempt takes one that has its own).
        self._idle: list[tuple[Actor, int | None, Opened, asyncio.TimerHandle]] = []
        # Attempts waiting for an actor (first come, first served), and the actors on
        # their way (placed by Ray, their worker process starting), each with its memory.
        self._waiting: list[tuple[int | None, asyncio.Future[tuple[Actor, Opened]]]] = []
        self._starting: list[tuple[int | None, asyncio.Task[None]]] = []

    @property
    def capacity(self) -> int:
        return self._slots

    def _rayapi(self) -> ModuleType:
        if self._api is None:
            self._api = load()
        return self._api

    async def start(self) -> None:
        """Join the cluster and check its nodes: fanout's version on each (a mismatch
        refuses the run), whether any node can hold a unit's resources (if none can,
        units wait for the autoscaler: said once), and that the nodes reach the gateway."""
        api = self._rayapi()
        await self._connect(api)
        reports = await self.probe_all()
        alive = [r for r in reports if r.alive]
        if not alive:
            raise HostsUnavailable(f"the Ray cluster at {self._ray.address} has no live node")
        wrong = [r for r in alive if r.version and r.version != __version__]
        if wrong:
            raise EnvironmentProblem(_mismatch(wrong[0].node, wrong[0].version))
        if self._kind == "bwrap":
            plain = [r.node for r in alive if r.version and not r.bwrap]
            if plain and len(plain) == len(alive) and self._requested == "auto":
                raise EnvironmentProblem(
                    self._handed.refusal(
                        f"no node of the Ray cluster has a working bwrap ({', '.join(plain)}):"
                        " its units would run in plain directories",
                        "install bubblewrap on the nodes",
                    )
                )
            if plain and len(plain) == len(alive):
                raise EnvironmentProblem(
                    f"runtime.sandbox is 'bwrap' but no node of the Ray cluster has a"
                    f" working bwrap ({', '.join(plain)})"
                )
            for name in plain:
                self._notice(
                    f"node {name} has no working bwrap: units Ray places there are lost"
                    " and run again"
                )
        unprobed = [r for r in alive if r.problem]
        for report in unprobed:
            self._notice(f"node {report.node}: {report.problem}")
        if not any(self._fits(r) for r in alive):
            self._notice(
                f"no node of the Ray cluster offers what a unit asks for ({self._asks()}):"
                " units wait until one joins (an autoscaler adds it)"
            )
        if self._gateway is not None:
            await self._check_gateway(api, alive)

    async def _connect(self, api: ModuleType) -> None:
        if self._joined:
            return
        try:
            await asyncio.to_thread(api.connect, self._ray.address)
        except Exception as exc:  # ray.init raises ConnectionError, RuntimeError, ValueError
            said = _line(exc)
            if "Could not find any running Ray instance" in said:
                # Ray's words name its own CLI's --address flag, which fanout has not.
                said = (
                    "no Ray cluster runs on this machine: start one (`ray start --head`) or"
                    " set runtime.ray.address to its head's HOST:PORT"
                )
            raise EnvironmentProblem(
                f"cannot join the Ray cluster at {self._ray.address}: {said}"
            ) from None
        self._joined = True

    def _fits(self, report: NodeReport) -> bool:
        asks = {"CPU": self._ray.cpus, **self._ray.resources}
        if self._memory is not None:
            asks["memory"] = self._memory
        has = report.resources
        if any(has.get(name, 0.0) < amount for name, amount in asks.items() if amount):
            return False
        return all(report.labels.get(k) == v for k, v in self._ray.labels.items())

    def _asks(self) -> str:
        asks = [f"cpus = {self._ray.cpus:g}"]
        asks += [f"{name} = {amount:g}" for name, amount in self._ray.resources.items()]
        if self._memory is not None:
            asks.append(f"memory = {self._memory / (1 << 30):g} GiB")
        asks += [f"label {k} = {v}" for k, v in self._ray.labels.items()]
        return ", ".join(asks)

    async def _check_gateway(self, api: ModuleType, alive: Sequence[NodeReport]) -> None:
        """A gateway on loopback serves nodes on this machine only: refuse a cluster
        with others rather than let their workers fail on a refused connection."""
        if not _loopback(self._ray.gateway_host):
            return
        here = await asyncio.to_thread(api.driver_address)
        away = [r for r in alive if r.address != here and not _loopback(r.address)]
        if away:
            raise EnvironmentProblem(
                f"node {away[0].node} is not on this machine and the API gateway listens on"
                f" {self._ray.gateway_host}: set runtime.ray.gatewayHost to an address of"
                " this machine the nodes reach"
            )

    async def close(self) -> None:
        starting = [task for _, task in self._starting]
        for task in starting:
            task.cancel()  # its actor is killed
        await asyncio.gather(*starting, return_exceptions=True)
        for actor, _, _, timer in self._idle:
            timer.cancel()
            actor.kill()
        self._idle = []
        if self._api is not None and self._joined:
            self._joined = False
            await asyncio.to_thread(self._api.disconnect)

    async def probe_all(self) -> list[NodeReport]:
        """Every node of the cluster, each live one probed by a task pinned to it
        (fanout's version there, bwrap, containment): ``fanout hosts check``."""
        api = self._rayapi()
        await self._connect(api)
        reports: list[NodeReport] = await asyncio.to_thread(api.nodes)

        async def probe(report: NodeReport) -> NodeReport:
            if not report.alive:
                return report
            try:
                async with asyncio.timeout(60):
                    version, bwrap, containment = await api.facts(report.node_id)
            except (Gone, TimeoutError) as exc:
                why = str(exc) or "the probe got no answer in 60 s"
                return replace(report, problem=f"cannot run fanout there: {why}")
            problem = "" if version == __version__ else _mismatch(report.node, version)
            return replace(
                report, version=version, bwrap=bwrap, containment=containment, problem=problem
            )

        return list(await asyncio.gather(*(probe(r) for r in reports)))

    async def run(self, attempt: Attempt) -> AttemptResult:
        return await execute(attempt, self)

    @contextlib.asynccontextmanager
    async def sandbox(self, attempt: Attempt) -> AsyncIterator[Sandbox]:
        """A sandbox in an idle actor (the last one left), or in the first one free
        (``_open``).  The sandbox is made by the attempt's first call, at a name chosen
        here, so a warm actor's attempt costs no call before its first step; its final
        step removes it (``driver.last_look``), so leaving cleanly costs none after.
        Left cleanly, the actor waits (``IDLE_KEEP``) for the next attempt; otherwise
        it is killed and its node cleaned."""
        memory = attempt.invocation.memory
        actor, opened = await self._open(memory)
        if self._emit is not None:
            self._emit(
                "attempt.placed",
                round=attempt.round,
                unit=attempt.unit_id,
                attempt=attempt.number,
                host=opened.node,
            )
        assert opened.place is not None
        token = os.urandom(6).hex()
        base = f"{opened.place.base}/{sandbox_name(opened.pid, token)}"
        place = replace(opened.place, base=base, gateway=self._gateway)
        box = RaySandbox(
            actor, opened, place, token=token, final=last_look(attempt), warn=self._warn
        )
        clean = False
        try:
            yield box
            clean = True
        finally:
            reusable = box.removed and not box.killed
            if not reusable:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(LEAVE_TIMEOUT):
                        reusable = await asyncio.shield(box.leave(clean))
            if reusable:
                self._hand(actor, memory, opened)
            else:
                actor.kill()

    async def _open(self, memory: int | None) -> tuple[Actor, Opened]:
        """An actor with ``memory`` (bytes) from Ray: an idle one (no call), or the first
        one free, whichever that is: an actor another attempt leaves cleanly, or a new
        one once its node's facts are in (one call).  A new actor is asked for only when
        no start already on its way is spare, so a run holds at most one actor per slot
        (and the idle); an attempt never waits on its own actor's start while another
        actor sits free.  An idle actor found gone by the attempt's first call makes
        the attempt lost (it runs again, no rung used)."""
        match = [n for n, (_, held, _, _) in enumerate(self._idle) if held == memory]
        if match:
            actor, _, opened, timer = self._idle.pop(match[-1])
            timer.cancel()
            return actor, opened
        if self._count(self._starting, memory) <= self._count(self._waiting, memory):
            self._starting.append((memory, asyncio.ensure_future(self._start(memory))))
        wanted: asyncio.Future[tuple[Actor, Opened]] = asyncio.get_running_loop().create_future()
        entry = (memory, wanted)
        self._waiting.append(entry)
        try:
            return await wanted
        except asyncio.CancelledError:
            if entry in self._waiting:
                self._waiting.remove(entry)
            elif wanted.done() and not wanted.cancelled() and wanted.exception() is None:
                actor, opened = wanted.result()
                self._hand(actor, memory, opened)
            self._trim(memory)
            raise

    @staticmethod
    def _count(entries: Sequence[tuple[int | None, object]], memory: int | None) -> int:
        return sum(1 for held, _ in entries if held == memory)

    def _trim(self, memory: int | None) -> None:
        """Starts no attempt waits for any more (a waiting one was cancelled): stopped,
        the newest first, their actors killed (Ray may still be placing them)."""
        while self._count(self._starting, memory) > self._count(self._waiting, memory):
            entry = next(e for e in reversed(self._starting) if e[0] == memory)
            self._starting.remove(entry)
            entry[1].cancel()

    async def _start(self, memory: int | None) -> None:
        """A new actor with ``memory``, asked for its node's facts, then handed to the
        first attempt waiting for one (or left idle).  If it cannot start, and fewer
        starts are left on the way than attempts waiting, the last of those fails with
        why (the attempt is lost: it runs again, no rung used)."""
        opening = Opening(
            version=__version__,
            sandbox=self._kind,
            root=self._ray.sandbox_root,
            hidden=self._hidden,
            network=self._network,
        )
        this = asyncio.current_task()
        actor: Actor | None = None
        try:
            try:
                api = self._rayapi()
                actor = api.Actor(
                    api.Placement(
                        cpus=self._ray.cpus,
                        resources=self._ray.resources,
                        labels=self._ray.labels,
                        memory=memory,
                    )
                )
                opened = await actor.open(opening)
            finally:
                self._starting = [e for e in self._starting if e[1] is not this]
        except Gone as exc:
            assert actor is not None  # only its open says Gone
            actor.kill()
            self._short(
                memory, Lost(f"lost the unit's Ray actor before it started: {exc}", host="ray")
            )
            return
        except asyncio.CancelledError:  # the run ends, or no attempt waits for it
            if actor is not None:
                actor.kill()
            raise
        except Exception as exc:  # what else Ray raises: the waiting attempt's error
            if actor is not None:
                actor.kill()
            self._short(memory, exc)
            return
        if opened.place is None:
            actor.kill()
            self._short(memory, HostsUnavailable(_mismatch(opened.node, opened.version)))
            return
        for warning in opened.warnings:
            self._warn(opened.node, warning)
        self._hand(actor, memory, opened)

    def _short(self, memory: int | None, error: BaseException) -> None:
        """A start failed with ``error``: the last attempt waiting with ``memory`` gets
        it, if fewer starts are on their way than attempts waiting."""
        waiting = [e for e in self._waiting if e[0] == memory and not e[1].done()]
        if len(waiting) > self._count(self._starting, memory):
            self._waiting.remove(waiting[-1])
            waiting[-1][1].set_exception(error)

    def _hand(self, actor: Actor, memory: int | None, opened: Opened) -> None:
        """A free actor (new, or left cleanly): to the first attempt waiting for one with
        its memory, else idle (``_keep``)."""
        for entry in self._waiting:
            # A done one: its attempt was cancelled and has yet to take itself off.
            if entry[0] == memory and not entry[1].done():
                self._waiting.remove(entry)
                entry[1].set_result((actor, opened))
                return
        self._keep(actor, memory, opened)

    def _keep(self, actor: Actor, memory: int | None, opened: Opened) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(IDLE_KEEP, self._retire, actor)
        self._idle.append((actor, memory, opened, timer))

    def _warn(self, node: str, warning: str) -> None:
        """What a node said, once per run."""
        if warning not in self._warned:
            self._warned.add(warning)
            self._notice(f"node {node}: {warning}")

    def _retire(self, actor: Actor) -> None:
        """An actor idle for ``IDLE_KEEP``: killed, so its node's resources are free
        (and an autoscaler can remove the node)."""
        self._idle = [entry for entry in self._idle if entry[0] is not actor]
        actor.kill()


class RaySandbox:
    """One attempt's sandbox, through its actor (see ``transport.Sandbox``).  The
    staged files and the making of the sandbox ride with the first step's call, the
    control file and (for the final step) the removal with its answer."""

    def __init__(
        self,
        actor: Actor,
        opened: Opened,
        place: Place,
        *,
        token: str,
        final: int | None,
        warn: Callable[[str, str], None],
    ) -> None:
        self.place = place
        self._actor = actor
        self._opened = opened
        self._token = token  # the sandbox's name on the node (``node.sandbox_name``)
        self._final = final  # the step (index) whose end removes the sandbox
        self._steps = 0  # the steps run so far
        self._warn = warn  # (node, what happened there)
        # Staged pieces not sent yet: they go with the first step.
        self._pieces: list[Piece] = []
        # A command's answer did not arrive whole (a cancellation, a deadline, a lost
        # actor): the actor is killed, and the node's clean-up removes the directory.
        self.killed = False
        # The final step's end removed the sandbox: nothing is left to leave.
        self.removed = False
        # The control file as the last step left it, which came with its answer.
        self._control: tuple[bytes | None] | None = None

    @contextlib.contextmanager
    def _calling(self) -> Iterator[None]:
        """Around each call to the actor: the node gone makes the attempt lost, and a
        cancellation (a deadline, Ctrl-C) kills the actor with force at once (the
        node's clean-up is awaited when the sandbox is left)."""
        try:
            yield
        except Gone as exc:
            self._kill()
            raise Lost(f"lost node {self._opened.node}: {exc}", host=self._opened.node) from None
        except asyncio.CancelledError:
            self._kill()
            raise

    def _kill(self) -> None:
        if not self.killed:
            self.killed = True
            self._actor.kill()

    async def stage(self, files: Sequence[StagedFile]) -> None:
        """Each file in pieces of at most ``STAGE_BATCH`` bytes, sent in batches of
        about that size, the last batch with the first step: the coordinator never
        holds more of a workspace in memory."""
        batch: list[Piece] = []
        size = 0
        for item in files:
            # OSError: a workspace file gone or unreadable (the unit fails, as locally).
            stream, mode = await asyncio.to_thread(_open, item.source)
            with stream:
                first = True
                while True:
                    data = await asyncio.to_thread(stream.read, STAGE_BATCH - size)
                    if data or first:
                        batch.append((item.path, mode, first, data))
                        size += len(data)
                        first = False
                    if size >= STAGE_BATCH:
                        await self._stage(batch)
                        batch, size = [], 0
                    if not data:
                        break
        self._pieces = batch

    async def _stage(self, batch: list[Piece]) -> None:
        with self._calling():
            await self._actor.stage(self._token, batch)

    async def run(self, command: Command, capture: OutputCapture, *, backstop: float) -> int:
        """The step on the node, its output fed to ``capture`` as it arrives: one call
        for a step that ends within the node's window, then a stream for the rest."""
        final = self._steps == self._final
        self._steps += 1
        pieces, self._pieces = self._pieces, []
        with self._calling():
            output, ended = await self._actor.step(self._token, command, backstop, pieces, final)
            if output:
                capture.feed(output)
            if ended is None:
                async with contextlib.aclosing(self._actor.follow()) as stream:
                    async for item in stream:
                        if isinstance(item, bytes):
                            capture.feed(item)
                        else:
                            ended = item
                            break
        if ended is None:
            self._kill()
            raise Lost(f"lost node {self._opened.node}: the step's end never came")
        code, control, self.removed, said = ended
        self._control = (control,)
        for warning in said:
            self._warn(self._opened.node, warning)
        return code

    async def _flush(self) -> None:
        """Staged pieces no step took (none ran): sent before the sandbox is read."""
        if self._pieces:
            pieces, self._pieces = self._pieces, []
            await self._stage(pieces)

    async def read(self, name: str) -> bytes | None:
        if self.killed:
            return None  # after a deadline: the sandbox is being removed
        if name == LAYOUT.control and self._control is not None:
            return self._control[0]
        await self._flush()
        with self._calling():
            data: bytes | None = await self._actor.read(name)
        return data

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        await self._flush()
        with self._calling():
            found: list[Entry] = await self._actor.listing(roots)
        return found

    async def fetch(self, names: Sequence[str], destination: Path) -> None:
        """Each file written as its pieces arrive, at ``collecting.target`` (which
        refuses a way out of the unit folder)."""
        current: int | None = None
        stream = None
        try:
            with self._calling():
                async for index, piece in self._actor.fetch(names):
                    if index != current:
                        current = index
                        target = collecting.target(destination, names[index])
                        stream = target.open("wb")
                    assert stream is not None
                    if piece:
                        stream.write(piece)
                    else:
                        stream.close()
                        stream = None
        finally:
            if stream is not None:
                stream.close()

    async def leave(self, clean: bool) -> bool:
        """Cleanly: the actor removes the sandbox and may serve the next attempt (True).
        Otherwise (or if that fails) it is killed at once and a task pinned to its node
        removes what is left, once the actor's process is gone.  Never raises."""
        opened = self._opened
        if clean and not self.killed:
            try:
                said = await self._actor.close()
            except Gone:
                pass
            else:
                for warning in said:
                    self._warn(opened.node, warning)
                return True
        self._kill()
        # A node that is gone, or cannot run the clean-up, keeps the directory: the
        # next attempt opened there removes it (its actor's process is gone: ``local``).
        with contextlib.suppress(Exception):
            for said in await load().remove(opened.node_id, self.place.base, opened.pid):
                self._warn(opened.node, said)
        return False


def _open(path: Path) -> tuple[BinaryIO, int]:
    stream = path.open("rb")
    return stream, stat.S_IMODE(os.fstat(stream.fileno()).st_mode)


def _mismatch(node: str, version: str) -> str:
    return (
        f"node {node} runs fanout {version or '(none)'} and this coordinator {__version__}:"
        f" install fanout=={__version__} in the nodes' image"
    )


def _line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    """``host`` as a URL's authority needs it (an IPv6 address in brackets)."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host
