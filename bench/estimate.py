"""What the next run's estimate costs on a large job: `fanout plan` of N units with a
journal of earlier runs of the job, against the same plan with no journal.

For each size N and number of earlier runs R, a journal is filled straight through
SQL with R finished runs of N settled units each, as fanout would have left them: 30%
of the units failed their first rung and ran a second, each attempt with one row of
API usage; the latest run's units carry their real fingerprints (computed as a run
computes them) and 90% of them succeeded, so the plan reuses those.  Printed per row:
the journal's two history queries (`rung_history` and `unit_history` over the R runs,
in process, median of three), and the wall time of `fanout plan` with the journal
(fingerprinting and sorting every selected unit, then the queries) and without it
(process start included, median of three).

Usage: .venv/bin/python bench/estimate.py [SIZE...] [--runs R ...]
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))

from fanout import spec as specs
from fanout.backlog.units import Unit, select
from fanout.journal import Journal
from fanout.outcome import RunState
from fanout.run.fingerprints import Fingerprints

FANOUT = [sys.executable, "-m", "fanout"]
JOB = """
version = 1
name = "estimate"
[inputs]
command = ["seq", "{units}"]
format = "lines"
[task]
command = ["true", "{{{{ unit.id }}}}"]
[retry]
ladder = [{{ name = "first" }}, {{ name = "second" }}]
[runtime]
sandbox = "none"
"""


def fill(workdir: Path, units: int, runs: int) -> None:
    job = workdir / "job.toml"
    loaded = specs.load(job)
    prints = Fingerprints(loaded, trigger=None, agent_version="")
    journal = Journal(workdir / ".fanout" / "journal.sqlite")
    now = time.time() - runs * 86400
    for number in range(runs):
        journal.clock = lambda: now + number * 86400  # noqa: B023 - used at once
        run = journal.create_run(job="estimate", job_file=str(job), apply=False)
        latest = number == runs - 1
        selection = select(loaded, environ={"PATH": "/usr/bin:/bin"})
        batch: list[Unit] = []
        for unit in selection:
            batch.append(prints.of(unit) if latest else unit)
            if len(batch) == 5000:
                journal.add_units(run, 1, batch)
                batch = []
        journal.add_units(run, 1, batch)
        with journal.db:
            db = journal.db
            db.execute("BEGIN")
            # Units whose number is divisible by 10 failed; those by 10 / 3 ran a rung 2.
            db.execute(
                "UPDATE units SET state = CASE WHEN CAST(id AS INTEGER) % 10 = 0"
                " THEN 'failed' ELSE 'succeeded' END,"
                " attempts = 1 + (CAST(id AS INTEGER) % 10 IN (0, 3, 6)) WHERE run = ?",
                (run,),
            )
            for n, rung, which in ((1, "first", "1"), (2, "second", "attempts = 2")):
                db.execute(
                    "INSERT INTO attempts (run, round, unit, n, rung, host, started, finished,"
                    " status, reason, duration) SELECT run, round, id, ?, ?, 'local', ?, ?,"
                    " 'failed', '', 1.0 + (CAST(id AS INTEGER) % 7) * 0.1 FROM units"
                    f" WHERE run = ? AND {which}",
                    (n, rung, now, now, run),
                )
            db.execute(
                "INSERT INTO usage (run, round, unit, n, api, requests, input_tokens,"
                " output_tokens, cache_read_tokens, cache_write_tokens, cost_usd,"
                " queued_seconds, throttles) SELECT run, round, unit, n, 'anthropic', 2, 200,"
                " 50, 0, 0, 0.004 + (CAST(unit AS INTEGER) % 5) * 0.001, 0, 0 FROM attempts"
                " WHERE run = ?",
                (run,),
            )
        journal.finish_run(run, state=RunState.FINISHED, wall=units / 100)
    journal.close()


def median_of(action: object, repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()  # type: ignore[operator]
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def timed_plan(workdir: Path) -> float:
    return median_of(
        lambda: subprocess.run(
            [*FANOUT, "plan", "job.toml"], cwd=workdir, stdout=subprocess.DEVNULL, check=True
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, default=[10_000, 100_000])
    parser.add_argument("--runs", nargs="*", type=int, default=[1, 5])
    args = parser.parse_args()
    print("| units | earlier runs | history queries | plan with history | plan without |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for size in args.sizes:
        for runs in args.runs:
            with tempfile.TemporaryDirectory() as directory:
                workdir = Path(directory)
                (workdir / "job.toml").write_text(JOB.format(units=size))
                without = timed_plan(workdir)
                fill(workdir, size, runs)
                journal = Journal(workdir / ".fanout" / "journal.sqlite", read_only=True)
                ids = [run.id for run in journal.past_runs("estimate", runs)]

                def read(journal: Journal = journal, ids: list[str] = ids) -> None:
                    sample = journal.sample(ids)
                    journal.rung_history(sample)
                    journal.unit_history(sample, budget_usd=0.01)

                queries = median_of(read)
                journal.close()
                with_history = timed_plan(workdir)
            print(f"| {size:,} | {runs} | {queries:.2f}s | {with_history:.2f}s | {without:.2f}s |")


if __name__ == "__main__":
    main()
