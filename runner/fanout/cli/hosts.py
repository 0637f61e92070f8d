"""Commands about SSH hosts: hosts check, hosts trust."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ..errors import ExitCode
from .app import HostsOption, JobFile, Typer, app, environ

hosts_app = Typer(
    name="hosts",
    help="Check SSH hosts and trust their keys.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(hosts_app, rich_help_panel="Hosts")


def _inventory(file: Path | None, hosts: Path | None) -> Any:
    return _runtime(file, hosts)[0]


def _runtime(file: Path | None, hosts: Path | None) -> tuple[Any, str, bool, Any, Any]:
    """The job's hosts, the sandbox its units ask for, whether it has APIs (its
    workers then reach the gateway through a forward on each host), its network, and
    the commands its workers start (each host must start them)."""
    from .. import spec
    from ..transports import preflight as commands

    if file is not None:
        job = spec.load(file, hosts_file=hosts)
        runtime = job.runtime
        return runtime.hosts, runtime.sandbox, bool(job.apis), runtime.network, commands.names(job)
    return (spec.load_hosts_file(hosts) if hosts is not None else ()), "auto", False, False, ()


@hosts_app.command("check")
def hosts_check(
    file: JobFile,
    hosts: HostsOption = None,
) -> None:
    """Probe every host of the job in parallel.

    Reachable, authenticated, remote shell, bwrap, what keeps the job's units from
    outliving them there (containment), free disk in the sandbox root and round-trip
    time; whether the job's worker commands start there, looked up inside a sandbox as
    a unit's are; for a job with [[apis]], whether sshd forwards a port to the API
    gateway and binds it to loopback only.  For a job with runtime.ray, every node of
    the cluster: alive, its resources and labels, fanout's version, bwrap and
    containment there (a probe pinned to each node).  Exit 4 if any is not usable.
    """
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from .. import spec
    from ..errors import EnvironmentProblem
    from ..transports.ssh import SshTransport
    from ..transports.ssh import knownhosts as inventory
    from ..transports.ssh.probe import GATEWAY_FINE

    job = spec.load(file, hosts_file=hosts)
    if job.runtime.ray is not None and not job.runtime.hosts:
        _ray_check(job)

    def probe() -> tuple[Any, bool]:
        pool, sandbox, apis, network, commands = _runtime(file, hosts)
        if not pool:
            raise EnvironmentProblem(f"{file} declares no SSH hosts; its units run on this machine")
        transport = SshTransport(
            pool,
            known_hosts=[inventory.fanout_known_hosts(environ())],
            home=inventory.home(environ()),
            sandbox_kind=sandbox,
            network=network,
            commands=commands,
            inventory=inventory.inventory_options(job),
        )
        return asyncio.run(transport.probe_all(gateway=apis)), apis

    probes, apis = probe()
    columns = ["host", "address", "reachable", "auth", "shell", "bwrap", "containment"]
    columns += ["free disk", "rtt", *(["gateway forward"] if apis else []), "problem"]
    table = Table(*columns)
    for p in probes:
        # The forward's refusal is the host's problem too (its units could not run).
        gateway = [] if not apis else [p.gateway if p.gateway in ("", *GATEWAY_FINE) else "NO"]
        problems = [p.error, p.gateway if apis and gateway == ["NO"] else ""]
        table.add_row(
            p.name,
            p.address,
            "yes" if p.reachable else "NO",
            "yes" if p.auth else "NO",
            p.shell,
            "yes" if p.bwrap else "no",
            p.containment,
            p.free_disk,
            f"{p.rtt_ms:.1f} ms" if p.rtt_ms is not None else "",
            *gateway,
            "; ".join(problem for problem in problems if problem),
        )
    Console(width=240).print(table)
    usable = all(p.auth and not p.error and p.gateway in ("", *GATEWAY_FINE) for p in probes)
    raise typer.Exit(ExitCode.OK if usable else ExitCode.CANNOT_RUN)


def _ray_check(job: Any) -> None:
    """``hosts check`` for runtime.ray: one row per node of the cluster."""
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from ..transports.ray import RayTransport

    transport = RayTransport(job.runtime.ray, slots=1, sandbox_kind=job.runtime.sandbox)

    async def probe() -> Any:
        try:
            return await transport.probe_all()
        finally:
            await transport.close()

    reports = asyncio.run(probe())
    table = Table("node", "alive", "resources", "labels", "fanout", "bwrap", "containment")
    table.add_column("problem")
    for r in reports:
        table.add_row(
            r.node,
            "yes" if r.alive else "NO",
            ", ".join(_amount(name, value) for name, value in sorted(r.resources.items())),
            ", ".join(f"{k}={v}" for k, v in sorted(r.labels.items())),
            r.version,
            "yes" if r.bwrap else "no",
            r.containment,
            r.problem,
        )
    Console(width=240).print(table)
    alive = [r for r in reports if r.alive]
    usable = alive and not any(r.problem for r in alive)
    raise typer.Exit(ExitCode.OK if usable else ExitCode.CANNOT_RUN)


def _amount(name: str, value: float) -> str:
    if name in ("memory", "object_store_memory"):
        return f"{name} {value / (1 << 30):.1f} GiB"
    return f"{name} {value:g}"


@hosts_app.command("trust")
def hosts_trust(
    host: Annotated[str, typer.Argument(help="A host name from the inventory, or ADDRESS[:PORT].")],
    job: Annotated[
        Path | None, typer.Option("--job", help="Find HOST in this job's hosts.")
    ] = None,
    hosts: HostsOption = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Trust a new key without asking (never a changed one).")
    ] = False,
) -> None:
    """Show HOST's SSH host key fingerprint, and trust it once you confirm.

    HOST is looked up as a run looks it up (~/.ssh/config's HostName, Port and
    HostKeyAlias apply), and the key is recorded under that name, [host]:port for a port
    other than 22, in fanout's own known_hosts file (~/.config/fanout/known_hosts),
    never in yours.  A changed key replaces the old one in fanout's file.
    """
    import asyncio

    from ..transports.ssh import fetch_host_key
    from ..transports.ssh import knownhosts as inventory

    coordinator_env = environ()
    own = inventory.fanout_known_hosts(coordinator_env)
    home = inventory.home(coordinator_env)
    target = inventory.find(_inventory(job, hosts), host)
    key = asyncio.run(fetch_host_key(target, [own], home))
    print(f"{target.name} (known_hosts name {key.name})")
    if key.trusted_by:
        where = ", ".join(f"{e.path}:{e.line}" for e in key.trusted_by)
        print(f"  {key.kind} key fingerprint {key.fingerprint} is already trusted ({where})")
        return
    if key.replaced:
        print("  WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!")
        for old in key.replaced:
            print(f"  trusted until now: {old.kind} key {old.fingerprint} ({old.path}:{old.line})")
        print(f"  offered now:       {key.kind} key {key.fingerprint}")
        print(
            "  Someone could be eavesdropping on you right now (a man-in-the-middle attack),"
            " or the host was reinstalled.  Replace the old key only once the host's"
            " administrator has confirmed the new fingerprint."
        )
        # Like StrictHostKeyChecking=accept-new: a script may accept new keys, never a
        # changed one (that is the one moment a person has to look).
        if yes:
            print(
                "not trusted: --yes never replaces a changed key; check the new"
                " fingerprint, then run this again without --yes and answer",
                file=sys.stderr,
            )
            raise typer.Exit(ExitCode.FAILED)
        question = "Replace the old key with this one?"
    else:
        print(f"  {key.kind} key fingerprint {key.fingerprint}")
        question = "Trust this key?"
    if not yes and not typer.confirm(question, default=False):
        print("not trusted", file=sys.stderr)
        raise typer.Exit(ExitCode.FAILED)
    path = inventory.record(
        key.line, coordinator_env, {e.line: e.text for e in key.replaced if e.path == own}
    )
    removed = any(e.path == own for e in key.replaced)
    print(f"trusted: recorded in {path}" + (" (the old key removed)" if removed else ""))
    for old in key.replaced:
        if old.path != own:
            # fanout never edits the user's files; until that line goes, both keys pass.
            print(
                f"the old key is still trusted by line {old.line} of {old.path}, which fanout"
                f" never edits: remove it with `ssh-keygen -f '{old.path}' -R '{old.name}'`",
                file=sys.stderr,
            )
