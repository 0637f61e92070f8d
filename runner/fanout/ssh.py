"""Running attempts on a pool of SSH hosts.  The only module that imports asyncssh.

Each host gets a few long-lived connections (one handshake serves many units); each
attempt is one channel running the POSIX sh wrapper (``wrapper.sh``), which creates the
sandbox, receives the staged files as a tar frame, runs the worker under bwrap (or
without a sandbox), runs verify, sends back the collected files, and always removes
the sandbox.  Secrets travel in frames on the channel's stdin, never in argv; no pty is
requested (a pty echoes stdin).  The stdin stays open as a lifeline: when fanout stops,
times the attempt out or loses the connection, the wrapper sees EOF and kills the
unit's process group, and it enforces a hard deadline of its own as well.

sshd's limits shape the pool: at most ``maxSessions - 2`` channels per connection (sshd
frees a slot late, and refuses channel opens near the limit: those are retried after a
short jittered delay), more connections per host for more slots, and at most eight
handshakes per host at once (MaxStartups drops unauthenticated connections beyond 10).

Keepalives are always on, so a frozen host is noticed in seconds.  A connection loss
makes the attempt ``lost`` (the unit is run again elsewhere, no rung used), the host
reconnects with backoff and is quarantined after repeated failures; when no host is
left, ``run`` raises HostsUnavailable and the run stops, resumable.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import secrets
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from . import fanin, protocol
from .capture import OutputCapture
from .errors import EnvironmentProblem, HostsUnavailable
from .outcome import AttemptResult, Status
from .spec import Host
from .transport import Attempt
from .verdict import Verdict

MAX_HANDSHAKES = 8
QUARANTINE_AFTER = 3
CHANNEL_RETRY_FOR = 10.0
# How long a timed-out attempt waits for the host to finish its teardown.
TEARDOWN_GRACE = 5.0
_CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
)


class _Lost(Exception):
    """The connection under an attempt went away."""


@dataclass(eq=False)
class _Connection:
    conn: asyncssh.SSHClientConnection
    room: int  # channels this connection may carry; lowered when sshd refuses one
    channels: int = 0
    closed: bool = False


@dataclass(eq=False)
class _Host:
    host: Host
    per_connection: int
    handshakes: asyncio.Semaphore
    connections: list[_Connection] = field(default_factory=list)
    running: int = 0
    healthy: bool = False
    quarantined: bool = False
    failures: int = 0
    reason: str = "not connected yet"
    sandbox: str = "none"
    reconnecting: asyncio.Task[None] | None = None
    opening: asyncio.Lock = field(default_factory=asyncio.Lock)
    idle: list[_Agent] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.host.name

    def free(self) -> int:
        return self.host.slots - self.running if self.healthy else 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    """What ``fanout hosts check`` learns about one host."""

    name: str
    address: str
    reachable: bool
    auth: bool
    shell: str
    bwrap: bool
    free_disk: str
    rtt_ms: float | None
    error: str


class SshTransport:
    def __init__(
        self,
        hosts: Sequence[Host],
        *,
        known_hosts: Sequence[Path],
        sandbox_kind: str = "auto",
        keepalive_interval: float = 5.0,
        keepalive_count: int = 3,
        connect_timeout: float = 15.0,
        notice: Callable[[str], None] = lambda message: None,
        rng: random.Random | None = None,
    ) -> None:
        self._hosts = [
            _Host(
                host=h,
                per_connection=max(1, h.max_sessions - 2),
                handshakes=asyncio.Semaphore(MAX_HANDSHAKES),
            )
            for h in hosts
        ]
        self._known_hosts = [p for p in known_hosts]
        self._requested = sandbox_kind
        self._keepalive = (keepalive_interval, keepalive_count)
        self._connect_timeout = connect_timeout
        self._notice = notice
        self._rng = rng or random.Random()
        self._changed = asyncio.Condition()
        self._wrapper = protocol.wrapper_script()
        self._reapers: set[asyncio.Task[None]] = set()

    @property
    def capacity(self) -> int:
        return sum(h.host.slots for h in self._hosts)

    # Connections ----------------------------------------------------------------

    def _options(self, host: Host) -> dict[str, object]:
        interval, count = self._keepalive
        options: dict[str, object] = {
            "known_hosts": asyncssh.read_known_hosts(
                [str(p) for p in self._known_hosts if p.is_file()]
            ),
            "keepalive_interval": interval,
            "keepalive_count_max": count,
            "connect_timeout": self._connect_timeout,
            "login_timeout": self._connect_timeout,
            # AES-GCM first: with AES-NI it costs a fraction of chacha20-poly1305's CPU per
            # packet, and packets are most of what the coordinator does per unit.
            "encryption_algs": _CIPHERS,
        }
        if host.port is not None:
            options["port"] = host.port
        if host.user is not None:
            options["username"] = host.user
        if host.identity is not None:
            options["client_keys"] = [str(Path(host.identity).expanduser())]
        return options

    async def _connect(self, state: _Host) -> _Connection:
        async with state.handshakes:
            try:
                options = self._options(state.host)
                conn = await asyncssh.connect(state.host.address, **options)
            except asyncssh.HostKeyNotVerifiable as exc:
                raise _Refused(
                    f"host key of {state.name} ({_where(state.host)}) is not trusted:"
                    f" {exc.reason}; check it and run `fanout hosts trust {state.name}`"
                ) from None
            except asyncssh.PermissionDenied:
                user = state.host.user or "the default user"
                raise _Refused(f"{state.name}: authentication refused for {user}") from None
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                raise _Unreachable(
                    f"{state.name} ({_where(state.host)}): {_describe(exc)}"
                ) from None
        connection = _Connection(conn=conn, room=state.per_connection)
        state.connections.append(connection)
        return connection

    async def start(self) -> None:
        if self._requested == "podman":
            raise EnvironmentProblem(
                "podman sandboxes run on this machine only; use bwrap or none with SSH hosts"
            )
        results = await asyncio.gather(
            *(self._bring_up(h) for h in self._hosts), return_exceptions=True
        )
        for state, result in zip(self._hosts, results, strict=True):
            if isinstance(result, BaseException):
                self._notice(f"host {state.name} is unavailable: {result}")
        if not any(h.healthy for h in self._hosts):
            raise HostsUnavailable(
                "no SSH host is reachable: " + "; ".join(f"{h.reason}" for h in self._hosts)
            )

    async def _bring_up(self, state: _Host) -> None:
        try:
            connection = await self._connect(state)
            state.sandbox = await self._choose_sandbox(state, connection)
        except _Refused as exc:
            state.quarantined, state.reason = True, str(exc)
            raise
        except (_Unreachable, _Lost) as exc:
            state.reason = str(exc)
            self._schedule_reconnect(state)
            raise
        state.healthy, state.failures, state.reason = True, 0, ""

    async def _choose_sandbox(self, state: _Host, connection: _Connection) -> str:
        if self._requested == "none":
            return "none"
        try:
            probe = await connection.conn.run(
                "for tool in bwrap timeout head tar find; do command -v $tool; done", check=False
            )
        except (OSError, asyncssh.Error) as exc:
            raise _Lost(str(exc)) from None
        found = str(probe.stdout or "")
        missing = [t for t in ("timeout", "head", "tar", "find") if f"/{t}\n" not in found]
        if missing:
            raise _Refused(f"{state.name} lacks {', '.join(missing)} (needed by fanout's wrapper)")
        if "/bwrap\n" in found:
            return "bwrap"
        if self._requested == "bwrap":
            raise _Refused(f"{state.name} has no bwrap and runtime.sandbox is 'bwrap'")
        self._notice(f"host {state.name} has no bwrap: its units run in plain directories")
        return "none"

    def _schedule_reconnect(self, state: _Host) -> None:
        if state.reconnecting is None or state.reconnecting.done():
            state.reconnecting = asyncio.create_task(self._reconnect(state))

    async def _reconnect(self, state: _Host) -> None:
        while not state.quarantined:
            state.failures += 1
            if state.failures > QUARANTINE_AFTER:
                state.quarantined = True
                self._notice(
                    f"host {state.name} quarantined after {QUARANTINE_AFTER} failed"
                    f" reconnects: {state.reason}"
                )
                break
            await asyncio.sleep(
                min(30.0, 2.0 ** (state.failures - 1)) * self._rng.uniform(0.5, 1.0)
            )
            try:
                await self._bring_up(state)
            except (_Unreachable, _Lost, _Refused):
                continue
            self._notice(f"host {state.name} is back")
            break
        async with self._changed:
            self._changed.notify_all()

    async def _host_failed(self, state: _Host, reason: str) -> None:
        if state.healthy:
            state.healthy, state.reason = False, reason
            self._notice(f"host {state.name} lost: {reason}")
            for connection in state.connections:
                connection.closed = True
                connection.conn.abort()
            state.connections.clear()
            if not state.quarantined:
                self._schedule_reconnect(state)
        async with self._changed:
            self._changed.notify_all()

    async def _quarantine(self, state: _Host, reason: str) -> None:
        """Take a host out of this run for good (a problem retrying will not fix)."""
        if not state.quarantined:
            state.quarantined = True
            self._notice(f"host {state.name} quarantined: {reason}")
        await self._host_failed(state, reason)

    async def close(self) -> None:
        for state in self._hosts:
            if state.reconnecting is not None:
                state.reconnecting.cancel()
            for agent in state.idle:
                self._retire(agent)
            state.idle.clear()
        if self._reapers:
            # Interrupted and timed-out units' teardowns on their hosts, each bounded.
            await asyncio.wait(set(self._reapers))
        for state in self._hosts:
            for connection in state.connections:
                connection.conn.close()
            for connection in state.connections:
                with contextlib.suppress(Exception):
                    await connection.conn.wait_closed()
            state.connections.clear()

    # Placement ------------------------------------------------------------------

    async def _place(self) -> _Host:
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

    async def _release(self, state: _Host) -> None:
        state.running -= 1
        async with self._changed:
            self._changed.notify_all()

    async def _channel(
        self, state: _Host, command: str
    ) -> tuple[_Connection, asyncssh.SSHClientProcess[bytes]]:
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
                    except (_Unreachable, _Refused) as exc:
                        raise _Lost(str(exc)) from None
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
                    raise _Lost(
                        f"{state.name} refused channels for {CHANNEL_RETRY_FOR:g}s: {exc.reason}"
                    ) from None
                await asyncio.sleep(self._rng.uniform(0.02, 0.15))
            except (OSError, asyncssh.Error) as exc:
                connection.channels -= 1
                raise _Lost(_describe(exc)) from None

    # Attempts -------------------------------------------------------------------

    async def run(self, attempt: Attempt) -> AttemptResult:
        state = await self._place()
        try:
            return await self._run_on(state, attempt)
        finally:
            await self._release(state)

    async def _agent(self, state: _Host, network: bool) -> _Agent:
        """An idle agent channel on a live connection, or a new one."""
        while state.idle:
            agent = state.idle.pop()
            if agent.network == network and agent.usable():
                return agent
            self._retire(agent)
        flag = "1" if network else "0"
        args = [state.host.sandbox_root, state.sandbox, flag]
        command = f"exec sh -c {shlex.quote(self._wrapper)} fanout {shlex.join(args)}"
        connection, process = await self._channel(state, command)
        return _Agent(connection=connection, process=process, network=network)

    def _retire(self, agent: _Agent) -> asyncio.Task[None]:
        """Cut an agent's lifeline; the task that ends when the agent has exited.

        At EOF the agent kills whatever of its unit still runs, removes the sandbox and
        exits, so when the task ends the unit's teardown on the host is finished, as it
        is for a local attempt: a timed-out unit's next rung never starts beside the last
        one's leftovers, and ``close`` (which waits for every such task) returns after
        an interrupted run's hosts are clean.  A host that does not answer within
        TEARDOWN_GRACE is left to the agent's own deadline.
        """
        if agent.reaper is None:
            agent.retired = True
            _cut_lifeline(agent.process)
            agent.reaper = asyncio.get_running_loop().create_task(_reap(agent))
            self._reapers.add(agent.reaper)
            agent.reaper.add_done_callback(self._reapers.discard)
        return agent.reaper

    async def _run_on(self, state: _Host, attempt: Attempt) -> AttemptResult:
        invocation = attempt.invocation
        verdict = Verdict(attempt, host=state.name)
        result = verdict.result
        # Unpredictable, not from the (seedable) jitter RNG: the token names the sandbox
        # in a shared directory, and the mark must be unguessable by the worker.
        token, mark = secrets.token_hex(8), secrets.token_hex(8)
        # The agent's own deadline is a backstop a little behind fanout's (which cuts the
        # lifeline at the timeout), for when fanout cannot reach the host any more.
        backstop = math.ceil(invocation.timeout) + 2
        try:
            message = protocol.message(attempt, token, backstop, mark)
        except (fanin.PathRefused, OSError) as exc:
            verdict.close()
            return result(Status.FAILED, str(exc))
        agent: _Agent | None = None
        conversation: asyncio.Task[protocol.Report] | None = None
        keep = False
        try:
            agent = await self._agent(state, attempt.network)
            conversation = asyncio.create_task(
                _converse(agent, message, token, mark, verdict.capture)
            )
            try:
                report = await asyncio.wait_for(asyncio.shield(conversation), invocation.timeout)
            except TimeoutError:
                # Cut the lifeline: the agent kills the unit's processes and cleans up.
                conversation.cancel()
                await asyncio.shield(self._retire(agent))
                report = protocol.Report(timed_out=True)
            keep = report.complete
        except _Lost as exc:
            await self._host_failed(state, str(exc))
            return result(Status.LOST, f"lost {state.name}: {exc}")
        finally:
            if conversation is not None:
                conversation.cancel()  # done already, unless the attempt was cancelled
            if agent is not None:
                if keep:
                    state.idle.append(agent)
                else:
                    self._retire(agent)
            verdict.close()
        if report.refused:
            await self._quarantine(state, f"{state.name}: {report.refused}")
            return result(Status.LOST, f"{state.name} cannot run units: {report.refused}")
        if report.lost:
            if agent is not None and agent.connection_alive():
                # The channel died but the connection lives: the agent itself failed.
                return result(Status.LOST, f"the agent on {state.name} stopped: {report.lost}")
            await self._host_failed(state, report.lost)
            return result(Status.LOST, f"lost {state.name}: {report.lost}")
        if report.worker is None and not report.timed_out:
            return result(Status.FAILED, "the remote agent ran no worker (see the output)")
        return verdict.decide(
            code=None
            if report.timed_out
            else (report.verify if report.verify is not None else report.worker),
            stage="verify" if report.verify is not None else "worker",
            control=report.control or None,
            collect=lambda: protocol.extract(report.collected, attempt.collect_dir),
        )

    # Probes and trust -------------------------------------------------------------

    async def probe(self, state: _Host) -> Probe:
        host = state.host
        base = {"name": host.name, "address": _where(host)}
        empty = {"shell": "", "bwrap": False, "free_disk": "", "rtt_ms": None}
        try:
            connection = await self._connect(state)
        except _Refused as exc:
            return Probe(**base, reachable=True, auth=False, error=str(exc), **empty)  # type: ignore[arg-type]
        except _Unreachable as exc:
            return Probe(**base, reachable=False, auth=False, error=str(exc), **empty)  # type: ignore[arg-type]
        conn = connection.conn
        try:
            begin = time.monotonic()
            await conn.run("true", check=False)
            rtt = (time.monotonic() - begin) * 1000
            root = shlex.quote(host.sandbox_root)
            facts = await conn.run(
                f'echo "$SHELL"; command -v bwrap || echo -; df -Pk {root} | tail -1;'
                f" test -d {root} -a -w {root} && echo writable || echo read-only",
                check=False,
            )
            lines = [*str(facts.stdout or "").splitlines(), "", "", "", ""]
            fields = lines[2].split()
            free = (
                f"{int(fields[3]) // 1024:,} MiB"
                if len(fields) > 3 and fields[3].isdigit()
                else "?"
            )
            return Probe(
                **base,
                reachable=True,
                auth=True,
                shell=lines[0],
                bwrap=lines[1] != "-",
                free_disk=free,
                rtt_ms=rtt,
                error="" if lines[3] == "writable" else f"{host.sandbox_root} is not writable",
            )
        finally:
            conn.close()

    async def probe_all(self) -> list[Probe]:
        return list(await asyncio.gather(*(self.probe(h) for h in self._hosts)))


class _Refused(Exception):
    """The host refused us for a reason retrying will not fix (host key, auth, tools)."""


class _Unreachable(Exception):
    """The host could not be reached this time."""


@dataclass(eq=False)
class _Agent:
    """One long-lived channel running the agent loop, serving one unit at a time."""

    connection: _Connection
    process: asyncssh.SSHClientProcess[bytes]
    network: bool
    retired: bool = False
    reaper: asyncio.Task[None] | None = None

    def usable(self) -> bool:
        return not self.retired and not self.connection.closed and self.process.exit_status is None

    def connection_alive(self) -> bool:
        return not self.connection.closed and not self.connection.conn.is_closed()


async def _converse(
    agent: _Agent, message: bytes, token: str, mark: str, capture: OutputCapture
) -> protocol.Report:
    """Send one unit to the agent and read its verdict and its output."""
    process = agent.process
    report = protocol.Report()
    try:
        process.stdin.write(message)
        await process.stdin.drain()
    except (OSError, asyncssh.Error) as exc:
        report.lost = _describe(exc)
        return report
    pump = asyncio.create_task(protocol.read_output(process.stderr, mark, capture))
    try:
        await protocol.read_verdict(process.stdout, token, report)
        if report.complete:
            await pump
    except (OSError, asyncssh.Error, asyncio.IncompleteReadError) as exc:
        report.lost = _describe(exc)
    finally:
        pump.cancel()
    if not report.complete and not report.lost and not report.refused:
        status = process.exit_status
        report.lost = f"the channel closed during the unit (agent exit status {status})"
    return report


async def _reap(agent: _Agent) -> None:
    """Wait (bounded) for a retired agent to exit, then release its channel."""
    try:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(agent.process.wait_closed(), TEARDOWN_GRACE)
    finally:
        agent.connection.channels -= 1
        with contextlib.suppress(Exception):
            agent.process.close()


def _cut_lifeline(process: asyncssh.SSHClientProcess[bytes]) -> None:
    """EOF on the wrapper's stdin: it kills whatever of the unit still runs."""
    with contextlib.suppress(Exception):
        process.stdin.write_eof()


def _where(host: Host) -> str:
    return f"{host.address}:{host.port}" if host.port else host.address


def _describe(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.DisconnectError):
        return f"disconnected: {exc.reason}"
    if isinstance(exc, asyncssh.ConnectionLost):
        return f"connection lost: {exc.reason}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)


async def fetch_host_key(host: Host, wait: float = 15.0) -> tuple[str, str, str]:
    """(known_hosts line, SHA256 fingerprint, key type) of ``host``'s server key, for
    ``fanout hosts trust`` to show before anything is recorded."""
    options: dict[str, object] = {}
    if host.port is not None:
        options["port"] = host.port
    try:
        lookup = asyncssh.get_server_host_key(host.address, **options)  # type: ignore[arg-type]
        key = await asyncio.wait_for(lookup, wait)
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise EnvironmentProblem(
            f"cannot reach {host.name} ({_where(host)}): {_describe(exc)}"
        ) from None
    if key is None:
        raise EnvironmentProblem(f"{host.name} ({_where(host)}) offered no host key")
    pattern = f"[{host.address}]:{host.port}" if host.port and host.port != 22 else host.address
    public = key.export_public_key("openssh").decode().split()
    return f"{pattern} {public[0]} {public[1]}", key.get_fingerprint("sha256"), key.get_algorithm()
