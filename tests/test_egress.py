"""runtime.network = "apis": whole runs whose workers (real bwrap sandboxes, locally and
on a real sshd host) reach the API gateway, and through it the upstream with the real
key, and nothing else: neither another loopback port of the machine nor its
non-loopback address, each a listening server the same worker reaches with
``network = true`` (the control: the servers really are there to be reached)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout import plan, spec
from fanout.errors import EnvironmentProblem, HostsUnavailable, JobError
from fanout.events import Events
from fanout.gateway import Gateway
from fanout.isolation import tools as sandbox
from fanout.isolation.place import Place
from fanout.transports.local import LocalTransport
from fanout.transports.ssh import SshTransport

from helpers import cli, places, table_rows, write_job
from mockapi import MockApi

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

KEY = "sk-ant-real-9c1e5a7f3b2d8e6a0f4c1b7d"
# One request to the gateway as an Anthropic SDK makes it, then a TCP connect to each
# address of argv[1:] ("host:port"); what happened goes to reached.json (collected).
WORKER = r"""
import json, os, socket, sys, urllib.request
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
body = json.dumps({"model": "claude-test-1", "max_tokens": 64,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(base + "/v1/messages", data=body, headers={
    "x-api-key": token, "content-type": "application/json",
    "anthropic-version": "2023-06-01"})
with urllib.request.urlopen(request, timeout=20) as answer:
    seen = {"gateway": answer.status}
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
        seen[target] = "connected"
    except OSError as exc:
        seen[target] = type(exc).__name__
json.dump(seen, open("reached.json", "w"))
"""


def _own_address() -> str | None:
    """This machine's first non-loopback IPv4 address (``hostname -I``; a UDP connect
    would trip the tests' loopback guard), or None if it has none."""
    try:
        listed = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False)
    except OSError:
        return None
    found = [a for a in listed.stdout.split() if "." in a and not a.startswith("127.")]
    return found[0] if found else None


@pytest.fixture
def listener() -> Iterator[int]:
    """A server listening on every address (loopback and the machine's own), port 0."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", 0))
    server.listen(64)
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()


def _job(directory: Path, network: str, upstream: str, targets: list[str], runtime: str) -> Path:
    command = json.dumps(["python3", "-c", WORKER, *targets])
    return write_job(
        directory,
        f"""
        version = 1
        name = "egress"
        [inputs]
        items = ["u0", "u1"]
        [units]
        collect = ["reached.json"]
        [task]
        command = {command}
        timeout = "60s"
        [runtime]
        maxConcurrentTasks = 2
        sandbox = "bwrap"
        network = {network}
        {runtime}
        [[apis]]
        name = "anthropic"
        upstream = "{upstream}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        """,
    )


def _reached(directory: Path) -> list[dict[str, Any]]:
    found = sorted((directory / ".fanout" / "runs").glob("*/units/*/reached.json"))
    return [json.loads(path.read_text()) for path in found]


@pytest.mark.parametrize("where", places("local", "ssh"))
@pytest.mark.parametrize("network", ["true", '"apis"'])
def test_apis_network_reaches_the_gateway_and_nothing_else(
    mock_api: MockApi,
    tmp_path: Path,
    listener: int,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    where: str,
    network: str,
) -> None:
    own = _own_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)
    mock_api.configure(require_key=KEY)
    runtime = ""
    if where == "ssh":
        pool = request.getfixturevalue("ssh_pool")
        pool.inventory(tmp_path, pool.add("h1"))
        runtime = 'hosts = "hosts.toml"'
    targets = [f"127.0.0.1:{listener}", f"{own}:{listener}"]
    job = _job(tmp_path, network, mock_api.url, targets, runtime)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    # The request reached the upstream, with the real key in place of the token.
    assert [(p.status, p.key) for p in mock_api.posts()] == [(200, KEY)] * 2
    if network == "true":  # the control: both servers are reachable with the network
        expected = {"gateway": 200, targets[0]: "connected", targets[1]: "connected"}
    else:
        # No route but the sandbox's own loopback, where nothing else listens.
        expected = {
            "gateway": 200,
            targets[0]: "ConnectionRefusedError",
            targets[1]: "OSError",
        }
    assert _reached(tmp_path) == [expected] * 2


# The job file ----------------------------------------------------------------------

MINIMAL = """\
version = 1
name = "egress"
[inputs]
items = ["a"]
[task]
command = ["true"]
[runtime]
"""
API = '[[apis]]\nname = "anthropic"\nupstream = "https://api.anthropic.com"\nstyle = "anthropic"\n'


def _problems(tmp_path: Path, text: str) -> list[str]:
    path = write_job(tmp_path, text)
    with pytest.raises(JobError) as caught:
        spec.load(path)
    return [str(problem).removeprefix(f"{path}:") for problem in caught.value.problems]


def test_network_apis_builds_into_the_runtime(tmp_path: Path) -> None:
    loaded = spec.load(write_job(tmp_path, MINIMAL + 'network = "apis"\n' + API))
    assert loaded.runtime.network == "apis"


def test_network_apis_without_apis_is_refused_with_a_fix(tmp_path: Path) -> None:
    assert _problems(tmp_path, MINIMAL + 'network = "apis"\n') == [
        '8:11: runtime.network: runtime.network = "apis" lets workers reach only the API '
        "gateway, and this job has no [[apis]]: its workers would reach nothing; declare "
        "the APIs they call in [[apis]], or set `runtime.network = false` (no network) or "
        "`true`"
    ]


def test_network_takes_no_other_word(tmp_path: Path) -> None:
    assert _problems(tmp_path, MINIMAL + 'network = "all"\n' + API) == [
        "8:11: runtime.network: must be true, false or 'apis', not 'all'"
    ]


# Where it cannot be had -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["none", "podman"])
def test_a_sandbox_without_its_own_network_is_refused_at_start(kind: str, tmp_path: Path) -> None:
    transport = LocalTransport(
        slots=1,
        sandbox_kind=kind,
        root=tmp_path,
        network="apis",
        gateway_port=1,
        gateway_socket=tmp_path / "gateway.sock",
    )
    if kind == "podman" and shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    with pytest.raises(EnvironmentProblem) as caught:
        asyncio.run(transport.start())
    assert str(caught.value) == (
        'runtime.network = "apis" needs bwrap sandboxes (a network namespace of their own '
        f"in which only the gateway is reachable); sandbox '{kind}' cannot limit a "
        "worker's network: install bubblewrap, or set runtime.network = true"
    )


# The gateway's unix socket ------------------------------------------------------


def test_the_gateway_serves_on_a_unix_socket_in_a_private_directory(tmp_path: Path) -> None:
    async def scenario() -> tuple[bytes, int]:
        gateway = Gateway([], {}, events=Events(), stop=lambda error: None, socket_dir=tmp_path)
        path = gateway.socket_path
        assert path is not None
        assert path.parent.parent == tmp_path
        mode = os.stat(path.parent).st_mode & 0o777
        await gateway.start()
        try:
            reader, writer = await asyncio.open_unix_connection(str(path))
            writer.write(b"HEAD / HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n")
            status = await reader.readline()
            writer.close()
        finally:
            await gateway.close()
        return status, mode

    status, mode = asyncio.run(scenario())
    left = list(tmp_path.iterdir())
    assert status == b"HTTP/1.1 200 OK\r\n"  # what it answers a HEAD on TCP, too
    assert mode == 0o700
    assert left == []  # closed: the socket and its directory are gone


# SSH hosts -------------------------------------------------------------------------

REFUSED_PATH = (
    "h1: sshd refuses forwarding to a unix socket (AllowStreamLocalForwarding or"
    ' DisableForwarding): workers there cannot reach the API gateway with runtime.network = "apis"'
)


def _ssh(pool: Any, server: Any, network: bool | str, sandbox_kind: str = "bwrap") -> SshTransport:
    return SshTransport(
        [pool.host(server)],
        known_hosts=[pool.known_hosts],
        rng=random.Random(3),
        connect_timeout=3.0,
        sandbox_kind=sandbox_kind,
        gateway_port=9,  # never dialled: these hosts only come up (or do not)
        network=network,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("network", [True, "apis"])
def test_a_host_refusing_unix_socket_forwards_is_refused_for_apis_only(
    ssh_pool: Any, network: bool | str
) -> None:
    server = ssh_pool.add("h1", extra=["AllowStreamLocalForwarding no"])
    transport = _ssh(ssh_pool, server, network)

    async def scenario() -> None:
        try:
            await transport.start()
        finally:
            await transport.close()

    if network is True:  # the control: its TCP forward is fine
        asyncio.run(scenario())
        return
    before = set(Path("/tmp").glob("fanout-gateway-*"))
    with pytest.raises(HostsUnavailable) as caught:
        asyncio.run(scenario())
    assert str(caught.value) == f"no SSH host can run units: {REFUSED_PATH}"
    assert set(Path("/tmp").glob("fanout-gateway-*")) <= before  # its directory removed


def test_a_host_without_bwrap_sandboxes_is_refused_for_apis(ssh_pool: Any) -> None:
    server = ssh_pool.add("h1")
    transport = _ssh(ssh_pool, server, "apis", sandbox_kind="none")

    async def scenario() -> None:
        try:
            await transport.start()
        finally:
            await transport.close()

    with pytest.raises(HostsUnavailable) as caught:
        asyncio.run(scenario())
    assert str(caught.value) == (
        'no SSH host can run units: h1: runtime.network = "apis" needs bwrap sandboxes (a '
        "network namespace of their own in which only the gateway is reachable); sandbox "
        "'none' cannot limit a worker's network: install bubblewrap, or set "
        "runtime.network = true"
    )


def test_the_hosts_socket_is_private_and_removed_with_its_connection(ssh_pool: Any) -> None:
    server = ssh_pool.add("h1")
    transport = _ssh(ssh_pool, server, "apis")

    async def scenario() -> tuple[str | None, str | None, int, int]:
        await transport.start()
        try:
            place = transport._hosts[0].place
            assert place.gateway_socket is not None
            socket_mode = os.stat(place.gateway_socket).st_mode & 0o777
            directory_mode = os.stat(Path(place.gateway_socket).parent).st_mode & 0o777
            return place.gateway, place.gateway_socket, socket_mode, directory_mode
        finally:
            await transport.close()

    url, path, socket_mode, directory_mode = asyncio.run(scenario())
    assert url == "http://127.0.0.1:29170"  # the sandbox's own loopback
    assert path is not None
    assert (socket_mode, directory_mode) == (0o600, 0o700)
    assert not Path(path).parent.exists()  # the hosts are this machine


def _hosts_check(pool: Any, tmp_path: Path, server: Any) -> tuple[int, list[str], list[str]]:
    """``fanout hosts check`` of a job with network "apis" on ``server``: the exit code,
    the table's header and the host's row (cells; a wrapped cell joined again)."""
    pool.inventory(tmp_path, server)
    job = write_job(
        tmp_path,
        MINIMAL
        + 'hosts = "hosts.toml"\nsandbox = "bwrap"\nnetwork = "apis"\n'
        + API.replace("https://api.anthropic.com", "http://127.0.0.1:1"),
    )
    known = Path.home() / ".ssh" / "known_hosts"
    known.parent.mkdir(parents=True, exist_ok=True)
    known.write_text(pool.known_hosts.read_text())
    ran = cli("hosts", "check", str(job))
    rows = table_rows(ran.out)
    header, row = rows
    return ran.code, header, row


def test_hosts_check_tries_the_unix_socket_forward_for_apis(ssh_pool: Any, tmp_path: Path) -> None:
    code, header, row = _hosts_check(ssh_pool, tmp_path, ssh_pool.add("h1"))
    assert code == 0, row
    assert row[header.index("gateway forward")] == "ok (unix socket)"
    assert row[-1] == ""


def test_hosts_check_reports_a_refused_unix_socket_forward(ssh_pool: Any, tmp_path: Path) -> None:
    server = ssh_pool.add("h1", extra=["AllowStreamLocalForwarding no"])
    code, header, row = _hosts_check(ssh_pool, tmp_path, server)
    assert code == 4
    assert row[header.index("gateway forward")] == "NO"
    assert row[-1] == REFUSED_PATH.removeprefix("h1: ")


# The forwarder as a step's wrapper -------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "code", "out"),
    [
        (["sh", "-c", "exit 3"], 3, b""),
        (["sh", "-c", "kill -TERM $$"], 143, b""),  # as bwrap reports a signal death
        (["sh", "-c", "read line; echo got $line"], 0, b"got prompt\n"),
    ],
)
def test_the_forwarder_keeps_the_steps_stdin_output_and_status(
    tmp_path: Path, argv: list[str], code: int, out: bytes
) -> None:
    base = tmp_path / "box"
    (base / "work").mkdir(parents=True)
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "gateway.sock"))
    listening.listen()
    place = Place(
        host="local",
        kind="bwrap",
        base=str(base),
        path="/usr/bin:/bin",
        # fanout's python, bound back as the local transport binds it (a checkout and
        # its venv under /tmp, as CI's may be, are hidden by bwrap otherwise).
        tools=tuple(str(tool) for tool in sandbox.bound_tools("/usr/bin:/bin")),
        gateway_socket=str(tmp_path / "gateway.sock"),
        python=sys.executable,
    )
    try:
        ran = subprocess.run(
            sandbox.command(place, argv, network="apis"),
            input=b"prompt\n",
            capture_output=True,
            check=False,
            timeout=60,
        )
    finally:
        listening.close()
    assert (ran.returncode, ran.stdout, ran.stderr) == (code, out, b"")


def test_the_forwarder_says_when_the_step_cannot_start(tmp_path: Path) -> None:
    (tmp_path / "work").mkdir()
    place = Place(
        host="local",
        kind="bwrap",
        base=str(tmp_path),
        path="/usr/bin:/bin",
        tools=tuple(str(tool) for tool in sandbox.bound_tools("/usr/bin:/bin")),
        gateway_socket="/dev/null",
        python=sys.executable,
    )
    ran = subprocess.run(
        sandbox.command(place, ["no-such-program-x"], network="apis"),
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert (ran.returncode, ran.stderr) == (
        127,
        b"fanout: cannot start no-such-program-x: No such file or directory\n",
    )


# The real Claude Code CLI ---------------------------------------------------------


@pytest.mark.parametrize("where", places("local", "ssh"))
def test_the_claude_cli_runs_its_agent_loop_with_only_the_gateway_reachable(
    claude_cli: Path,
    mock_api: MockApi,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    # test_gateway_claude's run (a two-turn tool loop, streamed), under network "apis":
    # the CLI's preflight, its streaming answers and its tool call all pass the forwarder.
    import test_gateway_claude as claude

    mock = claude.claude_mock.__wrapped__(mock_api, monkeypatch)  # type: ignore[attr-defined]
    runtime = "maxConcurrentTasks = 3"
    if where == "ssh":
        pool = request.getfixturevalue("ssh_pool")
        pool.inventory(tmp_path, pool.add("h1"), slots=3)
        runtime = 'hosts = "hosts.toml"'
    job = claude._job(tmp_path, claude_cli, mock.url, runtime)
    job.write_text(job.read_text().replace("network = true", 'network = "apis"'))
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    claude._check_run(tmp_path, mock, ran.out + ran.err)


def test_plan_says_the_sandbox_reaches_only_the_gateway(tmp_path: Path) -> None:
    job = spec.load(write_job(tmp_path, MINIMAL + 'sandbox = "bwrap"\nnetwork = "apis"\n' + API))
    assert plan.describe_sandbox(job) == (
        "this machine, sandbox bwrap, network: the API gateway only"
    )
