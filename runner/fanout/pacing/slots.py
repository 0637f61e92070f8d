"""The pool of worker slots and the order in which waiting units get them.

Fairness rule.  Slots are granted first come, first served, in two lanes:

    fresh   the backlog's next unit and units retrying after a failure's backoff
    back    units whose last attempt was throttled

A ``back`` waiter gets a slot only when no ``fresh`` waiter is waiting and the whole
backlog has been read (``backlog_closed``): a unit an API has just refused waits behind
every unit still to start, so healthy units are not held up by it, and the API sees the
refused work last.  That order matters more than it looks: each throttled start pauses
the whole fleet (see ``limits``), so retrying the refused unit first would multiply the
pauses everybody waits out.  Within a lane the order is arrival order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from enum import Enum


class Lane(Enum):
    FRESH = "fresh"
    BACK = "back"


class Slots:
    """``size`` worker slots, granted in the order of the fairness rule above."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: dict[Lane, deque[asyncio.Future[None]]] = {lane: deque() for lane in Lane}
        self._backlog_open = True

    async def take(self, lane: Lane = Lane.FRESH) -> None:
        """Wait for a slot in ``lane``'s turn."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[lane].append(waiter)
        self._grant()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()  # granted, then cancelled before it could be used
            elif waiter in self._waiting[lane]:
                self._waiting[lane].remove(waiter)
            raise

    def give(self) -> None:
        self._free += 1
        self._grant()

    def backlog_closed(self) -> None:
        """The producer has read every unit of the backlog: ``back`` units may go."""
        self._backlog_open = False
        self._grant()

    def _grant(self) -> None:
        while self._free > 0:
            queue = self._waiting[Lane.FRESH]
            if not queue and not self._backlog_open:
                queue = self._waiting[Lane.BACK]
            if not queue:
                return
            waiter = queue.popleft()
            if not waiter.done():  # a cancelled waiter leaves its place to the next
                self._free -= 1
                waiter.set_result(None)
