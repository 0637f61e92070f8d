"""The feed between the event loop reading a pipe and the selection's worker thread."""

from __future__ import annotations

import asyncio
import io
import threading

import pytest

from fanout.backlog.feed import Feed
from fanout.errors import InputFailed


class _Pipe(asyncio.ReadTransport):
    """Records what the feed asks of the pipe it reads."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def is_closing(self) -> bool:
        return False


async def test_the_feed_stops_reading_the_pipe_while_sixteen_chunks_wait() -> None:
    feed = Feed(asyncio.get_running_loop())
    pipe = _Pipe()
    protocol = feed.protocol()
    protocol.connection_made(pipe)
    for n in range(20):
        assert isinstance(protocol, asyncio.Protocol)
        protocol.data_received(b"%02d" % n)
    # Paused once, at the 16th chunk; the four after it came from the pipe's buffer.
    assert pipe.calls == ["pause"]
    reader = io.BufferedReader(feed, 2)
    # Reading it down to half the bound asks the loop to read the pipe again.
    got = await asyncio.to_thread(lambda: [reader.read(2) for _ in range(12)])
    assert got == [b"%02d" % n for n in range(12)]
    await asyncio.sleep(0)
    assert pipe.calls == ["pause", "resume"]
    protocol.eof_received()
    assert await asyncio.to_thread(reader.read) == b"".join(b"%02d" % n for n in range(12, 20))


async def test_abandon_wakes_a_thread_waiting_for_output_at_once() -> None:
    feed = Feed(asyncio.get_running_loop())
    feed.protocol().connection_made(_Pipe())
    waiting = threading.Event()

    def read() -> bytes:
        waiting.set()
        return feed.read(1)

    reading = asyncio.ensure_future(asyncio.to_thread(read))
    await asyncio.to_thread(waiting.wait)
    feed.abandon()
    with pytest.raises(InputFailed) as caught:
        await reading
    assert str(caught.value) == "input command stopped: the run is ending"
