"""The round's unit tasks: owned by their group, and a stop interrupts only those that
wait, never one whose worker runs or one that has not begun."""

from __future__ import annotations

import asyncio

import pytest

from fanout.run.round import UnitTasks


async def test_interrupt_cancels_the_waiting_and_spares_the_working() -> None:
    units = UnitTasks()
    seen: list[str] = []
    working = asyncio.Event()
    finish = asyncio.Event()

    async def waits() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("waiting: interrupted")
            raise

    async def works() -> None:
        with units.working():
            working.set()
            await finish.wait()
        seen.append("working: finished")

    async with units:
        units.start(waits)
        units.start(works)
        await working.wait()
        assert units.working_count == 1
        units.interrupt()
        await asyncio.sleep(0)
        finish.set()
    assert seen == ["waiting: interrupted", "working: finished"]
    assert units.working_count == 0


async def test_a_task_that_has_not_begun_is_not_cancelled_and_runs() -> None:
    units = UnitTasks()
    ran: list[str] = []

    async def unit() -> None:
        ran.append("ran")

    async with units:
        units.start(unit)
        units.interrupt()  # before the task's first step
    assert ran == ["ran"]


async def test_the_group_awaits_every_task_when_cancelled_from_outside() -> None:
    units = UnitTasks()
    cleaned: list[str] = []

    async def unit() -> None:
        try:
            with units.working():
                await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # clean-up that awaits still runs to its end
            cleaned.append("cleaned")

    async def body() -> None:
        async with units:
            units.start(unit)
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["cleaned"]
