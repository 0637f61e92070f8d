"""1,000 no-op units at concurrency 32 on this machine: fanout against GNU parallel and
xargs -P, without a sandbox and with bubblewrap, in the same run.  fanout's time
includes everything a real run does: start-up, selection, the SQLite journal, the
event log and the report.

Usage: .venv/bin/python bench/local.py [UNITS] [CONCURRENCY] [REPEATS]
Prints a markdown table (median of REPEATS runs each).
"""

from __future__ import annotations

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


def timed(argv: list[str], *, cwd: Path, stdin: str | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed


def fanout(units: int, concurrency: int, sandbox: str, workdir: Path) -> float:
    job = workdir / f"{sandbox}.toml"
    job.write_text(JOB.format(units=units, concurrency=concurrency, sandbox=sandbox))
    shutil.rmtree(workdir / ".fanout", ignore_errors=True)
    return timed([*FANOUT, "run", str(job)], cwd=workdir)


def main() -> None:
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    numbers = "".join(f"{n}\n" for n in range(units))
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        cases: dict[tuple[str, str], Callable[[], float]] = {
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
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in cases}
        for _ in range(repeats):
            for key, run in cases.items():
                samples[key].append(run())
    print(f"{units} no-op units, concurrency {concurrency}, median of {repeats} runs\n")
    print("| sandbox | tool | wall s | units/s | vs GNU parallel |")
    print("| --- | --- | ---: | ---: | ---: |")
    for (sandbox, tool), times in samples.items():
        wall = statistics.median(times)
        parallel = statistics.median(samples[(sandbox, "GNU parallel")])
        print(f"| {sandbox} | {tool} | {wall:.2f} | {units / wall:.0f} | {wall / parallel:.2f}x |")


if __name__ == "__main__":
    main()
