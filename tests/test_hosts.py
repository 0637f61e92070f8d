"""Host keys as users meet them: ``~/.ssh/config`` aliases trusted under the name that is
looked up, and a changed key warned about, refused, and replaced on trust (real sshd on
loopback, the real CLI, a real ``~/.ssh/config`` in the test's private HOME)."""

from __future__ import annotations

import os
import pwd
import random
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout.errors import HostsUnavailable
from fanout.spec import Host
from fanout.transports.ssh import SshTransport, knownhosts
from fanout.transports.ssh.connection import user_known_hosts

from helpers import make_attempt, write_job

FANOUT = [sys.executable, "-m", "fanout"]


def _home() -> Path:
    return Path(os.environ["HOME"])  # conftest's private HOME of this test


def _fanout(*argv: str, answer: str | None = None, cwd: Path | None = None) -> Any:
    return subprocess.run(
        [*FANOUT, *argv],
        capture_output=True,
        text=True,
        input=answer,
        env=dict(os.environ),
        cwd=cwd,
    )


def _fingerprint(public_key: str, tmp_path: Path) -> str:
    """The SHA256 fingerprint as OpenSSH's ssh-keygen prints it."""
    path = tmp_path / "key.pub"
    path.write_text(public_key + "\n")
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return listed.stdout.split()[1]


def _key(server: Any) -> str:
    return " ".join(server.host_public_key.split()[:2])


def _sandboxes(pool: Any) -> Path:
    root = Path(pool.base) / "sandboxes"
    root.mkdir(mode=0o777, exist_ok=True)
    root.chmod(0o777)
    return root


def _job(tmp_path: Path, hosts_toml: str) -> Path:
    (tmp_path / "hosts.toml").write_text(hosts_toml)
    return Path(
        write_job(
            tmp_path,
            'version = 1\nname = "h"\n[inputs]\nitems = ["a"]\n[task]\ncommand = ["true"]\n'
            '[runtime]\nhosts = "hosts.toml"\n',
        )
    )


def _rows(stdout: str) -> dict[str, str]:
    return {line.split("│")[1].strip(): line for line in stdout.splitlines() if "│" in line}


# An alias of ~/.ssh/config ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("alias_line", ["", "HostKeyAlias ecobox-key"])
def test_trusting_an_ssh_config_alias_records_the_name_that_is_looked_up(
    ssh_pool: Any, tmp_path: Path, alias_line: str
) -> None:
    """`address = "ecobox"`, a Host block giving HostName, Port, User and IdentityFile:
    the key is recorded as OpenSSH records it ([127.0.0.1]:PORT, or the HostKeyAlias
    bare) and `hosts check` then passes."""
    server = ssh_pool.add("h1")
    ssh = _home() / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "config").write_text(
        f"Host ecobox\n  HostName 127.0.0.1\n  Port {server.port}\n  User {ssh_pool.user}\n"
        f"  IdentityFile {ssh_pool.client_key}\n  {alias_line}\n"
    )
    job = _job(
        tmp_path,
        f'[[hosts]]\nname = "ecobox"\naddress = "ecobox"\nsandboxRoot = "{_sandboxes(ssh_pool)}"\n',
    )
    refused = _fanout("hosts", "check", str(job))
    assert refused.returncode == 4
    assert "is not trusted" in refused.stdout
    assert "run `fanout hosts trust ecobox`" in refused.stdout

    trusted = _fanout("hosts", "trust", "ecobox", "--yes")  # as the advice says, no --job
    assert trusted.returncode == 0, trusted.stderr
    name = "ecobox-key" if alias_line else f"[127.0.0.1]:{server.port}"
    recorded = knownhosts.fanout_known_hosts(os.environ)
    assert recorded.read_text() == f"{name} {_key(server)}\n"  # not "ecobox ssh-ed25519 ..."
    fingerprint = _fingerprint(server.host_public_key, tmp_path)
    assert trusted.stdout.splitlines()[:2] == [
        f"ecobox (known_hosts name {name})",
        f"  ssh-ed25519 key fingerprint {fingerprint}",
    ]

    checked = _fanout("hosts", "check", str(job))
    assert checked.returncode == 0, checked.stdout
    assert "/bin/sh" in _rows(checked.stdout)["ecobox"]

    again = _fanout("hosts", "trust", "ecobox", "--yes")
    assert again.returncode == 0
    assert f"is already trusted ({recorded}:1)" in again.stdout
    assert recorded.read_text() == f"{name} {_key(server)}\n"


@pytest.mark.slow
async def test_an_unknown_key_is_refused_naming_the_name_looked_up_and_the_key(
    ssh_pool: Any, tmp_path: Path
) -> None:
    server = ssh_pool.add("h1")
    ssh = _home() / ".ssh"
    ssh.mkdir(mode=0o700)
    (ssh / "config").write_text(
        f"Host ecobox\n  HostName 127.0.0.1\n  Port {server.port}\n  User {ssh_pool.user}\n"
        f"  IdentityFile {ssh_pool.client_key}\n"
    )
    host = Host(name="ecobox", address="ecobox", sandbox_root=str(_sandboxes(ssh_pool)))
    transport = SshTransport([host], known_hosts=[knownhosts.fanout_known_hosts(os.environ)])
    with pytest.raises(HostsUnavailable) as caught:
        await transport.start()
    await transport.close()
    fingerprint = _fingerprint(server.host_public_key, tmp_path)
    assert str(caught.value) == (
        "no SSH host can run units: host key of ecobox (ecobox) is not trusted: no known_hosts"
        f" entry for [127.0.0.1]:{server.port} trusts its ssh-ed25519 key {fingerprint};"
        " check it and run `fanout hosts trust ecobox`"
    )


@pytest.mark.slow
def test_the_trust_advice_for_an_inventory_name_runs_as_printed(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """Issue 20: `hosts check` said to run `fanout hosts trust a`, which took the
    inventory name for an address and failed; the advice names the hosts file."""
    server = ssh_pool.add("h1")
    job = _job(
        tmp_path,
        f'[[hosts]]\nname = "a"\naddress = "127.0.0.1"\nport = {server.port}\n'
        f'user = "{ssh_pool.user}"\nidentity = "{ssh_pool.client_key}"\n'
        f'sandboxRoot = "{_sandboxes(ssh_pool)}"\n',
    )
    refused = _fanout("hosts", "check", job.name, cwd=tmp_path)
    assert refused.returncode == 4
    advice = re.search(r"run `(fanout hosts trust [^`]*)`", " ".join(refused.stdout.split()))
    assert advice is not None, refused.stdout
    assert advice[1] == "fanout hosts trust a --hosts hosts.toml"
    trusted = _fanout(*shlex.split(advice[1])[1:], "--yes", cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    checked = _fanout("hosts", "check", job.name, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout


def test_the_trust_command_names_the_inventory_only_where_the_name_is_not_an_address() -> None:
    job = ("--job", "jobs/sweep.toml")
    assert knownhosts.trust_command(Host(name="a", address="10.0.0.7"), job) == (
        "fanout hosts trust a --job jobs/sweep.toml"
    )
    assert knownhosts.trust_command(Host(name="ecobox", address="ecobox"), job) == (
        "fanout hosts trust ecobox"
    )
    named = Host(name="10.0.0.7:2222", address="10.0.0.7", port=2222)
    assert knownhosts.trust_command(named, job) == "fanout hosts trust 10.0.0.7:2222"
    # Same name and address, another port: the name alone would reach port 22.
    ported = Host(name="box", address="box", port=2222)
    assert knownhosts.trust_command(ported, ("--hosts", "my hosts.toml")) == (
        "fanout hosts trust box --hosts 'my hosts.toml'"
    )


# ~/.ssh/config's UserKnownHostsFile --------------------------------------------------


@pytest.mark.slow
def test_the_user_known_hosts_file_of_ssh_config_is_where_keys_are_looked_up(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """Issue 20: fanout read ~/.ssh/known_hosts whatever ~/.ssh/config said.  Like
    OpenSSH, it reads the files UserKnownHostsFile names for the host (tokens expanded),
    and not ~/.ssh/known_hosts then."""
    server = ssh_pool.add("h1")
    ssh = _home() / ".ssh"
    (ssh / "fleet").mkdir(parents=True)
    fleet = ssh / "fleet" / f"hosts-{server.port}"
    fleet.write_text(f"# the fleet's keys\n{server.known_hosts_line}\n")
    (ssh / "config").write_text(
        "Host 127.0.0.1\n  UserKnownHostsFile ~/.ssh/none-here %d/.ssh/fleet/hosts-%p\n"
    )
    job = _job(
        tmp_path,
        f'[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {server.port}\n'
        f'user = "{ssh_pool.user}"\nidentity = "{ssh_pool.client_key}"\n'
        f'sandboxRoot = "{_sandboxes(ssh_pool)}"\n',
    )
    checked = _fanout("hosts", "check", str(job))
    assert checked.returncode == 0, checked.stdout
    trusted = _fanout("hosts", "trust", "h1", "--job", str(job), "--yes")
    assert trusted.returncode == 0, trusted.stderr
    assert f"is already trusted ({fleet}:2)" in trusted.stdout
    ran = _fanout("run", str(job), cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    # The key in ~/.ssh/known_hosts, the configured file empty: refused, as by OpenSSH.
    (ssh / "known_hosts").write_text(server.known_hosts_line + "\n")
    fleet.write_text("")
    refused = _fanout("hosts", "check", str(job))
    assert refused.returncode == 4
    assert "host key of h1 (127.0.0.1:" in refused.stdout


def test_user_known_hosts_files_are_found_as_openssh_finds_them() -> None:
    home = _home()
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh" / "config").write_text(
        "Host box\n  HostName 10.0.0.9\n  Port 2200\n  User deploy\n"
        "  UserKnownHostsFile ~/.ssh/a %d/.ssh/%h-%p-%r-%n %d/%k%% ~/.ssh/%C ${HOME}/x"
        " ~nobody-such-user/y ~root/z\n"
        "Host quiet\n  UserKnownHostsFile none\n"
        "Host aliased\n  HostKeyAlias fleet-key\n  UserKnownHostsFile %d/%k\n"
    )
    box = Host(name="b", address="box")
    assert user_known_hosts(box, home) == [
        home / ".ssh" / "a",
        home / ".ssh" / "10.0.0.9-2200-deploy-box",
        home / "10.0.0.9%",  # %k without a HostKeyAlias is the host name
        # %C and ${HOME}: left out (fanout does not expand them), as is an unknown user.
        Path(pwd.getpwnam("root").pw_dir) / "z",
    ]
    # The inventory's port and user win over the config's, as they do for the login.
    ported = Host(name="b", address="box", port=2222, user="ops")
    assert user_known_hosts(ported, home)[1] == home / ".ssh" / "10.0.0.9-2222-ops-box"
    assert user_known_hosts(Host(name="q", address="quiet"), home) == []
    assert user_known_hosts(Host(name="k", address="aliased"), home) == [home / "fleet-key"]
    assert user_known_hosts(Host(name="o", address="other"), home) == [
        home / ".ssh" / "known_hosts",
        home / ".ssh" / "known_hosts2",
    ]


# A changed key ----------------------------------------------------------------------


@pytest.mark.slow
async def test_a_changed_host_key_is_refused_with_both_fingerprints_and_the_old_line(
    ssh_pool: Any, tmp_path: Path
) -> None:
    server = ssh_pool.add("h1")
    old = _fingerprint(server.host_public_key, tmp_path)
    new = _fingerprint(server.rekey(), tmp_path)
    host = ssh_pool.host(server)
    transport = SshTransport(
        [host], known_hosts=[ssh_pool.known_hosts], rng=random.Random(3), connect_timeout=5.0
    )
    with pytest.raises(HostsUnavailable) as caught:
        await transport.start()
    await transport.close()
    name = f"[127.0.0.1]:{server.port}"
    assert str(caught.value) == (
        f"no SSH host can run units: host key of h1 (127.0.0.1:{server.port}) is not trusted:"
        f" WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! h1 now offers ssh-ed25519 key"
        f" {new} for {name}, but {ssh_pool.known_hosts}:1 trusts ssh-ed25519 key {old}"
        f" there.  Someone could be eavesdropping on you right now (a man-in-the-middle"
        f" attack), or the host was reinstalled with a new key.  Confirm {new} with the"
        f" host's administrator, then run `fanout hosts trust h1` to replace the old key"
    )


@pytest.mark.slow
def test_trusting_a_changed_key_asks_and_replaces_the_old_entry(
    ssh_pool: Any, tmp_path: Path
) -> None:
    server = ssh_pool.add("h1")
    job = _job(
        tmp_path,
        f'[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {server.port}\n'
        f'user = "{ssh_pool.user}"\nidentity = "{ssh_pool.client_key}"\n'
        f'sandboxRoot = "{_sandboxes(ssh_pool)}"\n',
    )
    first = _fanout("hosts", "trust", "h1", "--job", str(job), answer="y\n")
    assert first.returncode == 0, first.stderr
    recorded = knownhosts.fanout_known_hosts(os.environ)
    name = f"[127.0.0.1]:{server.port}"
    assert recorded.read_text() == f"{name} {_key(server)}\n"
    old_key, old = _key(server), _fingerprint(server.host_public_key, tmp_path)
    new = _fingerprint(server.rekey(), tmp_path)

    refused = _fanout("run", str(job), cwd=tmp_path)
    assert refused.returncode == 4
    assert "host h1 is unavailable: host key of h1" in refused.stderr
    assert "WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!" in refused.stderr
    assert f"but {recorded}:1 trusts ssh-ed25519 key {old} there" in refused.stderr

    scripted = _fanout("hosts", "trust", "h1", "--job", str(job), "--yes")
    assert scripted.returncode == 1
    assert "--yes never replaces a changed key" in scripted.stderr
    declined = _fanout("hosts", "trust", "h1", "--job", str(job), answer="n\n")
    assert declined.returncode == 1
    assert recorded.read_text() == f"{name} {old_key}\n"

    replaced = _fanout("hosts", "trust", "h1", "--job", str(job), answer="y\n")
    assert replaced.returncode == 0, replaced.stderr
    assert replaced.stdout.splitlines()[:4] == [
        f"h1 (known_hosts name {name})",
        "  WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!",
        f"  trusted until now: ssh-ed25519 key {old} ({recorded}:1)",
        f"  offered now:       ssh-ed25519 key {new}",
    ]
    assert "Replace the old key with this one? [y/N]" in replaced.stdout
    assert f"trusted: recorded in {recorded} (the old key removed)" in replaced.stdout
    assert recorded.read_text() == f"{name} {_key(server)}\n"  # one line: the new key only
    assert oct(recorded.stat().st_mode & 0o777) == "0o600"

    checked = _fanout("hosts", "check", str(job))
    assert checked.returncode == 0, checked.stdout


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["plain", "HashKnownHosts", "portless"])
def test_an_old_key_in_the_users_known_hosts_is_left_alone_and_named(
    ssh_pool: Any, tmp_path: Path, layout: str
) -> None:
    server = ssh_pool.add("h1")
    ssh = _home() / ".ssh"
    ssh.mkdir(mode=0o700)
    users = ssh / "known_hosts"
    # "portless": a line for 127.0.0.1 without a port, which asyncssh (like OpenSSH)
    # falls back to for any port when no [127.0.0.1]:PORT line exists.
    line = f"127.0.0.1 {_key(server)}" if layout == "portless" else server.known_hosts_line
    users.write_text(f"# mine\n{line}\n")
    if layout == "HashKnownHosts":  # Debian's and Ubuntu's default: |1|salt|hash names
        subprocess.run(["ssh-keygen", "-H", "-f", str(users)], capture_output=True, check=True)
        Path(f"{users}.old").unlink()
        assert "127.0.0.1" not in users.read_text()
    original = users.read_text()
    old = _fingerprint(server.host_public_key, tmp_path)
    server.rekey()
    name = f"[127.0.0.1]:{server.port}"
    replaced = _fanout("hosts", "trust", f"127.0.0.1:{server.port}", answer="y\n")
    assert replaced.returncode == 0, replaced.stderr
    assert f"  trusted until now: ssh-ed25519 key {old} ({users}:2)" in replaced.stdout
    recorded = knownhosts.fanout_known_hosts(os.environ)
    assert f"trusted: recorded in {recorded}\n" in replaced.stdout  # nothing removed there
    assert users.read_text() == original
    assert recorded.read_text() == f"{name} {_key(server)}\n"
    advice = replaced.stderr.strip()
    old_name = "127.0.0.1" if layout == "portless" else name
    assert advice == (
        f"the old key is still trusted by line 2 of {users}, which fanout never edits:"
        f" remove it with `ssh-keygen -f '{users}' -R '{old_name}'`"
    )
    # The command given works as written.
    command = advice.split("`")[1]
    subprocess.run(shlex.split(command), capture_output=True, check=True)
    assert users.read_text() == "# mine\n"


# fanout's own file ------------------------------------------------------------------


def test_recording_replaces_only_the_named_lines_still_as_they_were(tmp_path: Path) -> None:
    environ = {"HOME": str(tmp_path)}
    path = knownhosts.fanout_known_hosts(environ)
    path.parent.mkdir(parents=True)
    path.write_text("a ssh-ed25519 A\n[b]:2222 ssh-ed25519 OLD\nc ssh-ed25519 C\n")
    knownhosts.record(
        "[b]:2222 ssh-ed25519 NEW",
        environ,
        {2: "[b]:2222 ssh-ed25519 OLD", 3: "c ssh-ed25519 changed since"},
    )
    assert path.read_text() == "a ssh-ed25519 A\nc ssh-ed25519 C\n[b]:2222 ssh-ed25519 NEW\n"
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    knownhosts.record("[b]:2222 ssh-ed25519 NEW", environ)
    assert path.read_text().count("NEW") == 1


@pytest.mark.slow
async def test_a_key_changed_during_a_run_quarantines_the_host_with_the_warning(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """The host is reinstalled (or impersonated) while the run goes on: its connections
    drop, the reconnect meets the new key, and the host is quarantined saying why."""
    import asyncio

    servers = [ssh_pool.add("h1"), ssh_pool.add("h2")]
    pool = [ssh_pool.host(s) for s in servers]
    notices: list[str] = []
    transport = SshTransport(
        pool,
        known_hosts=[ssh_pool.known_hosts],
        rng=random.Random(3),
        keepalive_interval=1.0,
        keepalive_count=2,
        connect_timeout=5.0,
        notice=notices.append,
    )
    await transport.start()
    try:
        new = _fingerprint(servers[0].rekey(), tmp_path)
        for n in range(8):
            # Units keep running (on h2) while h1 is lost, reconnects and is refused.
            await transport.run(make_attempt(tmp_path / str(n), ["true"], unit_id=f"u{n}"))
        for _ in range(200):  # the reconnect backoff is at most 1 s here
            if any("quarantined" in n for n in notices):
                break
            await asyncio.sleep(0.05)
    finally:
        await transport.close()
    quarantined = [n for n in notices if n.startswith("host h1 quarantined")]
    assert len(quarantined) == 1, notices
    assert "WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! h1 now offers" in quarantined[0]
    assert f"ssh-ed25519 key {new} for [127.0.0.1]:{servers[0].port}" in quarantined[0]
