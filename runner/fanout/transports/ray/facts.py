"""The values the coordinator and a Ray node exchange (pickled by Ray, so both sides
run the same fanout: ``Opened.version`` is checked on every attempt)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ...isolation.place import Place


class Gone(Exception):
    """Ray reported the actor, its worker or its node gone (or unreachable): the
    attempt is lost.  Raised by ``rayapi`` only, with a one-line reason."""


# A piece of a staged file: its path in work/, its permission bits, whether it is the
# file's first piece (which creates it), and its bytes (b"" for an empty file).
Piece = tuple[str, int, bool, bytes]

# How a step ended, as the node answers: its exit status, the control file as it left
# it (None if absent), whether the sandbox was removed with it (a final step), and
# what the node has to tell the user of that removal.
Ended = tuple[int, bytes | None, bool, tuple[str, ...]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Opening:
    """What a node needs to open one attempt's sandbox (no secret: those travel with
    each step's command)."""

    version: str  # the coordinator's fanout
    sandbox: str  # runtime.sandbox: auto, bwrap or none
    root: str  # runtime.ray.sandboxRoot on the node
    hidden: tuple[str, ...] = ()  # paths bwrap hides, besides the node's own ~/.ssh
    network: bool | Literal["apis"] = False


@dataclass(frozen=True, kw_only=True, slots=True)
class Opened:
    """A node's answer to a new actor: its fanout's version and, when it matches the
    coordinator's, the place of its sandboxes (``place.base`` is the directory each
    attempt's is made in, ``sandbox_name``)."""

    version: str
    node: str  # the node's name in reports: "<address>/<node id, 8 hex>"
    node_id: str
    pid: int  # the actor's process, the parent of every step
    place: Place | None = None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeReport:
    """What ``fanout hosts check`` shows for one node of the cluster."""

    node: str
    node_id: str
    address: str
    alive: bool
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    version: str = ""  # the node's fanout, "" if the probe did not run
    bwrap: bool = False
    containment: str = ""
    problem: str = ""


def node_name(address: str, node_id: str) -> str:
    return f"{address}/{node_id[:8]}"


def sandbox_name(pid: int, token: str) -> str:
    """An attempt's sandbox directory on a node: its actor's process and a token the
    coordinator chose, named as the local transport names its own (``fanout-<pid>-*``),
    so a killed actor's leftover is swept like a killed run's."""
    return f"fanout-{pid}-{token}"
