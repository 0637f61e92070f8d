"""The pool of SSH hosts: each host's state, bringing hosts up and back (reconnects with
backoff, quarantine), the host events, placing attempts on the least loaded healthy host,
and opening agent channels within sshd's limits.  (The package docstring tells the whole
story; ``transport`` runs attempts on top of this pool.)"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import asyncssh

from ...errors import HostsUnavailable
from ...isolation.place import Place
from ...pacing.backoff import EQUAL, Backoff
from ...spec import Host
from . import forward, wire
from .agent import Agent, cut_lifeline, reap
from .connection import MAX_HANDSHAKES, Connection, Connector
from .failures import Lost, Refused, Unreachable, describe

QUARANTINE_AFTER = 3
# A down host's reconnects: 1, 2, 4 ... 30 s, each at least half that.
RECONNECT = Backoff(initial=1.0, max=30.0, jitter=EQUAL)
CHANNEL_RETRY_FOR = 10.0


@dataclass(eq=False)
class HostState:
    """One host's place in the pool: its connections, idle agents, load and health."""

    host: Host
    per_connection: int
    handshakes: asyncio.Semaphore
    connections: list[Connection] = field(default_factory=list)
    running: int = 0
    healthy: bool = False
    quarantined: bool = False
    failures: int = 0
    reason: str = "not connected yet"
    sandbox: str = "none"
    unshare: str | None = None  # unshare flags for the agent (None: none)
    python: str | None = None  # the host's python3, which runs each agent's keeper
    # The host's facts its sandboxes' commands are built from (``transport.Place``),
    # and the absolute sandbox root there: both learned when the host comes up.
    place: Place = field(default_factory=lambda: Place(host="", kind="none", base="", path=""))
    root: str = "/tmp"
    warned: bool = False  # the notice that this host contains units by process group only
    reconnecting: asyncio.Task[None] | None = None
    opening: asyncio.Lock = field(default_factory=asyncio.Lock)
    idle: list[Agent] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.host.name

    def free(self) -> int:
        return self.host.slots - self.running if self.healthy else 0


# How long ``close`` waits for a cancelled reconnect to let go.
RECONNECT_LET_GO = 5.0


class HostPool:
    """The hosts, their connections and idle agents.  What a host must offer to be used
    (and which sandbox it gets) is the transport's decision: ``_choose_sandbox``."""

    def __init__(
        self,
        hosts: Sequence[Host],
        *,
        connector: Connector,
        notice: Callable[[str], None],
        emit: Callable[..., None] | None,
        rng: random.Random | None,
        gateway_port: int | None = None,
        network: bool | Literal["apis"] = False,
    ) -> None:
        self._hosts = [
            HostState(
                host=h,
                per_connection=max(1, h.max_sessions - 2),
                handshakes=asyncio.Semaphore(MAX_HANDSHAKES),
            )
            for h in hosts
        ]
        self._connector = connector
        self._notice = notice
        # ``Events.emit`` of the run: host states and placements as structured events
        # (``host.up``, ``host.lost``, ``host.quarantined``, ``attempt.placed``), which the
        # display and the event log read.  Without it host states are notices (text).
        self._emit = emit
        self._rng = rng or random.Random()
        self._changed = asyncio.Condition()
        self._script = wire.agent_script()
        self._keeper = wire.keeper_script()
        self._reapers: set[asyncio.Task[None]] = set()
        # The coordinator's API gateway (None: the run has none): every connection
        # forwards a loopback port of its host there.
        self._gateway_port = gateway_port
        # network "apis": the forward is a unix socket on the host, bound into sandboxes
        # with a network of their own.
        self._network = network

    @property
    def capacity(self) -> int:
        return sum(h.host.slots for h in self._hosts)

    # Connections ----------------------------------------------------------------

    async def _connect(self, state: HostState) -> Connection:
        connection = await self._connector.connect(
            state.host, state.handshakes, state.per_connection
        )
        state.connections.append(connection)
        if self._gateway_port is not None:
            try:
                make = forward.forward_path if self._network == "apis" else forward.forward
                connection.forward = await make(connection.conn, state.name, self._gateway_port)
            except (Refused, Lost):
                connection.closed = True
                connection.conn.abort()
                state.connections.remove(connection)
                raise
        return connection

    async def _choose_sandbox(self, state: HostState, connection: Connection) -> str:
        """The sandbox the host gets, from what it offers on the connection it came up (or
        back) on; Refused for a host that cannot serve this run (``SshTransport``'s)."""
        raise NotImplementedError

    async def _bring_up(self, state: HostState) -> None:
        try:
            connection = await self._connect(state)
            if connection.forward is not None and connection.forward.path is None:
                # Once per host (up or back): sshd binds every forward of the host alike.
                try:
                    await forward.exposure(connection.conn, state.name, connection.forward.port)
                except Refused:
                    await connection.forward.close()  # not one moment longer on the network
                    raise
            state.sandbox = await self._choose_sandbox(state, connection)
            if connection.forward is not None:
                state.place = connection.forward.apply(state.place)
        except Refused as exc:
            state.quarantined, state.reason = True, str(exc)
            raise
        except (Unreachable, Lost) as exc:
            state.reason = str(exc)
            self._schedule_reconnect(state)
            raise
        state.healthy, state.failures, state.reason = True, 0, ""

    def _schedule_reconnect(self, state: HostState) -> None:
        if state.reconnecting is None or state.reconnecting.done():
            state.reconnecting = asyncio.create_task(self._reconnect(state))

    async def _reconnect(self, state: HostState) -> None:
        while not state.quarantined:
            state.failures += 1
            if state.failures > QUARANTINE_AFTER:
                state.quarantined = True
                self._changed_state(
                    state,
                    "quarantined",
                    f"host {state.name} quarantined after {QUARANTINE_AFTER} failed"
                    f" reconnects: {state.reason}",
                    reason=f"{QUARANTINE_AFTER} failed reconnects: {state.reason}",
                )
                break
            await asyncio.sleep(RECONNECT.delay(state.failures, self._rng))
            try:
                await self._bring_up(state)
            except Refused as exc:
                # _bring_up quarantined it (a changed host key, say): say why, once.
                self._notice(f"host {state.name} quarantined: {exc}")
                break
            except (Unreachable, Lost):
                continue
            self._changed_state(
                state, "up", f"host {state.name} is back", sandbox=state.sandbox, back=True
            )
            break
        async with self._changed:
            self._changed.notify_all()

    def unremovable(self, state: HostState, name: str) -> None:
        """The agent could not remove a sandbox (``agent.sh``'s ``remove``) and left it
        in the host's sandbox root as ``name``: said once, where nothing looks again."""
        path = shlex.quote(f"{state.root.rstrip('/')}/{name}")
        self._notice(
            f"host {state.name}: cannot remove {path}: what is left in it is immutable or"
            f" append-only, a mount point, or not {state.host.user or 'the login'}'s to"
            f" remove; fanout leaves it there, remove it as root with: chattr -R -i -a"
            f" {path} && rm -rf {path}"
        )

    # What a sandbox reports of its host and agent ---------------------------------

    def idle(self, state: HostState, agent: Agent) -> None:
        """The agent left its sandbox cleanly: the host's next attempt may reuse it."""
        state.idle.append(agent)

    async def lost(self, state: HostState, reason: str) -> None:
        """The host's connection is gone (``reason``): its connections are dropped and,
        unless it is quarantined, it is brought back with backoff."""
        if state.healthy:
            state.healthy, state.reason = False, reason
            self._changed_state(state, "lost", f"host {state.name} lost: {reason}", reason=reason)
            for connection in state.connections:
                connection.closed = True
                connection.conn.abort()
            state.connections.clear()
            if not state.quarantined:
                self._schedule_reconnect(state)
        async with self._changed:
            self._changed.notify_all()

    async def quarantine(self, state: HostState, reason: str) -> None:
        """Take a host out of this run for good (a problem retrying will not fix)."""
        if not state.quarantined:
            state.quarantined = True
            self._changed_state(
                state, "quarantined", f"host {state.name} quarantined: {reason}", reason=reason
            )
        await self.lost(state, reason)

    def _changed_state(self, state: HostState, event: str, line: str, **fields: Any) -> None:
        if self._emit is None:
            self._notice(line)
        else:
            self._emit(f"host.{event}", host=state.name, slots=state.host.slots, **fields)

    async def close(self) -> None:
        reconnects = [h.reconnecting for h in self._hosts if h.reconnecting is not None]
        for reconnect in reconnects:
            reconnect.cancel()
        if reconnects:
            # Awaited (bounded): a reconnect cut off midway has left what it opened in
            # the lists closed below, and none outlives ``close``.
            await asyncio.wait(reconnects, timeout=RECONNECT_LET_GO)
        for state in self._hosts:
            for agent in state.idle:
                self.retire(agent)
            state.idle.clear()
        if self._reapers:
            # Interrupted and timed-out units' teardowns on their hosts, each bounded.
            await asyncio.wait(set(self._reapers))
        # Forwards are cancelled first, each confirmed by sshd (bounded): once close()
        # returns, no host listens for the gateway any more.
        forwards = [c.forward for h in self._hosts for c in h.connections if c.forward]
        if forwards:
            await asyncio.gather(*(f.close() for f in forwards))
        for state in self._hosts:
            for connection in state.connections:
                connection.conn.close()
            for connection in state.connections:
                with contextlib.suppress(Exception):
                    await connection.conn.wait_closed()
            state.connections.clear()

    # Placement ------------------------------------------------------------------

    async def _place(self) -> HostState:
        """The least loaded healthy host with a free slot; waits for one."""
        async with self._changed:
            while True:
                candidates = [h for h in self._hosts if h.free() > 0]
                if candidates:
                    chosen = min(candidates, key=lambda h: (h.running / h.host.slots, h.running))
                    chosen.running += 1
                    return chosen
                if all(h.quarantined for h in self._hosts):
                    raise HostsUnavailable(
                        "every SSH host is down: " + "; ".join(h.reason for h in self._hosts)
                    )
                await self._changed.wait()

    async def _release(self, state: HostState) -> None:
        state.running -= 1
        async with self._changed:
            self._changed.notify_all()

    async def _channel(
        self, state: HostState, command: str
    ) -> tuple[Connection, asyncssh.SSHClientProcess[bytes]]:
        """A channel on a connection with room, opening another connection if needed.
        A refused open (sshd's MaxSessions is lower than the inventory says) teaches the
        connection its real room, and is retried after a short jittered delay."""
        give_up = time.monotonic() + CHANNEL_RETRY_FOR
        while True:
            async with state.opening:  # one new connection at a time, counted before use
                live = [c for c in state.connections if not c.closed]
                roomy = [c for c in live if c.channels < c.room]
                if roomy:
                    connection = min(roomy, key=lambda c: c.channels)
                elif sum(c.room for c in live) < state.host.slots:
                    try:
                        connection = await self._connect(state)
                    except (Unreachable, Refused) as exc:
                        raise Lost(str(exc)) from None
                else:
                    connection = min(live, key=lambda c: c.channels)
                connection.channels += 1
            try:
                process = await connection.conn.create_process(command, encoding=None)
                return connection, process
            except asyncssh.ChannelOpenError as exc:
                connection.channels -= 1
                connection.room = max(1, min(connection.room, connection.channels))
                if time.monotonic() > give_up:
                    raise Lost(
                        f"{state.name} refused channels for {CHANNEL_RETRY_FOR:g}s: {exc.reason}"
                    ) from None
                await asyncio.sleep(self._rng.uniform(0.02, 0.15))
            except (OSError, asyncssh.Error) as exc:
                connection.channels -= 1
                raise Lost(describe(exc)) from None

    async def _agent(self, state: HostState) -> Agent:
        """An idle agent channel on a live connection, or a new one."""
        while state.idle:
            agent = state.idle.pop()
            if agent.usable():
                return agent
            self.retire(agent)
        # The agent runs in a PID namespace of its own where the host allows one: if it
        # dies (killed, out of memory), the kernel kills its sandbox's whole tree with it.
        # bwrap needs a /proc of the namespace it starts in (it opens its own
        # /proc/PID/ns); without bwrap, steps see the host's /proc, as a local step does
        # (``sandbox._INIT`` reads it).
        mount = " --mount-proc" if state.sandbox == "bwrap" else ""
        contained = f"unshare {state.unshare}{mount} " if state.unshare else ""
        # The agent's keeper makes and removes its sandbox directories (where the host
        # has python3); the token names the FIFOs it talks on.
        keeper = (state.python or "", self._keeper if state.python else "")
        command = (
            f"exec {contained}sh -c {shlex.quote(self._script)} fanout {shlex.quote(state.root)}"
            f" {secrets.token_hex(8)} {shlex.join(keeper)}"
        )
        connection, process = await self._channel(state, command)
        return Agent(connection=connection, process=process)

    def retire(self, agent: Agent) -> asyncio.Task[None]:
        """Cut an agent's lifeline; the task that ends when the agent has exited.

        At EOF the agent kills whatever of its sandbox still runs, removes the sandbox
        and exits, so when the task ends the attempt's teardown on the host is finished,
        as it is for a local attempt: a timed-out unit's next rung never starts beside
        the last one's leftovers, and ``close`` (which waits for every such task)
        returns after an interrupted run's hosts are clean.  A host that does not answer
        within agent.TEARDOWN_GRACE is left to the agent's own deadline.
        """
        if agent.reaper is None:
            agent.retired = True
            cut_lifeline(agent.process)
            agent.reaper = asyncio.get_running_loop().create_task(reap(agent))
            self._reapers.add(agent.reaper)
            agent.reaper.add_done_callback(self._reapers.discard)
        return agent.reaper
