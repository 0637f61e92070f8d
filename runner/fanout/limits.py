"""Rate limits of the external APIs workers call: how fast units may be dispatched.

A task takes ``requestsPerTask`` requests from every limit it uses, so each limit
allows ``requests / per / requestsPerTask`` task starts per second; the tightest
limit sets the pace of the whole fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .events import Events
from .outcome import AttemptResult
from .spec import Limit, Spec


@dataclass(frozen=True, slots=True)
class Pace:
    limit: Limit

    @property
    def tasks_per_second(self) -> float:
        return self.limit.requests / self.limit.per / self.limit.requests_per_task


def paces(spec: Spec) -> list[Pace]:
    """One pace per limit the task uses, tightest first."""
    return sorted((Pace(limit) for limit in spec.task_limits()), key=lambda p: p.tasks_per_second)


def tightest(spec: Spec) -> Pace | None:
    found = paces(spec)
    return found[0] if found else None


def minimum_wall_time(spec: Spec, units: int) -> float | None:
    """Seconds ``units`` task starts need at the tightest limit's pace (None: unlimited)."""
    pace = tightest(spec)
    return None if pace is None else units / pace.tasks_per_second


def concurrency(spec: Spec) -> int:
    """Most units that can run at once: the task cap, host slots and in-flight limits."""
    cap = spec.runtime.max_concurrent_tasks
    if spec.runtime.hosts:
        cap = min(cap, sum(host.slots for host in spec.runtime.hosts))
    for limit in spec.task_limits():
        if limit.max_in_flight is not None:
            cap = min(cap, limit.max_in_flight)
    return cap


class Gate(Protocol):
    """Rate capacity for task starts: ``acquire`` before a worker starts, ``release``
    when it ends, ``report`` every result so throttle signals pause the fleet."""

    async def acquire(self) -> None: ...

    def release(self) -> None: ...

    def report(self, result: AttemptResult) -> None: ...


class OpenGate:
    """No limits: every start is allowed at once."""

    async def acquire(self) -> None:
        return None

    def release(self) -> None:
        return None

    def report(self, result: AttemptResult) -> None:
        return None


def gate_for(spec: Spec, events: Events | None = None) -> Gate:
    """The rate gate ``spec`` needs."""
    return OpenGate()
