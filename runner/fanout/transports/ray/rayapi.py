"""Ray itself: the only module that imports ray.  It connects the coordinator to the
cluster as a Ray driver, places one actor per attempt with the job's resources, talks
to it, kills it, pins the clean-up and the probes to a node, and turns Ray's errors
into fanout's (``facts.Gone`` for anything that means the actor or its node is gone).

The actor (``SandboxActor``) is this module's class, which Ray imports by name on the
node: fanout must be installed there (the same version; ``Opened.version`` says).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray
import ray.exceptions
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ...attempt.collecting import Entry, PathRefused
from ...attempt.sandbox import Command
from . import node
from .facts import Ended, Gone, NodeReport, Opened, Opening, Piece, node_name

# Ray's API through an untyped name: some of its functions have no annotations, and
# mypy must pass the same with ray installed or not (no ignores that go stale).
_untyped: Any = ray

# Errors that mean the actor, its worker process, its node or the object carrying its
# answer is gone: the attempt is lost (re-run elsewhere).  An exception of fanout's own
# code on the node (a full disk there) is too: the node could not serve the unit.
_GONE: tuple[type[BaseException], ...] = (
    ray.exceptions.RayActorError,  # ActorDiedError, ActorUnavailableError
    ray.exceptions.NodeDiedError,
    ray.exceptions.WorkerCrashedError,
    ray.exceptions.LocalRayletDiedError,
    ray.exceptions.ObjectLostError,  # OwnerDiedError among them
    ray.exceptions.RaySystemError,
    ray.exceptions.ActorUnschedulableError,
    ray.exceptions.TaskUnschedulableError,  # a task pinned to a node that died
    ray.exceptions.RuntimeEnvSetupError,
    ray.exceptions.OutOfMemoryError,
)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """Ray's errors as fanout's: ``Gone``; a collected path the node refused stays
    itself (it fails the unit, on every transport alike)."""
    try:
        yield
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, PathRefused):
            raise PathRefused(str(cause)) from None
        raise Gone(f"the node failed: {_first_line(cause or exc)}") from None
    except _GONE as exc:
        raise Gone(_first_line(exc)) from None


IN_FLIGHT = 8


@ray.remote(max_restarts=0, max_task_retries=0)
class SandboxActor:
    """Attempts' sandboxes on the node Ray placed the actor on (``node``)."""

    def __init__(self) -> None:
        context = ray.get_runtime_context()
        self._box = node.NodeSandbox(context.get_node_id(), _untyped.util.get_node_ip_address())

    async def open(self, opening: Opening) -> Opened:
        return await self._box.open(opening)

    async def stage(self, token: str, files: Sequence[Piece]) -> None:
        await self._box.stage(token, files)

    async def step(
        self,
        token: str,
        command: Command,
        stdin: bytes,
        backstop: float,
        files: Sequence[Piece],
        final: bool,
    ) -> tuple[bytes, Ended | None]:
        return await self._box.step(token, replace(command, stdin=stdin), backstop, files, final)

    # At most this many chunks of output on their way to a coordinator that has not
    # taken them: beyond, the generator waits, and the node's relay keeps (and, past its
    # bound, drops) the rest, so a chatty step never grows a node's memory unbounded.
    @ray.method(_generator_backpressure_num_objects=IN_FLIGHT)
    async def follow(self) -> AsyncIterator[bytes | Ended]:
        async for item in self._box.follow():
            yield item

    async def read(self, name: str) -> bytes | None:
        return await self._box.read(name)

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        return await self._box.listing(roots)

    async def fetch(self, names: Sequence[str]) -> AsyncIterator[tuple[int, bytes]]:
        async for item in self._box.fetch(names):
            yield item

    async def close(self) -> list[str]:
        return await self._box.close()


@ray.remote(num_cpus=0, max_retries=0)
def _remove(directory: str, pid: int) -> list[str]:
    return node.remove(directory, pid)


@ray.remote(num_cpus=0, max_retries=0)
def _facts() -> tuple[str, bool, str]:
    return node.facts()


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """What each attempt's actor holds on its node while it runs."""

    cpus: float
    resources: Mapping[str, float]
    labels: Mapping[str, str]
    memory: int | None = None  # bytes (Ray's ``memory`` resource)


# Transports joined to the cluster in this process: one driver connection serves them
# all (the scheduler may run several jobs' runs at once), left when the last leaves.
_joined = 0
_joining = threading.Lock()


def connect(address: str) -> None:
    """Join the cluster at ``address`` as a driver (blocking; one connection per
    process, counted: each ``connect`` is matched by a ``disconnect``)."""
    global _joined
    with _joining:
        if not ray.is_initialized():
            _init(address)
        _joined += 1


def _init(address: str) -> None:
    # Joined from a thread (the coordinator's loop goes on), which also keeps Ray from
    # replacing fanout's SIGTERM handler (which drains the run) with its own exit: Ray
    # says so with a warning, which says nothing to a fanout user.
    logging.getLogger("ray._private.worker").setLevel(logging.ERROR)
    ray.init(
        address=address,
        namespace="fanout",
        # Workers' prints are the worker's own business: a unit's output comes back
        # through its capture, never through Ray's log relay.
        log_to_driver=False,
        logging_level=logging.WARNING,
        configure_logging=False,
    )


def disconnect() -> None:
    """Leave the cluster once no transport of this process uses it: Ray kills every
    actor this driver still owns."""
    global _joined
    with _joining:
        _joined = max(0, _joined - 1)
        if _joined == 0 and ray.is_initialized():
            ray.shutdown()


def driver_address() -> str:
    """This machine's address as the cluster sees it."""
    return str(_untyped.util.get_node_ip_address())


def nodes() -> list[NodeReport]:
    found = []
    for entry in _untyped.nodes():
        node_id = str(entry["NodeID"])
        address = str(entry.get("NodeManagerAddress", ""))
        found.append(
            NodeReport(
                node=node_name(address, node_id),
                node_id=node_id,
                address=address,
                alive=bool(entry.get("Alive")),
                resources={
                    str(k): float(v)
                    for k, v in dict(entry.get("Resources", {})).items()
                    if not str(k).startswith("node:")
                },
                labels={
                    str(k): str(v)
                    for k, v in dict(entry.get("Labels", {})).items()
                    if not str(k).startswith("ray.io/")
                },
            )
        )
    return found


def _pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


async def facts(node_id: str) -> tuple[str, bool, str]:
    """fanout's version, bwrap and containment on one node (a task pinned to it)."""
    with _mapped():
        result: tuple[str, bool, str] = await _facts.options(
            scheduling_strategy=_pinned(node_id)
        ).remote()
    return result


async def remove(node_id: str, directory: str, pid: int) -> list[str]:
    """Remove a killed actor's sandbox on its node (a task pinned to it); what to tell
    the user (``local.clear``)."""
    with _mapped():
        said: list[str] = await _remove.options(scheduling_strategy=_pinned(node_id)).remote(
            directory, pid
        )
    return said


class Actor:
    """One attempt's actor, as the coordinator's transport speaks to it."""

    def __init__(self, placement: Placement) -> None:
        options: dict[str, Any] = {
            "num_cpus": placement.cpus,
            "resources": dict(placement.resources),
        }
        if placement.labels:
            options["label_selector"] = dict(placement.labels)
        if placement.memory is not None:
            options["memory"] = placement.memory
        self._handle = SandboxActor.options(**options).remote()  # type: ignore[attr-defined]

    async def open(self, opening: Opening) -> Opened:
        with _mapped():
            opened: Opened = await self._handle.open.remote(opening)
        return opened

    async def stage(self, token: str, files: Sequence[Piece]) -> None:
        with _mapped():
            await self._handle.stage.remote(token, list(files))

    async def step(
        self, token: str, command: Command, backstop: float, files: Sequence[Piece], final: bool
    ) -> tuple[bytes, Ended | None]:
        # The step's stdin (the prompt) as an argument of its own: an argument over
        # Ray's 100 KiB goes through the object store (shared memory, spilled to disk
        # under pressure), and the command, which carries the secrets, must never.
        with _mapped():
            answer: tuple[bytes, Ended | None] = await self._handle.step.remote(
                token, replace(command, stdin=b""), command.stdin, backstop, list(files), final
            )
        return answer

    async def follow(self) -> AsyncGenerator[bytes | Ended]:
        """The running step's output, then how it ended: the caller stops there, and
        never waits for the stream's end (a round trip more)."""
        with _mapped():
            async for ref in self._handle.follow.remote():
                yield await ref

    async def read(self, name: str) -> bytes | None:
        with _mapped():
            data: bytes | None = await self._handle.read.remote(name)
        return data

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        with _mapped():
            entries: list[Entry] = await self._handle.listing.remote(list(roots))
        return entries

    async def fetch(self, names: Sequence[str]) -> AsyncIterator[tuple[int, bytes]]:
        with _mapped():
            async for ref in self._handle.fetch.remote(list(names)):
                yield await ref

    async def close(self) -> list[str]:
        with _mapped():
            said: list[str] = await self._handle.close.remote()
        return said

    def kill(self) -> None:
        """Kill the actor now, with force (its process exits, its steps with it)."""
        with contextlib.suppress(Exception):
            ray.kill(self._handle, no_restart=True)
