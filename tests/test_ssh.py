"""The SSH transport against real OpenSSH sshd on loopback: sandboxes, host keys,
timeouts, lost connections, dead and frozen hosts, secrets, and sshd's session limits."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.attempt import collecting
from fanout.attempt.model import Attempt
from fanout.attempt.sandbox import StagedFile
from fanout.errors import HostsUnavailable
from fanout.events import Events
from fanout.isolation.exposure import NOTHING, Handed
from fanout.outcome import AttemptResult, Status
from fanout.run.job import Options, Runner
from fanout.spec import Host
from fanout.transports.ssh import SshTransport, wire

from helpers import make_attempt, make_runner, write_job
from procs import marker, pids_with, short_marker, wait_until_gone, wait_until_present

pytestmark = pytest.mark.slow


def _host(pool: Any, server: Any, **more: Any) -> Host:
    return pool.host(server, **more)  # type: ignore[no-any-return]


def _transport(pool: Any, hosts: list[Host], **more: Any) -> SshTransport:
    options: dict[str, Any] = {
        "keepalive_interval": 1.0,
        "keepalive_count": 2,
        "connect_timeout": 3.0,
    }
    options.update(more)
    return SshTransport(hosts, known_hosts=[pool.known_hosts], rng=random.Random(3), **options)


async def _started(
    pool: Any,
    *,
    sshd: dict[str, Any] | None = None,
    host: dict[str, Any] | None = None,
    **more: Any,
) -> SshTransport:
    """A started transport over one new sshd host, h1 (``sshd``: its settings; ``host``:
    what the inventory says of it)."""
    server = pool.add("h1", **(sshd or {}))
    transport = _transport(pool, [_host(pool, server, **(host or {}))], **more)
    await transport.start()
    return transport


async def _sleepers(
    transport: SshTransport, tmp_path: Path, count: int, seconds: str
) -> list[AttemptResult]:
    """``count`` units sleeping ``seconds`` at once."""
    return list(
        await asyncio.gather(
            *(
                transport.run(_attempt(tmp_path / str(n), ["sleep", seconds], unit_id=f"u{n}"))
                for n in range(count)
            )
        )
    )


def _attempt(tmp_path: Path, argv: list[str], **options: Any) -> Attempt:
    return make_attempt(tmp_path, argv, **options)


def _sandboxes(pool: Any) -> list[str]:
    root = pool.base / "sandboxes"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def _everything_but(name: str, directory: Path) -> Path:
    """A directory of links to every program in /usr/bin but ``name``."""
    directory.mkdir()
    for program in Path("/usr/bin").iterdir():
        if program.name != name:
            (directory / program.name).symlink_to(program)
    return directory


async def test_a_host_without_bwrap_is_refused_to_a_job_that_hands_out_tokens(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """sandbox auto: a host without bwrap would run its units in plain directories, where
    each reads the others' tokens (``exposure``); refused with the reason, while a job
    handing out nothing runs there as before."""
    tools = _everything_but("bwrap", ssh_pool.base / "no-bwrap")  # the host's PATH
    server = ssh_pool.add("h1", extra=[f"SetEnv PATH={tools}"])
    refusing = _transport(ssh_pool, [_host(ssh_pool, server)], handed=Handed(tokens=True))
    with pytest.raises(HostsUnavailable) as refused:
        await refusing.start()
    await refusing.close()
    assert str(refused.value) == (
        "no SSH host can run units: h1 has no bwrap: its units would run in plain"
        " directories, which do not hide the coordinator, the other units or this user's"
        " files from a worker: it could read the other running units' API tokens in /proc"
        " and keep them wherever its user can write; install bubblewrap there, or set"
        " runtime.unsandboxedSecrets = true to accept that"
    )
    plain = _transport(ssh_pool, [_host(ssh_pool, server)], handed=NOTHING)
    await plain.start()
    try:
        result = await plain.run(_attempt(tmp_path, ["sh", "-c", "echo plain"]))
    finally:
        await plain.close()
    assert (result.status, result.output_tail) == (Status.SUCCEEDED, "plain\n")


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_unit_runs_in_a_remote_sandbox_with_hostile_names_intact(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    server = ssh_pool.add("h1")
    hostile = 'it\'s a $(touch pwned) `x` "file"; rm -rf ~.txt'
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / hostile).write_text("hello\n")
    transport = _transport(ssh_pool, [_host(ssh_pool, server)], sandbox_kind=sandbox)
    await transport.start()
    script = 'cat; printf "[%s]\\n" "$1"; cat -- "$1"; echo changed >> "$1"; test -z "${HOSTNAME_FROM_LOGIN:-}"'
    try:
        result = await transport.run(
            _attempt(
                tmp_path,
                ["sh", "-c", script, "sh", hostile],
                prompt="the prompt\n",
                staged=(StagedFile(path=hostile, source=workspace / hostile),),
                collect=[hostile],
                verify=["grep", "-q", "changed", hostile],
            )
        )
    finally:
        await transport.close()
    assert result.status is Status.SUCCEEDED, (result, result.output_tail)
    assert result.output_tail == f"the prompt\n[{hostile}]\nhello\n"
    assert result.host == "h1"
    assert [c.path for c in result.collected] == [hostile]
    assert (tmp_path / "collected" / hostile).read_text() == "hello\nchanged\n"
    assert not (tmp_path / "pwned").exists()
    assert _sandboxes(ssh_pool) == []


async def test_an_unknown_host_key_is_refused_with_a_way_to_trust_it(
    ssh_pool: Any, tmp_path: Path
) -> None:
    server = ssh_pool.add("h1")
    ssh_pool.known_hosts.write_text("")
    transport = _transport(ssh_pool, [_host(ssh_pool, server)])
    with pytest.raises(HostsUnavailable) as caught:
        await transport.start()
    assert "host key of h1 (127.0.0.1:" in str(caught.value)
    assert "run `fanout hosts trust h1`" in str(caught.value)


async def test_a_changed_host_key_is_refused(ssh_pool: Any, tmp_path: Path) -> None:
    first = ssh_pool.add("h1")
    other = ssh_pool.add("h2")
    kind, key = other.host_public_key.split()[:2]
    ssh_pool.known_hosts.write_text(f"[127.0.0.1]:{first.port} {kind} {key}\n")
    transport = _transport(ssh_pool, [_host(ssh_pool, first)])
    with pytest.raises(HostsUnavailable, match=r"host key of h1 .* is not trusted"):
        await transport.start()


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_timeout_kills_the_remote_process_tree(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    transport = await _started(ssh_pool, sandbox_kind=sandbox)
    token = marker()
    try:
        result = await transport.run(
            _attempt(
                tmp_path, ["sh", "-c", f"sleep {token} & sleep {token}; echo never"], timeout=1
            )
        )
    finally:
        await transport.close()
    assert (result.status, result.reason) == (Status.TIMEOUT, "timed out after 1s")
    assert wait_until_gone(token) == []
    assert _sandboxes(ssh_pool) == []


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_an_interrupted_unit_is_torn_down_before_close_returns(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    transport = await _started(ssh_pool, sandbox_kind=sandbox)
    token, escaped = marker(), marker()
    # The setsid'd process leaves the unit's process group; it is found by its directory.
    script = f"setsid sh -c 'echo > ready; exec sleep {escaped}' & sleep {token}"
    task = asyncio.create_task(transport.run(_attempt(tmp_path, ["sh", "-c", script])))
    try:
        ready = await asyncio.to_thread(
            _wait_for, lambda: list((ssh_pool.base / "sandboxes").glob("*/work/ready"))
        )
        assert ready
        task.cancel()  # Ctrl-C
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await transport.close()
    # No waiting here: close() returns once the host has cleaned up.
    assert _sandboxes(ssh_pool) == []
    assert pids_with(token) == []
    assert pids_with(escaped) == []


async def test_a_cut_connection_leaves_nothing_running_on_the_host(
    ssh_pool: Any, tmp_path: Path
) -> None:
    transport = await _started(ssh_pool)
    token = marker()
    task = asyncio.create_task(
        transport.run(_attempt(tmp_path, ["sh", "-c", f"sleep {token} & sleep {token}"]))
    )
    assert await asyncio.to_thread(wait_until_present, token)
    for state in transport._hosts:
        for connection in state.connections:
            connection.conn.abort()
    result = await task
    await transport.close()
    assert result.status is Status.LOST
    assert await asyncio.to_thread(wait_until_gone, token, 5.0) == []
    assert await asyncio.to_thread(lambda: _wait_empty(ssh_pool)) == []


async def _settled(events: list[dict[str, Any]], count: int) -> None:
    """Poll (the events list is filled by the run under test) until COUNT units settled."""
    while sum(1 for e in events if e["event"] == "unit.settled") < count:  # noqa: ASYNC110
        await asyncio.sleep(0.02)


def _wait_for(condition: Any, timeout: float = 10.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


def _wait_empty(pool: Any, timeout: float = 5.0) -> list[str]:
    import time

    deadline = time.monotonic() + timeout
    while (left := _sandboxes(pool)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


async def test_secrets_never_reach_argv_disk_or_logs(ssh_pool: Any, tmp_path: Path) -> None:
    server = ssh_pool.add("h1")
    host = _host(ssh_pool, server)
    token = short_marker()
    secret = f"sk-test-{marker()}-value"
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "secrets"
            [inputs]
            items = ["a", "b"]
            [task]
            command = ["sh", "-c", "echo token is $API_TOKEN; test $(printf %s $API_TOKEN | wc -c) = {len(secret)}; sleep {token}"]
            secrets = ["API_TOKEN"]
            """,
        )
    )
    transport = _transport(ssh_pool, [host])
    runner = make_runner(job, transport, environ={"API_TOKEN": secret})
    running = asyncio.create_task(runner.execute(Options()))
    assert await asyncio.to_thread(wait_until_present, token)
    assert pids_with(secret) == []
    summary = await running
    assert summary.counts == {"succeeded": 2}
    leaked = await asyncio.to_thread(
        subprocess.run,
        ["grep", "-rl", secret, str(job.runtime.state_dir), str(ssh_pool.base / "sandboxes")],
        capture_output=True,
        text=True,
    )
    assert leaked.stdout == ""
    logs = "".join(p.read_text() for p in job.runtime.state_dir.rglob("*.log"))
    assert "token is [secret]" in logs


async def test_dead_and_frozen_hosts_every_unit_succeeds_exactly_once(
    ssh_pool: Any, tmp_path: Path
) -> None:
    servers = [ssh_pool.add(f"h{n}") for n in range(3)]
    shared = ssh_pool.base / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    done = shared / "done.txt"
    items = ", ".join(f'"u{n:02d}"' for n in range(60))
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "fleet"
            [inputs]
            items = [{items}]
            [task]
            command = ["sh", "-c", "sleep 0.4; echo $FANOUT_UNIT_ID >> {done}"]
            timeout = "30s"
            [runtime]
            maxConcurrentTasks = 12
            sandbox = "none"
            """,
        )
    )
    events: list[dict[str, Any]] = []
    transport = _transport(
        ssh_pool,
        [_host(ssh_pool, s) for s in servers],
        sandbox_kind="none",
        notice=lambda message: events.append({"event": "notice", "message": message}),
    )
    runner = make_runner(job, transport, events=events.append)

    async def sabotage() -> None:
        await _settled(events, 10)
        servers[0].kill()
        await _settled(events, 20)
        servers[1].freeze()

    saboteur = asyncio.create_task(sabotage())
    summary = await asyncio.wait_for(runner.execute(Options()), 90)
    await saboteur
    assert summary.counts == {"succeeded": 60}
    journal = runner.journal
    succeeded = [a for a in journal.attempts(summary.run_id) if a["status"] == "succeeded"]
    assert sorted(a["unit"] for a in succeeded) == [f"u{n:02d}" for n in range(60)]
    lost = [a for a in journal.attempts(summary.run_id) if a["status"] == "lost"]
    assert lost, "killing and freezing hosts mid-run must have lost some attempts"
    assert {a["host"] for a in lost} <= {"h0", "h1"}
    assert set(done.read_text().split()) == {f"u{n:02d}" for n in range(60)}
    notices = [e["message"] for e in events if e["event"] == "notice"]
    assert any(m.startswith("host h0 lost") for m in notices)
    assert any(m.startswith("host h1 lost") for m in notices)


async def test_every_host_down_stops_the_run_and_resume_finishes_it(
    ssh_pool: Any, tmp_path: Path
) -> None:
    server = ssh_pool.add("h1")
    items = ", ".join(f'"u{n}"' for n in range(12))
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "down"
            [inputs]
            items = [{items}]
            [task]
            command = ["sleep", "0.3"]
            [runtime]
            maxConcurrentTasks = 2
            """,
        )
    )
    events: list[dict[str, Any]] = []

    def runner() -> Runner:
        return make_runner(
            job, _transport(ssh_pool, [_host(ssh_pool, server, slots=2)]), events=events.append
        )

    async def kill_after_three() -> None:
        await _settled(events, 3)
        server.kill()

    killer = asyncio.create_task(kill_after_three())
    with pytest.raises(HostsUnavailable, match="every SSH host is down"):
        await asyncio.wait_for(runner().execute(Options()), 60)
    await killer
    first = runner()
    (run,) = first.journal.runs()
    assert run.state == "stopped"
    server.start()
    summary = await asyncio.wait_for(runner().execute(Options(resume=True)), 60)
    assert summary.run_id == run.id
    assert summary.counts == {"succeeded": 12}


async def test_more_slots_than_sessions_open_more_connections(
    ssh_pool: Any, tmp_path: Path
) -> None:
    transport = await _started(
        ssh_pool, sshd={"max_sessions": 4}, host={"slots": 10, "max_sessions": 4}
    )
    try:
        results = await _sleepers(transport, tmp_path, 40, "0.3")
        connections = len(transport._hosts[0].connections)
    finally:
        await transport.close()
    assert [r.status for r in results] == [Status.SUCCEEDED] * 40
    assert connections == 5  # 10 slots at 4 - 2 channels per connection


async def test_refused_channel_opens_are_retried(ssh_pool: Any, tmp_path: Path) -> None:
    # The inventory claims 10 sessions; this sshd allows 3: opens near the limit fail
    # and must be retried rather than failing units.
    transport = await _started(
        ssh_pool, sshd={"max_sessions": 3}, host={"slots": 8, "max_sessions": 10}
    )
    try:
        results = await _sleepers(transport, tmp_path, 24, "0.2")
    finally:
        await transport.close()
    assert [r.status for r in results] == [Status.SUCCEEDED] * 24


def test_hosts_check_and_trust_commands(ssh_pool: Any, tmp_path: Path) -> None:
    good = ssh_pool.add("h1")
    hosts_file = tmp_path / "hosts.toml"
    root = ssh_pool.base / "sandboxes"
    root.mkdir(exist_ok=True)
    hosts_file.write_text(
        f'[[hosts]]\nname = "good"\naddress = "127.0.0.1"\nport = {good.port}\nuser = "{ssh_pool.user}"\n'
        f'identity = "{ssh_pool.client_key}"\nsandboxRoot = "{root}"\n'
        f'[[hosts]]\nname = "gone"\naddress = "127.0.0.1"\nport = 1\n'
    )
    job = write_job(
        tmp_path,
        'version = 1\nname = "h"\n[inputs]\nitems = ["a"]\n[task]\ncommand = ["true"]\n[runtime]\nhosts = "hosts.toml"\n',
    )
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    env.pop("XDG_CONFIG_HOME", None)
    fanout = [sys.executable, "-m", "fanout"]
    untrusted = subprocess.run(
        [*fanout, "hosts", "check", str(job)], capture_output=True, text=True, env=env
    )
    assert untrusted.returncode == 4
    assert "is not trusted" in untrusted.stdout
    trust = subprocess.run(
        [*fanout, "hosts", "trust", "good", "--job", str(job), "--yes"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert trust.returncode == 0, trust.stderr
    assert "ssh-ed25519 key fingerprint SHA256:" in trust.stdout
    recorded = (home / ".config" / "fanout" / "known_hosts").read_text()
    assert (
        recorded == f"[127.0.0.1]:{good.port} " + " ".join(good.host_public_key.split()[:2]) + "\n"
    )
    checked = subprocess.run(
        [*fanout, "hosts", "check", str(job)], capture_output=True, text=True, env=env
    )
    assert checked.returncode == 4  # "gone" is still unreachable
    rows = {line.split("│")[1].strip(): line for line in checked.stdout.splitlines() if "│" in line}
    assert "/bin/sh" in rows["good"]
    assert " ms" in rows["good"]
    assert "NO" in rows["gone"]
    assert "is not writable" in rows["good"]  # the sandbox root is root's 0755 directory
    refused = subprocess.run(
        [*fanout, "run", str(job)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert refused.returncode == 4
    assert "host good quarantined: good: cannot create a sandbox in" in refused.stderr
    root.chmod(0o777)
    ran = subprocess.run(
        [*fanout, "run", str(job)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert ran.returncode == 0, ran.stderr
    assert "host gone is unavailable" in ran.stderr
    assert "finished: 1 succeeded" in ran.stderr


async def test_units_sharing_an_agent_share_nothing(ssh_pool: Any, tmp_path: Path) -> None:
    """Consecutive units on one slot reuse its channel, never each other's environment."""
    transport = await _started(ssh_pool, host={"slots": 1})
    try:
        first = await transport.run(
            _attempt(
                tmp_path / "a",
                ["sh", "-c", "pwd; echo $FOO"],
                env={"FOO": "from-first"},
                secrets={"FIRST_TOKEN": "t0ken"},
            )
        )
        second = await transport.run(_attempt(tmp_path / "b", ["env"], unit_id="u2"))
        channels = transport._hosts[0].connections[0].channels
    finally:
        await transport.close()
    assert first.status is Status.SUCCEEDED
    assert first.output_tail.splitlines()[1] == "from-first"
    names = {line.split("=", 1)[0] for line in second.output_tail.splitlines()}
    assert "FOO" not in names
    assert "FIRST_TOKEN" not in names
    assert "FANOUT_UNIT_ID=u2" in second.output_tail
    assert channels == 1


async def test_placement_prefers_the_least_loaded_host_and_respects_slots(tmp_path: Path) -> None:
    hosts = [Host(name="small", address="a", slots=1), Host(name="big", address="b", slots=3)]
    transport = SshTransport(hosts, known_hosts=[])
    for state in transport._hosts:
        state.healthy = True
    placed = [(await transport._place()).name for _ in range(4)]
    assert placed == ["small", "big", "big", "big"]
    waiting = asyncio.create_task(transport._place())
    await asyncio.sleep(0.01)
    assert not waiting.done()  # every slot is taken
    await transport._release(transport._hosts[1])
    assert (await asyncio.wait_for(waiting, 1)).name == "big"
    for state in transport._hosts:
        state.healthy, state.quarantined, state.reason = False, True, f"{state.name} is gone"
    with pytest.raises(
        HostsUnavailable, match="every SSH host is down: small is gone; big is gone"
    ):
        await transport._place()


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_collected_symlinks_follow_the_local_rule(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    """The same units and the same verdicts as test_local's
    test_collected_files_never_escape: one rule for symlinks, on the coordinator."""
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    transport = await _started(ssh_pool, sandbox_kind=sandbox)
    script = f"ln -s {secret} link.txt; mkdir d; ln -s {tmp_path} d/up; echo ok > real.txt"
    try:
        result = await transport.run(
            _attempt(tmp_path / "a", ["sh", "-c", script], collect=("*.txt", "d"))
        )
        escaping = await transport.run(
            _attempt(
                tmp_path / "c", ["sh", "-c", f"ln -s {tmp_path} up"], collect=("up/secret.txt",)
            )
        )
        named = await transport.run(
            _attempt(tmp_path / "d", ["sh", "-c", f"ln -s {secret} out.txt"], collect=("out.txt",))
        )
    finally:
        await transport.close()
    assert result.status is Status.SUCCEEDED, result.reason
    assert [c.path for c in result.collected] == ["real.txt"]
    assert (escaping.status, escaping.reason) == (
        Status.FAILED,
        "collect: 'up/secret.txt' goes through a symlink the worker made ('up');"
        " fanout never follows one",
    )
    assert (named.status, named.reason) == (
        Status.FAILED,
        "collect: 'out.txt' goes through a symlink the worker made ('out.txt');"
        " fanout never follows one",
    )
    assert not (tmp_path / "d" / "collected").exists()
    assert _sandboxes(ssh_pool) == []


# Names a worker may give its output: globs' own characters, spaces, unicode, newlines.
ODD_NAMES = ["notes[draft.md", "a b.md", "ünï cödé.md", "new\nline.md", "[x]*?.md", "-x.md"]


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_collected_names_are_paths_not_globs(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    """Issue 11: `notes[draft.md` matched by `*.md` is collected over SSH as locally
    (it failed with "PathRefused: '[' at position 6 is never closed")."""
    transport = await _started(ssh_pool, sandbox_kind=sandbox)
    script = 'for name in "$@"; do printf "%s\\n" "$name" > "$name"; done; mkdir sub; echo in > sub/[y].md'
    try:
        result = await transport.run(
            _attempt(tmp_path, ["sh", "-c", script, "sh", *ODD_NAMES], collect=("*.md", "sub"))
        )
    finally:
        await transport.close()
    assert result.status is Status.SUCCEEDED, result.reason
    assert sorted(c.path for c in result.collected) == sorted([*ODD_NAMES, "sub/[y].md"])
    for name in ODD_NAMES:
        assert (tmp_path / "collected" / name).read_text() == name + "\n"
    assert (tmp_path / "collected" / "sub" / "[y].md").read_text() == "in\n"
    assert _sandboxes(ssh_pool) == []


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_staged_files_keep_their_bits_and_stream_whole(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    workspace = tmp_path / "ws"
    (workspace / "deep" / "er").mkdir(parents=True)
    tool = workspace / "deep" / "er" / "tool.sh"
    tool.write_text("#!/bin/sh\necho tool ran\n")
    tool.chmod(0o750)
    big = workspace / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 12)  # larger than any chunk the stream reads
    transport = await _started(ssh_pool, sandbox_kind=sandbox)
    script = "deep/er/tool.sh; stat -c %a deep/er/tool.sh; sha256sum big.bin | cut -c1-64"
    try:
        result = await transport.run(
            _attempt(
                tmp_path,
                ["sh", "-c", script],
                staged=(
                    StagedFile(path="deep/er/tool.sh", source=tool),
                    StagedFile(path="big.bin", source=big),
                ),
            )
        )
    finally:
        await transport.close()
    assert result.status is Status.SUCCEEDED, (result.reason, result.output_tail)
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    assert result.output_tail == f"tool ran\n750\n{digest}\n"


async def test_a_file_that_changes_while_staged_fails_the_attempt(
    ssh_pool: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    source = workspace / "input.txt"
    source.write_text("hello")
    real = wire.StagedTar.chunks

    def growing(tar: wire.StagedTar) -> Any:
        source.write_text("hello, and more")  # after its header was made
        return real(tar)

    monkeypatch.setattr(wire.StagedTar, "chunks", growing)
    transport = await _started(ssh_pool)
    try:
        changed = await transport.run(
            _attempt(tmp_path / "a", ["true"], staged=(StagedFile(path="in.txt", source=source),))
        )
        after = await transport.run(_attempt(tmp_path / "b", ["echo", "next"]))
    finally:
        await transport.close()
    assert (changed.status, changed.reason) == (
        Status.FAILED,
        f"stage: changed while being staged (5 bytes, then it grew): {source}",
    )
    assert (after.status, after.output_tail) == (Status.SUCCEEDED, "next\n")
    assert _sandboxes(ssh_pool) == []


def test_a_collected_tar_never_creates_a_symlink(tmp_path: Path) -> None:
    """What the agent sends is not trusted: only the regular files asked for are
    written, each through collecting.target; a symlink member is never made."""
    outside = tmp_path / "outside"
    outside.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name in ("up", "link.txt"):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, str(outside)
            archive.addfile(link)
        for name in ("up/evil", "extra"):
            member = tarfile.TarInfo(name)
            member.size = 4
            archive.addfile(member, io.BytesIO(b"evil"))
    destination = tmp_path / "collected"
    destination.mkdir()
    buffer.seek(0)
    wire.extract(buffer, ["up/evil", "link.txt"], destination)
    assert list(outside.iterdir()) == []
    assert sorted(str(p.relative_to(destination)) for p in destination.rglob("*")) == [
        "up",
        "up/evil",
    ]
    assert not (destination / "up").is_symlink()
    (destination / "up" / "evil").unlink()
    (destination / "up").rmdir()
    (destination / "up").symlink_to(outside)  # one planted in the unit folder
    buffer.seek(0)
    with pytest.raises(collecting.PathRefused) as caught:
        wire.extract(buffer, ["up/evil"], destination)
    assert str(caught.value) == "collect: 'up/evil' leaves the unit folder"
    assert list(outside.iterdir()) == []


def test_a_frozen_host_is_given_up_after_15_seconds_of_silence() -> None:
    """The README's figure, from the parameters asyncssh gets: it drops a connection at
    the end of the interval after ``keepalive_count_max`` unanswered keepalives.  (The
    measured figure, with a really frozen sshd: bench/ssh.py.)"""
    from fanout.transports.ssh.connection import Connector

    connector = SshTransport([], known_hosts=[])._connector
    options = connector.options(Host(name="h", address="a"))
    assert (options["keepalive_interval"], options["keepalive_count_max"]) == (5.0, 2)
    assert connector.silence_limit == 15.0
    assert Connector(known_hosts=[], keepalive_interval=1.0, keepalive_count=2).silence_limit == 2.0


async def test_an_unwritable_sandbox_root_quarantines_the_host_even_when_staging(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """The agent refuses at ``open`` and exits while the staged tar is still on its
    way: the host is quarantined for it, not retried as a lost attempt forever."""
    server = ssh_pool.add("h1")
    root = ssh_pool.base / "read-only"
    root.mkdir(mode=0o555)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "big.bin").write_bytes(bytes(4 << 20))
    notices: list[str] = []
    transport = _transport(
        ssh_pool, [_host(ssh_pool, server, sandbox_root=str(root))], notice=notices.append
    )
    await transport.start()
    try:
        result = await transport.run(
            _attempt(
                tmp_path,
                ["true"],
                staged=(StagedFile(path="big.bin", source=workspace / "big.bin"),),
            )
        )
        quarantined = transport._hosts[0].quarantined
    finally:
        await transport.close()
    refusal = f"cannot create a sandbox in {root} (sandboxRoot must be a writable directory)"
    assert (result.status, result.reason) == (Status.LOST, f"h1 cannot run units: {refusal}")
    assert quarantined
    assert f"host h1 quarantined: h1: {refusal}" in notices


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_home_and_tmpdir_are_the_sandboxs_own_on_every_kind(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    """Issue 11: HOME and TMPDIR were /tmp under bwrap and both $base/home without it;
    the attempt decides them, the same as locally: the sandbox directory, work/ in it."""
    transport = await _started(ssh_pool, sandbox_kind=sandbox)
    script = 'echo "$HOME $TMPDIR $FANOUT_CONTROL $(pwd)"; touch "$HOME/h" "$TMPDIR/t"'
    try:
        result = await transport.run(_attempt(tmp_path, ["sh", "-c", script], collect=("**",)))
    finally:
        await transport.close()
    assert result.status is Status.SUCCEEDED, result.reason
    home, tmp, control, work = result.output_tail.split()
    base = home
    assert base.startswith(str(ssh_pool.base / "sandboxes" / "fanout-"))
    assert (home, tmp, control, work) == (
        base,
        base,
        f"{base}/control.json",
        f"{base}/work",
    )
    assert result.collected == ()  # nothing the worker's tools keep at home is collected


def test_the_agent_decides_nothing_an_attempt_decides() -> None:
    """No bwrap argv, verify rule, HOME or TMPDIR choice, glob or regex of its own."""
    script = wire.agent_script()
    for decided in ("bwrap", "verify", "HOME", "TMPDIR", "-regex", "-name '", "control.json"):
        assert decided not in script, decided


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_sandbox_the_agent_cannot_remove_is_set_aside_and_said_once(
    ssh_pool: Any, tmp_path: Path, sandbox: str
) -> None:
    """The login user cannot clear the flag root set on a file in its sandbox (what a
    root worker does with chattr +i where the login is root); the agent gives every
    folder back its owner's permissions first (chmod 000 does not stop it)."""
    notices: list[str] = []
    transport = await _started(ssh_pool, sandbox_kind=sandbox, notice=notices.append)
    root = ssh_pool.base / "sandboxes"
    script = (
        "echo x > locked; mkdir -p shut/inner && chmod 000 shut/inner shut;"
        " while [ ! -e go ]; do sleep 0.05; done"
    )
    task = asyncio.create_task(transport.run(_attempt(tmp_path, ["sh", "-c", script])))
    try:
        locked = await asyncio.to_thread(_wait_for, lambda: list(root.glob("*/work/locked")))
        assert len(locked) == 1
        await asyncio.to_thread(subprocess.run, ["chattr", "+i", str(locked[0])], check=True)
        (locked[0].parent / "go").touch()
        result = await task
        second = await transport.run(_attempt(tmp_path / "2", ["true"]))
    finally:
        await transport.close()
        await asyncio.to_thread(subprocess.run, ["chattr", "-R", "-i", str(root)], check=False)
    assert (result.status, second.status) == (Status.SUCCEEDED, Status.SUCCEEDED)
    aside = root / locked[0].parents[1].name.replace("fanout-", "fanout-unremovable-")
    assert _sandboxes(ssh_pool) == [aside.name]
    assert notices[-1:] == [
        f"host h1: cannot remove {aside}: what is left in it is immutable or append-only, a"
        f" mount point, or not {ssh_pool.user}'s to remove; fanout leaves it there, remove"
        f" it as root with: chattr -R -i -a {aside} && rm -rf {aside}"
    ]
    assert sum("cannot remove" in notice for notice in notices) == 1


async def test_a_host_quarantined_before_a_resume_is_in_the_run_again_once_back(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """Issue 20: the report of a resumed run showed a host quarantined by the stretch
    before, though it ran every unit since.  Its quarantine lasts until it shows up."""
    server = ssh_pool.add("h1")
    root = ssh_pool.base / "closed"
    root.mkdir(mode=0o755)  # root's: the login cannot make a sandbox in it
    job = spec.load(
        write_job(
            tmp_path,
            'version = 1\nname = "back"\n[inputs]\nitems = ["a", "b"]\n[task]\n'
            'command = ["true"]\n[runtime]\nsandbox = "none"\n',
        )
    )

    def runner() -> Runner:
        events = Events()
        host = _host(ssh_pool, server, sandbox_root=str(root), slots=1)
        return make_runner(
            job, _transport(ssh_pool, [host], sandbox_kind="none", emit=events.emit), events=events
        )

    with pytest.raises(HostsUnavailable):
        await runner().execute(Options())
    (run,) = runner().journal.runs()
    assert run.state == "stopped"
    root.chmod(0o777)
    summary = await runner().execute(Options(resume=True))
    assert summary.run_id == run.id
    assert summary.counts == {"succeeded": 2}
    report = json.loads((summary.report_dir / "report.json").read_text())
    assert report["hosts"] == [
        {
            "host": "h1",
            "slots": 1,
            "attempts": 3,
            "lostAttempts": 1,
            "timesLost": 0,
            "quarantined": False,
            "reason": "",
        }
    ]
    table = (summary.report_dir / "report.md").read_text()
    assert "| <code>h1</code> | 1 | 3 | 1 | 0 | no |\n" in table
