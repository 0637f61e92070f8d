"""1,000 no-op units at concurrency 32 on this machine: fanout against GNU parallel and
xargs -P, without a sandbox and with bubblewrap, in the same run.  fanout's time
includes everything a real run does: start-up, selection, the SQLite journal, the
event log and the report.

Usage: .venv/bin/python bench/local.py [UNITS] [CONCURRENCY] [REPEATS] [SANDBOX]
Prints a markdown table (median of REPEATS runs each); SANDBOX ("none" or "bwrap")
runs only that half.  fanout's "none" runs each step in a PID namespace of its own
(``unshare``) where the machine allows one, as a run does.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

FANOUT = [sys.executable, "-m", "fanout"]
BWRAP = [
    "bwrap",
    "--ro-bind",
    "/",
    "/",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "--tmpfs",
    "/tmp",
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--",
]

JOB = """
version = 1
name = "bench-{sandbox}"
[inputs]
command = ["seq", "{units}"]
format = "lines"
[task]
command = ["true"]
[runtime]
maxConcurrentTasks = {concurrency}
sandbox = "{sandbox}"
"""


def timed(
    argv: list[str], *, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None
) -> tuple[float, float]:
    """Wall seconds, and CPU seconds (user + system) of every descendant: on a shared
    machine wall time says as much about the neighbours as about the tool."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=cwd, input=stdin, env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return elapsed, cpu


def fanout(units: int, concurrency: int, sandbox: str, workdir: Path) -> tuple[float, float]:
    job = workdir / f"{sandbox}.toml"
    job.write_text(JOB.format(units=units, concurrency=concurrency, sandbox=sandbox))
    shutil.rmtree(workdir / ".fanout", ignore_errors=True)
    # The registry of state directories goes to the scratch directory, not the user's.
    env = {**os.environ, "XDG_STATE_HOME": str(workdir / "state")}
    return timed([*FANOUT, "run", str(job)], cwd=workdir, env=env)


def main() -> None:
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    only = sys.argv[4] if len(sys.argv) > 4 else None
    numbers = "".join(f"{n}\n" for n in range(units))
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        cases: dict[tuple[str, str], Callable[[], tuple[float, float]]] = {
            ("none", "fanout"): lambda: fanout(units, concurrency, "none", workdir),
            ("none", "GNU parallel"): lambda: timed(
                ["parallel", f"-j{concurrency}", "true"], cwd=workdir, stdin=numbers
            ),
            ("none", "xargs -P"): lambda: timed(
                ["xargs", f"-P{concurrency}", "-n1", "true"], cwd=workdir, stdin=numbers
            ),
            ("bwrap", "fanout"): lambda: fanout(units, concurrency, "bwrap", workdir),
            ("bwrap", "GNU parallel"): lambda: timed(
                ["parallel", f"-j{concurrency}", *BWRAP, "true"], cwd=workdir, stdin=numbers
            ),
            ("bwrap", "xargs -P"): lambda: timed(
                ["xargs", f"-P{concurrency}", "-n1", *BWRAP, "true"], cwd=workdir, stdin=numbers
            ),
        }
        cases = {key: run for key, run in cases.items() if only in (None, key[0])}
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in cases}
        for _ in range(repeats):
            for key, run in cases.items():
                samples[key].append(run())
    print(f"{units} no-op units, concurrency {concurrency}, median of {repeats} runs\n")
    print("| sandbox | tool | wall s | units/s | vs GNU parallel | CPU ms/unit |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (sandbox, tool), runs in samples.items():
        wall = statistics.median(run[0] for run in runs)
        cpu = statistics.median(run[1] for run in runs) * 1000 / units
        parallel = statistics.median(run[0] for run in samples[(sandbox, "GNU parallel")])
        print(
            f"| {sandbox} | {tool} | {wall:.2f} | {units / wall:.0f} | {wall / parallel:.2f}x "
            f"| {cpu:.2f} |"
        )


if __name__ == "__main__":
    main()
