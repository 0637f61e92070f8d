"""Host keys (known_hosts): where fanout looks them up, its own known_hosts file, trusting
a host's key, and finding the host a key is asked for by name.

Host keys are always verified.  fanout reads its own file
(``$XDG_CONFIG_HOME/fanout/known_hosts``, default ``~/.config/fanout``) and the user's
files for the host, as OpenSSH finds them (``UserKnownHostsFile`` in ``~/.ssh/config``,
else ``~/.ssh/known_hosts`` and ``known_hosts2``);
``fanout hosts trust`` shows a key's fingerprint and, once confirmed, records it in
fanout's own file, never in the user's.  A changed key replaces the old line of
fanout's file (two lines would keep the old key trusted); a line in the user's file is
theirs to remove.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from ...errors import FanoutError
from ...isolation import hidden
from ...spec import Host, Spec


def fanout_known_hosts(environ: Mapping[str, str]) -> Path:
    config = environ.get("XDG_CONFIG_HOME") or str(
        Path(environ.get("HOME", "/nonexistent")) / ".config"
    )
    return Path(config) / "fanout" / "known_hosts"


def home(environ: Mapping[str, str]) -> Path:
    """The home whose ``~/.ssh/config`` and known_hosts files a host's key is looked up
    in, besides fanout's own file (the ssh package reads them per host, as OpenSSH)."""
    return hidden.home(environ)


def find(hosts: Sequence[Host], wanted: str) -> Host:
    """The inventory host named ``wanted``, or a host made from ``address[:port]``."""
    for host in hosts:
        if wanted in (host.name, host.address):
            return host
    address, _, port = wanted.rpartition(":") if wanted.count(":") == 1 else (wanted, "", "")
    if port and not port.isdigit():
        raise FanoutError(f"{wanted!r} is not a host name from the inventory or ADDRESS[:PORT]")
    address = address or wanted
    return Host(name=wanted, address=address, port=int(port) if port else None)


def inventory_options(job: Spec) -> tuple[str, ...]:
    """The options that make ``fanout hosts trust`` find ``job``'s hosts: the hosts file
    they came from (``--hosts``, a run's override included), else the job file."""
    if job.runtime.hosts_file is not None:
        return ("--hosts", str(job.runtime.hosts_file))
    return ("--job", str(job.file))


def trust_command(host: Host, inventory: Sequence[str]) -> str:
    """The ``fanout hosts trust`` command line that finds ``host`` as its run does: its
    name alone where ``find`` makes the same address and port of it (an address, or
    ADDRESS:PORT), else with ``inventory`` (``inventory_options``), without which an
    inventory name is taken for an address and never reached."""
    alone = find((), host.name)
    words = ["fanout", "hosts", "trust", host.name]
    if (alone.address, alone.port) != (host.address, host.port):
        words += inventory
    return shlex.join(words)


def record(line: str, environ: Mapping[str, str], replacing: Mapping[int, str] = {}) -> Path:
    """Add a known_hosts ``line`` to fanout's own file (created 0600), dropping the
    lines ``replacing`` names (number, 1-based, to its text: a line that changed since
    it was read stays)."""
    path = fanout_known_hosts(environ)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    existing = path.read_text().splitlines() if path.exists() else []
    kept = [text for n, text in enumerate(existing, 1) if replacing.get(n) != text]
    if line not in kept:
        kept.append(line)
    if kept != existing:
        # Written aside and renamed: a run reading the file sees the old or the new one.
        partial = path.with_name(path.name + ".new")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as stream:
            stream.write("".join(text + "\n" for text in kept))
        partial.replace(path)
    return path
