"""One attempt's sandbox on one host, as every transport opens it (``Sandbox``): the
files staged into it, the commands it runs (everything already decided), and ``Lost``
when its host goes away.

A transport moves bytes and runs processes; it decides nothing about what an attempt
means (``attempt.model`` does, once, for every transport).  It places an attempt on a
host and opens a ``Sandbox`` there: a fresh directory laid out as ``model.LAYOUT``
says, which receives the staged files, runs the steps it is given (argv, environment
and stdin all decided by the coordinator), lists its work directory, hands over the
files it is asked for, and is torn down (its processes killed, its directory removed)
when the ``async with`` ends, on success, failure, timeout and cancellation alike.

``transports.local`` opens sandboxes on this machine, ``transports.ssh`` on a pool of
SSH hosts through a small remote executor, and ``tests/fakes.py`` has a fake of each
level: sandboxes that run steps as plain subprocesses (in the conformance suite) and a
scripted transport whose ``run`` returns canned results (dispatch logic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..isolation.place import Place
from .capture import OutputCapture
from .collecting import Entry


@dataclass(frozen=True, kw_only=True, slots=True)
class StagedFile:
    """A workspace file copied into the sandbox at ``path`` (relative, POSIX), with its
    permission bits (a staged script stays executable)."""

    path: str
    source: Path


@dataclass(frozen=True, kw_only=True, slots=True)
class Command:
    """One step as the sandbox runs it: everything already decided."""

    argv: tuple[str, ...]
    # The step's own program (its argv[0], inside whatever the sandbox argv wraps it
    # in): a sandbox checks it can start on the step's PATH before it starts anything,
    # and a missing one is exit 127 with "fanout: cannot start X: command not found".
    program: str
    env: Mapping[str, str]
    stdin: bytes
    cwd: str


class Lost(Exception):
    """The sandbox's host (or the executor on it) went away mid-attempt; the attempt is
    ``lost`` and runs again elsewhere.  The transport has done its own bookkeeping
    (the host marked down, or quarantined) before raising."""

    def __init__(self, reason: str, *, host: str = "local") -> None:
        super().__init__(reason)
        self.host = host


class Sandbox(Protocol):
    """One attempt's sandbox on one host.  Every method may raise ``Lost``."""

    @property
    def place(self) -> Place: ...

    async def stage(self, files: Sequence[StagedFile]) -> None:
        """Copy ``files`` into the work directory, keeping their permission bits.
        Raises OSError when a workspace file cannot be read."""

    async def run(self, command: Command, capture: OutputCapture, *, backstop: float) -> int:
        """Run ``command`` to its end, its output (stdout and stderr) fed to ``capture``;
        its exit status.  Nothing it started outlives it.  Cancelled, it kills the step
        (bounded) before it returns.  ``backstop``: seconds after which the host itself
        kills the step should the coordinator no longer reach it."""
        ...

    async def read(self, name: str) -> bytes | None:
        """The bytes of the regular file ``name`` of the sandbox's layout, None if absent."""

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        """What the work directory holds under the top-level ``roots`` (``.``: all),
        symlinks never followed."""
        ...

    async def fetch(self, names: Sequence[str], destination: Path) -> None:
        """Copy the regular files ``names`` (from ``listing``) to ``destination``, each
        at ``collecting.target(destination, name)``."""
