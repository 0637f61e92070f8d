"""Start-up time of `fanout validate` and `fanout --help`, median of N runs, as a table.

Usage: .venv/bin/python bench/startup.py [RUNS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FANOUT = Path(sys.executable).parent / "fanout"


def measure(argv: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, cwd=REPO, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "fanout --help": [str(FANOUT), "--help"],
        "fanout validate fanout.toml.example": [str(FANOUT), "validate", "fanout.toml.example"],
    }
    print("| command | median ms | min ms | runs |\n| --- | ---: | ---: | ---: |")
    for name, argv in cases.items():
        times = measure(argv, runs)
        median, best = statistics.median(times) * 1000, min(times) * 1000
        print(f"| `{name}` | {median:.0f} | {best:.0f} | {runs} |")


if __name__ == "__main__":
    main()
