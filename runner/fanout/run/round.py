"""A round of dispatch: everything it needs, injected, and how it is stopped.

``dispatch`` runs a round; ``backlog`` feeds it; ``run`` makes one per round.  It is a
module of its own so those three can share it without ``backlog`` (below dispatch in the
pipeline) importing ``dispatch``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
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
    rng: random.Random = field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    counts: Counter[UnitState] = field(default_factory=Counter)
    # The error that stops the round (the first one; a FanoutError but for a bug in the
    # selection); None while it runs.
    stopped: Exception | None = None
    # Running unit tasks, and those of them whose worker runs now (a stop lets these finish).
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    in_worker: set[asyncio.Task[Any]] = field(default_factory=set)

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
        running = len(self.in_worker)
        self.events.emit(
            "notice",
            message=f"stopping on {_kind(error)}: no new unit starts; {running} running"
            " attempt(s) finish first, then the reason and how to continue",
            reason=str(error),
        )
        for task in self.tasks - self.in_worker:
            task.cancel()


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
