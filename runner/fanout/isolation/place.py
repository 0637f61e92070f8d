"""The facts of the host a sandbox is on that its commands depend on: the sandbox tool
chosen there (``Kind``), what contains a step's processes (``Containment``), and the
``Place`` a transport tells and ``attempt`` builds every argv and environment from."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

Kind = Literal["bwrap", "podman", "none"]


class Containment(enum.Enum):
    """What keeps a step's processes from outliving it on this machine."""

    BWRAP = "pid-namespace (bwrap)"
    UNSHARE = "pid-namespace (unshare)"
    PODMAN = "container (podman)"
    GROUP = "process-group only"


@dataclass(frozen=True, kw_only=True, slots=True)
class Place:
    """The facts of the host a sandbox is on that its commands depend on: told by the
    transport, used by ``attempt`` (which builds every argv and environment from them)."""

    host: str  # "local", or the inventory name of an SSH host
    kind: Kind  # the sandbox tool chosen for this host
    base: str  # the sandbox directory on that host, absolute
    path: str  # PATH for workers there
    # Paths a bwrap sandbox hides (state dirs, ~/.ssh): a directory ends in "/".
    hidden: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()  # PATH directories under /tmp that bwrap binds back
    namespace: tuple[str, ...] = ()  # the unshare prefix for sandbox none, () if none
    # The process a step's unshare must be the child of, which its init checks: on this
    # machine fanout's PID (``sandbox.guarded``); None on a host, whose agent has a
    # lifeline of its own.
    lifeline: int | None = None
    # fanout's spawner on this machine (``spawner.spawner``), which stands in for the
    # namespace's chain of setpriv, unshare and the init shell; None: the chain.
    spawner: str | None = None
    image: str | None = None  # podman only
    root: bool = False  # the sandbox's user is root there: bwrap drops capabilities
    containment: Containment = Containment.GROUP
    # The coordinator's API gateway as workers on this host reach it
    # ("http://127.0.0.1:PORT": locally its own port, over SSH a remote forward's), or
    # None when the run has no gateway.
    gateway: str | None = None
    # runtime.network = "apis": the gateway's unix socket on this host (bound into each
    # sandbox), and the python3 that runs the forwarder there (``sandbox.command``).
    gateway_socket: str | None = None
    python: str | None = None
