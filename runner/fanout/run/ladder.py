"""The retry ladder: which rung and attempt comes next, and how long to wait first.

Rungs are tried in order, each ``attempts`` times.  Only attempts that ``failed`` or
hit their ``timeout`` use up a rung; a ``throttled`` or ``lost`` attempt is simply run
again (a unit lost ``MAX_LOST`` times in a row is failed, so a unit that kills its host
every time cannot loop forever).  A unit that exhausts the ladder is failed and handed
to a human.

Throttled attempts are capped the same way: a unit throttled
``retry.throttle.maxAttempts`` times in a row, or still throttled
``retry.throttle.maxWait`` after its first throttle in a row, is failed outright with a
reason naming the cap.  It does not climb to the next rung: rungs change the worker
(model, prompt, timeout) to get a task done that failed, while a throttle says nothing
about the task, only that the API refused it; the next rung would be refused alike (often
faster, as bigger models have tighter quotas) and would burn its attempts on that.  A
failed unit is listed for a human and ``fanout retry RUN --failed`` runs it once the
quota is back.  The counts live only in memory: a resumed unit starts a fresh streak.

Between climbing failures the unit waits an exponential backoff, ``initial * 2**(k-1)``
capped at ``max``, with jitter: ``full`` waits U(0, delay) (AWS's "full jitter", which
spreads retries best), ``equal`` waits delay/2 + U(0, delay/2), ``none`` waits delay
(``pacing.backoff``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from ..outcome import AttemptResult, Status
from ..pacing import backoff as waits
from ..spec import Backoff, Rung, Throttle
from ..values.quantities import format_duration

MAX_LOST = 5
# retry.backoff.jitter's words.
_JITTER = {"full": waits.FULL, "equal": waits.EQUAL, "none": waits.NONE}


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Where a unit stands on the ladder (persisted in the journal for --resume)."""

    rung: int = 0
    rung_attempts: int = 0
    attempts: int = 0
    failures: int = 0
    lost_in_a_row: int = 0
    throttled_in_a_row: int = 0
    # Loop time at which the unit's first throttled attempt in a row ended.
    throttled_since: float | None = None
    last: dict[str, Any] = field(default_factory=dict)

    def exhausted(self, ladder: tuple[Rung, ...]) -> bool:
        return self.rung >= len(ladder)


def advance(
    progress: Progress, ladder: tuple[Rung, ...], result: AttemptResult, now: float = 0.0
) -> Progress:
    """The progress after an attempt ended with ``result`` at loop time ``now``."""
    rung_name = ladder[min(progress.rung, len(ladder) - 1)].name
    last = result.last_context(rung_name, progress.attempts)
    if result.status is Status.THROTTLED:
        since = now if progress.throttled_since is None else progress.throttled_since
        return replace(
            progress,
            lost_in_a_row=0,
            throttled_in_a_row=progress.throttled_in_a_row + 1,
            throttled_since=since,
            last=last,
        )
    progress = replace(progress, throttled_in_a_row=0, throttled_since=None)
    if result.status is Status.LOST:
        return replace(progress, lost_in_a_row=progress.lost_in_a_row + 1, last=last)
    if not result.status.climbs_ladder:
        return replace(progress, lost_in_a_row=0, last=last)
    used = progress.rung_attempts + 1
    if used >= ladder[progress.rung].attempts:
        return replace(
            progress,
            rung=progress.rung + 1,
            rung_attempts=0,
            failures=progress.failures + 1,
            lost_in_a_row=0,
            last=last,
        )
    return replace(
        progress, rung_attempts=used, failures=progress.failures + 1, lost_in_a_row=0, last=last
    )


def given_up(
    progress: Progress, ladder: tuple[Rung, ...], throttle: Throttle, now: float
) -> str | None:
    """Why the unit must not be attempted again (it is failed), or None to go on."""
    reason = str(progress.last.get("reason", ""))
    if progress.exhausted(ladder):
        return reason
    if progress.lost_in_a_row >= MAX_LOST:
        return f"lost {progress.lost_in_a_row} times in a row: {reason}"
    if progress.throttled_in_a_row and progress.throttled_in_a_row >= throttle.max_attempts:
        return (
            f"throttled {progress.throttled_in_a_row} times in a row"
            f" (retry.throttle.maxAttempts): {reason}"
        )
    if progress.throttled_since is not None and throttle.max_wait is not None:
        waited = now - progress.throttled_since
        if waited >= throttle.max_wait:
            return (
                f"throttled for {format_duration(waited)} in a row"
                f" (retry.throttle.maxWait): {reason}"
            )
    return None


def backoff_delay(failures: int, backoff: Backoff, rng: random.Random) -> float:
    """Seconds to wait before the attempt after the ``failures``-th climbing failure."""
    if failures <= 0:
        return 0.0
    jitter = _JITTER[backoff.jitter]
    return waits.Backoff(initial=backoff.initial, max=backoff.max, jitter=jitter).delay(
        failures, rng
    )
