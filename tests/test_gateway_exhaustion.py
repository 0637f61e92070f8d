"""A unit that tries to exhaust the gateway, with real sockets against a real gateway in
a process of its own at ``ulimit -n 1024`` (systemd's default soft limit): 2,000
slowloris connections, 8 bodies of 60 MB at once.  Its open files and memory are read
from /proc."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from fanout.gateway.admission import ATTEMPT_BODIES
from fanout.gateway.connections import connection_cap

KEY = "sk-ant-real-0123456789abcdef"
NOFILE = 1024
HERE = Path(__file__).parent


@dataclass
class Proc:
    process: subprocess.Popen[str]
    port: int
    token: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def files(self) -> int:
        return len(list(Path(f"/proc/{self.process.pid}/fd").iterdir()))

    def sockets(self) -> int:
        """Its open sockets (its other files come and go as Python reads them)."""
        found = 0
        for fd in Path(f"/proc/{self.process.pid}/fd").iterdir():
            with contextlib.suppress(FileNotFoundError):
                found += os.readlink(fd).startswith("socket:")
        return found

    def memory(self, field: str) -> int:
        """``VmRSS`` or ``VmHWM`` (the peak) of the gateway's process, in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field}")

    def notices(self) -> list[str]:
        return [e["message"] for e in self.events if e.get("event") == "notice"]


def _read_events(stream: IO[str], proc: Proc) -> None:
    for line in stream:
        proc.events.append(json.loads(line))


@pytest.fixture
def gateway_process() -> Iterator[Callable[[float], Proc]]:
    started: list[Proc] = []

    def start(idle_timeout: float) -> Proc:
        process = subprocess.Popen(
            [sys.executable, str(HERE / "gatewayproc.py"), str(NOFILE), str(idle_timeout), KEY],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=HERE,
        )
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        proc = Proc(process, first["port"], first["token"])
        threading.Thread(target=_read_events, args=(process.stdout, proc), daemon=True).start()
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            assert proc.process.stdin is not None
            proc.process.stdin.close()
            try:
                proc.process.wait(30)
            except subprocess.TimeoutExpired:
                proc.process.kill()
                proc.process.wait()


@pytest.fixture
def many_files() -> Iterator[None]:
    """This process opens 2,000 sockets: its soft limit raised for the test."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard limit on open files is {hard}; the client needs {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never held")
        time.sleep(0.05)


def exchange(port: int, request: bytes) -> bytes:
    """``request`` (with ``connection: close``) sent on a fresh connection; all the
    gateway answered until it closed.  (Not half-closed: a worker that shuts its side
    has gone, and its request is cancelled.)"""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(request)
        return b"".join(iter(lambda: conn.recv(65536), b""))


def message_request(token: str) -> bytes:
    body = b'{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}'
    return (
        b"POST /anthropic/v1/messages HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n"
        b"content-type: application/json\r\nx-api-key: " + token.encode() + b"\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def closed_by_peer(conn: socket.socket) -> bool:
    """Whether the gateway closed this (non-blocking) connection."""
    try:
        return conn.recv(1) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except ConnectionResetError:
        return True
    except OSError as exc:
        if exc.errno == errno.ENOTCONN:  # still connecting: not accepted yet
            return False
        raise


@pytest.mark.slow
def test_2000_slowloris_connections_hold_a_quarter_of_the_files_and_requests_get_in(
    gateway_process: Callable[[float], Proc], many_files: None
) -> None:
    # On main the gateway accepted until EMFILE (1,024 files), asyncio printed a
    # traceback each time it tried again (68 MB of stderr in a minute), the coordinator
    # had no file left, and no request got through.
    proc = gateway_process(60.0)
    before = proc.sockets()  # the listening ones, the mock's, the loop's own
    cap = connection_cap(NOFILE)
    assert cap == 256
    sockets: list[socket.socket] = []
    closed: set[socket.socket] = set()

    def count_closed() -> int:
        closed.update(conn for conn in sockets if conn not in closed and closed_by_peer(conn))
        return len(closed)

    try:
        for _ in range(2000):
            conn = socket.socket()
            conn.setblocking(False)
            conn.connect_ex(("127.0.0.1", proc.port))
            sockets.append(conn)
        # What a slow one sends once connected: a request line, no more.  (Until it
        # sends, a connection the kernel finished with a SYN cookie is not one yet.)
        with selectors.DefaultSelector() as selector:
            for conn in sockets:
                selector.register(conn, selectors.EVENT_WRITE)
            while selector.get_map():
                for key, _ in selector.select(timeout=60):
                    ready = key.fileobj
                    assert isinstance(ready, socket.socket)
                    with contextlib.suppress(OSError):
                        ready.send(b"POST /anthropic/v1/messages HTTP/1.1\r\n")
                    selector.unregister(ready)
        # Each connection over the cap closed the one idle longest.
        wait_for(lambda: count_closed() == 2000 - cap)
        assert proc.sockets() == before + cap
        # A worker's request gets in meanwhile, closing one more.
        answer = exchange(proc.port, message_request(proc.token))
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer[:200]
        assert b"All done." in answer
        wait_for(lambda: count_closed() == 2000 - cap + 1)
        # 2 more: the kept-alive connection to the mock upstream, both ends in there.
        assert proc.sockets() == before + cap - 1 + 2
        assert proc.files() <= before + cap + 1 + 8
    finally:
        for conn in sockets:
            conn.close()
    wait_for(lambda: proc.sockets() == before + 2)
    assert proc.process.stdin is not None
    assert proc.process.stderr is not None
    proc.process.stdin.close()
    assert proc.process.wait(30) == 0
    assert proc.process.stderr.read() == ""
    said = (
        "fanout gateway: 256 connections are open, the most it holds (a quarter of the"
        " open-files limit): each new one closes the one idle longest"
    )
    assert proc.notices() == [said, f"{said} (1744 more like it since)"]


@pytest.mark.slow
def test_a_slowloris_connection_is_closed_after_the_idle_timeout(
    gateway_process: Callable[[float], Proc],
) -> None:
    proc = gateway_process(1.0)
    with socket.create_connection(("127.0.0.1", proc.port), timeout=30) as conn:
        started = time.monotonic()
        for piece in (b"POST /anthropic/v1/messages HTTP/1.1\r\n", b"host: gw\r\n", b"x-a: "):
            conn.sendall(piece)
            time.sleep(0.3)  # headers trickling in do not keep it open
        assert conn.recv(100) == b""  # closed, nothing answered
        assert 1.0 <= time.monotonic() - started < 5.0


def send_body(port: int, token: str, size: int, *, declared: bool) -> bytes:
    """A POST of ``size`` bytes (its length declared, or chunked), sent whole whatever
    the gateway answers meanwhile; the gateway's answer."""
    head = (
        b"POST /anthropic/v1/messages HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n"
        b"content-type: application/json\r\nx-api-key: " + token.encode() + b"\r\n"
    )
    head += (
        b"content-length: %d\r\n\r\n" % size if declared else b"transfer-encoding: chunked\r\n\r\n"
    )
    piece = b"x" * (1024 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
        conn.sendall(head)
        try:
            for _ in range(size // len(piece)):
                conn.sendall(piece if declared else b"%x\r\n%s\r\n" % (len(piece), piece))
            if not declared:
                conn.sendall(b"0\r\n\r\n")
        except OSError:  # the gateway stopped reading: its answer is there all the same
            pass
        return b"".join(iter(lambda: conn.recv(65536), b""))


@pytest.mark.slow
def test_8_bodies_of_60_mb_at_once_are_refused_with_413_and_memory_stays_bounded(
    gateway_process: Callable[[float], Proc],
) -> None:
    # On main each body was read whole (up to 64 MiB) before anything else, and the
    # eight took the coordinator from 54 MB to 1.07 GB.
    proc = gateway_process(60.0)
    before = proc.memory("VmHWM")
    answers: list[bytes] = []
    threads = [
        threading.Thread(
            target=lambda declared=i % 2 == 0: answers.append(
                send_body(proc.port, proc.token, 60 * 1024 * 1024, declared=declared)
            )
        )
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert len(answers) == 8
    expected: dict[str, Any] = {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": "fanout gateway: api anthropic: the request body is over 32 MiB, the"
            " most the gateway passes to this API",
        },
    }
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n"), head
        assert json.loads(body) == expected
    # The undeclared ones were read up to the cap, two at a time (the attempt's bodies).
    grown = proc.memory("VmHWM") - before
    assert grown < ATTEMPT_BODIES + 24 * 1024 * 1024, grown
    assert proc.notices() == [expected["error"]["message"]]
