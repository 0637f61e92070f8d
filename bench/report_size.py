"""report.md against its budget at scale: a finished run of SIZE units (100k by default)
in one round and a second round of the failed ones again, a fraction failing in both
with 4 KiB of output each, for a few shared reasons or one reason per unit.  Prints, per
case, the time of ``markdown_data`` (the journal's reads) and ``render_markdown``, of
``write_json`` (report.json), and report.md's size.

Usage: .venv/bin/python bench/report_size.py [SIZE] [--runner DIR]
(``--runner`` times another checkout's ``runner`` folder, as it was before a change).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def fill(journal: Any, units: int, failing: float, reasons: str) -> str:
    """A finished run: every unit in round 1, ``failing`` of them failed, run again in
    round 2 and failed again with 4 KiB of output; ``reasons`` is "shared" (20) or
    "distinct" (one per unit)."""
    from fanout.backlog.units import Unit
    from fanout.outcome import RunState

    run = journal.create_run(job="scale", job_file="job.toml", apply=False)
    journal.add_units(
        run, 1, (Unit(id=f"src/m{n:06d}.py", index=n, items=(n,), origin="x") for n in range(units))
    )
    every = max(1, round(1 / failing))
    failed = [n for n in range(units) if n % every == 0]
    journal.add_units(
        run,
        2,
        (
            Unit(id=f"src/m{n:06d}.py", index=i, items=(n,), origin="x")
            for i, n in enumerate(failed)
        ),
    )
    reason = "'exit 1: group ' || (idx % 20)" if reasons == "shared" else "'exit 1: ' || id"
    with journal.db:
        journal.db.execute("BEGIN")
        journal.db.execute(
            "UPDATE units SET state = 'succeeded', reason = 'ok', attempts = 1,"
            ' worker_seconds = 0.1, last = \'{"rung": "default"}\' WHERE run = ?',
            (run,),
        )
        journal.db.execute(
            f"UPDATE units SET state = 'failed', reason = {reason}, tail = ?"
            " WHERE run = ? AND id IN (SELECT id FROM units WHERE run = ? AND round = 2)",
            ("output line\n" * 340, run, run),
        )
    journal.finish_run(run, state=RunState.FINISHED, wall=units / 400)
    return str(run)


def best(action: Any, repeats: int = 3) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def timings(report: Any, journal: Any, run: str) -> tuple[str, float, float]:
    """report.md's text, the median time to read and render it, and report.json's time."""
    text = report.render_markdown(report.markdown_data(journal, run))
    markdown = best(lambda: report.render_markdown(report.markdown_data(journal, run)))
    as_json = best(lambda: report.write_json(journal, run, io.StringIO()), repeats=1)
    return text, markdown, as_json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("size", nargs="?", type=int, default=100_000)
    parser.add_argument(
        "--runner", type=Path, default=Path(__file__).resolve().parents[1] / "runner"
    )
    options = parser.parse_args()
    sys.path.insert(0, str(options.runner))
    from fanout.journal import Journal
    from fanout.report import document as report

    print(
        "| units | failed | reasons | report.md s (read + render) | report.json s | report.md chars |"
    )
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    for failing, reasons in ((0.01, "shared"), (0.3, "shared"), (0.3, "distinct")):
        with tempfile.TemporaryDirectory() as folder:
            journal = Journal(Path(folder) / ".fanout" / "journal.sqlite")
            run = fill(journal, options.size, failing, reasons)
            text, markdown, as_json = timings(report, journal, run)
            failed = sum(1 for _ in journal.failed_ids(run))
            print(
                f"| {options.size:,} | {failed:,} | {reasons} | {markdown:.3f} | {as_json:.2f}"
                f" | {len(text):,} |"
            )
            journal.close()


if __name__ == "__main__":
    main()
