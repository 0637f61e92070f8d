"""Nothing outlives its unit over SSH: a worker's setsid'd daemon that left the sandbox
directory dies with its unit when the unit ends, when its lifeline is cut and when its
agent dies; ``hosts check`` says which containment a host gives."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_ssh import _host, _sandboxes, _transport, _wait_empty

from fanout.outcome import AttemptResult, Status
from fanout.transports.ssh import SshTransport
from fanout.transports.ssh.probe import GROUP_ONLY, Facilities

from helpers import make_attempt, write_job
from procs import marker, pids_with, wait_until_gone

pytestmark = pytest.mark.slow


def _shared(pool: Any) -> Path:
    """A directory every worker may write to (outside any sandbox)."""
    shared: Path = pool.base / "shared"
    shared.mkdir(mode=0o777, exist_ok=True)
    shared.chmod(0o777)
    return shared


def _daemon_unit(token: str, touched: Path, then: str = "") -> list[str]:
    """A worker that leaves a daemon the way a careless tool does (setsid, ``cd /``, its
    output closed), waits until the daemon has its own session, then does ``then``."""
    daemon = f"touch ready; cd /; exec >/dev/null 2>&1 </dev/null; sleep {token}; touch {touched}"
    wait = "while [ ! -e ready ]; do sleep 0.01; done"
    return ["sh", "-c", f"setsid sh -c '{daemon}' & {wait}; echo started; {then}"]


async def _run_all(transport: SshTransport, tmp_path: Path, argv: list[str], count: int) -> Any:
    return [
        asyncio.create_task(
            transport.run(make_attempt(tmp_path / str(n), argv, unit_id=f"u{n}", timeout=60))
        )
        for n in range(count)
    ]


@pytest.mark.parametrize("login", ["user", "root"])
@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
async def test_no_daemon_outlives_a_unit_that_finished(
    ssh_pool: Any, tmp_path: Path, sandbox: str, login: str
) -> None:
    """As a non-root user (a user namespace holds the PID namespace) and as root (the
    README's systemd recipe: a PID namespace without a user namespace)."""
    if login == "root":
        if os.geteuid() != 0:
            pytest.skip("logging in as root needs the tests to run as root")
        ssh_pool.user = "root"
    server = ssh_pool.add("h1")
    transport = _transport(ssh_pool, [_host(ssh_pool, server)], sandbox_kind=sandbox)
    await transport.start()
    token, touched = marker(), _shared(ssh_pool) / f"marker-{sandbox}"
    try:
        results: list[AttemptResult] = await asyncio.gather(
            *await _run_all(transport, tmp_path, _daemon_unit(token, touched), 20)
        )
        survivors = await asyncio.to_thread(wait_until_gone, token, 10.0)
    finally:
        await transport.close()
    assert [r.status for r in results] == [Status.SUCCEEDED] * 20
    assert {r.output_tail for r in results} == {"started\n"}
    assert survivors == []
    assert not touched.exists()


async def _interrupted(ssh_pool: Any, tmp_path: Path, sandbox: str, cut: Any) -> Any:
    """Eight units, each with a daemon and a long worker; ``cut(transport, tasks)`` runs
    once every daemon is up.  Returns the daemons and workers left, the results."""
    server = ssh_pool.add("h1")
    host = _host(ssh_pool, server, slots=8)
    transport = _transport(ssh_pool, [host], sandbox_kind=sandbox)
    await transport.start()
    token, worker = marker(), marker()
    touched = _shared(ssh_pool) / "marker"
    try:
        tasks = await _run_all(
            transport, tmp_path, _daemon_unit(token, touched, f"sleep {worker}"), 8
        )

        def all_up() -> bool:
            return len(_sleeps(token)) == 8 and len(_sleeps(worker)) == 8

        assert await asyncio.to_thread(_poll, all_up)
        results = await cut(transport, tasks)
    finally:
        await transport.close()
    daemons = await asyncio.to_thread(wait_until_gone, token, 10.0)
    workers = await asyncio.to_thread(wait_until_gone, worker, 10.0)
    assert not touched.exists()
    return daemons, workers, results


def _sleeps(token: str) -> list[int]:
    """The ``sleep TOKEN`` processes (not the shells whose scripts mention it)."""
    return [pid for pid in pids_with(token) if _cmdline(pid) == ["sleep", token]]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _poll(condition: Any, timeout: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
async def test_no_daemon_outlives_an_interrupted_unit(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    async def interrupt(transport: SshTransport, tasks: list[Any]) -> list[Any]:
        for task in tasks:
            task.cancel()  # Ctrl-C: the lifelines are cut
        return await asyncio.gather(*tasks, return_exceptions=True)

    daemons, workers, results = await _interrupted(ssh_pool, tmp_path, sandbox, interrupt)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert (daemons, workers) == ([], [])
    assert _sandboxes(ssh_pool) == []


def _agents(root: Path) -> list[int]:
    """The main shells of the agents serving sandbox root ``root`` (this test's host):
    not the unshare above them (where there is one), not their subshells (whose parent
    is an agent shell)."""
    shells = {
        pid
        for pid in pids_with("fanout-end")
        if _cmdline(pid)[:1] == ["sh"] and str(root) in _cmdline(pid)
    }
    main = []
    for pid in shells:
        try:
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        if parent not in shells:
            main.append(pid)
    return main


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
async def test_no_daemon_outlives_a_killed_agent(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    async def kill_agents(transport: SshTransport, tasks: list[Any]) -> list[Any]:
        agents = _agents(ssh_pool.base / "sandboxes")
        assert len(agents) == 8
        for pid in agents:
            os.kill(pid, signal.SIGKILL)  # the OOM killer, say
        return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    daemons, workers, results = await _interrupted(ssh_pool, tmp_path, sandbox, kill_agents)
    assert (daemons, workers) == ([], [])
    assert [r.status for r in results] == [Status.LOST] * 8
    assert {r.reason.split(":")[0] for r in results} == {"the agent on h1 stopped"}


def test_hosts_check_names_the_containment(ssh_pool: Any, tmp_path: Path) -> None:
    server = ssh_pool.add("h1")
    root = ssh_pool.base / "sandboxes"
    root.mkdir(mode=0o777, exist_ok=True)
    root.chmod(0o777)
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(ssh_pool.known_hosts.read_text())
    env = {**os.environ, "HOME": str(home)}
    env.pop("XDG_CONFIG_HOME", None)
    rows = {}
    for sandbox in ("auto", "none"):
        folder = tmp_path / sandbox
        folder.mkdir()
        job = write_job(
            folder,
            f"""
            version = 1
            name = "h"
            [inputs]
            items = ["a"]
            [task]
            command = ["true"]
            [runtime]
            sandbox = "{sandbox}"
            [[runtime.hosts]]
            name = "h1"
            address = "127.0.0.1"
            port = {server.port}
            user = "{ssh_pool.user}"
            identity = "{ssh_pool.client_key}"
            sandboxRoot = "{root}"
            """,
        )
        checked = subprocess.run(
            [sys.executable, "-m", "fanout", "hosts", "check", str(job)],
            capture_output=True,
            text=True,
            env=env,
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        (row,) = [line for line in checked.stdout.splitlines() if "│ h1 " in line]
        rows[sandbox] = [cell.strip() for cell in row.split("│")][7]
    assert rows == {"auto": "pid namespace (bwrap)", "none": "pid namespace (unshare)"}


def test_a_host_without_pid_namespaces_says_what_it_gives() -> None:
    without = Facilities(bwrap=False, missing=(), unshare=None)
    assert without.containment("none") == (
        "process group only: a process that calls setsid can outlive its unit"
    )
    assert without.containment("none") == GROUP_ONLY
    with_bwrap = Facilities(bwrap=True, missing=(), unshare=None)
    assert with_bwrap.containment("bwrap") == "pid namespace (bwrap)"


async def test_a_host_without_pid_namespaces_is_announced_once(
    ssh_pool: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where unshare does not work, units still run (in process groups), and the run
    says once per host what that leaves open."""
    from fanout.transports.ssh import probe
    from fanout.transports.ssh import transport as transport_module

    real = probe.facilities

    async def without_unshare(conn: Any, commands: Any = (), root: Any = None) -> Facilities:
        offered = await real(conn, commands, root)
        return dataclasses.replace(offered, unshare=None)

    monkeypatch.setattr(transport_module, "facilities", without_unshare)
    notices: list[str] = []
    server = ssh_pool.add("h1")
    transport = _transport(
        ssh_pool, [_host(ssh_pool, server)], sandbox_kind="none", notice=notices.append
    )
    await transport.start()
    try:
        result = await transport.run(make_attempt(tmp_path, ["sh", "-c", "echo ok"]))
        state = transport._hosts[0]
        await transport.lost(state, "test: dropped")
        assert await asyncio.to_thread(_poll, lambda: state.healthy, 20.0)
    finally:
        await transport.close()
    assert result.status is Status.SUCCEEDED
    assert [n for n in notices if "PID namespace" in n] == [
        "host h1 offers no PID namespace (no unshare, or a non-root user without user"
        " namespaces): process group only: a process that calls setsid can outlive its unit"
    ]
    assert await asyncio.to_thread(_wait_empty, ssh_pool) == []


async def test_without_pid_namespaces_escapees_in_the_sandbox_die_at_its_end(
    ssh_pool: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process groups only (no unshare): a setsid'd daemon that stays in the sandbox
    (its environment cleared), or carries its FANOUT_CONTROL elsewhere, is found by the local rule when the sandbox
    is closed, even under a sandbox root reached through a symlink (the kernel names
    a cwd by its real path)."""
    from fanout.transports.ssh import probe
    from fanout.transports.ssh import transport as transport_module

    real = probe.facilities

    async def without_unshare(conn: Any, commands: Any = (), root: Any = None) -> Facilities:
        offered = await real(conn, commands, root)
        return dataclasses.replace(offered, unshare=None)

    monkeypatch.setattr(transport_module, "facilities", without_unshare)
    real_root = ssh_pool.base / "real-root"
    real_root.mkdir(mode=0o777)
    real_root.chmod(0o777)
    linked = ssh_pool.base / "linked-root"
    linked.symlink_to(real_root)
    server = ssh_pool.add("h1")
    host = _host(ssh_pool, server, sandbox_root=str(linked))
    transport = _transport(ssh_pool, [host], sandbox_kind="none")
    await transport.start()
    staying, leaving = marker(), marker()
    script = (
        f"env -i setsid sleep {staying} & cd /; setsid sh -c 'cd /; exec sleep {leaving}' &"
        " sleep 0.2; echo started"
    )
    try:
        result = await transport.run(make_attempt(tmp_path, ["sh", "-c", script]))
    finally:
        await transport.close()
    assert (result.status, result.output_tail) == (Status.SUCCEEDED, "started\n")
    assert pids_with(staying) == []
    assert pids_with(leaving) == []
    assert list(real_root.iterdir()) == []
