"""A real two-node Ray cluster on this machine, for the Ray transport's tests.

``ray start --head`` and a second node joined with ``ray start --address``, each in a
process group of its own (``start_new_session``) with its own temporary directory, and
node health checks made fast (``RAY_health_check_*``) so a killed node is declared dead
in about two seconds rather than thirty.  ``stop`` kills exactly what the cluster
started (each node's process group, and its workers, which Ray puts in groups of their
own), by process id, and removes the directories.  The second node carries the custom
resource ``second`` and the label ``zone=b``: a test that needs units on the node it
kills asks for them.

Without ray installed the tests that need it skip, but under CI (``$CI`` set), which
installs the ``fanout[ray]`` extra, where a missing ray is a failure.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# Fast failure detection: the GCS checks each raylet every 500 ms and gives a node up
# after 3 missed checks (Ray's defaults: 3 s, 5 misses).  Read by `ray start`.
FAST = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def require_ray() -> None:
    """Skip without ray, except under CI, which must run these tests."""
    if importlib.util.find_spec("ray") is not None:
        return
    if os.environ.get("CI"):
        pytest.fail(
            "ray is not installed but CI must run the Ray tests: pip install -e '.[dev,ray]'"
        )
    pytest.skip("ray is not installed (pip install 'fanout[ray]')")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _ray_cli() -> str:
    return str(Path(sys.executable).with_name("ray"))


@dataclass
class Node:
    group: int  # the process group `ray start` and its daemons run in
    temp: Path
    raylet: int | None = None


@dataclass
class Cluster:
    address: str
    base: Path  # everything of the cluster's on disk
    root: Path  # a directory for the tests' sandboxes
    nodes: list[Node] = field(default_factory=list)

    def _start(self, args: list[str], temp: Path) -> Node:
        env = {**os.environ, **FAST}
        started = subprocess.Popen(
            [_ray_cli(), "start", *args, f"--temp-dir={temp}", "--disable-usage-stats"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        output, _ = started.communicate(timeout=180)
        node = Node(group=started.pid, temp=temp)
        self.nodes.append(node)
        if started.returncode != 0:
            said = output.decode(errors="replace")
            taken = "Failed to start the grpc server" in said or "Address already in use" in said
            raise (_PortTaken if taken else RuntimeError)(f"ray start failed:\n{said}")
        node.raylet = next(
            iter(_pids(lambda argv: "raylet/raylet" in argv and str(temp) in argv)), None
        )
        return node

    def kill_node(self, node: Node) -> None:
        """SIGKILL a node: its raylet and daemons (its process group) and its workers
        (the raylet's children, in groups of their own)."""
        workers = _children(node.raylet) if node.raylet else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.group, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self.kill_node(node)
        # Anything else that still names a node's directory (a worker the raylet had
        # handed to a new parent): by id, never by name.
        temps = [str(node.temp) for node in self.nodes]
        deadline = time.monotonic() + 10
        while left := _pids(lambda argv: any(t in argv for t in temps)):
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        shutil.rmtree(self.base, ignore_errors=True)


# Tries at starting a cluster whose port another process took between ``_free_port``
# and the head's bind (two suites on one machine, each starting clusters, met it).
_TRIES = 3


def start() -> Cluster:
    """The cluster: a head with 4 CPUs and a second node with 4 CPUs, ``second`` = 100
    and the label ``zone=b``.  A start that lost its port to another process is tried
    again on another port; any other failure is raised."""
    for attempt in range(1, _TRIES + 1):
        try:
            return _start_once()
        except _PortTaken:
            if attempt == _TRIES:
                raise
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    """``ray start`` failed because a port it was given or chose was in use."""


def _start_once() -> Cluster:
    port = _free_port()
    base = Path(tempfile.mkdtemp(prefix="fray-", dir="/tmp"))
    cluster = Cluster(address=f"127.0.0.1:{port}", base=base, root=base / "boxes")
    cluster.root.mkdir()
    common = ["--num-cpus=4", "--object-store-memory=100000000", "--node-ip-address=127.0.0.1"]
    try:
        cluster._start(
            ["--head", f"--port={port}", "--include-dashboard=false", *common], base / "h"
        )
        cluster._start(
            [
                f"--address=127.0.0.1:{port}",
                *common,
                f"--resources={json.dumps({'second': 100})}",
                "--labels=zone=b",
            ],
            base / "n",
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _pids(match: object) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if argv and match(argv):  # type: ignore[operator]
            found.append(int(entry.name))
    return found


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent:
            found.append(int(entry.name))
    return found
