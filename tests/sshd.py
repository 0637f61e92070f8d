"""Real OpenSSH sshd instances on loopback ports, for the SSH transport's tests.

Each instance has its own host key, authorized_keys and config; the login user is a
non-root test user with /bin/sh (created when the tests run as root), so the suite
meets the real protocol, real MaxSessions behaviour and real signals.  ``kill`` makes
a dead host (sshd and everything it started, like a crashed machine), ``freeze`` a
frozen one (SIGSTOP on the same tree).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fanout.spec import Host

SSHD = "/usr/sbin/sshd"
TEST_USER = "fanouttest"


def login_user() -> str:
    """The user the tests log in as: a dedicated non-root user when running as root."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    try:
        pwd.getpwnam(TEST_USER)
    except KeyError:
        # Parallel workers (scripts/test --fast) may race to create it: the loser's
        # useradd fails, and the user is there all the same.
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", TEST_USER], check=False)
        pwd.getpwnam(TEST_USER)
    # useradd locks the account ("!"), and sshd refuses locked accounts even for keys.
    subprocess.run(["usermod", "-p", "*", TEST_USER], check=True)
    return TEST_USER


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


@dataclass
class Sshd:
    name: str
    port: int
    directory: Path
    host_public_key: str
    process: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)

    @property
    def known_hosts_line(self) -> str:
        kind, key = self.host_public_key.split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {key}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(self.directory / "sshd_config")],
            stdout=subprocess.DEVNULL,
            stderr=open(self.directory / "sshd.log", "ab"),  # noqa: SIM115 - sshd owns it
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError((self.directory / "sshd.log").read_text())
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError(f"sshd on port {self.port} did not start")

    def tree(self) -> list[int]:
        """sshd and every process it started (connections, wrappers, workers)."""
        if self.process is None:
            return []
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except (FileNotFoundError, ProcessLookupError):
                    continue
                parents[int(entry.name)] = int(stat[1])
        found, frontier = [self.process.pid], [self.process.pid]
        while frontier:
            parent = frontier.pop()
            children = [pid for pid, ppid in parents.items() if ppid == parent]
            found += children
            frontier += children
        return found

    def signal_tree(self, signum: int) -> None:
        for pid in self.tree():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill(self) -> None:
        """A dead host: sshd and everything under it die, the port closes."""
        self.signal_tree(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def freeze(self) -> None:
        """A frozen host: every process stops; TCP stays open but nothing answers."""
        self.signal_tree(signal.SIGSTOP)

    def stop(self) -> None:
        self.signal_tree(signal.SIGCONT)
        self.kill()

    def rekey(self) -> str:
        """The host reinstalled (or an impostor on its address): sshd restarted on the
        same port with a new host key, which is returned."""
        self.stop()
        for old in (self.directory / "hostkey", self.directory / "hostkey.pub"):
            old.unlink()
        self.host_public_key = keygen(self.directory / "hostkey")
        self.start()
        return self.host_public_key


@dataclass
class Pool:
    """Several sshd instances sharing one client key and one known_hosts file."""

    base: Path
    user: str
    client_key: Path
    known_hosts: Path
    hosts: list[Sshd] = field(default_factory=list)

    def add(self, name: str, *, max_sessions: int = 10, extra: list[str] | None = None) -> Sshd:
        directory = self.base / name
        directory.mkdir(mode=0o755)
        public = keygen(directory / "hostkey")
        port = free_port()
        (directory / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        (directory / "authorized_keys").chmod(0o644)
        config = [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {directory / 'hostkey'}",
            f"PidFile {directory / 'sshd.pid'}",
            f"AuthorizedKeysFile {directory / 'authorized_keys'}",
            "StrictModes no",
            "UsePAM no",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PubkeyAuthentication yes",
            f"AllowUsers {self.user}",
            f"MaxSessions {max_sessions}",
            "LogLevel ERROR",
            *(extra or []),
        ]
        (directory / "sshd_config").write_text("\n".join(config) + "\n")
        server = Sshd(name=name, port=port, directory=directory, host_public_key=public)
        server.start()
        self.hosts.append(server)
        self.trust(server)
        return server

    def host(self, server: Sshd, **more: Any) -> Host:
        """The inventory entry that logs in to ``server`` as the pool's user, with the
        pool's shared sandbox root (world-writable: a non-root user's units go there)."""
        root = self.base / "sandboxes"
        root.mkdir(mode=0o777, exist_ok=True)
        root.chmod(0o777)
        values: dict[str, Any] = {
            "name": server.name,
            "address": "127.0.0.1",
            "port": server.port,
            "user": self.user,
            "identity": str(self.client_key),
            "slots": 4,
            "sandbox_root": str(root),
            **more,
        }
        return Host(**values)

    def inventory(self, directory: Path, server: Sshd, *, slots: int = 4) -> Path:
        """A hosts.toml in ``directory`` naming ``server`` (as ``host`` does), and the
        pool's known hosts where fanout looks for them under the test's HOME: what a
        job's ``runtime.hosts = "hosts.toml"`` needs to run there."""
        host = self.host(server, slots=slots)
        path = directory / "hosts.toml"
        path.write_text(
            f'[[hosts]]\nname = "{host.name}"\naddress = "{host.address}"\nport = {host.port}\n'
            f'user = "{host.user}"\nidentity = "{host.identity}"\n'
            f'sandboxRoot = "{host.sandbox_root}"\nslots = {host.slots}\n'
        )
        config = Path(os.environ["HOME"]) / ".config" / "fanout"
        config.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.known_hosts, config / "known_hosts")
        return path

    def trust(self, server: Sshd) -> None:
        with self.known_hosts.open("a") as stream:
            stream.write(server.known_hosts_line + "\n")

    def close(self) -> None:
        for server in self.hosts:
            server.stop()
        shutil.rmtree(self.base, ignore_errors=True)


def make_pool() -> Pool:
    if not Path(SSHD).exists():
        raise RuntimeError("OpenSSH sshd is required (scripts/system-deps installs openssh-server)")
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="fanout-sshd-"))
    base.chmod(0o755)  # the login user reads authorized_keys through it
    client_key = base / "client_key"
    keygen(client_key)
    known_hosts = base / "known_hosts"
    known_hosts.touch()
    return Pool(base=base, user=login_user(), client_key=client_key, known_hosts=known_hosts)
