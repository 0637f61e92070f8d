"""Start-up time of `fanout validate`, `fanout --version` and `fanout --help` beside
`parallel --version` (GNU parallel, a Perl script: what a user would compare a CLI's
start against), as a side-by-side table of medians and ratios.

The commands run interleaved (round after round, each round in a new random order) so
that the machine's other load falls on all of them alike; the first round is a warm-up
and is not counted.  Children run with bytecode writing allowed (PYTHONDONTWRITEBYTECODE
removed from their environment), as an installed fanout runs from its .pyc files.

Usage: .venv/bin/python bench/startup.py [RUNS]
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FANOUT = Path(sys.executable).parent / "fanout"
BASELINE = "parallel --version"
# The targets, as a multiple of the baseline's median.
TARGETS = {"fanout validate": 2.0, "fanout --version": 1.2}


def cases() -> dict[str, list[str]]:
    found = {
        BASELINE: ["parallel", "--version"],
        "python -c pass": [sys.executable, "-c", "pass"],
        "fanout --version": [str(FANOUT), "--version"],
        "fanout validate": [str(FANOUT), "validate", "fanout.toml.example"],
        "fanout --help": [str(FANOUT), "--help"],
    }
    if shutil.which("parallel") is None:
        del found[BASELINE]
    return found


def once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    commands = cases()
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for round_ in range(runs + 1):
        random.shuffle(names)
        for name in names:
            elapsed = once(commands[name], env)
            if round_:  # round 0 warms the caches and writes the .pyc files
                times[name].append(elapsed)
    base = statistics.median(times[BASELINE]) if BASELINE in times else None
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {runs} runs each\n")
    print("| command | median ms | min ms | vs `parallel --version` | target |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in commands:
        median, best = statistics.median(times[name]), min(times[name])
        ratio = f"{median / base:.2f}x" if base else "-"
        target = f"<= {TARGETS[name]}x" if name in TARGETS else ""
        print(f"| `{name}` | {median * 1000:.0f} | {best * 1000:.0f} | {ratio} | {target} |")


if __name__ == "__main__":
    main()
