"""The SSH transport on top of the pool of hosts (``pool``): starting the hosts and
choosing each one's sandbox, running one attempt in a sandbox on an agent, and the probes
of ``fanout hosts check``.  (The package docstring tells the whole story.)"""

from __future__ import annotations

import asyncio
import contextlib
import random
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from ...attempt import sandbox as transport
from ...attempt.driver import execute
from ...attempt.model import Attempt
from ...attempt.sandbox import Sandbox
from ...errors import EnvironmentProblem, HostsUnavailable
from ...isolation.exposure import NOTHING, Handed, hides, network_refusal
from ...outcome import AttemptResult
from ...spec import Host
from .connection import Connection, Connector
from .failures import Lost, Refused
from .pool import HostPool, HostState
from .probe import GROUP_ONLY, Probe, chosen_sandbox, facilities, host_place, probe, unseen_commands
from .sandbox import SshSandbox


class SshTransport(HostPool):
    """``transport.Transport`` on a pool of SSH hosts."""

    def __init__(
        self,
        hosts: Sequence[Host],
        *,
        known_hosts: Sequence[Path],
        sandbox_kind: str = "auto",
        keepalive_interval: float = Connector.keepalive_interval,
        keepalive_count: int = Connector.keepalive_count,
        connect_timeout: float = Connector.connect_timeout,
        notice: Callable[[str], None] = lambda message: None,
        emit: Callable[..., None] | None = None,
        rng: random.Random | None = None,
        commands: Sequence[str] = (),
        gateway_port: int | None = None,
        network: bool | Literal["apis"] = False,
        handed: Handed = NOTHING,
        inventory: Sequence[str] = (),
        home: Path | None = None,
    ) -> None:
        super().__init__(
            hosts,
            connector=Connector(
                known_hosts=list(known_hosts),
                home=home,
                inventory=tuple(inventory),
                keepalive_interval=keepalive_interval,
                keepalive_count=keepalive_count,
                connect_timeout=connect_timeout,
            ),
            notice=notice,
            emit=emit,
            rng=rng,
            gateway_port=gateway_port,
            network=network,
        )
        self._requested = sandbox_kind
        # What workers get that a host's sandboxes must hide from its other units.
        self._handed = handed
        # The job's argv[0]s: a host that cannot start one is refused (``commands``).
        self._commands = tuple(commands)

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
                self._changed_state(
                    state,
                    "quarantined" if state.quarantined else "lost",
                    f"host {state.name} is unavailable: {result}",
                    reason=str(result),
                    start=True,
                )
            else:
                self._changed_state(
                    state, "up", f"host {state.name} is up", sandbox=state.sandbox, back=False
                )
        if not any(h.healthy for h in self._hosts):
            raise HostsUnavailable(
                "no SSH host can run units: " + "; ".join(f"{h.reason}" for h in self._hosts)
            )

    async def _choose_sandbox(self, state: HostState, connection: Connection) -> str:
        offered = await facilities(connection.conn, self._commands, state.host.sandbox_root)
        if offered.missing:
            missing = ", ".join(offered.missing)
            raise Refused(f"{state.name} lacks {missing} (needed by fanout's agent)")
        if offered.lacking:
            raise Refused(f"{state.name} {offered.lacking_problem()}")
        if self._requested == "bwrap" and not offered.bwrap:
            raise Refused(f"{state.name} has no bwrap and runtime.sandbox is 'bwrap'")
        sandbox = chosen_sandbox(self._requested, offered)
        if self._handed and not hides(sandbox):
            where = f"{state.name} has no bwrap: its units would run in plain directories"
            raise Refused(self._handed.refusal(where, "install bubblewrap there"))
        if self._network == "apis":
            refusal = network_refusal(sandbox)
            if refusal is not None:
                raise Refused(f"{state.name}: {refusal}")
            if offered.python is None:
                raise Refused(
                    f'{state.name} has no python3: runtime.network = "apis" runs a small'
                    " forwarder to the gateway in each sandbox"
                )
        if self._requested == "auto" and sandbox == "none" and not state.warned:
            self._notice(f"host {state.name} has no bwrap: its units run in plain directories")
        state.unshare = offered.unshare
        state.python = offered.python
        root, place = host_place(state.name, state.host.sandbox_root, sandbox, offered)
        if sandbox == "bwrap":
            unseen = await unseen_commands(connection.conn, root, place, self._commands)
            if unseen:
                raise Refused("; ".join(f"{state.name} {problem}" for problem in unseen))
        state.root, state.place = root, place
        if self._network == "apis":
            state.place = replace(state.place, python=offered.python)
        if offered.containment(sandbox) == GROUP_ONLY and not state.warned:
            self._notice(
                f"host {state.name} offers no PID namespace (no unshare, or a non-root user"
                f" without user namespaces): {GROUP_ONLY}"
            )
        state.warned = True
        return sandbox

    # Attempts -------------------------------------------------------------------

    async def run(self, attempt: Attempt) -> AttemptResult:
        return await execute(attempt, self)

    @contextlib.asynccontextmanager
    async def sandbox(self, attempt: Attempt) -> AsyncIterator[Sandbox]:
        """A sandbox on the least loaded healthy host, through an idle agent (or a new
        one).  Left cleanly, the agent removes it and serves the next attempt; left on
        an error, a deadline or a cancellation, the agent is retired and its teardown
        awaited (bounded)."""
        state = await self._place()
        try:
            if self._emit is not None:
                self._emit(
                    "attempt.placed",
                    round=attempt.round,
                    unit=attempt.unit_id,
                    attempt=attempt.number,
                    host=state.name,
                )
            try:
                agent = await self._agent(state)
            except Lost as exc:
                await self.lost(state, str(exc))
                raise transport.Lost(f"lost {state.name}: {exc}", host=state.name) from None
            # Unpredictable, not from the (seedable) jitter RNG: the token names the
            # sandbox in a shared directory.
            token = secrets.token_hex(8)
            place = replace(state.place, base=f"{state.root}/fanout-{token}")
            if agent.connection.forward is not None:
                # The forward of the connection the agent runs on: it dies with the
                # attempt's own channel, never under a running attempt on its own.
                place = agent.connection.forward.apply(place)
            box = SshSandbox(
                self,
                state,
                agent,
                token,
                place,
                steps=len(attempt.steps),
                collects=bool(attempt.collect),
            )
            clean = False
            try:
                yield box
                clean = True
            finally:
                await box.leave(clean)
        finally:
            await self._release(state)

    # Probes -----------------------------------------------------------------------

    async def probe_all(self, *, gateway: bool = False) -> list[Probe]:
        """``fanout hosts check``'s probes; ``gateway``: also try the gateway forward."""
        return list(
            await asyncio.gather(
                *(
                    probe(
                        self._connector,
                        h.host,
                        self._requested,
                        gateway=gateway,
                        network=self._network,
                        commands=self._commands,
                    )
                    for h in self._hosts
                )
            )
        )
