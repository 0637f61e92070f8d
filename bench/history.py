"""How `fanout history` scales with a job's runs: a journal of RUNS runs of UNITS units
each (every unit with an attempt and its usage of one API, a tenth of them failing in
round 1 and run again in round 2, a twentieth reused, a hundredth quarantined), filled
straight into SQLite as fanout would have left it, then `fanout history` on it.

For each size: the journal's size on disk, the time of the library call alone
(``Journal.history``: its one grouped query per table) and of `fanout history`
and `fanout history --format json` as processes (start-up and spec load included),
each the median of five, for all runs (``--last 0``) and the default last 30.

Usage: .venv/bin/python bench/history.py [RUNSxUNITS...]   (default: 30x10000 100x10000)
Prints a markdown table.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

from fanout.journal import Journal

FANOUT = [sys.executable, "-m", "fanout"]

JOB = """
version = 1
name = "nightly"
[inputs]
command = ["seq", "10"]
format = "lines"
[task]
command = ["true"]
[runtime]
sandbox = "none"
"""


def fill(journal: Journal, runs: int, units: int) -> None:
    """``runs`` finished runs of ``units`` units, a day apart, in one transaction."""
    db = journal.db
    db.execute("BEGIN")
    day = 86400.0
    start = time.time() - runs * day
    usage = (
        "INSERT INTO usage (run, round, unit, n, api, requests, input_tokens, output_tokens,"
        " cache_read_tokens, cache_write_tokens, cost_usd, queued_seconds, throttles)"
        " VALUES (?, ?, ?, 1, 'anthropic', 3, 1200, 300, 4000, 0, 0.0042, 0.0, 0)"
    )
    for r in range(runs):
        run = f"2026{r:04d}T030000-{r:04x}"
        started = start + r * day
        trigger = json.dumps({"name": "nightly", "schedule": "0 3 * * *"})
        db.execute(
            "INSERT INTO runs (id, job, job_file, started, finished, state, round, trigger,"
            " wall, quarantine_after) VALUES (?, 'nightly', 'job.toml', ?, ?, 'finished',"
            " 2, ?, 600.0, 3)",
            (run, started, started + 600, trigger),
        )
        db.execute(
            "INSERT INTO rounds (run, round, records, selected, selection_done, complete)"
            " VALUES (?, 1, ?, ?, 1, 1)",
            (run, units, units),
        )
        db.execute(
            "INSERT INTO rounds (run, round, records, selected, selection_done, complete,"
            " unchanged) VALUES (?, 2, ?, ?, 1, 1, ?)",
            (run, units, units, units // 50),
        )

        def state(n: int) -> tuple[str, int]:
            if n % 100 == 1:
                return "quarantined", 0
            if n % 20 == 2:
                return "reused", 0
            return ("failed" if n % 10 == 0 else "succeeded"), 1

        rows = []
        for n in range(units):
            name, attempts = state(n)
            rows.append((run, 1, f"u{n:06d}", n, "{}", name, attempts))
        rows += [(run, 2, f"u{n:06d}", n, "{}", "succeeded", 1) for n in range(0, units, 10)]
        db.executemany(
            "INSERT INTO units (run, round, id, idx, data, state, attempts)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        tried = [(rn, uid) for (_, rn, uid, _, _, _, attempts) in rows if attempts]
        db.executemany(
            "INSERT INTO attempts (run, round, unit, n, rung, started, finished, status,"
            " duration) VALUES (?, ?, ?, 1, 'default', 0, 1, 'succeeded', 1.0)",
            [(run, rn, uid) for rn, uid in tried],
        )
        db.executemany(usage, [(run, rn, uid) for rn, uid in tried])
    db.execute("COMMIT")


def median_s(action: object, times: int = 5) -> float:
    seconds = []
    for _ in range(times):
        began = time.perf_counter()
        action()  # type: ignore[operator]
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def command_s(workdir: Path, *args: str) -> float:
    def call() -> None:
        subprocess.run(
            [*FANOUT, "history", "job.toml", *args],
            cwd=workdir,
            check=True,
            stdout=subprocess.DEVNULL,
        )

    return median_s(call)


def main(argv: list[str]) -> None:
    sizes = [tuple(int(p) for p in size.split("x")) for size in argv or ["30x10000", "100x10000"]]
    print(
        "| runs x units | journal MiB | history() all | history() last 30"
        " | `history --last 0` | `history` | `history --format json --last 0` |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for runs, units in sizes:
        with tempfile.TemporaryDirectory() as folder:
            workdir = Path(folder)
            (workdir / "job.toml").write_text(JOB)
            path = workdir / ".fanout" / "journal.sqlite"
            journal = Journal(path)
            fill(journal, runs, units)
            journal.close()
            journal = Journal(path, read_only=True)
            assert len(journal.history("nightly")) == runs
            every = median_s(lambda j=journal: j.history("nightly"))
            last = median_s(lambda j=journal: j.history("nightly", 30))
            journal.close()
            size = sum(p.stat().st_size for p in path.parent.glob("journal.sqlite*"))
            print(
                f"| {runs} x {units:,} | {size / 2**20:.0f} | {every:.2f} s | {last:.2f} s"
                f" | {command_s(workdir, '--last', '0'):.2f} s"
                f" | {command_s(workdir):.2f} s"
                f" | {command_s(workdir, '--format', 'json', '--last', '0'):.2f} s |"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
