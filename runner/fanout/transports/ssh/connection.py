"""Connections to SSH hosts, and asyncssh's errors translated into fanout's three:
``Refused`` (retrying will not help: host key, authentication, missing tools),
``Unreachable`` (not this time) and ``Lost`` (a connection under an attempt went away).

Host keys are checked against fanout's own known_hosts and the user's files for that
host, which ``user_known_hosts`` finds as OpenSSH does (``~/.ssh/config``'s
``UserKnownHostsFile``, else ``~/.ssh/known_hosts`` and ``known_hosts2``).
asyncssh applies ``~/.ssh/config`` (``HostName``, ``Port``, ``User``,
``IdentityFile``, ``HostKeyAlias``) and looks the key up under the name OpenSSH uses:
the ``HostKeyAlias`` if set, else the real ``HostName``, as ``[name]:port`` for a port
other than 22 (and the peer's IP address the same way).  ``KeyWitness`` sits in that
lookup, so fanout learns the name asyncssh consulted and the key the host presented,
and can tell an unknown key from a changed one (and say which file and line holds the
old key).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncssh

if TYPE_CHECKING:
    from .forward import Forward

from ...spec import Host
from .failures import Refused, Unreachable, describe
from .knownhosts import trust_command

# sshd drops unauthenticated connections beyond MaxStartups (10 by default).
MAX_HANDSHAKES = 8
CIPHERS = (
    "aes128-gcm@openssh.com",
    "aes256-gcm@openssh.com",
    "chacha20-poly1305@openssh.com",
    "aes128-ctr",
    "aes256-ctr",
)


@dataclass(eq=False)
class Connection:
    """One SSH connection to a host and how many agent channels it carries."""

    conn: asyncssh.SSHClientConnection
    room: int  # channels this connection may carry; lowered when sshd refuses one
    channels: int = 0
    closed: bool = False
    # The gateway's remote forward on this connection (runs with APIs only): it lives
    # and dies with the connection, so an attempt's way to the gateway is the
    # connection its agent runs on.
    forward: Forward | None = None


@dataclass(frozen=True, kw_only=True)
class Connector:
    """How every connection of a run is made: verified host keys, keepalives, timeouts.

    A host that sends nothing for ``keepalive_count`` keepalive intervals (3 x 5 s) is
    given up: a frozen host is noticed in 15 s (``silence_limit``).
    """

    known_hosts: Sequence[Path]  # fanout's own: consulted for every host
    # The user's home, whose ~/.ssh/config says which of the user's files each host's
    # keys are looked up in too (``user_known_hosts``); None: ``known_hosts`` alone.
    home: Path | None = None
    # What ``fanout hosts trust`` needs besides a host's name to find it (its hosts file
    # or job file), for the advice a refused host key comes with.
    inventory: tuple[str, ...] = ()
    keepalive_interval: float = 5.0
    keepalive_count: int = 3  # intervals of silence tolerated, at least 2
    connect_timeout: float = 15.0

    @property
    def silence_limit(self) -> float:
        """Seconds without a byte from a host before its connection is dropped."""
        return self.keepalive_interval * self.keepalive_count

    def options(self, host: Host) -> dict[str, object]:
        options: dict[str, object] = {
            "keepalive_interval": self.keepalive_interval,
            # asyncssh sends a keepalive at each silent interval's end and drops the
            # connection at the end of the interval after keepalive_count_max of them
            # went unanswered: (count_max + 1) intervals of silence.  Passing the count
            # itself made a frozen host take 20 s to notice, not the 15 s documented.
            "keepalive_count_max": max(1, self.keepalive_count - 1),
            "connect_timeout": self.connect_timeout,
            "login_timeout": self.connect_timeout,
            # AES-GCM first: with AES-NI it costs a fraction of chacha20-poly1305's CPU per
            # packet, and packets are most of what the coordinator does per unit.
            "encryption_algs": CIPHERS,
        }
        if host.port is not None:
            options["port"] = host.port
        if host.user is not None:
            options["username"] = host.user
        if host.identity is not None:
            options["client_keys"] = [str(Path(host.identity).expanduser())]
        return options

    async def connect(self, host: Host, handshakes: asyncio.Semaphore, room: int) -> Connection:
        """A new authenticated connection to ``host`` that may carry ``room`` channels."""
        files = known_hosts_of(host, self.known_hosts, self.home)
        witness = KeyWitness(known=read_known_hosts(files))
        async with handshakes:
            try:
                conn = await asyncssh.connect(
                    host.address,
                    known_hosts=witness.lookup,
                    client_factory=witness.client,
                    **self.options(host),
                )
            except asyncssh.HostKeyNotVerifiable as exc:
                old = witness.entries(files)
                trust = trust_command(host, self.inventory)
                if witness.presented is not None and old:
                    raise Refused(changed_key_warning(host, witness, old, trust)) from None
                raise Refused(unknown_key_refusal(host, witness, exc.reason, trust)) from None
            except asyncssh.PermissionDenied:
                user = host.user or "the default user"
                raise Refused(f"{host.name}: authentication refused for {user}") from None
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                raise Unreachable(f"{host.name} ({where(host)}): {describe(exc)}") from None
        return Connection(conn=conn, room=room)


@dataclass(frozen=True, kw_only=True, slots=True)
class KnownEntry:
    """A known_hosts line that trusts a key for the name a host is looked up under."""

    path: Path
    line: int  # 1-based
    text: str
    name: str  # the name it matched (its pattern may be hashed): what `ssh-keygen -R` takes
    kind: str
    fingerprint: str  # SHA256:...


@dataclass(eq=False)
class KeyWitness:
    """Sits in asyncssh's host key check of one connection: records the name, address
    and port asyncssh looked up (the keys trusted there decide which key types it asks
    the host for, as OpenSSH does) and the key the host presented."""

    known: asyncssh.SSHKnownHosts
    looked_up: tuple[str, str, int | None] | None = None
    trusted: tuple[asyncssh.SSHKey, ...] = ()
    presented: asyncssh.SSHKey | None = None

    def lookup(self, host: str, addr: str, port: int | None) -> Any:
        self.looked_up = (host, addr, port)
        found = self.known.match(host, addr, port)
        self.trusted = tuple(found[0])
        return found

    def client(self) -> asyncssh.SSHClient:
        return _WitnessClient(self)

    @property
    def name(self) -> str:
        """The known_hosts name asyncssh looked up, as OpenSSH writes it."""
        assert self.looked_up is not None
        host, _, port = self.looked_up
        return f"[{host}]:{port}" if port else host

    def entries(self, files: Sequence[Path]) -> list[KnownEntry]:
        """The lines of ``files`` behind the keys this lookup trusted, in file order."""
        if self.looked_up is None or not self.trusted:
            return []
        host, addr, port = self.looked_up
        found = []
        for path in files:
            if not path.is_file():
                continue
            for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
                line = text.strip()
                if not line or line.startswith(("#", "@")):
                    continue  # markers (@revoked, @cert-authority) are not host keys
                try:
                    entry = asyncssh.import_known_hosts(line)
                except (ValueError, asyncssh.KeyImportError):
                    continue
                keys = entry.match(host, addr, port)[0]
                ported = [f"[{host}]:{port}", f"[{addr}]:{port}"] if port else []
                names = [n for n in (*ported, host, addr) if n and entry.match(n, "", None)[0]]
                # A line may match twice (by name and by address): one entry per key.
                for key in dict.fromkeys(keys):
                    # Only keys asyncssh really trusted: a port-less line it skipped
                    # because a [host]:port line matched is not the entry in force.
                    if key in self.trusted:
                        found.append(
                            KnownEntry(
                                path=path,
                                line=number,
                                text=text,
                                name=names[0] if names else self.name,
                                kind=key.get_algorithm(),
                                fingerprint=key.get_fingerprint("sha256"),
                            )
                        )
        return found


class _WitnessClient(asyncssh.SSHClient):
    def __init__(self, witness: KeyWitness) -> None:
        self._witness = witness
        self._conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn

    def begin_auth(self, username: str) -> None:
        # The key exchange is over: the host's key was trusted.
        if self._conn is not None:
            self._witness.presented = self._conn.get_server_host_key()

    # asyncssh asks this only about a key no known_hosts line trusts.
    def validate_host_public_key(
        self, host: str, addr: str, port: int, key: asyncssh.SSHKey
    ) -> bool:
        self._witness.presented = key
        return False


def host_key_alias(host: Host) -> str | None:
    """The ``HostKeyAlias`` that ``~/.ssh/config`` gives ``host``, if any."""
    options = asyncssh.SSHClientConnectionOptions(
        host=host.address,
        port=host.port if host.port is not None else (),
        config=(),
        known_hosts=None,
        client_keys=None,
        agent_path=None,
    )
    return options.host_key_alias


# OpenSSH's UserKnownHostsFile where ~/.ssh/config sets none (ssh_config(5)).
DEFAULT_USER_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
_TOKEN = re.compile(r"%(.)")


def known_hosts_of(host: Host, own: Sequence[Path], home: Path | None) -> list[Path]:
    """Every file ``host``'s key is looked up in: ``own`` (fanout's), then the user's
    (``user_known_hosts``) when ``home`` is given."""
    files = [*own, *(user_known_hosts(host, home) if home is not None else [])]
    return list(dict.fromkeys(files))


def user_known_hosts(host: Host, home: Path) -> list[Path]:
    """The user's known_hosts files for ``host``, as OpenSSH finds them: the
    ``UserKnownHostsFile`` that ``~/.ssh/config`` gives this host (as asyncssh reads the
    file: ``Host`` and ``Match`` blocks, ``Include``; several files; ``none`` for none),
    else OpenSSH's default.  ``~`` and ``%d`` are ``home``; ``%u`` the local user, ``%i``
    their uid, ``%h`` the host name after ``HostName``, ``%n`` the address as written,
    ``%p`` the port, ``%r`` the remote user, ``%k`` the ``HostKeyAlias`` (else ``%h``),
    ``%%`` a percent sign.  A file naming another token or a variable (``%C``,
    ``${X}``) is left out: fanout cannot say which file OpenSSH would read, and one key
    fewer refuses a host, where a wrong file could trust one.  Raises Refused for a
    ``~/.ssh/config`` that asyncssh cannot read."""
    try:
        options = asyncssh.SSHClientConnectionOptions(
            host=host.address,
            port=host.port if host.port is not None else (),
            username=host.user if host.user is not None else (),
            config=(),
            known_hosts=None,
            client_keys=None,
            agent_path=None,
        )
    except asyncssh.ConfigParseError as exc:
        raise Refused(f"{host.name}: cannot read ~/.ssh/config: {exc}") from None
    config = options.config
    configured = config.get("UserKnownHostsFile")
    written = DEFAULT_USER_KNOWN_HOSTS if not isinstance(configured, list) else configured
    name = str(config.get("Hostname") or host.address)
    local = pwd.getpwuid(os.getuid()).pw_name
    tokens = {
        "%": "%",
        "d": str(home),
        "u": local,
        "i": str(os.getuid()),
        "h": name,
        "n": host.address,
        "p": str(host.port or config.get("Port") or 22),
        "r": host.user or str(config.get("User") or local),
        "k": options.host_key_alias or name,
    }
    files = []
    for value in map(str, written):
        # As OpenSSH: the tilde first (``~`` is the user's home, ``~name`` another's),
        # then the tokens.
        head, slash, rest = value.partition("/")
        if head == "~":
            value = f"{home}{slash}{rest}"
        elif head.startswith("~"):
            try:
                value = f"{pwd.getpwnam(head[1:]).pw_dir}{slash}{rest}"
            except KeyError:
                continue
        if "${" in value or any(t not in tokens for t in _TOKEN.findall(value)):
            continue
        files.append(Path(_TOKEN.sub(lambda match: tokens[match[1]], value)))
    return files


def read_known_hosts(files: Sequence[Path]) -> asyncssh.SSHKnownHosts:
    return asyncssh.read_known_hosts([str(p) for p in files if p.is_file()])


def unknown_key_refusal(host: Host, witness: KeyWitness, reason: str, trust: str) -> str:
    """Why a host whose key no known_hosts line names is refused, and what to do
    (``trust``: the command that trusts it)."""
    if witness.presented is not None and witness.looked_up is not None:
        kind = witness.presented.get_algorithm()
        fingerprint = witness.presented.get_fingerprint("sha256")
        reason = f"no known_hosts entry for {witness.name} trusts its {kind} key {fingerprint}"
    return (
        f"host key of {host.name} ({where(host)}) is not trusted: {reason};"
        f" check it and run `{trust}`"
    )


def changed_key_warning(
    host: Host, witness: KeyWitness, old: Sequence[KnownEntry], trust: str
) -> str:
    """OpenSSH's REMOTE HOST IDENTIFICATION HAS CHANGED, in fanout's words, on one line
    (it is shown in a table cell, a notice and the run's log alike)."""
    assert witness.presented is not None
    kind = witness.presented.get_algorithm()
    new = witness.presented.get_fingerprint("sha256")
    trusted = " and ".join(f"{e.path}:{e.line} trusts {e.kind} key {e.fingerprint}" for e in old)
    return (
        f"host key of {host.name} ({where(host)}) is not trusted: WARNING: REMOTE HOST"
        f" IDENTIFICATION HAS CHANGED! {host.name} now offers {kind} key {new} for"
        f" {witness.name}, but {trusted} there.  Someone could be eavesdropping on you"
        f" right now (a man-in-the-middle attack), or the host was reinstalled with a new"
        f" key.  Confirm {new} with the host's administrator, then run"
        f" `{trust}` to replace the old key"
    )


def where(host: Host) -> str:
    return f"{host.address}:{host.port}" if host.port else host.address
