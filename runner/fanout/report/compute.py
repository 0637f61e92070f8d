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

The estimate is of the job's next run with nothing changed (``estimate`` is the model,
shared with ``fanout plan``).  What that run runs: if this run can be continued (it
did not finish and no later run of the job superseded it), the next ``fanout run``
continues it and runs only its unsettled units (pending, interrupted), each priced at
what a unit that settled here took.  Otherwise the next run is a new one, and with
``units.reuse = "succeeded"`` (the default) it reuses the successes: it runs the failed
units again, each priced at what a failed unit took here (unchanged, it most likely
fails the same way), and any unit left unsettled.  Reused and quarantined units run
nothing.  The report is built from the journal alone, without the job file, so it
cannot see ``units.reuse = "none"`` or a streak about to quarantine a unit: the figure
per unit that ran here prices those (and a changed backlog) by multiplying, and
``fanout plan`` estimates the next run from the backlog as it is then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..journal import Journal
from ..journal.past import UnitSums
from ..journal.worktime import AttemptTally
from ..outcome import RunState, UnitState
from ..values.quantities import size_text
from . import estimate

GIB = 2**30


def totals(
    journal: Journal,
    run_id: str,
    *,
    tally: AttemptTally | None = None,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The report's ``compute`` object: the run's sums, why it has no GiB-seconds if it
    has none, and the next run's estimate.  ``tally`` (the run's
    ``Journal.attempt_tally``) and ``counts`` (its ``unit_counts``), if the caller has
    them: each is a scan of the run (a count of 100k units is a tenth of a second)."""
    tally = journal.attempt_tally(run_id) if tally is None else tally
    attempts, active = tally.attempts, tally.active_seconds
    low, high = tally.memory_min, tally.memory_max
    # None: no memory declared at all, or an attempt that ran had none.
    gib_seconds = None
    if high is not None and tally.byte_seconds is not None:
        gib_seconds = tally.byte_seconds / GIB
    note = ""
    if high is None:
        note = "the job declares no task.memory, so there is no allocation to bill"
    elif gib_seconds is None:
        note = (
            f"{tally.unallocated} attempt(s) ran without a declared memory"
            " (task.memory or their rung's)"
        )
    return {
        "attempts": attempts,
        "activeSeconds": round(active, 3),
        "gibSeconds": None if gib_seconds is None else round(gib_seconds, 3),
        "memoryBytes": None if high is None else {"min": low, "max": high},
        "note": note,
        "estimate": next_run(journal, run_id, memory_max=high, counts=counts) if attempts else None,
    }


def next_run(
    journal: Journal,
    run_id: str,
    *,
    memory_max: int | None,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any] | None:
    """The report's estimate of the job's next run with nothing changed (see the module
    docstring); None when no unit settled after running here.  ``memory_max``: the
    largest memory an attempt was allocated, None if none declared any."""
    run = journal.run(run_id)
    sample = journal.unit_history(journal.sample([run_id]), budget_usd=None)
    settled = estimate.per_unit(sample.all)
    if settled is None or not settled.attempts:
        return None
    counts = journal.unit_counts(run_id) if counts is None else counts
    unsettled = sum(counts.get(str(state), 0) for state in _UNSETTLED)
    latest = journal.last_unfinished(run.job)
    resumed = run.state is not RunState.FINISHED and latest is not None and latest.id == run_id
    failed = 0 if resumed else counts.get(str(UnitState.FAILED), 0)
    again = estimate.per_unit(sample.by_state.get(str(UnitState.FAILED), UnitSums())) or settled
    projection = estimate.project([(failed, again), (unsettled, settled)])
    # No memory declared at all: no GiB-seconds, as in the run's totals.
    gib = None if memory_max is None else projection.gib_seconds
    each_gib = None if memory_max is None else settled.gib_seconds
    return {
        # "resume": the next fanout run continues this one; "new": a new run.
        "next": "resume" if resumed else "new",
        "units": projection.units,
        "failed": failed,
        "unsettled": unsettled,
        "attempts": round(projection.attempts, 2),
        "meanSeconds": round(projection.mean_seconds, 3),
        # By active second, so attempts x mean x memory is the figure exactly.
        "memoryGib": None
        if gib is None or not projection.seconds
        else round(gib / projection.seconds, 4),
        "activeSeconds": round(projection.seconds, 3),
        "gibSeconds": None if gib is None else round(gib, 3),
        # What a unit that settled here took: a changed backlog is priced by multiplying.
        "perUnit": {
            "units": round(settled.units),
            "attempts": round(settled.attempts, 3),
            "activeSeconds": round(settled.seconds, 3),
            "gibSeconds": None if each_gib is None else round(each_gib, 3),
        },
    }


_UNSETTLED = (UnitState.PENDING, UnitState.RUNNING, UnitState.INTERRUPTED)


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
    if compute["estimate"] is not None:
        lines += [_estimate_text(compute["estimate"]), ""]
    return lines


def _estimate_text(estimate: dict[str, Any]) -> str:
    """The next run's estimate in one paragraph: which units it runs, and what they and
    a unit that ran here take."""
    units, failed, unsettled = estimate["units"], estimate["failed"], estimate["unsettled"]
    if estimate["next"] == "resume":
        text = f"Next run: `fanout run` continues this one and runs its {units} unsettled unit(s)"
    elif units == 0:
        text = "Next run, with nothing changed: no unit runs again (the successes are reused)"
    else:
        parts = (
            [f"{failed} failed unit(s) run again unless a streak quarantines them"]
            if failed
            else []
        )
        parts += [f"{unsettled} unsettled unit(s) run"] if unsettled else []
        text = f"Next run, with nothing changed: {' and '.join(parts)} (the successes are reused)"
    if units and not estimate["attempts"]:
        text += ": no attempt (they failed here before a worker started)"
    elif units:
        text += f": {estimate['attempts']:g} attempt(s) x {estimate['meanSeconds']:,.3f}s mean"
        if estimate["memoryGib"] is None:
            text += f" = {estimate['activeSeconds']:,.3f} active seconds"
        else:
            text += f" x {estimate['memoryGib']:g} GiB = {estimate['gibSeconds']:,.3f} GiB-seconds"
    each = estimate["perUnit"]
    took = f"{each['attempts']:g} attempt(s), {each['activeSeconds']:,.3f} active seconds"
    if each["gibSeconds"] is not None:
        took += f", {each['gibSeconds']:,.3f} GiB-seconds"
    return f"{text}. A unit that settled here took {took} on average."
