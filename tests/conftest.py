"""Shared fixtures, tripwires and the suite's tiers.

Tripwires: every test gets a private HOME, and a connection to anything but loopback
or a Unix socket fails loudly, so a test that forgot to inject a state directory or a
transport cannot touch the developer's home or the network.

Tiers: a test's cost markers (``sshd``, ``ray``, ``agent``, ``browser``, ``bwrap``) are derived from
the fixtures it uses (``COSTS``), and a parametrized case that names a place
(``helpers.places``) or an agent (``helpers.agents``) carries the marks of what it starts, so
``scripts/test --fast`` (``-m "not sshd and not ray and not agent and not browser and
not slow"``) never starts what it deselects.  A test that starts sshd, a Ray node, an
agent CLI or chromedriver without its marker fails (``_spawn_tripwire``), so none can be
mislabelled.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from raycluster import Cluster

    from browser import Browser
    from mockapi import MockApi
    from sshd import Pool

REPO = Path(__file__).resolve().parents[1]
# Where scripts/system-deps installs the npm tools (eslint, the Claude Code CLI): a fixed
# prefix, since bwrap sandboxes hide /tmp.
TOOLS = Path(os.environ.get("FANOUT_TEST_TOOLS", "/opt/fanout-test-tools"))
AGENT_CLIS = ("claude", "codex", "gemini")

# Each cost marker and the fixtures that pay it: a test that uses one of them, itself or
# through another fixture (pytest resolves ``item.fixturenames`` transitively), carries
# the marker.
COSTS: dict[str, frozenset[str]] = {
    "sshd": frozenset({"ssh_pool", "module_ssh_pool"}),
    "ray": frozenset({"ray_cluster", "own_ray_cluster"}),
    "agent": frozenset(f"{name}_cli" for name in AGENT_CLIS),
    "browser": frozenset({"browser"}),
    "bwrap": frozenset({"bwrap"}),
}


def pytest_collection_modifyitems(items: Sequence[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in COSTS.items():
            if used & fixtures:
                item.add_marker(marker)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> None:
    global _running
    _running = item


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("bwrap") is not None and shutil.which("bwrap") is None:
        _missing("bubblewrap (bwrap) is not installed (scripts/system-deps installs it)")


def pytest_runtest_logfinish() -> None:
    global _running
    _running = None


def _missing(reason: str) -> None:
    """What a test does without a real component it needs: a skip on a developer's
    machine, a failure under CI (which installs it)."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


# The test whose setup, call or teardown is running, for the spawn tripwire (module- and
# session-scoped fixtures start with the first test that uses them).
_running: pytest.Item | None = None
SSHD = "/usr/sbin/sshd"
CHROMEDRIVER = "/usr/bin/chromedriver"


def spawn_cost(args: Sequence[str], path: str) -> str | None:
    """The cost marker a command ``args`` run with ``PATH`` = ``path`` needs: sshd, a Ray
    node (``ray start``), chromedriver (which starts Chromium), or a real agent CLI (by
    its path under the test tools, or by its name with their directory on ``path``, as
    inside a sandbox)."""
    if not args:
        return None
    if args[0] == SSHD:
        return "sshd"
    if args[0] == CHROMEDRIVER:
        return "browser"
    if Path(args[0]).name == "ray" and "start" in args[1:2]:
        return "ray"
    clis = TOOLS / "node_modules" / ".bin"
    on_path = str(clis) in path.split(os.pathsep)
    for arg in args:
        where = Path(arg)
        if where.name in AGENT_CLIS and (where.parent == clis or (on_path and arg == where.name)):
            return "agent"
    return None


class CostTripwire(AssertionError):
    """A test started what its markers say it does not."""


def _spawn_tripwire(event: str, details: tuple[Any, ...]) -> None:
    if event != "subprocess.Popen" or _running is None:
        return
    _executable, args, _cwd, env = details
    argv = [os.fsdecode(arg) for arg in ([args] if isinstance(args, (str, bytes)) else args)]
    path = (env or os.environ).get("PATH", "")
    marker = spawn_cost(argv, path if isinstance(path, str) else os.fsdecode(path))
    if marker is None or _running.get_closest_marker(marker) is not None:
        return
    message = (
        f"{_running.nodeid} started {argv[0]} without the {marker!r} marker: use the fixture"
        f" that provides it ({', '.join(sorted(COSTS[marker]))}) or a parameter of"
        " helpers.places/agents"
    )
    _running.stash.setdefault(_TRIPPED, []).append(message)
    raise CostTripwire(message)


_TRIPPED = pytest.StashKey[list[str]]()
sys.addaudithook(_spawn_tripwire)

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
def _tripwires(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[None]:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setattr(socket.socket, "connect", _connect)
    monkeypatch.setattr(socket.socket, "connect_ex", _connect_ex)
    yield
    # The code under test may have swallowed the tripwire's exception.
    tripped = request.node.stash.get(_TRIPPED, [])
    if tripped:
        pytest.fail("\n".join(tripped))


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
        _missing(f"the {what} is not installed at {program} (scripts/system-deps installs it)")
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
def bwrap() -> Path:
    """The real bubblewrap (``bwrap`` on PATH): a test that runs it asks for this, or
    is a case of ``places`` naming bwrap (the ``bwrap`` marker skips it without)."""
    found = shutil.which("bwrap")
    if found is None:
        _missing("bubblewrap (bwrap) is not installed (scripts/system-deps installs it)")
    return Path(str(found))


@pytest.fixture
def ssh_pool() -> Iterator[Pool]:
    """A factory of real sshd hosts on loopback (see tests/sshd.py); all stopped after."""
    from sshd import make_pool

    pool = make_pool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def module_ssh_pool() -> Iterator[Pool]:
    """``ssh_pool``, shared by the tests of a module (its hosts outlive each test)."""
    from sshd import make_pool

    pool = make_pool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """A real headless Chromium, offline, with its console and network logs
    (tests/browser.py); skips without Chromium, but under CI."""
    from browser import started

    with started(tmp_path) as opened:
        yield opened


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Cluster]:
    """A real two-node Ray cluster on loopback for the whole session (tests/raycluster.py),
    stopped at the end with nothing left running; skips without ray, but under CI."""
    from raycluster import require_ray, start

    require_ray()
    cluster = start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def own_ray_cluster() -> Iterator[Cluster]:
    """A real two-node Ray cluster of the test's own (one it may kill a node of)."""
    from raycluster import require_ray, start

    require_ray()
    cluster = start()
    try:
        yield cluster
    finally:
        cluster.stop()
