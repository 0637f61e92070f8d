"""One long-lived channel running the remote agent loop (``wrapper.sh``): sending it a
unit, reading the verdict and the output back, and retiring it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

import asyncssh

from .. import protocol
from ..capture import OutputCapture
from .connection import Connection, describe

# How long a retired agent may take to kill its unit and remove the sandbox.
TEARDOWN_GRACE = 5.0


@dataclass(eq=False)
class Agent:
    """One long-lived channel running the agent loop, serving one unit at a time."""

    connection: Connection
    process: asyncssh.SSHClientProcess[bytes]
    network: bool
    retired: bool = False
    reaper: asyncio.Task[None] | None = None

    def usable(self) -> bool:
        return not self.retired and not self.connection.closed and self.process.exit_status is None

    def connection_alive(self) -> bool:
        return not self.connection.closed and not self.connection.conn.is_closed()


async def converse(
    agent: Agent, message: bytes, token: str, mark: str, capture: OutputCapture
) -> protocol.Report:
    """Send one unit to the agent and read its verdict and its output."""
    process = agent.process
    report = protocol.Report()
    try:
        process.stdin.write(message)
        await process.stdin.drain()
    except (OSError, asyncssh.Error) as exc:
        report.lost = describe(exc)
        return report
    pump = asyncio.create_task(protocol.read_output(process.stderr, mark, capture))
    try:
        await protocol.read_verdict(process.stdout, token, report)
        if report.complete:
            await pump
    except (OSError, asyncssh.Error, asyncio.IncompleteReadError) as exc:
        report.lost = describe(exc)
    finally:
        pump.cancel()
    if not report.complete and not report.lost and not report.refused:
        status = process.exit_status
        report.lost = f"the channel closed during the unit (agent exit status {status})"
    return report


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
    """EOF on the wrapper's stdin: it kills whatever of the unit still runs."""
    with contextlib.suppress(Exception):
        process.stdin.write_eof()
