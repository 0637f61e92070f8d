"""What happened to an attempt and to a unit, as values.

A unit's fate is data, never an exception, so one failing unit cannot cancel its
siblings; the same records feed the journal, the report, resume and the exit code.

Attempt statuses and what the retry ladder does with them:

    succeeded    the worker and verify exited 0                 the unit is done
    failed       non-zero exit, verify failed, a staging error  climbs the ladder
    timeout      the attempt ran past its timeout               climbs the ladder
    throttled    the worker was told to slow down (HTTP 429)    requeued, no rung used
    lost         the worker or its host went away               requeued, no rung used
    interrupted  fanout itself was stopped (Ctrl-C, SIGTERM)    picked up by --resume
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMEOUT = "timeout"
    THROTTLED = "throttled"
    LOST = "lost"
    INTERRUPTED = "interrupted"

    @property
    def climbs_ladder(self) -> bool:
        """Whether this attempt uses up one attempt of the current rung."""
        return self in (Status.FAILED, Status.TIMEOUT)


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectedFile:
    """A file copied back from a sandbox into the run's unit folder."""

    path: str
    sha256: str
    size: int

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptResult:
    status: Status
    reason: str
    exit_code: int | None = None
    output_tail: str = ""
    duration: float = 0.0
    host: str = "local"
    collected: tuple[CollectedFile, ...] = ()
    # Throttle signals (see ``throttle``): how long the API asked us to wait, and which limit.
    retry_after: float | None = None
    throttled_limit: str | None = None
    # Why fanout could not store part of this attempt under its state dir (a full disk):
    # fanout's fault, not the unit's; dispatch stops the run on it.
    storage_error: str = ""

    def last_context(self, rung: str, attempt: int) -> dict[str, Any]:
        """The ``last`` variable a later attempt's templates see."""
        return {
            "status": str(self.status),
            "reason": self.reason,
            "exitCode": self.exit_code,
            "outputTail": self.output_tail,
            "rung": rung,
            "attempt": attempt,
        }


class UnitState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """A unit's fate in one round: the summary the report and the exit code use."""

    unit_id: str
    round: int
    state: UnitState
    rung: str = ""
    attempts: int = 0
    reason: str = ""
    output_tail: str = ""
    collected: tuple[CollectedFile, ...] = field(default_factory=tuple)
