"""pacing.backoff: the one exponential backoff with jitter (the ladder's, a limit's
pause, an SSH host's reconnects)."""

from __future__ import annotations

import random

from fanout.pacing.backoff import EQUAL, FULL, NONE, Backoff, Jitter


class Top(random.Random):
    """Randomness that always draws the top of the range."""

    def random(self) -> float:
        return 1.0


class Counting(random.Random):
    def __init__(self) -> None:
        super().__init__(0)
        self.draws = 0

    def random(self) -> float:
        self.draws += 1
        return 0.5


def test_each_wait_doubles_from_initial_to_its_cap() -> None:
    backoff = Backoff(initial=10, max=60)
    assert [backoff.step(n) for n in range(1, 7)] == [10, 20, 40, 60, 60, 60]
    assert [backoff.delay(n, random.Random(0)) for n in range(1, 7)] == [10, 20, 40, 60, 60, 60]
    assert Backoff(initial=1, max=100, factor=3).step(4) == 27


def test_jitter_draws_the_factor_from_its_band() -> None:
    assert Backoff(initial=8, max=60, jitter=FULL).delay(2, Top()) == 16
    assert Backoff(initial=8, max=60, jitter=FULL).delay(2, Counting()) == 8
    assert Backoff(initial=8, max=60, jitter=EQUAL).delay(2, Counting()) == 12
    assert Backoff(initial=8, max=60, jitter=Jitter.above(0.5)).delay(2, Top()) == 24


def test_a_floor_raises_the_wait_and_the_cap_never_cuts_it() -> None:
    above = Backoff(initial=5, max=60, jitter=Jitter.above(0.5))
    assert above.delay(1, Top(), floor=30) == 45  # Retry-After 30, jitter on top
    assert above.delay(1, Top(), floor=50) == 60  # capped at max...
    assert above.delay(1, Top(), floor=90) == 90  # ...but never below the Retry-After


def test_no_jitter_draws_nothing_and_a_zero_spread_still_draws() -> None:
    rng = Counting()
    Backoff(initial=1, max=2, jitter=NONE).delay(1, rng)
    assert rng.draws == 0
    assert Backoff(initial=1, max=2, jitter=Jitter.above(0)).delay(1, rng) == 1
    assert rng.draws == 1
