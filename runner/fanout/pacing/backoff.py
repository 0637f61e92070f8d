"""Exponential backoff with jitter: the one formula behind every wait that grows with
failures in a row (the retry ladder's, a limit's pause after a throttle, the gateway's,
an SSH host's reconnects).

The n-th wait in a row (n >= 1) starts from ``initial * factor**(n - 1)``, capped at
``max``.  A floor (a Retry-After) raises it, then jitter multiplies it by a factor drawn
from U(low, low + spread), and the result is capped at ``max`` again but never below
the floor.  Jitter spreads clients apart so they do not retry in lockstep:

- ``FULL`` (0, 1): anywhere from nothing to the whole wait (AWS's "full jitter", which
  spreads retries best);
- ``EQUAL`` (0.5, 0.5): at least half the wait;
- ``NONE``: the wait itself, and the rng is not drawn from;
- ``above(j)`` (1, j): the wait and up to a fraction ``j`` more (a limit's pause: a
  Retry-After is never cut short).  It draws even when ``j`` is 0, so a seeded rng
  that several limits share yields the same sequence whatever their jitter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Jitter:
    """The factor a wait is multiplied by: U(low, low + spread); None draws nothing."""

    low: float = 1.0
    spread: float | None = None

    @staticmethod
    def above(fraction: float) -> Jitter:
        return Jitter(low=1.0, spread=fraction)

    def factor(self, rng: random.Random) -> float:
        if self.spread is None:
            return 1.0
        return self.low + rng.uniform(0, self.spread)


FULL = Jitter(low=0.0, spread=1.0)
EQUAL = Jitter(low=0.5, spread=0.5)
NONE = Jitter()


@dataclass(frozen=True, kw_only=True, slots=True)
class Backoff:
    """Waits that grow ``factor``-fold with each failure in a row, up to ``max``."""

    initial: float
    max: float
    factor: float = 2.0
    jitter: Jitter = NONE

    def step(self, n: int) -> float:
        """The n-th wait in a row (n >= 1) before jitter: ``initial * factor**(n-1)``,
        capped at ``max``."""
        return min(self.max, self.initial * self.factor ** (n - 1))

    def delay(self, n: int, rng: random.Random, *, floor: float = 0.0) -> float:
        """Seconds to wait the n-th time in a row: the step, raised to ``floor``,
        jittered, and capped at ``max`` but never below ``floor``."""
        seconds = max(floor, self.step(n)) * self.jitter.factor(rng)
        return max(floor, min(seconds, self.max))
