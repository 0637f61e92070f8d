"""The gateway's per-request limiter on virtual time (looptime drives the loop clock the
limiter reads and its timers run on); admission times are asserted exactly."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from fanout.gateway.limiter import Limiter, Remaining, Ticket
from fanout.gateway.windows import SKEW
from fanout.pacing.ceiling import ESTIMATED_MARGIN, Learned, Pause
from fanout.spec import Window

pytestmark = pytest.mark.looptime

T = TypeVar("T")


def _w(limit: int, per: float) -> Window:
    return Window(limit=limit, per=per)


def _limiter(
    *,
    requests: Window | None = None,
    input_tokens: Window | None = None,
    output_tokens: Window | None = None,
    max_in_flight: int | None = None,
) -> Limiter:
    return Limiter(
        requests=requests,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        max_in_flight=max_in_flight,
    )


def _now() -> float:
    return round(asyncio.get_running_loop().time(), 6)


async def _within(awaitable: Awaitable[T], seconds: float = 1000) -> T:
    """A virtual deadline, so a limiter that never admits fails fast instead of hanging."""
    return await asyncio.wait_for(awaitable, seconds)


async def _admitted_at(limiter: Limiter, input_tokens: int = 0, output_tokens: int = 0) -> float:
    ticket = await _within(limiter.admit(input_tokens=input_tokens, output_tokens=output_tokens))
    limiter.settle(ticket, input_tokens=input_tokens, output_tokens=output_tokens)
    return _now()


def _most_in_any_window(events: list[tuple[float, int]], width: float) -> int:
    """The largest sum of amounts whose times fall in one half-open [t, t + width)."""
    events = sorted(events)
    best = 0
    for start, _ in events:
        best = max(best, sum(a for t, a in events if start <= t < start + width))
    return best


async def test_no_window_ever_exceeds_its_limit_under_random_load() -> None:
    rng = random.Random(12)
    requests, inputs, outputs = _w(20, 10), _w(30000, 10), _w(20000, 30)
    limiter = _limiter(
        requests=requests, input_tokens=inputs, output_tokens=outputs, max_in_flight=6
    )
    counted: list[tuple[float, int, int]] = []  # admission time, input and output it kept

    async def caller(start: float) -> None:
        await asyncio.sleep(start)
        for _ in range(6):
            estimate, reserve = rng.randint(0, 3000), rng.choice([100, 500, 1000, 4000])
            if rng.random() < 0.05:
                estimate = 40_000  # above the window: capped at 30,000
            if rng.random() < 0.02:
                reserve = 64_000  # above the window: capped at 20,000
            ticket = await limiter.admit(input_tokens=estimate, output_tokens=reserve)
            admitted = asyncio.get_running_loop().time()
            await asyncio.sleep(rng.uniform(0, 4))
            if rng.random() < 0.1:
                limiter.release(ticket)  # the reservation stays, capped
                counted.append((admitted, min(estimate, 30_000), min(reserve, 20_000)))
            else:
                real_in = rng.randint(0, min(estimate, 30_000))
                real_out = rng.randint(0, min(reserve, 20_000))
                limiter.settle(ticket, input_tokens=real_in, output_tokens=real_out)
                counted.append((admitted, real_in, real_out))
            await asyncio.sleep(rng.uniform(0, 2))

    await _within(asyncio.gather(*(caller(rng.uniform(0, 20)) for _ in range(30))), seconds=100_000)
    assert len(counted) == 180
    # Windows a little longer than ``per``: the skew's margin holds too.  The load fills
    # the requests window to its limit, so the property is tested where it can break.
    width = 1 - 1e-3
    assert _most_in_any_window([(t, 1) for t, _, _ in counted], 10 + SKEW * width) == 20
    assert _most_in_any_window([(t, i) for t, i, _ in counted], 10 + SKEW * width) <= 30_000
    assert _most_in_any_window([(t, o) for t, _, o in counted], 30 + SKEW * width) <= 20_000
    assert limiter.stats()["inFlight"] == 0


async def test_admissions_follow_arrival_order_and_the_head_is_never_overtaken() -> None:
    limiter = _limiter(input_tokens=_w(1000, 10))
    first = await limiter.admit(input_tokens=800, output_tokens=0)
    order: list[tuple[str, float]] = []

    async def caller(name: str, tokens: int, delay: float) -> None:
        await asyncio.sleep(delay)
        ticket = await limiter.admit(input_tokens=tokens, output_tokens=0)
        order.append((name, _now()))
        limiter.settle(ticket, input_tokens=tokens, output_tokens=0)

    # "big" does not fit until the first leaves the window; "small" would fit at once
    # (800 + 100) but must not pass the head.
    await _within(
        asyncio.gather(
            caller("big", 500, 1),
            caller("small", 100, 2),
            caller("late", 100, 3),
            caller("x", 300, 4),
        )
    )
    limiter.settle(first, input_tokens=800, output_tokens=0)
    assert order == [
        ("big", round(10 + SKEW, 6)),
        ("small", round(10 + SKEW, 6)),
        ("late", round(10 + SKEW, 6)),
        ("x", round(10 + SKEW, 6)),
    ]


async def test_callers_are_admitted_in_the_order_they_asked() -> None:
    limiter = _limiter(requests=_w(2, 1))
    order: list[int] = []

    async def caller(number: int) -> None:
        await asyncio.sleep(number * 0.01)
        await _admitted_at(limiter)
        order.append(number)

    await _within(asyncio.gather(*(caller(n) for n in reversed(range(12)))))
    assert order == list(range(12))


@pytest.mark.parametrize("side", ["input", "output"])
async def test_a_reservation_above_a_windows_limit_is_capped_at_the_limit(side: str) -> None:
    window = _w(1000, 60)
    limiter = _limiter(input_tokens=window) if side == "input" else _limiter(output_tokens=window)

    def tokens(count: int) -> dict[str, int]:
        other = "output_tokens" if side == "input" else "input_tokens"
        return {f"{side}_tokens": count, other: 0}

    first = await limiter.admit(**tokens(0))  # in the window, holding none of its tokens
    limiter.answered(first)  # through: slow start lets the next go
    await asyncio.sleep(1)
    oversized = await _within(limiter.admit(**tokens(50_000)), 1)
    # Capped at 1000 it fits at once; uncapped it would wait for the empty entry to leave.
    assert (_now(), oversized.queued) == (1, 0)
    limiter.release(oversized)  # keeps the capped reservation: the whole window
    assert await _admitted_at(limiter, **tokens(1)) == round(61 + SKEW, 6)


async def test_max_in_flight_caps_concurrent_requests() -> None:
    limiter = _limiter(requests=_w(1000, 1), max_in_flight=2)
    running = peak = 0
    times: list[float] = []

    async def request(index: int) -> None:
        nonlocal running, peak
        ticket = await limiter.admit(input_tokens=0, output_tokens=0)
        times.append(_now())
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(1)
        running -= 1
        if index % 2:
            limiter.release(ticket)
        else:
            limiter.settle(ticket, input_tokens=0, output_tokens=0)

    await _within(asyncio.gather(*(request(i) for i in range(5))))
    assert peak == 2
    assert times == [0, 0, 1, 1, 2]


async def test_settle_is_idempotent_and_frees_one_slot() -> None:
    limiter = _limiter(output_tokens=_w(1000, 60), max_in_flight=2)
    first = await limiter.admit(input_tokens=0, output_tokens=500)
    second = await limiter.admit(input_tokens=0, output_tokens=0)
    limiter.settle(first, input_tokens=0, output_tokens=0)
    limiter.settle(first, input_tokens=0, output_tokens=900)  # a late duplicate: ignored
    limiter.release(first)
    third = await _within(limiter.admit(input_tokens=0, output_tokens=1000), 1)
    assert (_now(), third.queued) == (0, 0)  # first holds 0 tokens and no slot
    fourth = asyncio.create_task(limiter.admit(input_tokens=0, output_tokens=0))
    await asyncio.sleep(5)
    assert not fourth.done()  # second and third are in flight
    limiter.settle(second, input_tokens=0, output_tokens=0)
    assert (await _within(fourth)).queued == 5


async def test_usage_above_the_reservation_counts_and_later_requests_wait_longer() -> None:
    limiter = _limiter(output_tokens=_w(1000, 60))
    ticket = await limiter.admit(input_tokens=0, output_tokens=100)
    await asyncio.sleep(1)
    limiter.settle(ticket, input_tokens=0, output_tokens=1500)  # 500 over the limit
    assert await _admitted_at(limiter, output_tokens=100) == round(60 + SKEW, 6)


async def test_usage_below_the_reservation_frees_room_at_once() -> None:
    limiter = _limiter(output_tokens=_w(1000, 60))
    ticket = await limiter.admit(input_tokens=0, output_tokens=900)
    waiting = asyncio.create_task(limiter.admit(input_tokens=0, output_tokens=900))
    await asyncio.sleep(2)
    limiter.settle(ticket, input_tokens=0, output_tokens=50)
    assert (await _within(waiting)).queued == 2


async def test_a_request_settled_after_it_left_the_window_changes_nothing_there() -> None:
    limiter = _limiter(input_tokens=_w(1000, 10))
    slow = await limiter.admit(input_tokens=600, output_tokens=0)  # a long generation
    await asyncio.sleep(20)
    full = await _within(limiter.admit(input_tokens=1000, output_tokens=0), 1)
    limiter.settle(slow, input_tokens=0, output_tokens=0)  # 20 s after its window
    limiter.settle(full, input_tokens=1000, output_tokens=0)
    assert await _admitted_at(limiter, input_tokens=600) == round(30 + SKEW, 6)


async def test_a_pause_holds_admissions_and_a_shorter_one_does_not_shorten_it() -> None:
    limiter = _limiter(requests=_w(1, 10))
    assert await _admitted_at(limiter) == 0
    waiting = asyncio.create_task(_admitted_at(limiter))  # due at 10 + SKEW
    await asyncio.sleep(1)
    limiter.pause(30)
    await asyncio.sleep(1)
    limiter.pause(5)
    assert await waiting == 31
    limiter.pause(20)  # past the window's own 41 + SKEW
    assert await _admitted_at(limiter) == 51


async def test_upstream_remaining_zero_holds_until_its_reset() -> None:
    limiter = _limiter(requests=_w(100, 60), input_tokens=_w(10_000, 60))
    limiter.observe(Remaining(requests=0, requests_reset=12.5))
    assert await _admitted_at(limiter) == 12.5
    limiter.observe(Remaining(requests=50, requests_reset=3, input_tokens=0, input_tokens_reset=7))
    assert await _admitted_at(limiter, input_tokens=10) == 19.5
    limiter.observe(Remaining(requests=0))  # no reset said: nothing to wait for
    assert await _admitted_at(limiter) == 19.5


async def test_few_requests_left_go_as_they_come_then_wait_for_the_reset() -> None:
    limiter = _limiter(requests=_w(100, 60))
    limiter.observe(Remaining(requests=4, requests_reset=8))  # under 10% of 100: rationed
    times = [await _admitted_at(limiter) for _ in range(6)]
    # The 4 go at once; at the reset one more is free, and the next a reset later (when
    # the spread of one a reset ends, it goes alone: see below).
    assert times == [0, 0, 0, 0, 8, 16]
    limiter.observe(Remaining(requests=40, requests_reset=8))  # plenty: nothing held
    assert [await _admitted_at(limiter) for _ in range(3)] == [16, 16, 16]


async def test_a_sliding_window_of_two_goes_two_a_window_together() -> None:
    """Bench case C: an upstream counting 2 requests per sliding 10 s says, after one
    request, 1 remaining and a reset in 10 s (when its oldest leaves).  Spread over the
    reset (one per 5 s, 5.5 s with whole-second resets), 12 requests used 0.86 of the
    limit; a window's two together use all of it."""
    limiter = _limiter()
    first = await _within(limiter.admit(input_tokens=0, output_tokens=0))
    limiter.answered(first)  # slow start's first: the second goes once it is through
    second = await _within(limiter.admit(input_tokens=0, output_tokens=0))
    # The first's answer: 1 left, but the second went after it and is not counted yet.
    limiter.observe(Remaining(requests=1, requests_reset=10), of=first)
    waiting = asyncio.create_task(_admitted_at(limiter))
    await asyncio.sleep(1)
    assert not waiting.done()
    limiter.observe(Remaining(requests=0, requests_reset=9), of=second)
    assert await waiting == 10  # both left the window at 10
    limiter.observe(Remaining(requests=1, requests_reset=10))  # its answer: one more fits
    assert await _admitted_at(limiter) == 10
    for ticket in (first, second):
        limiter.settle(ticket, input_tokens=0, output_tokens=0)


async def test_when_a_spread_ends_one_goes_and_the_rest_wait_for_its_answer() -> None:
    """Bench case E: a spread ended at its reset and the three requests it held went at
    once; two were refused.  Now one goes, and the others wait for its answer."""
    limiter = _limiter()
    limiter.observe(Remaining(requests=1, requests_reset=10))  # one now, one at 10
    assert [await _admitted_at(limiter) for _ in range(2)] == [0, 10]
    probe = await _within(limiter.admit(input_tokens=0, output_tokens=0))
    assert _now() == 20  # one a reset apart, and then the spread has ended: this goes
    behind = asyncio.create_task(_admitted_at(limiter))
    await asyncio.sleep(3)
    assert not behind.done()  # waiting for what the probe's answer says
    limiter.answered(probe)
    assert await behind == 23
    limiter.settle(probe, input_tokens=0, output_tokens=0)


async def test_what_remains_of_a_shared_key_is_spread_by_this_jobs_share() -> None:
    """Bench case E: two jobs share a key, and each gateway read the upstream's
    remaining as its own: together they spent it twice (5 429s of 29 requests)."""
    limiter = _limiter()
    limiter.shared(0.5)
    assert await _admitted_at(limiter) == 0
    limiter.observe(Remaining(requests=1, requests_reset=10))  # 2 fit in 10 s, 1 is ours
    assert await _admitted_at(limiter) == 10
    limiter.observe(Remaining(requests=0, requests_reset=5))
    # The reset frees one, for either job: one per two resets is ours.
    assert await _admitted_at(limiter) == 20
    # Alone on the key it would take the 3 at once (rationed): shared, it spreads its
    # share of the 4 (2) over the reset.
    limiter.observe(Remaining(requests=3, requests_reset=10))
    assert [await _admitted_at(limiter) for _ in range(2)] == [25, 30]


async def test_little_remaining_of_tokens_spreads_by_each_requests_tokens() -> None:
    limiter = _limiter(input_tokens=_w(100_000, 60))
    limiter.observe(Remaining(input_tokens=6000, input_tokens_reset=30))  # 200 a second
    times = [await _admitted_at(limiter, input_tokens=1000) for _ in range(3)]
    assert times == [0, 5, 10]


async def test_what_counts_as_little_remaining() -> None:
    # "tokens" (input and output together) against both our token windows: 10% of 20,000.
    limiter = _limiter(input_tokens=_w(10_000, 60), output_tokens=_w(10_000, 60))
    limiter.observe(Remaining(tokens=1000, tokens_reset=10))  # 100 a second, 200 a request
    assert [await _admitted_at(limiter, 100, 100) for _ in range(3)] == [0, 2, 4]
    limiter.observe(Remaining(tokens=2000, tokens_reset=10))  # not below 10%: no spread
    assert [await _admitted_at(limiter, 100, 100) for _ in range(2)] == [4, 4]
    # Without our own windows: requests below SMALL_REQUESTS spread, tokens never do.
    bare = _limiter()
    bare.observe(Remaining(requests=5, requests_reset=10, tokens=1, tokens_reset=10))
    assert [await _admitted_at(bare, 100, 100) for _ in range(2)] == [4, 4]
    bare.observe(Remaining(requests=4, requests_reset=10))  # below 5: rationed
    assert [await _admitted_at(bare) for _ in range(5)] == [4, 4, 4, 4, 14]


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    limiter = _limiter(requests=_w(1, 10))
    assert await _admitted_at(limiter) == 0
    head = asyncio.create_task(_admitted_at(limiter))
    behind = asyncio.create_task(_admitted_at(limiter))
    await asyncio.sleep(1)
    head.cancel()
    assert await _within(behind) == round(
        10 + SKEW, 6
    )  # not 20 + 2 * SKEW: the cancelled head took nothing
    assert limiter.stats()["waiting"] == 0


async def test_a_waiter_cancelled_as_the_queue_moves_is_skipped() -> None:
    limiter = _limiter(max_in_flight=1)
    first = await limiter.admit(input_tokens=0, output_tokens=0)
    head = asyncio.create_task(limiter.admit(input_tokens=0, output_tokens=0))
    behind = asyncio.create_task(limiter.admit(input_tokens=0, output_tokens=0))
    await asyncio.sleep(1)
    head.cancel()  # its admit() has not seen the cancellation yet ...
    limiter.settle(first, input_tokens=0, output_tokens=0)  # ... when the queue moves
    assert (await _within(behind)).queued == 1
    assert head.cancelled()
    assert limiter.stats() == {"admitted": 2, "queuedSeconds": 1, "inFlight": 1, "waiting": 0}


async def test_a_waiter_cancelled_right_after_its_admission_gives_it_back() -> None:
    limiter = _limiter(requests=_w(2, 10), max_in_flight=1)
    first = await limiter.admit(input_tokens=0, output_tokens=0)
    granted = asyncio.create_task(limiter.admit(input_tokens=0, output_tokens=0))
    await asyncio.sleep(1)
    limiter.settle(first, input_tokens=0, output_tokens=0)  # admits ``granted`` ...
    granted.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await granted
    second: Ticket = await _within(limiter.admit(input_tokens=0, output_tokens=0), 1)
    assert (_now(), second.queued) == (1, 0)  # the slot and the window's room came back
    limiter.settle(second, input_tokens=0, output_tokens=0)
    assert await _admitted_at(limiter) == round(10 + SKEW, 6)  # first and second fill the window


@pytest.mark.parametrize(("limit", "per", "rounds"), [(5, 10, 4), (50, 60, 3), (1, 1, 6)])
async def test_throughput_is_the_limit_per_window_plus_the_skew(
    limit: int, per: float, rounds: int
) -> None:
    limiter = _limiter(requests=_w(limit, per))
    times = await asyncio.gather(*(_admitted_at(limiter) for _ in range(limit * rounds)))
    expected = [round(r * (per + SKEW), 6) for r in range(rounds) for _ in range(limit)]
    assert sorted(times) == expected


async def test_queued_seconds_are_recorded_on_the_ticket_and_in_stats() -> None:
    limiter = _limiter(requests=_w(1, 10))
    first = await limiter.admit(input_tokens=0, output_tokens=0)
    assert first.queued == 0
    await asyncio.sleep(3)
    second = await _within(limiter.admit(input_tokens=0, output_tokens=0))
    assert round(second.queued, 6) == round(7 + SKEW, 6)
    assert limiter.stats() == {
        "admitted": 2,
        "queuedSeconds": round(7 + SKEW, 6),
        "inFlight": 2,
        "waiting": 0,
    }


async def test_an_injected_clock_sets_the_windows_and_the_loop_runs_the_timers() -> None:
    loop = asyncio.get_running_loop()
    limiter = Limiter(
        requests=_w(1, 10),
        input_tokens=None,
        output_tokens=None,
        max_in_flight=None,
        clock=lambda: loop.time() + 1000,
    )
    await _admitted_at(limiter)
    ticket = await _within(limiter.admit(input_tokens=0, output_tokens=0))
    assert round(ticket.queued, 6) == round(10 + SKEW, 6)
    assert _now() == round(10 + SKEW, 6)


async def test_a_request_counts_from_when_it_was_sent_not_from_its_admission() -> None:
    # Admitted at 0 but sent at 0.5 (the loop was busy): the next of a one-per-10-s
    # window may reach the upstream no sooner than 10 s after the first did.
    limiter = _limiter(requests=_w(1, 10))
    ticket = await _within(limiter.admit(input_tokens=0, output_tokens=0))
    await asyncio.sleep(0.5)
    limiter.sent(ticket)
    limiter.settle(ticket, input_tokens=0, output_tokens=0)
    assert await _admitted_at(limiter) == round(0.5 + 10 + SKEW, 6)


# -- the learned ceiling --------------------------------------------------------------


class _NoJitter(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


async def test_one_burst_of_throttled_requests_makes_one_pause_then_the_learned_pace() -> None:
    told: list[Learned] = []
    limiter = Limiter(
        requests=None,
        input_tokens=None,
        output_tokens=None,
        max_in_flight=None,
        rng=_NoJitter(),
        told=told.append,
    )
    # Slow start lets one go, then two once it is through, then four; the upstream
    # refuses the four at t=1, asking 9 s.
    for size in (1, 2):
        tickets = [
            await _within(limiter.admit(input_tokens=0, output_tokens=0), 1) for _ in range(size)
        ]
        for ticket in tickets:
            limiter.answered(ticket)
            limiter.settle(ticket, input_tokens=0, output_tokens=0)
    burst = [await _within(limiter.admit(input_tokens=0, output_tokens=0), 1) for _ in range(4)]
    assert _now() == 0
    await asyncio.sleep(1)
    pauses = [limiter.throttled(ticket, 9.0) for ticket in burst]
    for ticket in burst:
        limiter.release(ticket)
    # One pause (a new episode, backoff level 0, Retry-After its floor); the other three
    # were admitted before it began: its episode, no escalation, no pause of their own.
    assert pauses == [Pause(seconds=9.0, until=10.0, level=0, new_episode=True), None, None, None]
    assert limiter.paused_until == 10
    # One more fits at 10, when the three that got through at 0 leave: a 10 s window
    # (not the 9 s asked) of three, from 4 throttles.
    assert [(k.per_window, k.window, k.throttles) for k in told][-1] == (3.0, 10.0, 4)

    retried: list[float] = []

    async def retry() -> None:
        ticket = await limiter.admit(input_tokens=0, output_tokens=0)
        retried.append(_now())
        limiter.answered(ticket)
        limiter.settle(ticket, input_tokens=0, output_tokens=0)

    await _within(asyncio.gather(*(retry() for _ in range(4))))
    # After the pause, paced at the learned rate: the first at its end, two more a
    # window (widened by ESTIMATED_MARGIN) after the burst's starts, then the fourth a
    # window after the first.
    m = ESTIMATED_MARGIN
    assert retried == [10, round(10 * m, 6), round(10 * m, 6), round(10 + 10 * m, 6)]


async def test_a_stated_limit_that_changes_scales_the_pace_at_once() -> None:
    limiter = Limiter(
        requests=None,
        input_tokens=None,
        output_tokens=None,
        max_in_flight=None,
        learned=Learned(rate=0.2, window=10, throttles=1),  # 2 per 10 s
    )
    limiter.observe(Remaining(requests_limit=2))  # what it learned: nothing changes
    times: list[float] = []

    async def caller() -> None:
        times.append(await _admitted_at(limiter))

    callers = asyncio.gather(*(caller() for _ in range(4)))
    await asyncio.sleep(6)
    assert times == [0, 5.25]  # 1.05 / 0.2 apart; the next was due at 10.5 ...
    limiter.observe(Remaining(requests_limit=4))  # ... until the upstream said 4
    await _within(callers)
    assert times == [0, 5.25, 7.875, 10.5]
    assert limiter.ceiling.known() == Learned(rate=0.4, window=10, throttles=1)


async def test_a_share_of_the_limit_re_paces_the_waiting_head() -> None:
    limiter = Limiter(
        requests=None,
        input_tokens=None,
        output_tokens=None,
        max_in_flight=None,
        learned=Learned(rate=0.2, window=10, throttles=1),
    )
    assert await _admitted_at(limiter) == 0
    waiting = asyncio.create_task(_admitted_at(limiter))  # due at 5.25 alone
    await asyncio.sleep(1)
    limiter.shared(0.5)  # another job shares the key: half the pace
    await asyncio.sleep(6)
    assert not waiting.done()
    assert await _within(waiting) == 10.5
    limiter.shared(1.0)
    assert await _admitted_at(limiter) == 15.75


async def test_a_share_scales_each_declared_window() -> None:
    limiter = _limiter(requests=_w(4, 10), input_tokens=_w(1000, 10))
    limiter.shared(0.5)
    times = [await _admitted_at(limiter, input_tokens=100) for _ in range(4)]
    assert times == [0, 0, round(10 + SKEW, 6), round(10 + SKEW, 6)]
    limiter.shared(1.0)
    assert [await _admitted_at(limiter) for _ in range(2)] == [round(10 + SKEW, 6)] * 2


async def test_a_request_settled_without_an_answer_is_forgotten_by_the_ceiling() -> None:
    limiter = Limiter(
        requests=None,
        input_tokens=None,
        output_tokens=None,
        max_in_flight=None,
        rng=_NoJitter(),
    )
    # Slow start: one, two more after RAMP_S (none got through), one more after another.
    tickets = [await _within(limiter.admit(input_tokens=0, output_tokens=0)) for _ in range(4)]
    assert round(_now(), 3) == 4
    await asyncio.sleep(1)
    for ticket in tickets[:3]:
        limiter.release(ticket)  # the upstream could not be reached
    limiter.throttled(tickets[3], 10.0)
    limiter.release(tickets[3])
    # Had the three been running still, or got through, the window would hold 3.
    known = limiter.ceiling.known()
    assert known is not None
    assert (known.per_window, known.window) == (1.0, 10.0)


async def test_a_seeded_rate_is_not_probed_early_on_a_clock_far_from_zero() -> None:
    # A loop's monotonic clock reads hours or days; the seed's refused rate (one
    # request a window above it) must still hold for HOLD_MAX windows from the start.
    loop = asyncio.get_running_loop()
    limiter = Limiter(
        requests=None,
        input_tokens=None,
        output_tokens=None,
        max_in_flight=None,
        clock=lambda: loop.time() + 86_400,
        learned=Learned(rate=0.2, window=10, throttles=1),
    )
    times = [await _admitted_at(limiter) for _ in range(12)]
    assert {round(b - a, 6) for a, b in itertools.pairwise(times)} == {5.25}
