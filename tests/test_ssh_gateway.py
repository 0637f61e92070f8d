"""Workers on SSH hosts reach the coordinator's API gateway through a remote port
forward on the host's own SSH connection (``ssh.forward``), against real sshd: the
forward works from inside a sandbox, a host whose sshd refuses forwarding or binds it
beyond loopback is refused with the reason, a reconnect makes a new forward, and
``fanout hosts check`` says all of it for a job with APIs."""

from __future__ import annotations

import asyncio
import dataclasses
import http.server
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.attempt.model import ApiAccess, Attempt
from fanout.errors import HostsUnavailable
from fanout.outcome import Status
from fanout.run.where import transport_for
from fanout.spec import Host
from fanout.transports.local import LocalTransport
from fanout.transports.ssh import SshTransport

from helpers import MINIMAL, cli, make_attempt, table_rows, write_job

pytestmark = pytest.mark.slow

REFUSED = (
    "h1: sshd refuses remote port forwarding (AllowTcpForwarding, DisableForwarding or"
    " PermitListen): workers there cannot reach the API gateway"
)


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = f"gateway saw {self.path} with {self.headers.get('x-api-key')}".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[int]:
    """A tiny HTTP server on this machine's loopback standing for the gateway: its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _transport(pool: Any, hosts: list[Host], **more: Any) -> SshTransport:
    return SshTransport(
        hosts,
        known_hosts=[pool.known_hosts],
        rng=random.Random(3),
        keepalive_interval=1.0,
        keepalive_count=2,
        connect_timeout=3.0,
        **more,
    )


def _caller(tmp_path: Path, unit: str = "u1", sleep: str = "0") -> Attempt:
    """An attempt whose worker calls the gateway with its token, as an agent CLI would."""
    attempt = make_attempt(
        tmp_path / unit,
        [
            "sh",
            "-c",
            f'sleep {sleep}; printf "%s " "$MOCK_BASE_URL";'
            ' curl -sS -H "x-api-key: $MOCK_TOKEN" "$MOCK_BASE_URL/v1/ping"',
        ],
        unit_id=unit,
        network=True,
    )
    return dataclasses.replace(
        attempt,
        apis=(
            ApiAccess(
                name="mock", base_url_env="MOCK_BASE_URL", token_env="MOCK_TOKEN", token="t0k"
            ),
        ),
    )


def _listening(port: int) -> list[str]:
    """The addresses sockets listen on at ``port`` here (the hosts are this machine)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, _, hexport = fields[1].rpartition(":")
            if fields[3] == "0A" and int(hexport, 16) == port:
                found.append(address)
    return found


def _gone(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _listening(port)


def _port(url: str) -> int:
    match = re.fullmatch(r"http://127\.0\.0\.1:([0-9]+)", url)
    assert match, url
    return int(match.group(1))


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
async def test_a_worker_on_a_host_reaches_the_gateway_through_the_forward(
    ssh_pool: Any, tmp_path: Path, gateway: int, sandbox: str
) -> None:
    server = ssh_pool.add("h1")
    transport = _transport(
        ssh_pool, [ssh_pool.host(server)], sandbox_kind=sandbox, gateway_port=gateway
    )
    await transport.start()
    try:
        url = transport._hosts[0].place.gateway
        assert url is not None
        result = await transport.run(_caller(tmp_path))
        listening = _listening(_port(url))
    finally:
        await transport.close()
    assert result.status is Status.SUCCEEDED, result.output_tail
    # The gateway echoed the attempt's token, which the tail redacts like a secret.
    assert result.output_tail == f"{url}/mock gateway saw /mock/v1/ping with [secret]"
    assert listening == ["0100007F"]  # 127.0.0.1 only
    assert _listening(_port(url)) == []  # closed with its connection


async def test_each_connection_of_a_host_forwards_for_the_agents_it_carries(
    ssh_pool: Any, tmp_path: Path, gateway: int
) -> None:
    # MaxSessions 3: one agent channel per connection, so three units need three
    # connections, and each unit's way to the gateway is its own connection's forward.
    server = ssh_pool.add("h1", max_sessions=3)
    host = ssh_pool.host(server, slots=3, max_sessions=3)
    transport = _transport(ssh_pool, [host], sandbox_kind="none", gateway_port=gateway)
    await transport.start()
    try:
        results = await asyncio.gather(
            *(transport.run(_caller(tmp_path, f"u{n}", sleep="0.5")) for n in range(3))
        )
        urls = [c.forward.url for c in transport._hosts[0].connections if c.forward]
    finally:
        await transport.close()
    assert [r.status for r in results] == [Status.SUCCEEDED] * 3
    assert len(set(urls)) == 3
    assert sorted(r.output_tail for r in results) == sorted(
        f"{url}/mock gateway saw /mock/v1/ping with [secret]" for url in urls
    )


async def test_without_a_gateway_no_port_is_forwarded(ssh_pool: Any) -> None:
    server = ssh_pool.add("h1")
    transport = _transport(ssh_pool, [ssh_pool.host(server)])
    await transport.start()
    try:
        state = transport._hosts[0]
        assert state.place.gateway is None
        assert [c.forward for c in state.connections] == [None]
    finally:
        await transport.close()


@pytest.mark.parametrize(
    "option", ["AllowTcpForwarding no", "DisableForwarding yes", "no-port-forwarding key"]
)
async def test_a_host_refusing_forwards_is_refused_with_the_reason(
    ssh_pool: Any, gateway: int, option: str
) -> None:
    if option.endswith(" key"):
        server = ssh_pool.add("h1")
        keys = server.directory / "authorized_keys"
        keys.write_text("no-port-forwarding " + keys.read_text())  # the key, restricted
    else:
        server = ssh_pool.add("h1", extra=[option])
    events: list[dict[str, Any]] = []
    transport = _transport(
        ssh_pool,
        [ssh_pool.host(server)],
        gateway_port=gateway,
        emit=lambda event, **fields: events.append({"event": event, **fields}),
    )
    try:
        with pytest.raises(HostsUnavailable) as caught:
            await transport.start()
    finally:
        await transport.close()
    assert str(caught.value) == f"no SSH host can run units: {REFUSED}"
    assert events == [
        {"event": "host.quarantined", "host": "h1", "slots": 4, "reason": REFUSED, "start": True}
    ]


async def test_gateway_ports_yes_is_refused_and_its_forward_closed(
    ssh_pool: Any, gateway: int
) -> None:
    server = ssh_pool.add("h1", extra=["GatewayPorts yes"])
    transport = _transport(ssh_pool, [ssh_pool.host(server)], gateway_port=gateway)
    try:
        with pytest.raises(HostsUnavailable) as caught:
            await transport.start()
    finally:
        await transport.close()
    match = re.fullmatch(
        r"no SSH host can run units: h1: sshd's GatewayPorts exposes forwarded ports beyond"
        r" loopback \(the gateway forward listens on 0\.0\.0\.0, \[::\] port ([0-9]+)\);"
        r" set GatewayPorts no or clientspecified there",
        str(caught.value),
    )
    assert match, str(caught.value)
    assert _listening(int(match.group(1))) == []


async def test_a_reconnected_host_gets_a_new_working_forward(
    ssh_pool: Any, tmp_path: Path, gateway: int
) -> None:
    server = ssh_pool.add("h1")
    transport = _transport(
        ssh_pool, [ssh_pool.host(server, slots=1)], sandbox_kind="none", gateway_port=gateway
    )
    await transport.start()
    try:
        state = transport._hosts[0]
        first = state.place.gateway
        assert first is not None
        cut = asyncio.create_task(transport.run(_caller(tmp_path, "u1", sleep="30")))
        while state.running == 0 or not any(c.channels for c in state.connections):  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        old = state.connections[0]
        old.conn.abort()
        lost = await cut
        # The next attempt waits for the host to come back (a new connection, forward
        # and loopback check), then reaches the gateway through the new forward.
        result = await transport.run(_caller(tmp_path, "u2"))
        second = state.place.gateway
        assert second is not None
        new = state.connections[0]
    finally:
        await transport.close()
    assert lost.status is Status.LOST
    assert new is not old
    assert new.forward is not None
    assert second == new.forward.url
    assert result.status is Status.SUCCEEDED, result.output_tail
    assert result.output_tail == f"{second}/mock gateway saw /mock/v1/ping with [secret]"
    if second != first:
        # The lost connection's forward is gone once that host's sshd has seen it end.
        assert await asyncio.to_thread(_gone, _port(first))


async def test_local_workers_reach_the_gateway_on_its_own_port(
    tmp_path: Path, gateway: int
) -> None:
    transport = LocalTransport(slots=1, sandbox_kind="none", gateway_port=gateway)
    await transport.start()
    try:
        result = await transport.run(_caller(tmp_path))
    finally:
        await transport.close()
    url = f"http://127.0.0.1:{gateway}"
    assert result.status is Status.SUCCEEDED, result.output_tail
    assert result.output_tail == f"{url}/mock gateway saw /mock/v1/ping with [secret]"


def _check(pool: Any, tmp_path: Path, server: Any) -> tuple[int, dict[str, list[str]]]:
    """``fanout hosts check`` of a job with one API on ``server``: its exit code and each
    host's table cells."""
    hosts = tmp_path / "hosts.toml"
    root = pool.base / "sandboxes"
    root.mkdir(mode=0o777, exist_ok=True)
    root.chmod(0o777)
    hosts.write_text(
        f'[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {server.port}\n'
        f'user = "{pool.user}"\nidentity = "{pool.client_key}"\nsandboxRoot = "{root}"\n'
    )
    job = write_job(
        tmp_path,
        'version = 1\nname = "h"\n[inputs]\nitems = ["a"]\n[task]\ncommand = ["true"]\n'
        '[runtime]\nhosts = "hosts.toml"\nnetwork = true\n'
        '[[apis]]\nname = "mock"\nupstream = "http://127.0.0.1:1"\nstyle = "anthropic"\n',
    )
    known = Path.home() / ".ssh" / "known_hosts"
    known.parent.mkdir(parents=True, exist_ok=True)
    known.write_text(pool.known_hosts.read_text())
    ran = cli("hosts", "check", str(job))
    rows = table_rows(ran.out)
    return ran.code, {"header": rows[0], **{cells[0]: cells for cells in rows[1:]}}


def test_hosts_check_reports_a_working_loopback_forward(ssh_pool: Any, tmp_path: Path) -> None:
    code, rows = _check(ssh_pool, tmp_path, ssh_pool.add("h1"))
    assert code == 0, rows
    column = rows["header"].index("gateway forward")
    assert rows["h1"][column] == "ok (loopback)"
    assert rows["h1"][-1] == ""


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        (
            "AllowTcpForwarding no",
            "sshd refuses remote port forwarding (AllowTcpForwarding, DisableForwarding or"
            " PermitListen): workers there cannot reach the API gateway",
        ),
        ("GatewayPorts yes", "sshd's GatewayPorts exposes forwarded ports beyond loopback"),
    ],
)
def test_hosts_check_reports_a_refused_or_exposed_forward(
    ssh_pool: Any, tmp_path: Path, option: str, problem: str
) -> None:
    code, rows = _check(ssh_pool, tmp_path, ssh_pool.add("h1", extra=[option]))
    assert code == 4
    column = rows["header"].index("gateway forward")
    assert rows["h1"][column] == "NO"
    assert rows["h1"][-1].startswith(problem), rows["h1"]


async def test_transport_for_hands_the_gateway_port_to_either_transport(
    ssh_pool: Any, tmp_path: Path, gateway: int
) -> None:
    server = ssh_pool.add("h1")
    local = spec.load(write_job(tmp_path / "local", MINIMAL))
    remote = spec.load(
        write_job(
            tmp_path / "remote",
            MINIMAL
            + f'[runtime]\nsandbox = "none"\n[[runtime.hosts]]\nname = "h1"\naddress = "127.0.0.1"\n'
            f'port = {server.port}\nuser = "{ssh_pool.user}"\nidentity = "{ssh_pool.client_key}"\n'
            f'sandboxRoot = "{ssh_pool.base / "sandboxes"}"\n',
        )
    )
    (ssh_pool.base / "sandboxes").mkdir(mode=0o777, exist_ok=True)
    (ssh_pool.base / "sandboxes").chmod(0o777)
    environ = {"HOME": str(Path.home()), "PATH": "/usr/bin:/bin"}
    known = Path.home() / ".ssh" / "known_hosts"
    known.parent.mkdir(parents=True, exist_ok=True)
    known.write_text(ssh_pool.known_hosts.read_text())
    places = []
    for job in (local, remote):
        transport = transport_for(job, environ, lambda message: None, gateway_port=gateway)
        await transport.start()
        try:
            result = await transport.run(_caller(tmp_path / job.name))
        finally:
            await transport.close()
        assert result.status is Status.SUCCEEDED, result.output_tail
        places.append(result.output_tail.split(" ", 1)[0])
    assert places[0] == f"http://127.0.0.1:{gateway}/mock"
    assert re.fullmatch(r"http://127\.0\.0\.1:[0-9]+/mock", places[1])
    assert places[1] != places[0]  # the host's own end of the forward
