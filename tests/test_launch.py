"""``launch.Drain``: a request stops the run it is bound to, before or while it runs,
and does nothing once the run has ended."""

from __future__ import annotations

import asyncio
from typing import cast

from fanout.errors import Interrupted
from fanout.run.job import Runner
from fanout.run.launch import Drain


class StopRecorder:
    def __init__(self) -> None:
        self.stops: list[str] = []

    def stop(self, error: Exception) -> None:
        assert isinstance(error, Interrupted)
        self.stops.append(str(error))


async def test_a_request_before_the_run_stops_it_as_it_starts() -> None:
    drain, runner = Drain(), StopRecorder()
    drain.request()
    with drain.bound(asyncio.get_running_loop(), cast(Runner, runner)):
        assert runner.stops == [Drain.REASON]


async def test_a_request_while_bound_stops_the_run_and_after_it_nothing() -> None:
    drain, runner = Drain(), StopRecorder()
    loop = asyncio.get_running_loop()
    with drain.bound(loop, cast(Runner, runner)):
        assert runner.stops == []
        await loop.run_in_executor(None, drain.request)  # from another thread
        await asyncio.sleep(0)
        assert runner.stops == [Drain.REASON]
    drain.request()
    await asyncio.sleep(0)
    assert runner.stops == [Drain.REASON]
