"""No-op units on a two-node Ray cluster: fanout beside raw Ray doing the least it can.

A real two-node Ray cluster on loopback (``tests/raycluster.py``: 4 CPUs a node, so 8
at once), or the one at ``--address``.  Six ways to get UNITS no-op units done, 8 at
once, interleaved round after round on the same cluster:

- fanout on Ray: fanout's whole path (``Runner``: selection, journal, events, report)
  through ``RayTransport``, sandbox none, each unit ``true`` in a sandbox on a node;
- raw Ray tasks: ``@ray.remote`` tasks each running ``true`` (a subprocess), no sandbox,
  on the task workers a warm-up of 100 tasks (and the rounds before) left running;
- raw Ray tasks on new workers: the same, with a runtime env of the round's own (one
  variable), so Ray starts new worker processes for them, as it does for fanout's
  actors (a worker that ran tasks never becomes an actor);
- raw Ray tasks from a new driver: the same tasks from a Python process of their own
  that has just joined the cluster, as a Ray script a user would write instead of a
  fanout job runs (a new job, whose workers Ray starts for it);
- one actor call: 8 actors, one call of a method that does nothing per unit;
- fanout's node side as raw tasks: each unit one raw task on the warm task workers
  that does what a node does for fanout's no-op unit (``node.NodeSandbox``: the
  sandbox made, ``true`` run in it behind the PID namespace, the control file read,
  the sandbox removed), with nothing of the coordinator's side (no journal, no events,
  no driver): the most a design that ran attempts as tasks on warm workers could get.

"units/s" is units over the wall time of the whole batch (fanout's includes probing
the nodes and starting its 8 actors' worker processes, the new-worker tasks' starting
theirs; the driver has joined the cluster before: "first unit s" is when the first
unit ended); "steady" is the rate from the 100th unit's end to the last's.  The ratios
are each way's over raw tasks' (warm workers), whole and steady, and, whole, over the
new-worker tasks'.

Usage: .venv/bin/python bench/ray.py [UNITS] [ROUNDS] [--address HOST:PORT]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SLOTS = 8
SKIP = 100  # units before the steady rate counts


def _job(workdir: Path, units: int) -> Any:
    from fanout import spec

    workdir.mkdir(parents=True)
    (workdir / "job.toml").write_text(
        f'version = 1\nname = "ray"\n[inputs]\ncommand = ["seq", "{units}"]\n'
        f'format = "lines"\n[task]\ncommand = ["true"]\n[runtime]\n'
        f'maxConcurrentTasks = {SLOTS}\nsandbox = "none"\n'
    )
    return spec.load(workdir / "job.toml")


class _Timed:
    """A transport that notes when each attempt ended."""

    def __init__(self, inner: Any, ends: list[float]) -> None:
        self._inner = inner
        self._ends = ends

    @property
    def capacity(self) -> int:
        return int(self._inner.capacity)

    async def start(self) -> None:
        await self._inner.start()

    async def run(self, attempt: Any) -> Any:
        result = await self._inner.run(attempt)
        self._ends.append(time.perf_counter())
        return result

    async def close(self) -> None:
        await self._inner.close()


def _rates(start: float, ends: list[float]) -> tuple[float, float, float]:
    """Units/s over the whole batch, units/s after the ``SKIP``th, and when the first
    unit ended (s)."""
    ends = sorted(ends)
    whole = len(ends) / (ends[-1] - start)
    if len(ends) <= SKIP:
        return whole, whole, ends[0] - start
    steady = (len(ends) - SKIP) / (ends[-1] - ends[SKIP - 1])
    return whole, steady, ends[0] - start


async def _fanout(
    address: str, root: Path, workdir: Path, units: int
) -> tuple[float, float, float]:
    from fanout.events import Events
    from fanout.journal import Journal
    from fanout.run.job import Options, Runner
    from fanout.spec import Ray
    from fanout.transports.ray import RayTransport

    job = _job(workdir, units)
    ends: list[float] = []
    ray = Ray(address=address, sandbox_root=str(root))
    runner = Runner(
        spec=job,
        transport=_Timed(RayTransport(ray, slots=SLOTS, sandbox_kind="none"), ends),
        journal=Journal(job.runtime.state_dir / "journal.sqlite"),
        environ={"PATH": "/usr/bin:/bin"},
        events=Events(),
    )
    start = time.perf_counter()
    summary = await runner.execute(Options())
    assert summary.counts == {"succeeded": units}, summary.counts
    return _rates(start, ends)


async def _many(units: int, call: Any) -> tuple[float, float, float]:
    """``units`` awaits of ``call(slot)``, ``SLOTS`` at once."""
    left = list(range(units))
    ends: list[float] = []

    async def slot(n: int) -> None:
        while left:
            left.pop()
            await call(n)
            ends.append(time.perf_counter())

    start = time.perf_counter()
    await asyncio.gather(*(slot(n) for n in range(SLOTS)))
    return _rates(start, ends)


# The tasks of "raw Ray tasks running `true`", from a driver of their own: argv is the
# cluster's address, the units and the slots; it prints when each unit ended (s after
# its first submission, once it has joined).
_NEW_DRIVER = """
import asyncio, json, subprocess, sys, time
import ray

ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")

@ray.remote
def true():
    return subprocess.run(["true"], check=False).returncode

async def main(units, slots):
    left, ends = list(range(units)), []
    async def slot():
        while left:
            left.pop()
            await true.remote()
            ends.append(time.perf_counter())
    start = time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(slots)))
    print(json.dumps([end - start for end in ends]))

asyncio.run(main(int(sys.argv[2]), int(sys.argv[3])))
"""


def _new_driver(address: str, units: int) -> tuple[float, float, float]:
    done = subprocess.run(
        [sys.executable, "-c", _NEW_DRIVER, address, str(units), str(SLOTS)],
        capture_output=True,
        text=True,
        check=True,
    )
    return _rates(0.0, json.loads(done.stdout.splitlines()[-1]))


def _node_side(token: str) -> int:
    """One no-op unit's work on a node, as ``node.NodeSandbox`` does it for an actor's
    step, in this worker process: its sandbox made, ``true`` run in it, the control file
    read and the sandbox removed (``final``).  The node's set-up (its local transport,
    an event loop) is made once a worker process and kept in a module of its own."""
    import types
    from dataclasses import replace

    from fanout import __version__
    from fanout.attempt.model import LAYOUT
    from fanout.attempt.sandbox import Command
    from fanout.isolation import tools
    from fanout.transports.ray.facts import Opening, sandbox_name
    from fanout.transports.ray.node import NodeSandbox

    state: Any = sys.modules.get("fanout_bench_node")
    if state is None:
        state = types.ModuleType("fanout_bench_node")
        state.loop = asyncio.new_event_loop()
        state.box = NodeSandbox("0" * 8, "127.0.0.1")
        opening = Opening(version=__version__, sandbox="none", root="auto")
        state.place = state.loop.run_until_complete(state.box.open(opening)).place
        sys.modules["fanout_bench_node"] = state
    place = state.place
    base = f"{place.base}/{sandbox_name(os.getpid(), token)}"
    argv = tools.command(replace(place, base=base), ("true",), network=False, env_names=("PATH",))
    command = Command(
        argv=tuple(argv),
        program="true",
        env={"PATH": place.path, "HOME": base, "TMPDIR": base},
        stdin=b"",
        cwd=f"{base}/{LAYOUT.work}",
    )
    _, ended = state.loop.run_until_complete(state.box.step(token, command, 60.0, [], True))
    assert ended is not None, "a no-op step ends within the node's window"
    assert ended[2], "a final step removes its sandbox"
    code: int = ended[0]
    return code


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--address")]
    address = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--address=")), "")
    units = int(args[0]) if args else 1000
    rounds = int(args[1]) if len(args) > 1 else 3
    import ray
    import raycluster

    from fanout.transports.ray import rayapi

    cluster = None
    if not address:
        cluster = raycluster.start()
        address = cluster.address
    scratch = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    root = scratch / "boxes"
    root.mkdir()
    rows: dict[str, list[tuple[float, float, float]]] = {
        "fanout on Ray": [],
        "raw Ray tasks running `true`": [],
        "raw Ray tasks on new workers": [],
        "raw Ray tasks from a new driver": [],
        "one actor call": [],
        "fanout's node side as raw tasks": [],
    }
    try:
        rayapi.connect(address)  # fanout's transport joins this connection and leaves it

        @ray.remote
        def true() -> int:
            return subprocess.run(["true"], check=False).returncode

        @ray.remote
        def node_side(token: str) -> int:
            return _node_side(token)

        @ray.remote
        class Nop:
            def call(self) -> None:
                return None

        async def measure(round_: int) -> None:
            actors = [Nop.remote() for _ in range(SLOTS)]  # type: ignore[attr-defined]
            await asyncio.gather(*(actor.call.remote() for actor in actors))
            await _many(SKIP, lambda n: true.remote())  # warm the task workers
            rows["raw Ray tasks running `true`"].append(await _many(units, lambda n: true.remote()))
            rows["one actor call"].append(await _many(units, lambda n: actors[n].call.remote()))
            for actor in actors:
                ray.kill(actor)
            fresh = true.options(runtime_env={"env_vars": {"FANOUT_BENCH_ROUND": str(round_)}})
            rows["raw Ray tasks on new workers"].append(
                await _many(units, lambda n: fresh.remote())
            )
            rows["raw Ray tasks from a new driver"].append(_new_driver(address, units))
            workdir = scratch / f"round{round_}"
            rows["fanout on Ray"].append(await _fanout(address, root, workdir, units))
            tokens = iter(range(units + SKIP))
            await _many(SKIP, lambda n: node_side.remote(f"{next(tokens):012x}"))
            rows["fanout's node side as raw tasks"].append(
                await _many(units, lambda n: node_side.remote(f"{next(tokens):012x}"))
            )

        for round_ in range(rounds):
            asyncio.run(measure(round_))
            print(f"round {round_ + 1}: " + ", ".join(f"{v[-1][0]:.0f}" for v in rows.values()))
        left = sorted(path.name for path in root.iterdir())
        assert not left, f"sandboxes left on the nodes: {left}"
    finally:
        rayapi.disconnect()
        shutil.rmtree(scratch, ignore_errors=True)
        if cluster is not None:
            cluster.stop()
    print(
        f"\n{units} no-op units, {SLOTS} at once, a two-node loopback Ray cluster,"
        f" {rounds} rounds interleaved (median, range)\n"
    )
    print(
        "| way | units/s | steady units/s | first unit s | vs raw tasks (steady)"
        " | vs new-worker tasks |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    raw = [statistics.median(m[i] for m in rows["raw Ray tasks running `true`"]) for i in (0, 1)]
    cold = statistics.median(m[0] for m in rows["raw Ray tasks on new workers"])
    for name, measured in rows.items():
        whole, steady, first = ([m[i] for m in measured] for i in (0, 1, 2))
        print(
            f"| {name} | {statistics.median(whole):.0f} ({min(whole):.0f}-{max(whole):.0f})"
            f" | {statistics.median(steady):.0f} ({min(steady):.0f}-{max(steady):.0f})"
            f" | {statistics.median(first):.2f}"
            f" | {statistics.median(whole) / raw[0]:.2f}x"
            f" ({statistics.median(steady) / raw[1]:.2f}x)"
            f" | {statistics.median(whole) / cold:.2f}x |"
        )


if __name__ == "__main__":
    # As a script, this file's folder leads sys.path, and this file would be the `ray`
    # that fanout's Ray transport imports: the folder goes first.  (mypy sees it as
    # bench.ray, bench being a package.)
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
    main()
