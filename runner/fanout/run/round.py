"""A round of dispatch: everything it needs, injected, and how it is stopped.

``dispatch`` runs a round; ``backlog`` feeds it; ``run`` makes one per round.  It is a
module of its own so those three can share it without ``backlog`` (below dispatch in the
pipeline) importing ``dispatch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..attempt.seam import Transport
from ..errors import (
    EnvironmentProblem,
    HostsUnavailable,
    InputFailed,
    JobError,
    SpendStopped,
    StateError,
)
from ..events import Events
from ..journal import Journal
from ..outcome import UnitState
from ..pacing.limits import Gate, OpenGate
from ..spec import Spec

if TYPE_CHECKING:  # the gateway (and aiohttp) load only for a job with [[apis]]
    from ..gateway import Gateway


class Phase(enum.Enum):
    """Where a unit's task is: what a stop of the round does to it."""

    WAITING = "waiting"  # for a slot, a backoff, a throttle pause: a stop interrupts it
    WORKING = "working"  # its worker runs: a stop lets it finish and settle


class UnitTasks:
    """The round's unit tasks, owned: each is started here (``start``), inside the
    group, and awaited when the group ends, however it ends (a task that raises, or a
    cancellation from outside, cancels the rest first, as ``asyncio.TaskGroup`` does).
    Each task's phase is known, so ``interrupt`` cancels exactly those that wait."""

    def __init__(self) -> None:
        self._group: asyncio.TaskGroup | None = None
        # Tasks that have begun: one cancelled before its first step would never run the
        # handlers that record its unit and give its slot back, so none is cancelled
        # before it runs (it sees the stop as it starts).
        self._phases: dict[asyncio.Task[None], Phase] = {}

    async def __aenter__(self) -> UnitTasks:
        assert self._group is None, "a round's units are dispatched once"
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._group is not None
        await self._group.__aexit__(*exc)

    def start(self, unit: Callable[[], Awaitable[None]]) -> None:
        """Run ``unit()`` in a task of the group."""
        assert self._group is not None, "start inside ``async with``"
        self._group.create_task(self._run(unit))

    async def _run(self, unit: Callable[[], Awaitable[None]]) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._phases[task] = Phase.WAITING
        try:
            await unit()
        finally:
            del self._phases[task]

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """The current task's worker runs inside this block: ``interrupt`` spares it."""
        task = asyncio.current_task()
        assert task is not None
        before = self._phases.get(task)
        self._phases[task] = Phase.WORKING
        try:
            yield
        finally:
            if before is None:
                del self._phases[task]
            else:
                self._phases[task] = before

    @property
    def working_count(self) -> int:
        return sum(phase is Phase.WORKING for phase in self._phases.values())

    def interrupt(self) -> None:
        """Cancel every task that waits; those whose worker runs go on."""
        for task, phase in self._phases.items():
            if phase is Phase.WAITING:
                task.cancel()


@dataclass(kw_only=True)
class Round:
    """Everything one round of dispatch needs, injected."""

    spec: Spec
    run_id: str
    number: int
    journal: Journal
    transport: Transport
    events: Events
    run_dir: Path
    concurrency: int
    gate: Gate = field(default_factory=OpenGate)
    # The coordinator's API gateway (None: the job declares no [[apis]]).
    gateway: Gateway | None = None
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    trigger: Mapping[str, Any] | None = None
    # Whether a unit may reuse an earlier run's success (``run.reusing``).
    reuse: bool = True
    # Whether the job's text runs Jinja (``invocation.templated``); if not, attempts are
    # rendered on the loop.  True unless the run says otherwise: a thread is always safe.
    templated: bool = True
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    counts: Counter[UnitState] = field(default_factory=Counter)
    # The error that stops the round (the first one; a FanoutError but for a bug in the
    # selection); None while it runs.
    stopped: Exception | None = None
    # The unit tasks, owned, each waiting or in its worker (a stop lets these finish).
    units: UnitTasks = field(default_factory=UnitTasks)

    @property
    def keys(self) -> tuple[str, ...]:
        """The real keys of the job's [[apis]], which no worker is given: redacted from
        its output all the same (one it found elsewhere, an upstream's echo)."""
        return () if self.gateway is None else self.gateway.keys

    def stop(self, error: Exception) -> None:
        """Stop the round on ``error``: nothing new starts, waiting units are interrupted."""
        if self.stopped is not None:
            return
        self.stopped = error
        # Decision: this live line says that the run stops and what it waits for, but not
        # the error's text, which is the run's last line once the attempts have finished
        # (one place for it, in logs and CI output too; printed twice it read as two
        # failures).  Its kind is here, so a long drain is not a mystery; the event log
        # keeps the whole reason with the notice.
        running = self.units.working_count
        self.events.emit(
            "notice",
            message=f"stopping on {_kind(error)}: no new unit starts; {running} running"
            " attempt(s) finish first, then the reason and how to continue",
            reason=str(error),
        )
        self.units.interrupt()


def _kind(error: Exception) -> str:
    """What sort of error stops the round, in a few words."""
    kinds: tuple[tuple[type[Exception], str], ...] = (
        (JobError, "a job error"),
        (InputFailed, "an input failure"),
        (HostsUnavailable, "no usable host"),
        (EnvironmentProblem, "an environment problem"),
        (StateError, "a state error"),
        (SpendStopped, "money (a budget or the API's spend limit)"),
    )
    return next((name for kind, name in kinds if isinstance(error, kind)), "an error")
