"""What ``fanout hosts trust`` asks a host: the key it presents, looked up as a run
looks it up, without authenticating."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import asyncssh

from ...errors import EnvironmentProblem
from ...spec import Host
from .connection import (
    KeyWitness,
    KnownEntry,
    host_key_alias,
    known_hosts_of,
    read_known_hosts,
    where,
)
from .failures import Refused, describe


@dataclass(frozen=True, kw_only=True, slots=True)
class HostKey:
    """What ``fanout hosts trust`` shows before it records anything: the key a host
    presented, the known_hosts name it is looked up under, and which lines already
    trust a key there (this one, or another: a changed key)."""

    name: str  # as OpenSSH writes it: [host]:port, HostKeyAlias or HostName
    line: str  # the known_hosts line that trusts this key under ``name``
    kind: str
    fingerprint: str
    trusted_by: tuple[KnownEntry, ...]  # lines trusting this very key
    replaced: tuple[KnownEntry, ...]  # lines trusting another key for ``name``


async def fetch_host_key(
    host: Host, known_hosts: Sequence[Path], home: Path | None = None, wait: float = 15.0
) -> HostKey:
    """The key ``host`` presents, looked up exactly as a run looks it up (through
    ``~/.ssh/config``, in ``known_hosts`` and the user's files under ``home``), without
    authenticating: every auth method is off, so the handshake ends once the host has
    shown its key."""
    try:
        files = known_hosts_of(host, known_hosts, home)
    except Refused as exc:
        raise EnvironmentProblem(str(exc)) from None
    witness = KeyWitness(known=read_known_hosts(files))
    options: dict[str, object] = {
        "known_hosts": witness.lookup,
        "client_factory": witness.client,
        "connect_timeout": wait,
        # Never authenticate: no key, agent, password, keyboard or GSS attempt.
        "client_keys": None,
        "agent_path": None,
        "password_auth": False,
        "kbdint_auth": False,
        "gss_auth": False,
        "host_based_auth": False,
    }
    if host.port is not None:
        options["port"] = host.port
    if host.user is not None:
        options["username"] = host.user
    try:
        conn = await asyncio.wait_for(asyncssh.connect(host.address, **options), wait)
        conn.close()
        await conn.wait_closed()
    except asyncssh.HostKeyNotVerifiable as exc:
        if witness.presented is None:  # a revoked key: never offered for trust
            raise EnvironmentProblem(f"{host.name} ({where(host)}): {exc.reason}") from None
    except asyncssh.PermissionDenied:
        pass  # a trusted key, and no authentication tried
    except (OSError, asyncssh.Error, TimeoutError) as exc:
        if witness.presented is None:
            raise EnvironmentProblem(
                f"cannot reach {host.name} ({where(host)}): {describe(exc)}"
            ) from None
    key = witness.presented
    if key is None or witness.looked_up is None:
        raise EnvironmentProblem(f"{host.name} ({where(host)}) offered no host key")
    # OpenSSH records a HostKeyAlias bare (it never adds the port to it); asyncssh looks
    # up [alias]:port first and then the bare alias, so both accept the line.
    name = witness.looked_up[0] if host_key_alias(host) else witness.name
    public = key.export_public_key("openssh").decode().split()
    entries = witness.entries(files)
    fingerprint = key.get_fingerprint("sha256")
    trusted_by = tuple(e for e in entries if e.fingerprint == fingerprint)
    return HostKey(
        name=name,
        line=f"{name} {public[0]} {public[1]}",
        kind=key.get_algorithm(),
        fingerprint=fingerprint,
        trusted_by=trusted_by,
        # A trusted key next to keys of other types is not a change (hosts have several).
        replaced=() if trusted_by else tuple(entries),
    )
