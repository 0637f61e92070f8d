"""What one attempt of one unit is, decided once on the coordinator: everything a
transport needs and nothing it decides (``driver`` carries it out).

The value (``Attempt``) holds everything: the steps (the worker with the prompt on its
stdin, then verify), the environment, one deadline for all steps, the staged files,
the collect patterns compiled, the sandbox options.

Every argv a sandbox runs is built here from its host's facts (``isolation.place.Place``)
by ``tools.command``: bwrap's argv, the PID namespace, podman's, written once.

A sandbox is one directory on its host, laid out as ``LAYOUT``: the directory itself is
HOME and TMPDIR, ``work/`` in it is the worker's cwd (staged files in, collected files
out) and ``control.json`` beside it the throttle control file.  HOME and TMPDIR are the
sandbox's under every transport and every sandbox kind, never ``work/``: what an agent
caches in ``~/.cache`` or leaves in its temporary directory is not collected by
``collect = ["**"]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..isolation import tools as sandbox
from ..isolation.place import Place
from .collecting import Collect
from .sandbox import Command, StagedFile

if TYPE_CHECKING:
    # The job language, which a Ray node (importing this module for ``LAYOUT``) never
    # runs: imported where attempts are built.
    from .invocation import Invocation

# How long after the coordinator's deadline a host kills a step by itself: for when
# the coordinator can no longer reach it (a partition); never the deadline that counts.
BACKSTOP_GRACE = 2.0


@dataclass(frozen=True, slots=True)
class Layout:
    """The names inside a sandbox directory (see the module docstring)."""

    work: str = "work"
    control: str = "control.json"
    # A control file is a few bytes of JSON; a worker cannot make fanout read more.
    control_limit: int = 1 << 16

    @property
    def directories(self) -> tuple[str, ...]:
        """What a sandbox makes inside its directory, which is itself HOME and TMPDIR:
        every directory a sandbox makes and removes is on the hot path (about 0.3 ms
        each on this project's machine, ext4 on a VM disk, a tenth of a no-op unit)."""
        return (self.work,)


LAYOUT = Layout()


@dataclass(frozen=True, kw_only=True, slots=True)
class Step:
    """One program an attempt runs.  ``gated``: only if the step before exited 0."""

    name: str  # how reasons name it: "worker", "verify"
    argv: tuple[str, ...]
    stdin: bytes = b""
    gated: bool = True


@dataclass(frozen=True, slots=True)
class ApiAccess:
    """How a worker reaches one API through the coordinator's gateway: the variable
    that gets the gateway's URL for that API, and the one that gets the attempt's token
    (the worker's "API key"; the real key never leaves the gateway).  The token dies
    when the attempt ends."""

    name: str
    base_url_env: str
    token_env: str
    token: str = field(repr=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    """Everything an attempt means; secrets only in memory."""

    run_id: str
    unit_id: str
    round: int
    number: int
    invocation: Invocation
    staged: tuple[StagedFile, ...]
    collect: Collect
    collect_dir: Path
    log_path: Path
    log_limit: int
    tail_limit: int
    network: bool | Literal["apis"]
    throttle_patterns: tuple[re.Pattern[str], ...] = ()
    # Values of the job's secrets; never logged, never written, hidden from repr.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # The real keys of the job's [[apis]]: never in the worker's environment, only in
    # what its output is redacted of.
    keys: tuple[str, ...] = field(default=(), repr=False)
    # The APIs it reaches through the gateway (set when the attempt is dispatched).
    apis: tuple[ApiAccess, ...] = ()
    # The agent CLI the worker is (``task.agent``), whose output says what the attempt
    # came to (``agents``), and the longest pause a usage window may make (longer: the
    # run stops, resumable).
    agent: str | None = None
    longest_pause: float = 0.0
    # The API (of ``apis``) the agent calls through the gateway, if any.
    agent_api: str | None = None

    @property
    def redacted(self) -> tuple[str, ...]:
        """Values no log, reason or tail may show: the secrets, the real API keys and the
        attempt's gateway tokens (any other token is redacted by its shape: ``redact``)."""
        return (*self.secrets.values(), *self.keys, *(access.token for access in self.apis))

    @property
    def deadline(self) -> float:
        """Seconds all steps together may take."""
        return self.invocation.timeout

    @property
    def steps(self) -> tuple[Step, ...]:
        invocation = self.invocation
        setup = self._setup()
        worker = Step(
            name="worker",
            argv=invocation.argv,
            stdin=invocation.prompt.encode(),
            gated=setup is not None,
        )
        steps = (worker,) if setup is None else (setup, worker)
        if not invocation.verify:
            return steps
        return (*steps, Step(name="verify", argv=invocation.verify))

    def _setup(self) -> Step | None:
        """The step that writes the agent's config file into the unit's HOME before the
        agent starts (codex and gemini read their provider, auth type and telemetry
        from it only), or None.  A fixed script: the file's path is its argument and
        the file itself its stdin (``command``), so nothing is read through a shell."""
        if self.agent is None:
            return None
        from ..spec import presets  # see ``agent_config``

        written = presets.config_file(self.agent, base_url=None, token_env="")
        if written is None:
            return None
        path = written[0]
        return Step(name="setup", argv=(*_SETUP, path), gated=False)

    def agent_config(self, place: Place) -> bytes:
        """The agent's config file for a sandbox at ``place`` (the gateway's URL for
        the agent's API is where that host reaches it)."""
        # Imported here, where an attempt is built: a Ray node imports this module for
        # ``LAYOUT`` and never runs the job language (0.1 s of each actor's start).
        from ..spec import presets

        access = next((a for a in self.apis if a.name == self.agent_api), None)
        base_url = None
        if access is not None and place.gateway is not None:
            base_url = f"{place.gateway}/{access.name}"
        assert self.agent is not None
        token_env = access.token_env if access is not None else ""
        written = presets.config_file(self.agent, base_url=base_url, token_env=token_env)
        return b"" if written is None else written[1].encode()

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

    def environment(self, place: Place) -> dict[str, str]:
        """A step's whole environment in a sandbox at ``place``: nothing else reaches it
        (the transport's own environment never does)."""
        base = place.base
        return {
            "PATH": place.path,
            "HOME": base,
            "TMPDIR": base,
            **self.base_env(),
            "FANOUT_CONTROL": f"{base}/{LAYOUT.control}",
            **self.invocation.env,
            **self.gateway_env(place),
            **self.secrets,
        }

    def gateway_env(self, place: Place) -> dict[str, str]:
        """Each API's base URL (the gateway as ``place`` reaches it, then the API's
        name) and the attempt's token."""
        if not self.apis:
            return {}
        if place.gateway is None:
            raise AssertionError(f"host {place.host} has no way to the gateway")
        env: dict[str, str] = {}
        for access in self.apis:
            env[access.base_url_env] = f"{place.gateway}/{access.name}"
            env[access.token_env] = access.token
        return env

    def command(self, step: Step, place: Place) -> Command:
        env = self.environment(place)
        work = f"{place.base}/{LAYOUT.work}"
        argv = sandbox.command(place, step.argv, network=self.network, env_names=tuple(env))
        stdin = self.agent_config(place) if step.name == "setup" else step.stdin
        return Command(argv=tuple(argv), program=step.argv[0], env=env, stdin=stdin, cwd=work)


# Writes its stdin to $HOME/<its argument>, making the directory: an agent's config file.
_SETUP = ("sh", "-c", 'mkdir -p -- "$HOME/${1%/*}" && cat > "$HOME/$1"', "fanout-setup")
