"""What ``fanout hosts check`` and ``fanout hosts trust`` ask a host."""

from __future__ import annotations

import asyncio
import shlex
import time
from dataclasses import dataclass

import asyncssh

from ..errors import EnvironmentProblem
from ..spec import Host
from .connection import Connector, Refused, Unreachable, describe, where


@dataclass(frozen=True, kw_only=True, slots=True)
class Probe:
    """What ``fanout hosts check`` learns about one host."""

    name: str
    address: str
    reachable: bool
    auth: bool
    shell: str
    bwrap: bool
    free_disk: str
    rtt_ms: float | None
    error: str


async def probe(connector: Connector, host: Host) -> Probe:
    """Reachability, authentication, shell, bwrap, free disk in the sandbox root and
    round-trip time of one host."""
    base = {"name": host.name, "address": where(host)}
    empty = {"shell": "", "bwrap": False, "free_disk": "", "rtt_ms": None}
    try:
        connection = await connector.connect(host, asyncio.Semaphore(1), room=1)
    except Refused as exc:
        return Probe(**base, reachable=True, auth=False, error=str(exc), **empty)  # type: ignore[arg-type]
    except Unreachable as exc:
        return Probe(**base, reachable=False, auth=False, error=str(exc), **empty)  # type: ignore[arg-type]
    conn = connection.conn
    try:
        begin = time.monotonic()
        await conn.run("true", check=False)
        rtt = (time.monotonic() - begin) * 1000
        root = shlex.quote(host.sandbox_root)
        facts = await conn.run(
            f'echo "$SHELL"; command -v bwrap || echo -; df -Pk {root} | tail -1;'
            f" test -d {root} -a -w {root} && echo writable || echo read-only",
            check=False,
        )
        lines = [*str(facts.stdout or "").splitlines(), "", "", "", ""]
        fields = lines[2].split()
        free = f"{int(fields[3]) // 1024:,} MiB" if len(fields) > 3 and fields[3].isdigit() else "?"
        return Probe(
            **base,
            reachable=True,
            auth=True,
            shell=lines[0],
            bwrap=lines[1] != "-",
            free_disk=free,
            rtt_ms=rtt,
            error="" if lines[3] == "writable" else f"{host.sandbox_root} is not writable",
        )
    finally:
        conn.close()


async def fetch_host_key(host: Host, wait: float = 15.0) -> tuple[str, str, str]:
    """(known_hosts line, SHA256 fingerprint, key type) of ``host``'s server key, for
    ``fanout hosts trust`` to show before anything is recorded."""
    options: dict[str, object] = {}
    if host.port is not None:
        options["port"] = host.port
    try:
        lookup = asyncssh.get_server_host_key(host.address, **options)  # type: ignore[arg-type]
        key = await asyncio.wait_for(lookup, wait)
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        raise EnvironmentProblem(
            f"cannot reach {host.name} ({where(host)}): {describe(exc)}"
        ) from None
    if key is None:
        raise EnvironmentProblem(f"{host.name} ({where(host)}) offered no host key")
    pattern = f"[{host.address}]:{host.port}" if host.port and host.port != 22 else host.address
    public = key.export_public_key("openssh").decode().split()
    return f"{pattern} {public[0]} {public[1]}", key.get_fingerprint("sha256"), key.get_algorithm()
