"""Shared fixtures and tripwires.

Tripwires: every test gets a private HOME, and a connection to anything but loopback
or a Unix socket fails loudly, so a test that forgot to inject a state directory or a
transport cannot touch the developer's home or the network.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mockapi import MockApi

REPO = Path(__file__).resolve().parents[1]
# Where scripts/system-deps installs the npm tools (eslint, the Claude Code CLI): a fixed
# prefix, since bwrap sandboxes hide /tmp.
TOOLS = Path(os.environ.get("FANOUT_TEST_TOOLS", "/opt/fanout-test-tools"))

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _guard(sock: socket.socket, address: Any) -> None:
    if sock.family == socket.AF_UNIX:
        return
    host = address[0] if isinstance(address, tuple) else address
    if host not in ("127.0.0.1", "::1", "localhost"):
        raise AssertionError(f"test tried to reach {address!r}; tests stay on loopback")


def _connect(sock: socket.socket, address: Any) -> None:
    _guard(sock, address)
    _real_connect(sock, address)


def _connect_ex(sock: socket.socket, address: Any) -> int:
    _guard(sock, address)
    return _real_connect_ex(sock, address)


@pytest.fixture(autouse=True)
def _tripwires(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setattr(socket.socket, "connect", _connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _connect_ex)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def chdir_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def mock_api() -> Iterator[MockApi]:
    """A mock upstream API (tests/mockapi.py) on 127.0.0.1, port 0, serving on a thread
    of its own so sync and async tests alike can use it; `.url`, `.configure(...)`."""
    from mockapi import MockApi

    with MockApi().in_thread() as api:
        yield api


def _agent_cli(name: str, what: str) -> Path:
    """The real agent CLI ``name`` as scripts/system-deps installs it (from npm, its
    native binary inside the registry package).  Missing: a skip on a developer's
    machine, a failure under CI (which installs it), as for the linters of
    test_lint.py."""
    program = TOOLS / "node_modules" / ".bin" / name
    if not os.access(program, os.X_OK):
        reason = f"the {what} is not installed at {program} (scripts/system-deps installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return program


@pytest.fixture
def claude_cli() -> Path:
    """The real Claude Code CLI (npm @anthropic-ai/claude-code)."""
    return _agent_cli("claude", "Claude Code CLI")


@pytest.fixture
def codex_cli() -> Path:
    """The real Codex CLI (npm @openai/codex)."""
    return _agent_cli("codex", "Codex CLI")


@pytest.fixture
def gemini_cli() -> Path:
    """The real Gemini CLI (npm @google/gemini-cli, on node)."""
    return _agent_cli("gemini", "Gemini CLI")


@pytest.fixture
def ssh_pool() -> Iterator[Any]:
    """A factory of real sshd hosts on loopback (see tests/sshd.py); all stopped after."""
    from sshd import make_pool

    pool = make_pool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A real two-node Ray cluster on loopback for the whole session (tests/raycluster.py),
    stopped at the end with nothing left running; skips without ray, but under CI."""
    from raycluster import require_ray, start

    require_ray()
    cluster = start()
    try:
        yield cluster
    finally:
        cluster.stop()
