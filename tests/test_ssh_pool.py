"""The SSH host pool's own bookkeeping, without an sshd: what ``close`` waits for."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

from fanout.spec import Host
from fanout.transports.ssh.connection import Connection, Connector
from fanout.transports.ssh.pool import HostPool


class NoWait(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return 0.0


class HangingConnector:
    """A connect that never completes and, once cancelled, takes a moment to let go."""

    def __init__(self) -> None:
        self.connecting = asyncio.Event()
        self.let_go = False

    async def connect(self, host: Host, handshakes: asyncio.Semaphore, room: int) -> Connection:
        self.connecting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.sleep(0.05))
            self.let_go = True
            raise
        raise AssertionError("unreachable")


async def test_close_awaits_the_reconnect_it_cancels() -> None:
    connector = HangingConnector()
    pool = HostPool(
        [Host(name="box", address="box")],
        connector=cast(Connector, connector),
        notice=lambda line: None,
        emit=None,
        rng=NoWait(),
    )
    state: Any = pool._hosts[0]
    state.healthy = True
    await pool.lost(state, "test: dropped")  # the host is brought back in the background
    await connector.connecting.wait()
    await pool.close()
    assert connector.let_go
    assert state.reconnecting is not None
    assert state.reconnecting.done()
