"""1,000 no-op units at concurrency 32 on this machine: fanout against GNU parallel and
xargs -P, without a sandbox and with bubblewrap, in the same run, each alternative also
with the isolation fanout gives a step.  fanout's time includes everything a real run
does: start-up, selection, the SQLite journal, the event log and the report.

- sandbox none: fanout runs each step in a PID namespace of its own where the machine
  allows one (``unshare``, as a run does); "GNU parallel + unshare" runs ``true`` behind
  the same unshare prefix.  "fanout, sandboxes on disk" names the temporary directory as
  ``runtime.sandboxRoot``: what the default (a tmpfs with room) saves.
- sandbox bwrap: "GNU parallel + bwrap, fanout's flags" runs ``true`` behind the bwrap
  argv fanout builds for a sandbox (``isolation.tools.command``: its tool binds, hidden
  paths, the sandbox's bind and, as root, --cap-drop ALL), one shared sandbox folder for
  every unit; "minimal flags" behind the fewest that isolate.
- ``--baseline PYTHON`` adds rows for another checkout's fanout (its venv's python, as
  it was before a change), run in turn with the others.

Runs are interleaved (each repeat runs every case once, in turn), so that a busy
neighbour slows them alike: the ratios are what to trust.  Prints a markdown table
(medians), then each target of issue 26 with its ratio.

Usage: .venv/bin/python bench/local.py [--units N] [--concurrency N] [--repeats N]
       [--sandbox none|bwrap] [--baseline PYTHON]
"""

from __future__ import annotations

import argparse
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

from fanout.isolation import hidden, tools
from fanout.isolation.place import Place

MINIMAL_BWRAP = [
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
{root}
"""

Sample = tuple[float, float]
# What "vs parallel" divides by, for each sandbox.
REFERENCE = {"none": "GNU parallel", "bwrap": "GNU parallel + bwrap, fanout's flags"}


def timed(
    argv: list[str], *, cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None
) -> Sample:
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


def fanout(
    python: str, units: int, concurrency: int, sandbox: str, workdir: Path, root: str = ""
) -> Sample:
    job = workdir / f"{sandbox}.toml"
    line = f'sandboxRoot = "{root}"' if root else ""
    job.write_text(JOB.format(units=units, concurrency=concurrency, sandbox=sandbox, root=line))
    shutil.rmtree(workdir / ".fanout", ignore_errors=True)
    # The registry of state directories goes to the scratch directory, not the user's;
    # no TMPDIR, so that auto chooses as it does for a user who set none.
    env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
    env["XDG_STATE_HOME"] = str(workdir / "state")
    return timed([python, "-m", "fanout", "run", str(job)], cwd=workdir, env=env)


def fanout_bwrap(workdir: Path) -> list[str]:
    """The bwrap argv fanout runs a step with, for one sandbox folder in ``workdir``."""
    base = workdir / "box"
    (base / "work").mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PATH", os.defpath)
    place = Place(
        host="local",
        kind="bwrap",
        base=str(base),
        path=path,
        hidden=tools.hidden_entries(hidden.paths(os.environ, workdir / ".fanout")),
        tools=tuple(str(tool) for tool in tools.bound_tools(path)),
        root=os.geteuid() == 0,
    )
    return tools.command(place, ["true"], network=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sandbox", choices=("none", "bwrap"))
    parser.add_argument("--baseline", help="another checkout's python, for before/after rows")
    options = parser.parse_args()
    units, concurrency = options.units, options.concurrency
    numbers = "".join(f"{n}\n" for n in range(units))
    me = sys.executable
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        disk = workdir / "disk"
        disk.mkdir()

        def parallel(*prefix: str) -> Callable[[], Sample]:
            return lambda: timed(
                ["parallel", f"-j{concurrency}", *prefix, "true"], cwd=workdir, stdin=numbers
            )

        def ours(python: str, sandbox: str, root: str = "") -> Callable[[], Sample]:
            return lambda: fanout(python, units, concurrency, sandbox, workdir, root)

        namespace = tools.pid_namespace()
        cases: dict[tuple[str, str], Callable[[], Sample]] = {
            ("none", "fanout"): ours(me, "none"),
            ("none", "fanout, sandboxes on disk"): ours(me, "none", str(disk)),
            ("none", "GNU parallel"): parallel(),
            ("none", "GNU parallel + unshare"): parallel(*namespace, "--"),
            ("none", "xargs -P"): lambda: timed(
                ["xargs", f"-P{concurrency}", "-n1", "true"], cwd=workdir, stdin=numbers
            ),
            ("bwrap", "fanout"): ours(me, "bwrap"),
            ("bwrap", "GNU parallel + bwrap, fanout's flags"): parallel(
                *fanout_bwrap(workdir)[:-1]
            ),
            ("bwrap", "GNU parallel + bwrap, minimal flags"): parallel(*MINIMAL_BWRAP),
        }
        if options.baseline:
            cases[("none", "fanout, baseline")] = ours(options.baseline, "none")
            cases[("bwrap", "fanout, baseline")] = ours(options.baseline, "bwrap")
        if not namespace:
            del cases[("none", "GNU parallel + unshare")]
        cases = {key: run for key, run in cases.items() if options.sandbox in (None, key[0])}
        samples: dict[tuple[str, str], list[Sample]] = {key: [] for key in cases}
        for _ in range(options.repeats):
            for key, run in cases.items():
                samples[key].append(run())
    wall = {key: statistics.median(run[0] for run in runs) for key, runs in samples.items()}
    print(f"{units} no-op units, concurrency {concurrency}, median of {options.repeats} runs")
    print(f"(load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
    print("| sandbox | tool | wall s | units/s | vs parallel | CPU ms/unit |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (sandbox, tool), runs in samples.items():
        cpu = statistics.median(run[1] for run in runs) * 1000 / units
        alone = wall[(sandbox, REFERENCE[sandbox])]
        print(
            f"| {sandbox} | {tool} | {wall[(sandbox, tool)]:.2f} | {units / wall[(sandbox, tool)]:.0f}"
            f" | {wall[(sandbox, tool)] / alone:.2f}x | {cpu:.2f} |"
        )
    targets = [
        ("none", "fanout", "GNU parallel", 0.9),
        ("bwrap", "fanout", "GNU parallel + bwrap, fanout's flags", 1.0),
    ]
    print()
    for sandbox, tool, other, target in targets:
        if (sandbox, tool) in wall and (sandbox, other) in wall:
            ratio = wall[(sandbox, tool)] / wall[(sandbox, other)]
            verdict = "met" if ratio <= target else "NOT met"
            print(f"- {sandbox}: fanout / {other} = {ratio:.2f}x (target <= {target}x: {verdict})")


if __name__ == "__main__":
    main()
