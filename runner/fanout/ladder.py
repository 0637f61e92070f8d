"""The retry ladder: which rung and attempt comes next, and how long to wait first.

Rungs are tried in order, each ``attempts`` times.  Only attempts that ``failed`` or
hit their ``timeout`` use up a rung; a ``throttled`` or ``lost`` attempt is simply run
again (a unit lost more than ``MAX_LOST`` times in a row is failed, so a unit that
kills its host every time cannot loop forever).  A unit that exhausts the ladder is
failed and handed to a human.

Between climbing failures the unit waits an exponential backoff, ``initial * 2**(k-1)``
capped at ``max``, with jitter: ``full`` waits U(0, delay) (AWS's "full jitter", which
spreads retries best), ``equal`` waits delay/2 + U(0, delay/2), ``none`` waits delay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from .outcome import AttemptResult, Status
from .spec import Backoff, Rung

MAX_LOST = 5


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Where a unit stands on the ladder (persisted in the journal for --resume)."""

    rung: int = 0
    rung_attempts: int = 0
    attempts: int = 0
    failures: int = 0
    lost_in_a_row: int = 0
    last: dict[str, Any] = field(default_factory=dict)

    def exhausted(self, ladder: tuple[Rung, ...]) -> bool:
        return self.rung >= len(ladder)


def advance(progress: Progress, ladder: tuple[Rung, ...], result: AttemptResult) -> Progress:
    """The progress after an attempt ended with ``result``."""
    rung_name = ladder[min(progress.rung, len(ladder) - 1)].name
    last = result.last_context(rung_name, progress.attempts)
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


def backoff_delay(failures: int, backoff: Backoff, rng: random.Random) -> float:
    """Seconds to wait before the attempt after the ``failures``-th climbing failure."""
    if failures <= 0:
        return 0.0
    delay = float(min(backoff.max, backoff.initial * 2.0 ** (failures - 1)))
    if backoff.jitter == "full":
        return rng.uniform(0, delay)
    if backoff.jitter == "equal":
        return delay / 2 + rng.uniform(0, delay / 2)
    return delay
