"""How fanout scales with the backlog: 10k, 30k and 100k no-op units through the whole
`fanout run` (selection, dispatch, journal, event log, report), then `fanout status` and
`fanout report` on the journal the run left.

For each size: units/s of the run (and, from its event log, the rate over the first
and the last tenth of its units: flat if a growing backlog costs nothing per unit, and
independent of what else the machine was doing between runs), the coordinator's peak RSS (its own maximum resident
set, from wait4), the journal's size on disk, and the wall time of `status` and of
`report` (markdown) and `report --format json` (median of three, process start
included).  ``--synthetic`` skips the runs and fills a journal with that many settled
units instead (for status and report timings where a real run takes too long); its rows
are labelled synthetic.

``--keep DIR`` (one size) makes the run in DIR and keeps it, or, if DIR already holds
one, times the commands on it without running anything (its row says "kept"): a 100k
run takes minutes to make and one serves every timing.  ``--repeats N`` sets how many
times each command is timed (the median is shown).  ``--against FANOUT`` times
``report --format json`` of another fanout (e.g. /work/main/.venv/bin/fanout) on the
same journal too, interleaved with this one's, and adds its median and the ratio.

Usage: .venv/bin/python bench/scale.py [--synthetic] [SIZE...] [--concurrency N]
       [--keep DIR] [--repeats N] [--against FANOUT]
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FANOUT = [sys.executable, "-m", "fanout"]

JOB = """
version = 1
name = "scale"
[inputs]
command = ["seq", "{units}"]
format = "lines"
[task]
command = ["true"]
[runtime]
maxConcurrentTasks = {concurrency}
sandbox = "none"
"""


def run_job(units: int, concurrency: int, workdir: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `fanout run` of ``units`` no-op units."""
    job = workdir / "job.toml"
    job.write_text(JOB.format(units=units, concurrency=concurrency))
    said = workdir / "run.err"
    start = time.perf_counter()
    with said.open("wb") as stderr:
        process = subprocess.Popen(
            [*FANOUT, "run", str(job)], cwd=workdir, stdout=subprocess.DEVNULL, stderr=stderr
        )
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = said.read_text(errors="replace")[-2000:]
        raise SystemExit(f"fanout run of {units} units failed (exit {code}):\n{tail}")
    return wall, usage.ru_maxrss / 1024  # KiB on Linux


def synthetic_journal(units: int, workdir: Path) -> None:
    """A finished run of ``units`` settled units (each with one attempt), written
    straight into a journal as fanout would have left it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runner"))
    from fanout.backlog.units import Unit
    from fanout.journal import Journal
    from fanout.outcome import RunState

    journal = Journal(workdir / ".fanout" / "journal.sqlite")
    run = journal.create_run(job="scale", job_file=str(workdir / "job.toml"), apply=False)
    journal.set_round(run, 1, records=units, selected=units)
    journal.add_units(
        run,
        1,
        (
            Unit(id=str(n), index=n, items=(str(n),), origin=f"output of seq:{n}")
            for n in range(units)
        ),
    )
    now = time.time()
    with journal.db:
        journal.db.execute("BEGIN")
        journal.db.execute(
            "UPDATE units SET state = 'succeeded', reason = 'ok', attempts = 1,"
            ' worker_seconds = 0.1, last = \'{"rung": "default"}\' WHERE run = ?',
            (run,),
        )
        journal.db.execute(
            "INSERT INTO attempts (run, round, unit, n, rung, host, started, finished, status,"
            " exit_code, reason, duration) SELECT run, round, id, 1, 'default', 'local', ?, ?,"
            " 'succeeded', 0, 'ok', 0.1 FROM units WHERE run = ?",
            (now, now, run),
        )
    journal.complete_round(run, 1)
    journal.finish_run(run, state=RunState.FINISHED, wall=units / 400)
    journal.close()


def timed(argv: list[str], workdir: Path, repeats: int = 3) -> float:
    (median,) = interleaved([argv], workdir, repeats)
    return median


def interleaved(commands: list[list[str]], workdir: Path, repeats: int) -> list[float]:
    """The median wall seconds of each command, run in turn ``repeats`` times (A B A B
    ...), so a change in the machine's load falls on all of them alike."""
    samples: list[list[float]] = [[] for _ in commands]
    for _ in range(repeats):
        for argv, times in zip(commands, samples, strict=True):
            # What the last command wrote (``report`` writes a 22 MB report.json at 100k
            # units) is flushed before the clock starts, not while the next one runs.
            os.sync()
            start = time.perf_counter()
            subprocess.run(argv, cwd=workdir, stdout=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in samples]


def tenths(workdir: Path) -> str:
    """Settled units/s over the first and over the last tenth of the run's units."""
    (log,) = (workdir / ".fanout" / "runs").glob("*/events.jsonl")
    times = []
    with log.open(encoding="utf-8") as lines:
        for line in lines:
            if '"unit.settled"' in line:
                times.append(json.loads(line)["time"])
    tenth = len(times) // 10
    if tenth < 2:
        return "-"

    def rate(part: list[float]) -> float:
        return (len(part) - 1) / max(part[-1] - part[0], 1e-9)

    return f"{rate(times[:tenth]):.0f} / {rate(times[-tenth:]):.0f}"


def journal_mib(workdir: Path) -> float:
    state = workdir / ".fanout"
    return sum(p.stat().st_size for p in state.glob("journal.sqlite*")) / (1 << 20)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="*", type=int, default=[10_000, 30_000, 100_000])
    parser.add_argument("--synthetic", action="store_true")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--keep", type=Path, metavar="DIR")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", metavar="FANOUT")
    options = parser.parse_args()
    if options.keep and len(options.sizes) != 1:
        parser.error("--keep takes one size")
    rows = []
    for units in options.sizes:
        with tempfile.TemporaryDirectory() as scratch:
            workdir = options.keep or Path(scratch)
            if options.keep and (workdir / ".fanout" / "journal.sqlite").exists():
                rate, flat, rss = "kept", "-", "-"
            elif options.synthetic:
                synthetic_journal(units, workdir)
                rate, flat, rss = "synthetic", "-", "-"
            else:
                workdir.mkdir(parents=True, exist_ok=True)
                wall, peak = run_job(units, options.concurrency, workdir)
                rate, flat, rss = f"{units / wall:.0f}", tenths(workdir), f"{peak:.0f}"
            rows.append(time_commands(workdir, options, f"| {units:,} | {rate} | {flat} | {rss} "))
            print(rows[-1], file=sys.stderr, flush=True)
    kind = "synthetic journals of settled units" if options.synthetic else "no-op units"
    print(f"{kind}, sandbox none, concurrency {options.concurrency}\n")
    against = " | report json s, against | ratio" if options.against else ""
    print(
        "| units | units/s | first / last tenth | peak RSS MiB | journal MiB | status s"
        f" | report s | report json s{against} |"
    )
    print(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        + " ---: |" * (2 * bool(against))
    )
    for row in rows:
        print(row)
    if options.against:
        print(f"\nagainst: {options.against}; medians of {options.repeats}, interleaved")


def time_commands(workdir: Path, options: argparse.Namespace, row: str) -> str:
    """The rest of a table row: the journal's size and the commands' medians."""
    (run_id,) = [p.name for p in (workdir / ".fanout" / "runs").glob("*")] or [_only_run(workdir)]
    repeats = options.repeats
    status = timed([*FANOUT, "status"], workdir, repeats)
    markdown = timed([*FANOUT, "report", run_id], workdir, repeats)
    as_json = [[*FANOUT, "report", run_id, "--format", "json"]]
    if options.against:
        as_json.append([options.against, "report", run_id, "--format", "json"])
    times = interleaved(as_json, workdir, repeats)
    row += f"| {journal_mib(workdir):.1f} | {status:.2f} | {markdown:.2f} | {times[0]:.2f} |"
    if options.against:
        row += f" {times[1]:.2f} | {times[0] / times[1]:.2f} |"
    return row


def _only_run(workdir: Path) -> str:
    """The id of the one run in a synthetic journal (it has no run directory)."""
    import sqlite3

    db = sqlite3.connect(workdir / ".fanout" / "journal.sqlite")
    try:
        ((run_id,),) = db.execute("SELECT id FROM runs")
        return str(run_id)
    finally:
        db.close()


if __name__ == "__main__":
    main()
