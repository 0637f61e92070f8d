"""The worker slot pool's order: first come, first served, throttled units last."""

from __future__ import annotations

import asyncio

import pytest

from fanout.pacing.slots import Lane, Slots

pytestmark = pytest.mark.looptime


async def _granted(slots: Slots, waiters: list[tuple[str, Lane]]) -> list[str]:
    """Queue ``waiters`` in order on a full pool; the order in which they get a slot."""
    order: list[str] = []

    async def wait(name: str, lane: Lane) -> None:
        await slots.take(lane)
        order.append(name)

    tasks = []
    for name, lane in waiters:
        tasks.append(asyncio.create_task(wait(name, lane)))
        await asyncio.sleep(0)  # queued in this order
    for _ in waiters:
        slots.give()
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), 1)
    return order


async def test_fresh_waiters_go_first_in_arrival_order_then_throttled_ones() -> None:
    slots = Slots(1)
    await slots.take()
    slots.backlog_closed()
    order = await _granted(
        slots,
        [("t1", Lane.BACK), ("a", Lane.FRESH), ("t2", Lane.BACK), ("b", Lane.FRESH)],
    )
    assert order == ["a", "b", "t1", "t2"]


async def test_throttled_units_wait_until_the_whole_backlog_is_read() -> None:
    slots = Slots(2)
    back = asyncio.create_task(slots.take(Lane.BACK))
    await asyncio.sleep(1)
    assert not back.done()  # two free slots, but the backlog may still hold units
    slots.backlog_closed()
    await asyncio.wait_for(back, 1)


async def test_a_cancelled_waiter_loses_no_slot() -> None:
    slots = Slots(1)
    await slots.take()
    gone = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    gone.cancel()
    slots.give()  # the cancelled waiter's place goes to the next one
    await asyncio.wait_for(slots.take(), 1)
    with pytest.raises(asyncio.CancelledError):
        await gone
