"""Connections to SSH hosts, and asyncssh's errors translated into fanout's three:
``Refused`` (retrying will not help: host key, authentication, missing tools),
``Unreachable`` (not this time) and ``Lost`` (a connection under an attempt went away)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from ..spec import Host

# sshd drops unauthenticated connections beyond MaxStartups (10 by default).
MAX_HANDSHAKES = 8
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
)


class Lost(Exception):
    """The connection under an attempt went away."""


class Refused(Exception):
    """The host refused us for a reason retrying will not fix (host key, auth, tools)."""


class Unreachable(Exception):
    """The host could not be reached this time."""


@dataclass(eq=False)
class Connection:
    """One SSH connection to a host and how many agent channels it carries."""

    conn: asyncssh.SSHClientConnection
    room: int  # channels this connection may carry; lowered when sshd refuses one
    channels: int = 0
    closed: bool = False


@dataclass(frozen=True, kw_only=True)
class Connector:
    """How every connection of a run is made: verified host keys, keepalives, timeouts.

    A host that sends nothing for ``keepalive_count`` keepalive intervals (3 x 5 s) is
    given up: a frozen host is noticed in 15 s (``silence_limit``).
    """

    known_hosts: Sequence[Path]
    keepalive_interval: float = 5.0
    keepalive_count: int = 3  # intervals of silence tolerated, at least 2
    connect_timeout: float = 15.0

    @property
    def silence_limit(self) -> float:
        """Seconds without a byte from a host before its connection is dropped."""
        return self.keepalive_interval * self.keepalive_count

    def options(self, host: Host) -> dict[str, object]:
        options: dict[str, object] = {
            "known_hosts": asyncssh.read_known_hosts(
                [str(p) for p in self.known_hosts if p.is_file()]
            ),
            "keepalive_interval": self.keepalive_interval,
            # asyncssh sends a keepalive at each silent interval's end and drops the
            # connection at the end of the interval after keepalive_count_max of them
            # went unanswered: (count_max + 1) intervals of silence.  Passing the count
            # itself made a frozen host take 20 s to notice, not the 15 s documented.
            "keepalive_count_max": max(1, self.keepalive_count - 1),
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
            # AES-GCM first: with AES-NI it costs a fraction of chacha20-poly1305's CPU per
            # packet, and packets are most of what the coordinator does per unit.
            "encryption_algs": CIPHERS,
        }
        if host.port is not None:
            options["port"] = host.port
        if host.user is not None:
            options["username"] = host.user
        if host.identity is not None:
            options["client_keys"] = [str(Path(host.identity).expanduser())]
        return options

    async def connect(self, host: Host, handshakes: asyncio.Semaphore, room: int) -> Connection:
        """A new authenticated connection to ``host`` that may carry ``room`` channels."""
        async with handshakes:
            try:
                conn = await asyncssh.connect(host.address, **self.options(host))
            except asyncssh.HostKeyNotVerifiable as exc:
                raise Refused(
                    f"host key of {host.name} ({where(host)}) is not trusted:"
                    f" {exc.reason}; check it and run `fanout hosts trust {host.name}`"
                ) from None
            except asyncssh.PermissionDenied:
                user = host.user or "the default user"
                raise Refused(f"{host.name}: authentication refused for {user}") from None
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                raise Unreachable(f"{host.name} ({where(host)}): {describe(exc)}") from None
        return Connection(conn=conn, room=room)


def where(host: Host) -> str:
    return f"{host.address}:{host.port}" if host.port else host.address


def describe(exc: BaseException) -> str:
    if isinstance(exc, asyncssh.DisconnectError):
        return f"disconnected: {exc.reason}"
    if isinstance(exc, asyncssh.ConnectionLost):
        return f"connection lost: {exc.reason}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return str(text)
