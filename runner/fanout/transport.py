"""The seam between the dispatcher and the places workers run.

A Transport runs one attempt of one unit in a fresh sandbox (stage, run, verify,
collect, tear down) and returns an AttemptResult; it never raises for a unit's failure.
``local.LocalTransport`` runs sandboxes on this machine, ``ssh.SshTransport`` on a pool
of SSH hosts, and tests use a fake.  Whatever the transport, the sandbox is removed the
same way on success, failure, timeout and cancellation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .invocation import Invocation
from .outcome import AttemptResult


@dataclass(frozen=True, kw_only=True, slots=True)
class StagedFile:
    """A workspace file copied into the sandbox at ``path`` (relative, POSIX)."""

    path: str
    source: Path


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """Everything a transport needs for one attempt; secrets only in memory."""

    run_id: str
    unit_id: str
    round: int
    number: int
    invocation: Invocation
    staged: tuple[StagedFile, ...]
    collect_dir: Path
    log_path: Path
    log_limit: int
    tail_limit: int
    network: bool
    throttle_patterns: tuple[str, ...] = ()
    # Values of the job's secrets; never logged, never written, hidden from repr.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    def base_env(self) -> dict[str, str]:
        """Variables fanout gives every worker, before the job's env and secrets."""
        return {
            "FANOUT_RUN_ID": self.run_id,
            "FANOUT_UNIT_ID": self.unit_id,
            "FANOUT_ROUND": str(self.round),
            "FANOUT_ATTEMPT": str(self.number),
            "FANOUT_RUNG": self.invocation.rung,
            "LANG": "C.UTF-8",
        }


class Transport(Protocol):
    """Runs attempts somewhere.  ``capacity`` is how many can run at once."""

    @property
    def capacity(self) -> int: ...

    async def start(self) -> None:
        """Prepare (connect to hosts, check the sandbox tool).  May raise FanoutError."""

    async def run(self, attempt: Attempt) -> AttemptResult:
        """Run one attempt to its end and tear its sandbox down, whatever happens."""
        ...

    async def close(self) -> None:
        """Release connections; running attempts have already been cancelled."""
