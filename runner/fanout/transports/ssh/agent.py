"""One long-lived channel running the remote agent (``agent.sh``), and retiring it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import asyncssh

from .connection import Connection

# How long a retired agent may take to kill its sandbox's processes and remove it.
TEARDOWN_GRACE = 5.0


@dataclass(eq=False)
class Agent:
    """One long-lived channel running the agent, serving one sandbox at a time."""

    connection: Connection
    process: asyncssh.SSHClientProcess[bytes]
    retired: bool = False
    reaper: asyncio.Task[None] | None = None

    def usable(self) -> bool:
        return not self.retired and not self.connection.closed and self.process.exit_status is None

    def connection_alive(self) -> bool:
        return not self.connection.closed and not self.connection.conn.is_closed()


async def reap(agent: Agent) -> None:
    """Wait (bounded) for a retired agent to exit, then release its channel."""
    try:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(agent.process.wait_closed(), TEARDOWN_GRACE)
    finally:
        agent.connection.channels -= 1
        with contextlib.suppress(Exception):
            agent.process.close()


def cut_lifeline(process: asyncssh.SSHClientProcess[bytes]) -> None:
    """EOF on the agent's stdin: it kills whatever of its sandbox still runs, removes
    the sandbox and exits."""
    with contextlib.suppress(Exception):
        process.stdin.write_eof()
