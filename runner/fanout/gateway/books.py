"""The gateway's books in the journal: each attempt's running usage, written as its
requests start and end, so a coordinator killed mid-attempt (SIGKILL, a crash) loses
none of the money it spent.

A request's reservation (``usage.Hold``: what its prompt and output cap may cost) is
in the journal before the request is sent: it waits for that write, made at the
loop's next turn.  Its answer's usage replaces the reservation in a later write, not
waited for: the next reservation's, or one ``SETTLE_DELAY`` later; until then the
journal holds the reservation.  So after a kill the journal has every answered request
at its usage, and every request in flight (and any answered in the moment before) at
its reservation: a resumed run's budgets count them all, and none twice.

One write carries every attempt whose ledger changed since the last, in one short
transaction, its rows replaced whole (running totals, never increments: writing one
again, or at the attempt's end, counts nothing twice).  A busy gateway's reservations
share writes: all those of one turn of the loop go in one transaction
(``bench/gateway.py`` measures how many a request costs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Protocol

from ..errors import FanoutError
from ..outcome import ApiUsage

# How long an answered request's usage may wait for a write to go with: its
# reservation is in the journal meanwhile.
SETTLE_DELAY = 0.05

# Whose usage a ledger holds in the journal: (round, unit id, attempt number).
Whose = tuple[int, str, int]
# Writes each attempt's usage so far, in one transaction (the journal's
# ``record_usages`` for the run): (round, unit id, attempt number, usage per API).
Write = Callable[[Sequence[tuple[int, str, int, tuple[ApiUsage, ...]]]], None]


class Ledger(Protocol):
    """What the books read of a ledger (``usage.Ledger``, which imports this module)."""

    @property
    def whose(self) -> Whose | None: ...

    def used(self) -> tuple[ApiUsage, ...]: ...


class Books:
    """The writes of the attempts' ledgers to the journal.  Nothing is written until
    ``keep`` gives a writer (a gateway outside a run: tests, the benchmarks)."""

    def __init__(self) -> None:
        self._write: Write | None = None
        self._failed: Callable[[FanoutError], None] = _ignore
        # The ledgers changed since the last write (a dict as an ordered set).
        self._changed: dict[Ledger, None] = {}
        self._waiters: list[asyncio.Future[None]] = []
        # The write to come: at the loop's next turn (``_soon``) or later.
        self._timer: asyncio.Handle | None = None
        self._soon = False

    def keep(self, write: Write, *, failed: Callable[[FanoutError], None]) -> None:
        """Write to ``write`` from now; a write that fails (a full or broken disk) is
        passed to ``failed`` (which stops the run) and the requests go on."""
        self._write, self._failed = write, failed

    def changed(self, ledger: Ledger) -> None:
        """``ledger`` changed: written within ``SETTLE_DELAY``, not waited for."""
        if self._write is None or ledger.whose is None:
            return
        self._changed[ledger] = None
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(SETTLE_DELAY, self._flush)

    async def written(self, ledger: Ledger) -> None:
        """``ledger`` changed: returns once the journal has it (at once without a
        writer).  A cancelled wait leaves the change to be written all the same."""
        if self._write is None or ledger.whose is None:
            return
        self._changed[ledger] = None
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if not self._soon:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = asyncio.get_running_loop().call_soon(self._flush)
            self._soon = True
        await waiter

    def now(self, ledger: Ledger) -> None:
        """Write ``ledger`` (and every other change) now, raising what the journal
        raises: an attempt's end is in the journal when it returns."""
        if self._write is None or ledger.whose is None:
            return
        self._changed[ledger] = None
        self._flush(raising=True)

    def close(self) -> None:
        """Write what is left (the gateway closes, after the run's end is recorded):
        the usage of requests that ended after their attempts.  A failure now stops
        nothing (the run has ended; its report has their reservations)."""
        self._failed = _ignore
        if self._changed:
            self._flush()

    def _flush(self, *, raising: bool = False) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._soon = None, False
        changed, self._changed = list(self._changed), {}
        waiters, self._waiters = self._waiters, []
        write = self._write
        assert write is not None
        try:
            if changed:
                write([(*_whose(ledger), ledger.used()) for ledger in changed])
        except FanoutError as error:
            # Kept, to go with the next write (the attempt's end, the close), which
            # may find the disk writable again.  The run stops: resumable.
            self._changed = {**dict.fromkeys(changed), **self._changed}
            if raising:
                raise
            self._failed(error)
        finally:
            # The requests go on even if the write failed: their money still counts in
            # this process, and the run is stopping.
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


def _whose(ledger: Ledger) -> Whose:
    assert ledger.whose is not None
    return ledger.whose


def _ignore(error: FanoutError) -> None:
    return None
