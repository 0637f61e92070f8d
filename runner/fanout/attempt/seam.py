"""The seam between an attempt and the places workers run: what the dispatcher sees of
a transport (``Transport``), and a transport that opens sandboxes (``Sandboxes``, every
real one), whose ``run`` is ``attempt.driver.execute``.  ``attempt.sandbox`` says what a
sandbox does."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

from .sandbox import Sandbox

if TYPE_CHECKING:
    from ..outcome import AttemptResult
    from .model import Attempt


class Transport(Protocol):
    """Runs attempts somewhere.  ``capacity`` is how many can run at once.  What the
    dispatcher and the run see; a scripted fake implements just this."""

    @property
    def capacity(self) -> int: ...

    async def start(self) -> None:
        """Prepare (connect to hosts, check the sandbox tool).  May raise FanoutError."""

    async def run(self, attempt: Attempt) -> AttemptResult:
        """Run one attempt to its end and tear its sandbox down, whatever happens."""
        ...

    async def close(self) -> None:
        """Release connections; running attempts have already been cancelled."""


class Sandboxes(Transport, Protocol):
    """A transport that opens sandboxes: every real one.  Its ``run`` is
    ``attempt.execute(attempt, self)``, the one driver."""

    def sandbox(self, attempt: Attempt) -> AbstractAsyncContextManager[Sandbox]:
        """A fresh sandbox for ``attempt`` on a free host (waiting for one), removed
        with everything it started when the block ends.  Leaving it never raises."""
        ...
