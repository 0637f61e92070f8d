"""The SIGKILL figure: 500 units, the real ``fanout run`` SIGKILLed at 5 random points
and resumed each time, without a sandbox, under bwrap and over SSH (a real sshd).

Every worker reports to a TCP collector in this process: ``W unit attempt`` itself,
then, from a child it starts and waits for, ``C unit attempt`` 20 ms later, or
``ORPHAN unit attempt`` if by then the worker is gone (a child that outlived its unit,
doing its work beside the resumed run).  The figure: zero units lost, no settled unit
run again, every settled attempt's side effects exactly once, the journal's
``integrity_check`` ok, and (with process containment) no orphan ever.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socketserver
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from helpers import places

pytestmark = pytest.mark.slow

UNITS = 500
KILLS = 5
MODES = places("none", "bwrap", "ssh")

# "Alive" reads /proc, not ``kill -0``: a killed worker whose parent was the killed
# coordinator may stay a zombie (a container's PID 1 need not reap), which ``kill -0``
# counts as alive.
WORKER = (
    'send() { echo "$*" > /dev/tcp/127.0.0.1/{port}; }; '
    'alive() { [ -r /proc/$1/stat ] && read -r _ _ state _ < /proc/$1/stat && [ "$state" != Z ]; }; '
    "send W $FANOUT_UNIT_ID $FANOUT_ATTEMPT; worker=$$; "
    "(sleep 0.02; if alive $worker; then send C $FANOUT_UNIT_ID $FANOUT_ATTEMPT;"
    " else send ORPHAN $FANOUT_UNIT_ID $FANOUT_ATTEMPT; fi) & wait"
)

JOB = """
version = 1
name = "kill-figure"
[inputs]
items = [{items}]
[task]
command = ["bash", "-c", '{worker}']
[runtime]
maxConcurrentTasks = 32
sandbox = "{sandbox}"
network = true
{hosts}
"""


class _Collector(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    # 32 workers connect at once: a short accept queue would hold reports back for
    # seconds (SYN-ACK retransmits) after their workers have exited.
    request_queue_size = 1024

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Line)
        self.lines: list[str] = []
        self.lock = threading.Lock()


class _Line(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        server: Any = self.server
        for raw in self.rfile:
            with server.lock:
                server.lines.append(raw.decode().strip())


@dataclass
class Figure:
    mode: str
    seed: int
    kills: int
    states: Counter[str]
    attempts: dict[str, list[tuple[int, str]]] = field(repr=False)
    lines: list[str] = field(repr=False)
    integrity: str
    wall: float
    # The run's wall time as the journal has it, and the least it can honestly be: each
    # stretch from its first attempt's start to the last thing it recorded.
    journal_wall: float
    least_wall: float
    stderr: list[str] = field(default_factory=list, repr=False)

    def effects(self, kind: str) -> Counter[tuple[str, int]]:
        found: Counter[tuple[str, int]] = Counter()
        for line in self.lines:
            word, unit, attempt = line.split()
            if word == kind:
                found[unit, int(attempt)] += 1
        return found


def _settled(db: Path) -> int:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            row = conn.execute(
                "SELECT COUNT(*) FROM units WHERE state IN ('succeeded', 'failed')"
            ).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return 0
    return int(row[0])


def _hosts(pool: Any, directory: Path) -> tuple[str, Any]:
    server = pool.add("h1", max_sessions=64)
    root = pool.base / "sandboxes"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    (directory / "home" / ".ssh").mkdir(parents=True)
    shutil.copy(pool.known_hosts, directory / "home" / ".ssh" / "known_hosts")
    inline = (
        f'[[runtime.hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {server.port}\n'
        f'user = "{pool.user}"\nidentity = "{pool.client_key}"\nslots = 32\n'
        f'sandboxRoot = "{root}"\n'
    )
    return inline, server


def _run_figure(mode: str, directory: Path, pool: Any) -> Figure:
    seed = int(os.environ.get("FANOUT_KILL_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    (directory / "home").mkdir(parents=True)
    (directory / "tmp").mkdir()
    hosts, server = _hosts(pool, directory) if mode == "ssh" else ("", None)
    collector = _Collector()
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    try:
        worker = WORKER.replace("{port}", str(collector.server_address[1]))
        items = ", ".join(f'"u{n:03d}"' for n in range(UNITS))
        sandbox = "bwrap" if mode == "bwrap" else "none"
        (directory / "job.toml").write_text(
            JOB.format(items=items, worker=worker, sandbox=sandbox, hosts=hosts)
        )
        env = {**os.environ, "HOME": str(directory / "home"), "TMPDIR": str(directory / "tmp")}
        env.pop("XDG_CONFIG_HOME", None)
        db = directory / ".fanout" / "journal.sqlite"
        points = sorted(rng.sample(range(10, UNITS - 10), KILLS))
        started = time.monotonic()
        stderr: list[str] = []
        stretches: list[tuple[float, float]] = []
        for point in points:
            begun = time.time()
            coordinator = subprocess.Popen(
                [sys.executable, "-m", "fanout", "run", "job.toml"],
                cwd=directory,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            deadline = time.monotonic() + 60
            while _settled(db) < point and coordinator.poll() is None:
                assert time.monotonic() < deadline, f"seed {seed}: no progress to {point}"
                time.sleep(0.01)
            coordinator.send_signal(signal.SIGKILL)
            stretches.append((begun, time.time()))
            _, err = coordinator.communicate()
            stderr.append(err)
            assert coordinator.returncode == -signal.SIGKILL, f"seed {seed}: {err}"
        begun = time.time()
        final = subprocess.run(
            [sys.executable, "-m", "fanout", "run", "job.toml"],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert final.returncode == 0, f"seed {seed}: {final.stderr}"
        stretches.append((begun, time.time()))
        wall = time.monotonic() - started
        # Reports may still be on their way: wait until every unit's settling attempt
        # has both (at most 10 s), then a little longer for orphans.
        with sqlite3.connect(db) as conn:
            settling = {
                f"{unit} {n}"
                for unit, n in conn.execute(
                    "SELECT unit, n FROM attempts WHERE status = 'succeeded'"
                )
            }
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with collector.lock:
                lines = list(collector.lines)
            workers = {line[2:] for line in lines if line.startswith("W ")}
            children = {line[2:] for line in lines if line.startswith("C ")}
            if settling <= workers and settling <= children:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        with sqlite3.connect(db) as conn:
            states = Counter(dict(conn.execute("SELECT state, COUNT(*) FROM units GROUP BY state")))
            attempts: dict[str, list[tuple[int, str]]] = {}
            for unit, n, status in conn.execute(
                "SELECT unit, n, status FROM attempts ORDER BY unit, n"
            ):
                attempts.setdefault(unit, []).append((n, status))
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
            journal_wall = conn.execute("SELECT wall FROM runs").fetchone()[0]
            least_wall = 0.0
            for first, last in stretches:
                times = conn.execute(
                    "SELECT MIN(started), MAX(MAX(started), MAX(COALESCE(finished, 0)))"
                    " FROM attempts WHERE started BETWEEN ? AND ? AND"
                    " (finished IS NULL OR finished <= ?)",
                    (first, last, last),
                ).fetchone()
                if times[0] is not None:
                    least_wall += times[1] - times[0]
        with collector.lock:
            lines = list(collector.lines)
        return Figure(
            mode=mode,
            seed=seed,
            kills=len(points),
            states=states,
            attempts=attempts,
            lines=lines,
            integrity=integrity,
            wall=wall,
            journal_wall=journal_wall,
            least_wall=least_wall,
            stderr=stderr,
        )
    finally:
        collector.shutdown()
        collector.server_close()
        if server is not None:
            server.stop()


@pytest.fixture(scope="module", params=MODES)
def figure(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Figure:
    mode = str(request.param)
    pool = request.getfixturevalue("module_ssh_pool") if mode == "ssh" else None
    return _run_figure(mode, tmp_path_factory.mktemp(f"kill-{mode}"), pool)


def test_sigkilled_runs_lose_no_unit_and_run_no_settled_unit_again(figure: Figure) -> None:
    context = f"mode {figure.mode}, seed {figure.seed}"
    assert figure.kills == KILLS
    assert figure.states == Counter({"succeeded": UNITS}), context
    assert figure.integrity == "ok"
    workers = figure.effects("W")
    children = figure.effects("C") + figure.effects("ORPHAN")
    for unit, attempts in figure.attempts.items():
        numbers = [n for n, _ in attempts]
        statuses = [status for _, status in attempts]
        # Exactly one attempt settled the unit, and it was the last one ever started.
        assert statuses.count("succeeded") == 1, (context, unit, attempts)
        assert statuses[-1] == "succeeded", (context, unit, attempts)
        assert set(statuses[:-1]) <= {"interrupted"}, (context, unit, attempts)
        last = numbers[-1]
        # The settling attempt's worker and child did their side effect exactly once.
        assert workers[unit, last] == 1, (context, unit)
        assert children[unit, last] == 1, (context, unit)
    # Nothing ran twice under one attempt, nor under a number the journal never gave out.
    for effects in (workers, children):
        for (unit, n), count in effects.items():
            assert count == 1, (context, unit, n)
            assert n in [number for number, _ in figure.attempts[unit]], (context, unit, n)
    assert set(figure.attempts) == {f"u{n:03d}" for n in range(UNITS)}
    # The stretches the kills cut short count in the wall time (the report's speed-up).
    assert figure.journal_wall >= figure.least_wall, context
    # Attempts the kills cut short may have done their side effect before they died;
    # their units then ran again, as they had not settled.  Reported, not a defect.
    cut = sum(
        1 for unit, attempts in figure.attempts.items() for n, s in attempts if s == "interrupted"
    )
    print(
        f"{figure.mode}: {figure.kills} kills, {cut} attempts cut short,"
        f" {len(figure.effects('ORPHAN'))} orphans, wall {figure.wall:.1f}s"
        f" (journal {figure.journal_wall:.1f}s, at least {figure.least_wall:.1f}s)"
    )


# Every process of a unit dies with its unit and with a killed coordinator, in every
# mode: a PID namespace per step (bwrap's, or unshare's for sandbox "none").
def test_no_child_of_a_killed_unit_does_its_work_beside_the_resumed_run(figure: Figure) -> None:
    orphans = figure.effects("ORPHAN")
    assert orphans == Counter(), f"mode {figure.mode}, seed {figure.seed}: {sorted(orphans)}"
