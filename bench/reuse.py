"""What a unit's fingerprint and the reuse lookup cost (``run.fingerprints``,
``run.reusing``), in two tables.

1. Their share of a no-op run: one ``fanout run`` of N no-op units (``true``, sandbox
   none, ``units.reuse = "none"``, default N 10,000), then the same units fingerprinted
   and looked up again in this process as the selection does it (the first rung
   rendered; every success of the job read once, then each batch sorted: the reuse,
   quarantine and earlier-round look-ups): their seconds over the run's wall time.  The goal is at most 5%.
2. A run that reuses: a journal holding a finished run of M units that succeeded (M
   default 100,000; written directly with their real fingerprints, as a real run of
   them would take minutes), then a real ``fanout run`` over the same M units and one
   new one, last in the selection: the seconds from the run's start to the new unit's
   ``attempt.started`` (from its event log), and the whole run, the median of
   ``--trials`` runs (5) from that same journal.  The goal is under 2 s.

Usage: .venv/bin/python bench/reuse.py [--units N] [--reused M] [--trials T]
       [--only share|reuse]
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fanout import spec
from fanout.backlog.units import Unit, select
from fanout.journal import Journal, Successes
from fanout.outcome import CollectedFile, Outcome, UnitState
from fanout.run.fingerprints import Fingerprints, agent_version
from fanout.run.reusing import Reusing

FANOUT = [sys.executable, "-m", "fanout"]
BATCH = 1000  # as run/selection.py takes them

JOB = """
version = 1
name = "reuse"
[inputs]
command = ["seq", "{units}"]
format = "lines"
[units]
reuse = "{reuse}"
[task]
command = ["true"]
prompt = "Enrich record {{{{ unit.id }}}} of {{{{ job.name }}}}."
[runtime]
maxConcurrentTasks = 32
sandbox = "none"
"""


def _run(workdir: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [*FANOUT, "run", "job.toml"], cwd=workdir, capture_output=True, check=False
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(done.stderr.decode(errors="replace")[-2000:])
    return wall


def _units(job: spec.Spec) -> list[Unit]:
    return list(select(job, environ={"PATH": "/usr/bin:/bin"}))


def share(units: int) -> list[str]:
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as scratch:
        workdir = Path(scratch)
        (workdir / "job.toml").write_text(JOB.format(units=units, reuse="none"))
        wall = _run(workdir)
        job = spec.load(workdir / "job.toml")
        journal = Journal(job.runtime.state_dir / "journal.sqlite")
        (run,) = journal.runs("reuse")
        selected = _units(job)
        start = time.perf_counter()
        prints = Fingerprints(job, trigger=None, agent_version=agent_version(job, {}))
        # Rendered, as a first run does (a run of unchanged units finds them by their
        # inputs without rendering).
        fingerprinted = [prints.found(unit, Successes()) for unit in selected]
        printing = time.perf_counter() - start
        start = time.perf_counter()
        # As a round does: every success of the job read once, each batch sorted (the
        # reuse, quarantine and earlier-round look-ups), as if reuse were on.
        successes = journal.all_successes("reuse")
        reusing = Reusing(job, journal, successes, run_id=run.id, round_number=2, reuse=True)
        for at in range(0, len(fingerprinted), BATCH):
            reusing.sort(fingerprinted[at : at + BATCH])
        lookup = time.perf_counter() - start
        journal.close()
    return [
        f"| {units:,} | {wall:.2f} | {printing:.3f} | {lookup:.3f} "
        f"| {(printing + lookup) / wall:.1%} | {(printing + lookup) / units * 1e6:.0f} |"
    ]


def reuse(reused: int, trials: int) -> list[str]:
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as scratch:
        workdir = Path(scratch)
        (workdir / "job.toml").write_text(JOB.format(units=reused, reuse="succeeded"))
        start = time.perf_counter()
        # As `fanout run job.toml` in that folder loads it: job.file is "job.toml", what
        # its templates see, so the next run finds each unit by its inputs.
        with contextlib.chdir(workdir):
            _journal_of_a_run(spec.load("job.toml"))
        made = time.perf_counter() - start
        (workdir / "job.toml").write_text(JOB.format(units=reused + 1, reuse="succeeded"))
        state = workdir / ".fanout"
        kept = workdir / "kept"
        shutil.copytree(state, kept)
        firsts, walls = [], []
        for _ in range(trials):  # each from the same journal: a run adds to it
            shutil.rmtree(state)
            shutil.copytree(kept, state)
            # Written out first, as a nightly run finds the last one's journal: the
            # kernel writing 60 MB back during the run was half a second of noise.
            os.sync()
            walls.append(_run(workdir))
            (run,) = sorted((state / "runs").iterdir())
            events = [json.loads(line) for line in (run / "events.jsonl").open()]
            began = next(e["time"] for e in events if e["event"] == "run.started")
            firsts.append(
                next(e["time"] for e in events if e["event"] == "attempt.started") - began
            )
            counts = next(
                e for e in events if e["event"] == "round.selected" and e.get("round") == 1
            )
    return [
        f"| {reused:,} | {counts['reused']:,} | {statistics.median(firsts):.2f}"
        f" ({min(firsts):.2f}-{max(firsts):.2f}) | {statistics.median(walls):.2f} | {made:.1f} |"
    ]


def _journal_of_a_run(job: spec.Spec) -> None:
    """A finished run of the job whose every unit succeeded, with the fingerprints a real
    run of it would have kept."""
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    prints = Fingerprints(job, trigger=None, agent_version=agent_version(job, {}))
    run_id = journal.create_run(job=job.name, job_file=str(job.file), apply=False)
    units = [prints.of(unit) for unit in _units(job)]  # with their inputs, as a run's
    for at in range(0, len(units), 5000):
        batch = units[at : at + 5000]
        journal.add_units(run_id, 1, batch)
        for unit in batch:
            journal.unit_settled(
                run_id,
                Outcome(
                    unit_id=unit.id,
                    round=1,
                    state=UnitState.SUCCEEDED,
                    reason="ok",
                    collected=tuple[CollectedFile, ...](),
                ),
            )
    journal.set_round(run_id, 1, records=len(units), selected=len(units))
    journal.selection_done(run_id, 1)
    journal.complete_round(run_id, 1)
    from fanout.outcome import RunState

    journal.finish_run(run_id, state=RunState.FINISHED, wall=1.0, note="", limits={})
    # What each success's settle writes (``Journal._record_success``), at once.
    journal.db.execute(
        "INSERT OR REPLACE INTO successes (job, fingerprint, inputs, unit, run, collected,"
        " staged) SELECT ?, fingerprint, inputs, id, run, collected, staged FROM units"
        " WHERE run = ?",
        (job.name, run_id),
    )
    journal.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--reused", type=int, default=100_000)
    parser.add_argument("--only", choices=["share", "reuse"])
    parser.add_argument("--trials", type=int, default=5, help="runs of the second table")
    args = parser.parse_args()
    if args.only in (None, "share"):
        print("\n### The fingerprint and the lookup in a no-op run (goal: at most 5%)\n")
        print("| units | run wall s | fingerprints s | lookups s | share of the run | µs a unit |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for line in share(args.units):
            print(line, flush=True)
    if args.only in (None, "reuse"):
        print("\n### A run that reuses (goal: the first new unit within 2 s)\n")
        print(
            "| units reused before | reused | first new unit starts s, median (range)"
            " | run wall s, median | journal made s |"
        )
        print("| ---: | ---: | ---: | ---: | ---: |")
        for line in reuse(args.reused, args.trials):
            print(line, flush=True)


if __name__ == "__main__":
    main()
