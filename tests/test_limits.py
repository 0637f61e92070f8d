"""Rate limits on virtual time (looptime drives the loop clock the rate gate reads)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from fanout import spec
from fanout.outcome import AttemptResult, Status
from fanout.pacing import limits
from fanout.pacing.limits import RateGate
from fanout.spec import Limit, Throttle

from helpers import write_job

pytestmark = pytest.mark.looptime

THROTTLE = Throttle(initial=5, max=600, jitter=0.5)
OK = AttemptResult(status=Status.SUCCEEDED, reason="ok")


async def _starts(gate: RateGate, count: int, concurrency: int = 8) -> list[float]:
    """Start times of ``count`` tasks of 0.1 s each, ``concurrency`` at a time."""
    loop = asyncio.get_running_loop()
    times: list[float] = []
    slots = asyncio.Semaphore(concurrency)

    async def task() -> None:
        async with slots:
            start = await gate.acquire()
            times.append(loop.time())
            await asyncio.sleep(0.1)
            gate.finish(start, OK)

    await asyncio.gather(*(task() for _ in range(count)))
    return sorted(times)


def _most_in_any_window(times: list[float], width: float) -> int:
    """The most start times in any half-open window [t, t + width)."""
    best, left = 0, 0
    for right, moment in enumerate(times):
        while times[left] <= moment - width:
            left += 1
        best = max(best, right - left + 1)
    return best


async def test_pace_matches_the_limit_and_never_exceeds_any_window() -> None:
    limit = Limit(name="api", requests=50, per=60, requests_per_task=4)
    gate = RateGate([limit], THROTTLE)
    times = await _starts(gate, 240)
    # 50 requests a minute at 4 a task: 12 tasks fit in a minute, one every 5 s.
    achieved = (len(times) - 1) / (times[-1] - times[0]) * 60
    assert achieved == pytest.approx(12, rel=0.01)
    assert achieved <= 12
    assert _most_in_any_window(times, 60) * 4 <= 50
    assert times[0] == pytest.approx(0, abs=1e-6)  # no burst, and no needless wait either


async def test_the_tighter_of_two_limits_governs() -> None:
    loose = Limit(name="search", requests=100, per=1)
    tight = Limit(name="crm", requests=10, per=1)
    gate = RateGate([loose, tight], THROTTLE)
    times = await _starts(gate, 101)
    assert (times[-1] - times[0]) == pytest.approx(10, rel=0.01)
    assert _most_in_any_window(times, 1) <= 10
    stats = gate.stats()
    assert stats["crm"]["achievedPerMinute"] == pytest.approx(600, rel=0.01)
    assert stats["search"]["configuredPerMinute"] == 6000


async def test_max_in_flight_caps_concurrent_tasks() -> None:
    gate = RateGate([Limit(name="db", requests=1000, per=1, max_in_flight=3)], THROTTLE)
    running = peak = 0

    async def task() -> None:
        nonlocal running, peak
        start = await gate.acquire()
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(1)
        running -= 1
        gate.finish(start, OK)

    await asyncio.gather(*(task() for _ in range(12)))
    assert peak == 3


async def test_retry_after_pauses_that_limit_for_at_least_its_value() -> None:
    loop = asyncio.get_running_loop()
    api = Limit(name="api", requests=600, per=60)
    other = Limit(name="other", requests=600, per=60)
    gate = RateGate([api, other], Throttle(initial=5, max=600, jitter=0.2), rng=random.Random(1))
    start = await gate.acquire()
    gate.finish(
        start,
        AttemptResult(status=Status.THROTTLED, reason="429", retry_after=30, throttled_limit="api"),
    )
    paused_at = loop.time()
    await gate.acquire()
    waited = loop.time() - paused_at
    assert 30 <= waited <= 30 * 1.2
    stats = gate.stats()
    assert (stats["api"]["throttles"], stats["other"]["throttles"]) == (1, 0)
    assert stats["api"]["pausedSeconds"] == pytest.approx(waited, abs=0.01)


async def test_jitter_spreads_resumptions() -> None:
    resumed = []
    for seed in range(20):
        gate = RateGate([Limit(name="api", requests=100, per=1)], THROTTLE, rng=random.Random(seed))
        resumed.append(gate.pause("api", 30))
    assert min(resumed) >= 30
    assert max(resumed) <= 45
    assert max(resumed) - min(resumed) > 5
    assert len({round(r, 3) for r in resumed}) == 20


async def test_repeated_throttling_backs_off_exponentially_and_success_resets_it() -> None:
    gate = RateGate([Limit(name="api", requests=100, per=1)], Throttle(initial=5, max=60, jitter=0))
    assert [gate.pause("api", None) for _ in range(6)] == [5, 10, 20, 40, 60, 60]
    gate.finish(await gate.acquire(), OK)  # one got through after the last pause
    assert gate.pause("api", 2) == 5
    assert gate.pause("api", 90) == 90  # Retry-After is a floor, even above the cap


async def test_a_throttle_without_limits_pauses_all_dispatch() -> None:
    loop = asyncio.get_running_loop()
    gate = RateGate([], Throttle(initial=5, max=600, jitter=0))
    assert gate.stats() == {}
    gate.finish(
        await gate.acquire(), AttemptResult(status=Status.THROTTLED, reason="exit 75", exit_code=75)
    )
    start = loop.time()
    await gate.acquire()
    assert loop.time() - start == pytest.approx(5)
    assert gate.stats()["*"]["throttles"] == 1


async def test_a_pause_reaches_units_already_waiting_for_capacity() -> None:
    loop = asyncio.get_running_loop()
    gate = RateGate([Limit(name="api", requests=1, per=10)], Throttle(initial=5, max=600, jitter=0))
    await gate.acquire()
    waiting = asyncio.create_task(gate.acquire())  # due at t=10
    await asyncio.sleep(1)
    gate.pause("api", 30)  # until t=31
    await waiting
    assert loop.time() == pytest.approx(31, abs=0.01)


def test_plan_math_names_the_bottleneck(tmp_path: Path) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "pace"
            [inputs]
            items = ["a"]
            [task]
            command = ["true"]
            limits = ["anthropic"]
            [[limits]]
            name = "anthropic"
            requests = 50
            per = "1m"
            requestsPerTask = 4
            [[limits]]
            name = "unused"
            requests = 1
            per = "1h"
            """,
        )
    )
    assert [p.limit.name for p in limits.paces(job)] == ["anthropic"]
    # 12 tasks a minute (50 // 4): 1,000 units need 83 min 20 s.
    assert limits.minimum_wall_time(job, 1000) == pytest.approx(1000 / 12 * 60)


async def test_starts_pass_a_pause_in_arrival_order() -> None:
    """A unit that re-enters the gate right after its throttle must not overtake one that
    was already waiting: before the fix the waiter's start came due inside each new pause,
    it went back to sleep behind the re-entering unit, and never started (defect 5)."""
    loop = asyncio.get_running_loop()
    gate = RateGate([Limit(name="api", requests=60, per=60)], Throttle(initial=1, max=5, jitter=0))
    passed: list[tuple[str, float]] = []

    async def throttled_every_time() -> None:
        for _ in range(5):
            start = await gate.acquire()
            passed.append(("hot", loop.time()))
            await asyncio.sleep(0.5)
            gate.finish(start, AttemptResult(status=Status.THROTTLED, reason="429", retry_after=1))

    async def waiting() -> None:
        await asyncio.sleep(0.1)
        gate.finish(await gate.acquire(), OK)
        passed.append(("queued", loop.time()))

    await asyncio.gather(throttled_every_time(), waiting())
    # The queued start came due at 1 s, inside the pause (0.5 to 1.5 s); it starts when
    # the pause ends (1.5 s), ahead of the hot unit, which waits out the pace learned from
    # the throttle (one start per the 1 s Retry-After, widened by 1%: 2.51 s).  The queued
    # start got through after the pause, so the hot unit's next throttle starts the
    # backoff again from 1 s (until 4.01 s); the first starts after that pause are
    # throttled again, so it doubles: 2 s, 4 s.  (With aiolimiter the queued start spent
    # the 1 s slot inside the pause and took the next one, at 2 s.)
    assert [(who, round(t, 2)) for who, t in passed] == [
        ("hot", 0.0),
        ("queued", 1.5),
        ("hot", 2.51),
        ("hot", 4.01),
        ("hot", 6.51),
        ("hot", 11.01),
    ]


async def test_a_pause_ending_on_a_virtual_clock_tick_does_not_spin() -> None:
    """``paused_until - now`` can be 7e-15 after a sleep that ended on time; waiting
    that out spun forever on looptime's clock (and burnt a core on a real one)."""
    loop = asyncio.get_running_loop()
    gate = RateGate([Limit(name="api", requests=60, per=60)], Throttle(initial=5, max=5, jitter=0))
    await asyncio.sleep(27.166093)
    gate.pause("api", 5.000000000000004)
    await asyncio.wait_for(gate.acquire(), 10)
    assert loop.time() == pytest.approx(32.166093, abs=1e-5)


async def test_a_wait_on_one_limit_does_not_spend_another_limits_capacity_early() -> None:
    """Capacity is taken from every limit at the moment the task starts.  Taken from the
    first limit before a pause on the second had ended (aiolimiter's ``acquire`` takes
    what it waits for), the start landed 9.99 s after the first limit's capacity was
    spent, and the next start followed 0.01 s later: two starts in 10 s on a limit of one."""
    loop = asyncio.get_running_loop()
    slow = Limit(name="slow", requests=1, per=10)
    fast = Limit(name="fast", requests=100, per=1)
    gate = RateGate([slow, fast], Throttle(initial=1, max=600, jitter=0))
    gate.pause("fast", 9.99)
    times = []
    for _ in range(3):
        gate.finish(await gate.acquire(), OK)
        times.append(loop.time())
    assert _most_in_any_window(times, 10) == 1
    assert [round(t, 3) for t in times] == [9.99, 19.99, 29.99]


def test_what_paces_a_run_is_the_least_of_the_limits_the_api_windows_and_the_slots(
    tmp_path: Path,
) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "pace"
            [inputs]
            items = ["a"]
            [task]
            command = ["true"]
            limits = ["crm"]
            [runtime]
            network = "apis"
            [[limits]]
            name = "crm"
            requests = 30
            per = "1m"
            [[apis]]
            name = "claude"
            upstream = "https://api.anthropic.com"
            style = "anthropic"
            requests = { limit = 50, per = "1m" }
            inputTokens = { limit = 40000, per = "1m" }
            [[apis]]
            name = "gpt"
            upstream = "https://api.openai.com"
            style = "openai"
            outputTokens = { limit = 9000, per = "1m" }
            inputTokens = { limit = 90000, per = "1m" }
            """,
        )
    )
    paces = limits.pace_fields(job)["paces"]
    # Anthropic's input limit leaves cache reads out; OpenAI's counts the whole prompt.
    assert paces == [
        {"limit": "crm", "perMinute": 30.0},
        {"api": "claude", "window": "requests", "perMinute": 50.0, "counts": ["requests"]},
        {
            "api": "claude",
            "window": "inputTokens",
            "perMinute": 40000.0,
            "counts": ["inputTokens", "cacheWriteTokens"],
        },
        {
            "api": "gpt",
            "window": "inputTokens",
            "perMinute": 90000.0,
            "counts": ["inputTokens", "cacheWriteTokens", "cacheReadTokens"],
        },
        {"api": "gpt", "window": "outputTokens", "perMinute": 9000.0, "counts": ["outputTokens"]},
    ]

    def pacer(slots: int, attempts: int, own: float, **used: float) -> str:
        amounts: dict[tuple[str, str], float] = {}
        for key, value in used.items():
            api, field = key.split("_")
            amounts[(api, field)] = value
        return limits.pacer(paces, slots=slots, attempts=attempts, own_seconds=own, used=amounts)

    # Before any attempt has finished: the declared limit (0.5 units a second).
    assert pacer(4, 0, 0.0) == "limit crm 30/min"
    # 4 slots of 10 s attempts: 0.4 a second, fewer than the limit allows.
    assert pacer(4, 10, 100.0) == "4 slot(s)"
    # 1 s attempts, 2 requests each: 25 a minute of claude's 50 requests, under crm's 30.
    assert pacer(4, 10, 10.0, claude_requests=20) == "api claude 50 requests/min"
    # 2,000 input tokens an attempt (cache reads are not counted): 20 a minute.
    assert (
        pacer(
            4,
            10,
            10.0,
            claude_requests=20,
            claude_inputTokens=15000,
            claude_cacheWriteTokens=5000,
            claude_cacheReadTokens=10**9,
        )
        == "api claude 40,000 input tokens/min"
    )
    # gpt's cache reads count: 10,000 an attempt is 9 a minute; its 1,000 output tokens 9
    # a minute too, and the first of equal bounds is named.
    assert (
        pacer(4, 10, 10.0, gpt_inputTokens=10000, gpt_cacheReadTokens=90000, gpt_outputTokens=10000)
        == "api gpt 90,000 input tokens/min"
    )
    # No slot up (every host lost): what bounds the pace, once one is up again.
    assert pacer(0, 10, 10.0) == "limit crm 30/min"
