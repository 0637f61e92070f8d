"""What happened to an attempt, to a unit and to a run, as values.

A unit's fate is data, never an exception, so one failing unit cannot cancel its
siblings; the same records feed the journal, the report, resume and the exit code.
Why a run's rounds ended is a ``StopReason``, which owns the run's state and its exit
code; how the run ended, counts and all, is its ``Summary``.

Attempt statuses and what the retry ladder does with them:

    succeeded    the worker and verify exited 0                 the unit is done
    failed       non-zero exit, verify failed, a staging error  climbs the ladder
    timeout      the attempt ran past its timeout               climbs the ladder
    throttled    the worker was told to slow down (HTTP 429)    requeued, no rung used
    lost         the worker or its host went away               requeued, no rung used
    interrupted  fanout itself was stopped (Ctrl-C, SIGTERM)    picked up by --resume
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from .errors import ExitCode, FanoutError, Interrupted, NothingSelected
from .values.quantities import usd_text


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
class ApiUsage:
    """What one attempt (or a unit, or a run: ``plus``) used of one API through the
    gateway.  ``input_tokens`` are the uncached ones; cached reads and writes are
    counted apart, as the APIs bill them."""

    api: str
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    # Seconds its requests waited in the gateway's queue, and the 429/529 answers the
    # gateway absorbed (retried upstream, never shown to the worker).
    queued_seconds: float = 0.0
    throttles: int = 0
    # Of ``cost_usd``, what requests whose answers were never read had reserved (their
    # prompt's estimate and output cap at the model's price): a coordinator killed while
    # they ran, or a worker gone mid-request.  The upstream may have billed them, so
    # they count; this says how much of the cost is that estimate, not a measure.
    reserved_usd: float = 0.0

    def plus(self, other: ApiUsage) -> ApiUsage:
        return ApiUsage(
            api=self.api,
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            queued_seconds=self.queued_seconds + other.queued_seconds,
            throttles=self.throttles + other.throttles,
            reserved_usd=self.reserved_usd + other.reserved_usd,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "api": self.api,
            "requests": self.requests,
            "inputTokens": self.input_tokens,
            "outputTokens": self.output_tokens,
            "cacheReadTokens": self.cache_read_tokens,
            "cacheWriteTokens": self.cache_write_tokens,
            "costUsd": round(self.cost_usd, 6),
            "queuedSeconds": round(self.queued_seconds, 3),
            "throttles": self.throttles,
            "reservedUsd": round(self.reserved_usd, 6),
        }


def unit_budget_spent(budget_usd: float, spent_usd: float) -> str | None:
    """Why a unit may spend no more (``task.budget``), None while ``spent_usd`` is under
    ``budget_usd``.  One wording for the attempt's reason (the dispatcher) and the 400
    the gateway gives the unit's further requests."""
    if spent_usd < budget_usd:
        return None
    return f"unit budget {usd_text(budget_usd)} spent ({usd_text(spent_usd)} used)"


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
    # The seconds of the limit the API's throttle message stated (its agent read "of 50
    # requests per minute"): the window the rate gate learns.
    limit_window: float | None = None
    # Why fanout could not store part of this attempt under its state dir (a full disk):
    # fanout's fault, not the unit's; dispatch stops the run on it.
    storage_error: str = ""
    # What the attempt's requests through the gateway used, one entry per API it called
    # (or, without a gateway, what its agent reported it used).
    usage: tuple[ApiUsage, ...] = ()
    # The class its agent's output reads as (``agents.taxonomy.Kind``; "" for a task
    # without ``task.agent``), and why it stops the run ("" if it does not): a spend cap,
    # or a usage window or quota that resets later than a pause may last.
    kind: str = ""
    halt: str = ""
    # When a halt for a usage window or quota can end (epoch seconds; None: unknown),
    # which ``fanout schedule`` continues the run at.
    resume_at: float | None = None

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
    # Not run: an earlier run's success of the same fingerprint counts (units.reuse).
    REUSED = "reused"
    # Not run: failed alike in units.quarantineAfter runs in a row (see ``journal``).
    QUARANTINED = "quarantined"


# The states a unit ends a round in: the journal never settles it again.
SETTLED = frozenset(
    {UnitState.SUCCEEDED, UnitState.FAILED, UnitState.REUSED, UnitState.QUARANTINED}
)


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


class RunState(StrEnum):
    """A run's state in the journal.  The values are the ones stored since the first
    journal format, so a journal an older fanout wrote reads the same."""

    # Going, or its coordinator died (a lock nobody holds): the next run resumes it.
    RUNNING = "running"
    # Its rounds ended: never resumed, the next ``fanout run`` starts a new run.
    FINISHED = "finished"
    # A FanoutError or a bug stopped it: resumable.
    STOPPED = "stopped"
    # Ctrl-C or SIGTERM: resumable.
    INTERRUPTED = "interrupted"


class StopReason(StrEnum):
    """Why a run's rounds ended.  Each reason owns the state the run is recorded in, the
    note the journal and the report show (``note``), and the exit code (``exit_code``).
    The values name the reasons in code and tests; the journal stores the state and the
    note, never these values."""

    # The first round selected no units.
    NOTHING_SELECTED = "nothing-selected"
    # A later round selected no units: every unit is done.
    NOTHING_REMAINS = "nothing-remains"
    # A later round would select exactly what the round before it did.
    SAME_SELECTION = "same-selection"
    # ``rounds.max`` rounds ran.
    LAST_ROUND = "last-round"
    # More rounds need the collected files applied, and they are not.
    NOT_APPLIED = "not-applied"
    # The round's collected files changed nothing in the workspace.
    NO_CHANGE = "no-change"
    # Ctrl-C or SIGTERM.
    INTERRUPTED = "interrupted"
    # A FanoutError (or a bug) stopped the run; its note is the error's text and its exit
    # code the error's own (the run raises it).
    STOPPED = "stopped"

    @property
    def state(self) -> RunState:
        if self is StopReason.INTERRUPTED:
            return RunState.INTERRUPTED
        if self is StopReason.STOPPED:
            return RunState.STOPPED
        return RunState.FINISHED

    def note(self, number: int) -> str:
        """The note of a run whose rounds ended on this reason with round ``number``
        (the round that was to start, or had just run)."""
        notes = {
            StopReason.NOTHING_SELECTED: "nothing selected",
            StopReason.NOTHING_REMAINS: f"nothing remains after round {number - 1}",
            StopReason.SAME_SELECTION: (
                f"round {number} would select what round {number - 1} did: no progress"
            ),
            StopReason.LAST_ROUND: "",
            StopReason.NOT_APPLIED: (
                "more rounds need collected files applied (collect.apply or --apply)"
            ),
            StopReason.NO_CHANGE: f"round {number} changed nothing in the workspace: no progress",
            StopReason.INTERRUPTED: "interrupted; `fanout run --resume` continues",
        }
        return notes.get(self, "")

    def exit_code(self, counts: Mapping[str, int]) -> int:
        """The exit code of a run that ended on this reason, given its units counted by
        state: 3 for nothing selected, 130 when interrupted, else 1 if a unit failed or
        was left interrupted, 9 if none did but units are quarantined, and 0 if every
        unit succeeded or was reused.  (A stopped run raises its error, whose class owns
        the code; here it is FanoutError's.)"""
        if self is StopReason.NOTHING_SELECTED:
            return NothingSelected.exit_code
        if self is StopReason.INTERRUPTED:
            return Interrupted.exit_code
        if self is StopReason.STOPPED:
            return FanoutError.exit_code
        unsettled = counts.get(UnitState.FAILED, 0) or counts.get(UnitState.INTERRUPTED, 0)
        if unsettled:
            return ExitCode.FAILED
        return ExitCode.QUARANTINED if counts.get(UnitState.QUARANTINED, 0) else ExitCode.OK


@dataclass(kw_only=True)
class Summary:
    """How a run ended: what ``fanout run`` prints and exits with, and what its
    notification tells (``notify``)."""

    run_id: str
    reason: StopReason
    counts: dict[str, int]
    report_dir: Path
    note: str = ""
    # Nothing selected: the inputs.files patterns that matched no file (see units).
    unmatched: tuple[str, ...] = ()
    wall_seconds: float = 0.0
    worker_seconds: float = 0.0
    # Units this run quarantined (newly: failed the same way in too many runs in a row).
    quarantined: int = 0
    # The exit code of the error that stopped the run, which the run raises (reason
    # STOPPED): parked, spend stopped, a host gone, a bug.  None: the reason decides.
    stopped_by: ExitCode | None = None
    # The trigger context of the fire that started the run (None: started by hand).
    trigger: Mapping[str, Any] | None = None

    @property
    def state(self) -> RunState:
        return self.reason.state

    def describe(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items())) or "no units"
        return f"run {self.run_id} {self.state}: {counts}"

    @property
    def exit_code(self) -> int:
        if self.stopped_by is not None:
            return int(self.stopped_by)
        return self.reason.exit_code(self.counts)
