"""1,000 no-op units through Ray, beside the local and SSH paths, on this machine.

A real two-node Ray cluster on loopback (``tests/raycluster.py``: 4 CPUs a node, so 8
units at once), a loopback sshd host with 8 slots (``tests/sshd.py``) and local
sandboxes at concurrency 8, each through fanout's whole path (``Runner``: selection,
journal, events, report), sandbox none.  "slot ms/unit" is wall time x slots / units:
what one no-op unit costs a slot, which is the transport's overhead per unit (a real
unit adds its own run time to it).

Usage: .venv/bin/python bench/ray.py [UNITS]
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import raycluster

from fanout import spec
from fanout.attempt.seam import Transport
from fanout.events import Events
from fanout.journal import Journal
from fanout.run.job import Options, Runner
from fanout.spec import Host, Ray
from fanout.transports.local import LocalTransport
from fanout.transports.ray import RayTransport
from fanout.transports.ssh import SshTransport

from sshd import make_pool

SLOTS = 8


def _job(workdir: Path, name: str, units: int) -> spec.Spec:
    workdir.mkdir(parents=True)
    (workdir / "job.toml").write_text(
        f'version = 1\nname = "{name}"\n[inputs]\ncommand = ["seq", "{units}"]\n'
        f'format = "lines"\n[task]\ncommand = ["true"]\n[runtime]\n'
        f'maxConcurrentTasks = {SLOTS}\nsandbox = "none"\n'
    )
    return spec.load(workdir / "job.toml")


def _timed(job: spec.Spec, transport: Transport, units: int) -> float:
    async def run() -> float:
        runner = Runner(
            spec=job,
            transport=transport,
            journal=Journal(job.runtime.state_dir / "journal.sqlite"),
            environ={"PATH": "/usr/bin:/bin"},
            events=Events(),
        )
        start = time.perf_counter()
        summary = await runner.execute(Options())
        elapsed = time.perf_counter() - start
        assert summary.counts == {"succeeded": units}, summary.counts
        return elapsed

    return asyncio.run(run())


def main() -> None:
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    scratch = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    rows: list[tuple[str, float]] = []
    try:
        local = _job(scratch / "local", "local", units)
        rows.append(
            (
                "local",
                _timed(
                    local, LocalTransport(slots=SLOTS, sandbox_kind="none", root=scratch), units
                ),
            )
        )
        pool = make_pool()
        try:
            server = pool.add("h1")
            root = pool.base / "sandboxes"
            root.mkdir(mode=0o777, exist_ok=True)
            root.chmod(0o777)
            host = Host(
                name="h1",
                address="127.0.0.1",
                port=server.port,
                user=pool.user,
                identity=str(pool.client_key),
                slots=SLOTS,
                sandbox_root=str(root),
            )
            job = _job(scratch / "ssh", "ssh", units)
            transport = SshTransport([host], known_hosts=[pool.known_hosts], sandbox_kind="none")
            rows.append(("SSH, one loopback host", _timed(job, transport, units)))
        finally:
            pool.close()
        cluster = raycluster.start()
        try:
            job = _job(scratch / "ray", "ray", units)
            ray = Ray(address=cluster.address, sandbox_root=str(cluster.root))
            rows.append(
                ("Ray, two loopback nodes", _timed(job, RayTransport(ray, slots=SLOTS), units))
            )
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{units} no-op units, {SLOTS} at once, sandbox none, fanout's whole path\n")
    print("| transport | wall s | units/s | slot ms/unit | vs local |")
    print("| --- | ---: | ---: | ---: | ---: |")
    base = rows[0][1]
    for name, wall in rows:
        print(
            f"| {name} | {wall:.2f} | {units / wall:.0f} | {wall * SLOTS * 1000 / units:.0f}"
            f" | {wall / base:.1f}x |"
        )


if __name__ == "__main__":
    # As a script, this file's folder leads sys.path, and this file would be the `ray`
    # that fanout's Ray transport imports: the folder goes first.  (mypy sees it as
    # bench.ray, bench being a package.)
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
    main()
