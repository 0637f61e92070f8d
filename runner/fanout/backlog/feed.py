"""A bounded stream of bytes from a pipe read on the event loop to a worker thread.

The event loop reads the pipe (``Feed.protocol``); a worker thread reads the feed as a
blocking binary stream.  At most ``_MOST_CHUNKS`` chunks wait in between: past that the
loop stops reading the pipe, so a command writing faster than the selection is parsed
blocks on its pipe instead of filling the coordinator's memory.  ``abandon`` wakes the
reading thread at once, whatever the pipe does: the thread then raises, and nothing
waits for a writer that may never close the pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import threading
from collections import deque

from ..errors import InputFailed

# asyncio reads a pipe 256 KiB at a time: 16 chunks hold at most 4 MiB.
_MOST_CHUNKS = 16


class Feed(io.RawIOBase):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._loop = loop
        self._cond = threading.Condition()
        self._chunks: deque[memoryview] = deque()
        self._ended = False
        self._abandoned = False
        self._paused = False
        # How long the loop has left the pipe unread because the feed was full: the
        # time the selection held the command back (``held``).
        self._held = 0.0
        self._paused_at = 0.0
        self._transport: asyncio.ReadTransport | None = None

    def protocol(self) -> asyncio.Protocol:
        """The protocol that reads the pipe into this feed (``loop.connect_read_pipe``)."""
        return _Reading(self)

    # The event loop's side.

    def _attach(self, transport: asyncio.ReadTransport) -> None:
        self._transport = transport

    def _put(self, data: bytes) -> None:
        with self._cond:
            if self._abandoned:
                return
            self._chunks.append(memoryview(data))
            self._cond.notify()
            if len(self._chunks) >= _MOST_CHUNKS and not self._paused and self._transport:
                self._paused = True
                self._paused_at = self._loop.time()
                self._transport.pause_reading()

    def end(self) -> None:
        """The pipe is closed: the thread reads what is left, then end of file."""
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def abandon(self) -> None:
        """Nobody will read on: drop what waits, make the reading thread raise."""
        with self._cond:
            self._abandoned = True
            self._chunks.clear()
            self._cond.notify_all()

    def held(self) -> float:
        """Seconds the pipe has been left unread so far because the selection had not
        read what waited (it goes at the pace units are dispatched): time the command
        spent blocked on its pipe by fanout, which its timeout does not count."""
        with self._cond:
            return self._held + (self._loop.time() - self._paused_at if self._paused else 0.0)

    def _resume(self) -> None:
        transport = self._transport
        if transport is not None and not self._abandoned and not transport.is_closing():
            transport.resume_reading()

    # The worker thread's side.

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        with self._cond:
            while not (self._chunks or self._ended or self._abandoned):
                self._cond.wait()
            if self._abandoned:
                raise InputFailed("input command stopped: the run is ending")
            if not self._chunks:
                return 0
            chunk = self._chunks[0]
            size = min(len(buffer), len(chunk))
            buffer[:size] = chunk[:size]
            if size == len(chunk):
                self._chunks.popleft()
            else:
                self._chunks[0] = chunk[size:]
            resume = self._paused and len(self._chunks) <= _MOST_CHUNKS // 2
            if resume:
                self._paused = False
                self._held += self._loop.time() - self._paused_at
        if resume:
            # RuntimeError: the loop closed, the run is over.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._resume)
        return size


class _Reading(asyncio.Protocol):
    def __init__(self, feed: Feed) -> None:
        self._feed = feed

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.ReadTransport)
        self._feed._attach(transport)

    def data_received(self, data: bytes) -> None:
        self._feed._put(data)

    def eof_received(self) -> bool:
        self._feed.end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._feed.end()
