"""Where a job's units run (this machine, SSH hosts, a Ray cluster), and the table of
transports that choice picks from, each built from the job and the same wiring."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from ..attempt.seam import Transport
from ..errors import EnvironmentProblem
from ..spec import Spec
from ..spec.apikeys import handed
from ..transports import preflight as commands


class Where(enum.Enum):
    """Where a job's units run: the one choice that picks its transport."""

    LOCAL = "local"
    SSH = "ssh"
    RAY = "ray"


def where(job: Spec) -> Where:
    """A Ray cluster (``runtime.ray``), SSH hosts when the job has any (``runtime.hosts``
    or ``--hosts``), else sandboxes on this machine.  Only chooses: nothing is touched."""
    if job.runtime.ray is not None:
        if job.runtime.hosts:
            raise EnvironmentProblem(
                "runtime.ray and SSH hosts (--hosts) are exclusive: units run on a Ray"
                " cluster or on SSH hosts, not both"
            )
        return Where.RAY
    return Where.SSH if job.runtime.hosts else Where.LOCAL


@dataclass(frozen=True, kw_only=True, slots=True)
class Wiring:
    """What a transport is built with besides the job: the environment, where it
    reports, and the run's API gateway on this machine (which workers reach)."""

    environ: Mapping[str, str]
    notice: Callable[[str], None]
    emit: Callable[..., None] | None = None
    gateway_port: int | None = None
    gateway_socket: Path | None = None


def _ray(job: Spec, wiring: Wiring) -> Transport:
    from ..isolation import hidden
    from ..transports.ray import RayTransport

    assert job.runtime.ray is not None
    return RayTransport(
        job.runtime.ray,
        slots=job.runtime.max_concurrent_tasks,
        sandbox_kind=job.runtime.sandbox,
        # On a node that is this machine (a cluster on a laptop) the same paths as
        # locally; elsewhere those that exist there.
        hidden=hidden.paths(wiring.environ, job.runtime.state_dir),
        network=job.runtime.network,
        gateway_port=wiring.gateway_port,
        # The most an attempt is allocated (task.memory or a rung's): a node must offer
        # it; each attempt's actor asks Ray for its own as Ray's memory resource.
        memory=max(
            (m for m in (job.task.memory, *(r.memory for r in job.retry.ladder)) if m),
            default=None,
        ),
        notice=wiring.notice,
        emit=wiring.emit,
        handed=handed(job),
    )


def _ssh(job: Spec, wiring: Wiring) -> Transport:
    from ..transports.ssh import SshTransport
    from ..transports.ssh import knownhosts as hosts

    return SshTransport(
        job.runtime.hosts,
        known_hosts=[hosts.fanout_known_hosts(wiring.environ)],
        home=hosts.home(wiring.environ),
        inventory=hosts.inventory_options(job),
        sandbox_kind=job.runtime.sandbox,
        notice=wiring.notice,
        commands=commands.names(job),
        emit=wiring.emit,
        gateway_port=wiring.gateway_port,
        network=job.runtime.network,
        handed=handed(job),
    )


def _local(job: Spec, wiring: Wiring) -> Transport:
    # ``auto`` without bwrap is refused before the run starts (``commands.check``,
    # through ``Runner.workers``).
    from ..isolation import hidden
    from ..transports.local import LocalTransport

    return LocalTransport(
        slots=job.runtime.max_concurrent_tasks,
        sandbox_kind=job.runtime.sandbox,
        image=job.runtime.image,
        sandbox_root=job.runtime.sandbox_root,
        environ=wiring.environ,
        path=wiring.environ.get("PATH", ""),
        # Workers never see fanout's own state (this job's, other jobs'), its
        # configuration, its secrets or the user's keys.
        hidden=hidden.paths(wiring.environ, job.runtime.state_dir),
        warn=wiring.notice,
        gateway_port=wiring.gateway_port,
        network=job.runtime.network,
        gateway_socket=wiring.gateway_socket,
    )


# Each transport, built from the job and the same wiring.
TRANSPORTS: Mapping[Where, Callable[[Spec, Wiring], Transport]] = MappingProxyType(
    {Where.LOCAL: _local, Where.SSH: _ssh, Where.RAY: _ray}
)


def transport_for(
    job: Spec,
    environ: Mapping[str, str],
    notice: Callable[[str], None],
    emit: Callable[..., None] | None = None,
    gateway_port: int | None = None,
    gateway_socket: Path | None = None,
) -> Transport:
    """The job's transport (``where`` it runs, built from ``TRANSPORTS``), once the
    run's state directory has joined the registry that every local sandbox hides.
    ``gateway_port``: the run's API gateway on this machine, which workers reach."""
    build = TRANSPORTS[where(job)]
    _remember_state_dir(job, environ, notice)
    wiring = Wiring(
        environ=environ,
        notice=notice,
        emit=emit,
        gateway_port=gateway_port,
        gateway_socket=gateway_socket,
    )
    return build(job, wiring)


def _remember_state_dir(
    job: Spec, environ: Mapping[str, str], notice: Callable[[str], None]
) -> None:
    from ..isolation import hidden

    try:
        hidden.remember(job.runtime.state_dir, environ)
    except OSError as exc:
        notice(
            f"cannot record the state directory in {hidden.registry(environ)} "
            f"({exc.strerror or exc}): sandboxes of other jobs will not hide it"
        )
