"""The remote port forward that carries a host's workers to the coordinator's API
gateway: one per connection, bound to the host's loopback.

A worker on an SSH host reaches the gateway at ``http://127.0.0.1:PORT`` on that host:
sshd listens there (``tcpip-forward``, port chosen by sshd) and hands each connection
over the SSH connection it was asked on, to the gateway's port on the coordinator.  No
port opens on any network: the forward asks for 127.0.0.1, and ``exposure`` checks on
the host that sshd really bound loopback only (``GatewayPorts yes`` binds the wildcard
whatever the client asks, and the client cannot tell over SSH).  A loopback port is
open to every local user of the host; the per-attempt token is what protects it.
For ``runtime.network = "apis"`` the forward listens on a unix socket instead (mode
0600, in a 0700 directory), which bwrap binds into sandboxes that have no other
network (``sandbox``): no port at all opens on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
from dataclasses import dataclass, replace

import asyncssh

from ...isolation import tools as sandbox
from ...isolation.place import Place
from .failures import Lost, Refused, describe

LOOPBACK = "127.0.0.1"
REFUSED = (
    "sshd refuses remote port forwarding (AllowTcpForwarding, DisableForwarding or"
    " PermitListen): workers there cannot reach the API gateway"
)
REFUSED_PATH = (
    "sshd refuses forwarding to a unix socket (AllowStreamLocalForwarding or"
    ' DisableForwarding): workers there cannot reach the API gateway with runtime.network = "apis"'
)
EXPOSED = "sshd's GatewayPorts exposes forwarded ports beyond loopback"
# /proc/net/tcp{,6} write each address as 32-bit words in the host's byte order: these
# are 127.0.0.1 and ::1 (and ::ffff:127.0.0.1) on little- and big-endian hosts alike.
_LOOPBACK_HEX = frozenset(
    {
        "0100007F",
        "7F000001",
        "00000000000000000000000001000000",
        "00000000000000000000000000000001",
        "0000000000000000FFFF00000100007F",
        "00000000000000000000FFFF7F000001",
    }
)
_LISTEN = "0A"
CLOSE_WAIT = 5.0  # seconds sshd may take to confirm a cancelled forward


@dataclass(eq=False)
class Forward:
    """A live forward: sshd listens on the host's ``port`` for the gateway, or (network
    "apis") on the unix socket ``path`` in the private directory ``directory``."""

    listener: asyncssh.SSHListener
    path: str | None = None
    directory: str | None = None
    conn: asyncssh.SSHClientConnection | None = None  # to remove ``directory`` with

    @property
    def port(self) -> int:
        return int(self.listener.get_port())

    @property
    def url(self) -> str:
        """The gateway as workers on the host reach it."""
        return f"http://{LOOPBACK}:{self.port}"

    def apply(self, place: Place) -> Place:
        """``place`` with the gateway as its sandboxes reach it through this forward: a
        loopback port of the host, or the socket a sandbox of its own network binds in
        and reaches on its own loopback (``sandbox``)."""
        if self.path is None:
            return replace(place, gateway=self.url)
        return replace(place, gateway=sandbox.gateway_url(), gateway_socket=self.path)

    async def close(self) -> None:
        """Cancel the forward and wait (bounded) until sshd has closed its socket; a
        socket's directory is removed (sshd leaves the socket file behind)."""
        self.listener.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.listener.wait_closed(), CLOSE_WAIT)
        if self.directory is not None and self.conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.conn.run(f"rm -rf -- {shlex.quote(self.directory)}", check=False),
                    CLOSE_WAIT,
                )


async def forward(conn: asyncssh.SSHClientConnection, name: str, gateway_port: int) -> Forward:
    """Ask sshd for a loopback listener (port 0: sshd picks one) that forwards to the
    gateway's port on this machine.  Refused: sshd does not allow it (asyncssh's refusal
    carries no reason; these are the settings that cause it)."""
    try:
        listener = await conn.forward_remote_port(LOOPBACK, 0, LOOPBACK, gateway_port)
    except asyncssh.ChannelListenError:
        raise Refused(f"{name}: {REFUSED}") from None
    except (OSError, asyncssh.Error) as exc:
        raise Lost(describe(exc)) from None
    return Forward(listener=listener)


async def forward_path(conn: asyncssh.SSHClientConnection, name: str, gateway_port: int) -> Forward:
    """Ask sshd for a unix socket on the host (in a fresh directory of mode 0700 that
    ``mktemp -d`` makes; sshd creates the socket 0600) that forwards to the gateway's
    port on this machine, for sandboxes with a network of their own (network "apis").
    A connection lost before ``close`` leaves the empty directory in the host's /tmp."""
    try:
        made = await conn.run("mktemp -d /tmp/fanout-gateway-XXXXXXXXXX", check=False)
    except (OSError, asyncssh.Error) as exc:
        raise Lost(describe(exc)) from None
    directory = str(made.stdout or "").strip()
    if made.exit_status != 0 or not directory.startswith("/tmp/fanout-gateway-"):
        raise Refused(f"{name}: cannot make a directory for the gateway's socket in /tmp")
    path = f"{directory}/gateway.sock"
    try:
        listener = await conn.forward_remote_path_to_port(path, LOOPBACK, gateway_port)
    except asyncssh.ChannelListenError:
        with contextlib.suppress(OSError, asyncssh.Error):
            await conn.run(f"rm -rf -- {shlex.quote(directory)}", check=False)
        raise Refused(f"{name}: {REFUSED_PATH}") from None
    except (OSError, asyncssh.Error) as exc:
        raise Lost(describe(exc)) from None
    return Forward(listener=listener, path=path, directory=directory, conn=conn)


def listen_script(port: int) -> str:
    """A command printing the host's listening sockets on ``port`` (grep: one of the
    agent's tools), however busy its socket tables."""
    pattern = f"^ *[0-9]+: [0-9A-F]+:{port:04X} [0-9A-F]+:0000 {_LISTEN} "
    return f"grep -h -E {shlex.quote(pattern)} /proc/net/tcp /proc/net/tcp6 2>/dev/null"


def beyond_loopback(listing: str) -> list[str] | None:
    """The addresses other than loopback among ``listen_script``'s lines, or None when
    it found no socket (so nothing is known)."""
    addresses = [line.split()[1].rsplit(":", 1)[0] for line in listing.splitlines() if line.strip()]
    if not addresses:
        return None
    return [_readable(a) for a in addresses if a not in _LOOPBACK_HEX]


async def exposure(conn: asyncssh.SSHClientConnection, name: str, port: int) -> None:
    """Refused unless the host's sockets listening on the forward's ``port`` are all on
    loopback (one command)."""
    try:
        answer = await conn.run(listen_script(port), check=False)
    except (OSError, asyncssh.Error) as exc:
        raise Lost(describe(exc)) from None
    beyond = beyond_loopback(str(answer.stdout or ""))
    if beyond is None:
        # No /proc/net (not Linux, or another network namespace than sshd's): a host
        # fanout cannot check is not trusted with the tokens.
        raise Refused(
            f"{name}: cannot see the gateway forward's port {port} in /proc/net/tcp:"
            " cannot check it listens on loopback only"
        )
    if beyond:
        raise Refused(
            f"{name}: {EXPOSED} (the gateway forward listens on {', '.join(beyond)}"
            f" port {port}); set GatewayPorts no or clientspecified there"
        )


def _readable(address: str) -> str:
    """A /proc/net address for a message: the wildcards by name, else the hex."""
    if set(address) == {"0"}:
        return "0.0.0.0" if len(address) == 8 else "[::]"
    return address
