"""What asking the journal for one unit's spending costs (``Journal.unit_spent``, asked
before every attempt of a unit with a ``task.budget``), in a run with many units'
usage rows, against a query that names no round (and so scans the run's rows).

Usage: .venv/bin/python bench/unit_spent.py [UNITS]
Prints a markdown table: microseconds per query, median of the units asked.
"""

from __future__ import annotations

import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fanout.journal import Journal


def _median_us(ask: Callable[[str], object], ids: list[str]) -> float:
    times = []
    for unit in ids:
        start = time.perf_counter()
        ask(unit)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as directory:
        journal = Journal(Path(directory) / "journal.sqlite")
        rows = [("r", 1, f"u{i}", 1, "api", 1, 10, 5, 0, 0, 0.01, 0.0, 0) for i in range(units)]
        journal.db.executemany(
            "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
        )
        ids = [f"u{i}" for i in range(0, units, max(1, units // 200))]
        print(f"| query ({units:,} units' usage rows) | us per query (median) |")
        print("| --- | --- |")
        for rounds in (1, 3):
            us = _median_us(functools.partial(journal.unit_spent, "r", rounds=rounds), ids)
            print(f"| unit_spent, rounds 1..{rounds} | {us:,.1f} |")

        def scan(unit: str) -> None:
            sql = "SELECT SUM(cost_usd) FROM usage WHERE run = ? AND unit = ?"
            journal.db.execute(sql, ("r", unit)).fetchone()

        print(f"| no round named (a scan) | {_median_us(scan, ids[:20]):,.1f} |")
        journal.close()


if __name__ == "__main__":
    main()
