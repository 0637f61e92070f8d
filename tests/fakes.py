"""A scripted transport for logic tests (the real ones are tested with real processes)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from fanout.attempt import Attempt
from fanout.outcome import AttemptResult, Status

Script = Callable[[Attempt], AttemptResult]


def ok(attempt: Attempt) -> AttemptResult:
    return AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0, duration=1.0)


@dataclass
class FakeTransport:
    """Runs every attempt through ``script`` after ``delay`` seconds (virtual under
    looptime), recording what it was asked to run and the peak concurrency."""

    script: Script = ok
    slots: int = 1000
    delay: float = 1.0
    attempts: list[Attempt] = field(default_factory=list)
    running: int = 0
    peak: int = 0
    started: bool = False
    closed: bool = False
    # Seconds ``close`` takes (virtual under looptime): a host that stopped answering.
    close_delay: float = 0.0

    @property
    def capacity(self) -> int:
        return self.slots

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        if self.close_delay:
            await asyncio.sleep(self.close_delay)
        self.closed = True

    async def run(self, attempt: Attempt) -> AttemptResult:
        self.attempts.append(attempt)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delay)
            return self.script(attempt)
        finally:
            self.running -= 1
