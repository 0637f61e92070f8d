"""The text of ``fanout status``: recent runs, or one run's units by state, each
state's list bounded (the report has the rest)."""

from __future__ import annotations

from ..journal import Journal, RunRow, UnitRow
from ..journal.ceilings import label
from ..outcome import RunState, UnitState
from ..values import safetext
from . import attention

# Units ``fanout status RUN`` lists per state; the report has the rest.
STATUS_UNITS = 10
# The states in the order ``fanout status RUN`` lists them: what needs a human first.
STATUS_ORDER = (
    UnitState.FAILED,
    UnitState.QUARANTINED,
    UnitState.INTERRUPTED,
    UnitState.RUNNING,
    UnitState.PENDING,
    UnitState.SUCCEEDED,
    UnitState.REUSED,
)
# A reason longer than this is cut on the terminal (the report has it whole).
STATUS_REASON = 160


def status_text(
    journal: Journal,
    run_id: str | None,
    job: str | None = None,
    *,
    shown: int = STATUS_UNITS,
    report_command: str = "fanout report",
) -> str:
    """The text of ``fanout status``: recent runs, or one run's units by state.

    Every query is bounded: the counts are one aggregate, and each state lists at most
    ``shown`` units, so a 100k-unit run costs what a small one does.  Ids, reasons and
    notes came from units and workers, so they pass through ``safetext.for_terminal``."""
    term = safetext.for_terminal
    if run_id is None:
        runs = journal.runs(job=job)
        if not runs:
            return "no runs yet\n"
        # The job column is as wide as the longest name shown (a name may have 64
        # characters): a name cut short could be another job's.
        jobs = [term(run.job) for run in runs]
        width = max(21, *(len(name) for name in jobs))
        lines = [f"{'run':<21} {'job':<{width}} {'state':<12} round  units"]
        for run, name in zip(runs, jobs, strict=True):
            counts = journal.unit_counts(run.id)
            shown_counts = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "-"
            retry = f"  (retry of {term(run.parent)})" if run.parent else ""
            lines.append(
                f"{run.id:<21} {name:<{width}} {run.state:<12} {run.round:>5}"
                f"  {shown_counts}{retry}"
            )
        # Each job's latest run shown (runs are newest first) says what it quarantines.
        latest: dict[str, RunRow] = {}
        for row in runs:
            latest.setdefault(row.job, row)
        for row in latest.values():
            attention_lines = attention.status_lines(journal, row, shown=shown)
            lines += ["", *attention_lines] if attention_lines else []
        lines += _kept_lines(journal, list(dict.fromkeys(run.job for run in runs)))
        return "\n".join(lines) + "\n"
    run = journal.run(run_id)
    counts = journal.unit_counts(run_id)
    lines = [
        f"run {run.id} of {term(run.job)}: {run.state}, round {run.round}"
        + (f" ({term(run.note)})" if run.note else "")
    ]
    if run.parent:
        lines.append(f"  retry of {term(run.parent)}")
    retries = journal.retries_of(run_id)
    if retries:
        lines.append(f"  retried in {', '.join(term(r) for r in retries)}")
    if not counts:
        lines.append("  no units")
    states: list[str] = [s for s in STATUS_ORDER if counts.get(s)]
    states += sorted(s for s in counts if s not in STATUS_ORDER and counts[s])
    for state in states:
        lines.append(f"  {state:<12} {counts[state]}")
        rows = journal.units_in_state(run_id, state, shown)
        lines += _unit_lines(rows)
        if counts[state] > len(rows):
            lines.append(f"    and {counts[state] - len(rows)} more: {report_command} {run.id}")
    # What the job quarantines now: its latest run recorded which streaks quarantine.
    newest = journal.runs(job=run.job, limit=1)
    lines += attention.status_lines(journal, newest[0] if newest else run, shown=shown, indent="  ")
    learned = _learned(journal, run)
    if learned:
        lines.append("  learned limits")
        lines += [f"    {term(label(name))}: {term(text)}" for name, text in learned.items()]
    return "\n".join(lines) + "\n"


def _learned(journal: Journal, run: RunRow) -> dict[str, str]:
    """What the run's limits learned, by name: as its end recorded them, or while it
    runs (or after it was killed, or resumed) as its last round's end kept them."""
    recorded = {
        name: str(stats["learnedText"])
        for name, stats in run.limits.items()
        if isinstance(stats, dict) and stats.get("learnedText")
    }
    if run.state is not RunState.RUNNING:
        return recorded
    kept = {row.name: row.text for row in journal.kept_ceiling_rows(run.job) if row.run == run.id}
    return {**recorded, **kept}


def _kept_lines(journal: Journal, jobs: list[str]) -> list[str]:
    """What each job's next run starts from (``journal.ceilings``), under the runs."""
    term = safetext.for_terminal
    lines = [
        f"  {term(job)}  {term(label(row.name))}: {term(row.text)}"
        for job in jobs
        for row in journal.kept_ceiling_rows(job)
    ]
    return ["", "learned limits (kept for each job's next run)", *lines] if lines else []


def _unit_lines(rows: list[UnitRow]) -> list[str]:
    """One line per unit: id, rung, attempts, reason, in columns as wide as the widest
    shown (a state lists a few units, so the widths cost nothing)."""
    term = safetext.for_terminal
    cells = []
    for row in rows:
        reason = safetext.shorten(term(row.reason), STATUS_REASON, ellipsis="...")
        rung = term(str(row.last.get("rung", ""))) or "-"
        cells.append((term(row.unit.id), f"rung {rung}", f"{row.attempts} attempt(s)", reason))
    width = [max((len(c[i]) for c in cells), default=0) for i in range(4)]
    return [
        ("    " + "  ".join(cell.ljust(width[i]) for i, cell in enumerate(line))).rstrip()
        for line in cells
    ]
