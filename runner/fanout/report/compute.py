"""What a run's workers cost in the seeds' model: active seconds x allocated memory.

Each attempt is billed its duration (the journal's, the same figure for every
transport: from its sandbox opening to its verdict) times the memory the job allocates
it (``task.memory``, or its rung's), retries, lost and interrupted attempts included.
The allocation is the figure, not a measured peak: no measure of one attempt's memory
is honest on every transport (``getrusage`` of children mixes the attempts that ran
side by side, a process tree's ``ru_maxrss`` is its largest process, not what its
processes held together, and an SSH host would have to run a meter of its own), and
an elastic platform bills what it reserves, not what the worker touched.  Without
``task.memory`` the report shows active seconds and says why it has no GiB-seconds.

The estimate is the one the seed describes for the next submission: attempts (so the
retries this run needed) x mean attempt duration x memory, given per unit as well so a
larger backlog can be priced by multiplying.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from ..journal import Journal
from ..values.quantities import size_text

GIB = 2**30


def totals(journal: Journal, run_id: str) -> dict[str, Any]:
    """The report's ``compute`` object: the run's sums, why it has no GiB-seconds if it
    has none, and the next run's estimate."""
    row = journal.compute_totals(run_id)
    attempts, active = int(row["attempts"]), float(row["active_seconds"])
    low, high = row["memory_min"], row["memory_max"]
    # None: no memory declared at all, or an attempt that ran had none.
    gib_seconds = None
    if high is not None and row["byte_seconds"] is not None:
        gib_seconds = row["byte_seconds"] / GIB
    note = ""
    if high is None:
        note = "the job declares no task.memory, so there is no allocation to bill"
    elif gib_seconds is None:
        note = (
            f"{row['unallocated']} attempt(s) ran without a declared memory"
            " (task.memory or their rung's)"
        )
    units = int(row["units"])
    estimate = None
    if attempts and units:
        mean = active / attempts
        # By active second, so attempts x mean x memory is this run's figure exactly.
        memory = None
        if gib_seconds is not None:
            memory = gib_seconds / active if active else high / GIB
        estimate = {
            "units": units,
            "attempts": attempts,
            "meanSeconds": round(mean, 3),
            "memoryGib": None if memory is None else round(memory, 4),
            "activeSeconds": round(active, 3),
            "gibSeconds": None if gib_seconds is None else round(gib_seconds, 3),
            "gibSecondsPerUnit": None if gib_seconds is None else round(gib_seconds / units, 3),
        }
    return {
        "attempts": attempts,
        "activeSeconds": round(active, 3),
        "gibSeconds": None if gib_seconds is None else round(gib_seconds, 3),
        "memoryBytes": None if high is None else {"min": low, "max": high},
        "note": note,
        "estimate": estimate,
    }


def annotate(
    journal: Journal, run_id: str, page: Sequence[dict[str, Any]], *, with_memory: bool
) -> None:
    """Add ``activeSeconds`` (and, in a run that declares memory, ``gibSeconds``: None
    where an attempt ran without one) to each unit record of ``page``."""
    sums = journal.compute_of(run_id, [(r["round"], r["unit"]) for r in page])
    for record in page:
        row: sqlite3.Row | None = sums.get((record["round"], record["unit"]))
        record["activeSeconds"] = round(float(row["active_seconds"]), 3) if row else 0.0
        if with_memory:
            byte_seconds = row["byte_seconds"] if row else 0
            record["gibSeconds"] = None if byte_seconds is None else round(byte_seconds / GIB, 3)


def markdown(compute: dict[str, Any]) -> list[str]:
    """The report's "Compute" section: numbers and fixed words only, so nothing in it
    can carry markup (no unit or worker text reaches it)."""
    if not compute["attempts"]:
        return []
    memory = compute["memoryBytes"]
    if memory is None:
        allocation = "not declared"
    elif memory["min"] == memory["max"]:
        allocation = size_text(memory["max"])
    else:
        allocation = f"{size_text(memory['min'])} to {size_text(memory['max'])}"
    gib = compute["gibSeconds"]
    lines = [
        "### Compute",
        "",
        "| attempts | active seconds | memory per attempt | GiB-seconds |",
        "| ---: | ---: | ---: | ---: |",
        f"| {compute['attempts']} | {compute['activeSeconds']:,.3f} | {allocation} "
        f"| {'n/a' if gib is None else f'{gib:,.3f}'} |",
        "",
    ]
    if compute["note"]:
        lines += [f"No GiB-seconds: {compute['note']}.", ""]
    estimate = compute["estimate"]
    if estimate is not None:
        text = (
            f"Next run of {estimate['units']} unit(s), estimated from this one:"
            f" {estimate['attempts']} attempt(s) x {estimate['meanSeconds']:,.3f}s mean"
        )
        if estimate["gibSeconds"] is None:
            text += f" = {estimate['activeSeconds']:,.3f} active seconds."
        else:
            text += (
                f" x {estimate['memoryGib']:g} GiB = {estimate['gibSeconds']:,.3f} GiB-seconds"
                f" ({estimate['gibSecondsPerUnit']:,.3f} per unit)."
            )
        lines += [text, ""]
    return lines
