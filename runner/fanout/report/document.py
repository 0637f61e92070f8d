"""The fan-in report of a run, built from the journal: ``report.json`` for machines and
``report.md`` ready to paste into a pull request comment.

It shows totals, wall time against summed worker time and the speed-up the pool
achieved, per-unit status with the rung reached and the attempts used, the files each
unit changed with a diffstat, and the failures with the end of their output.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from ..journal import Journal, UnitRow
from ..journal.ceilings import label
from ..outcome import UnitState
from ..pacing.ceiling import Learned
from ..values import safetext
from ..values.quantities import format_duration
from . import accounting, attention, compute, fleet, skipped

SHOWN_UNITS = 200


def unit_record(row: UnitRow) -> dict[str, Any]:
    """One unit's result, as the report and the aggregate command's JSONL see it."""
    return {
        "unit": row.unit.id,
        "round": row.round,
        "state": str(row.state),
        "rung": row.last.get("rung", ""),
        "attempts": row.attempts,
        "workerSeconds": round(row.worker_seconds, 3),
        "reason": row.reason,
        "origin": row.unit.origin,
        "collected": [c.path for c in row.collected],
        **({"reusedFrom": row.reused_from} if row.reused_from else {}),
    }


def summary(journal: Journal, run_id: str) -> dict[str, Any]:
    """The run-level part of the report (everything but the unit lists), from
    aggregate queries: its cost does not grow with the units held in memory."""
    run = journal.run(run_id)
    worker = journal.worker_seconds(run_id)
    return {
        "run": run.id,
        "job": run.job,
        "jobFile": run.job_file,
        "state": str(run.state),
        "note": run.note,
        "parent": run.parent,
        "started": run.started,
        "finished": run.finished,
        "wallSeconds": round(run.wall, 3),
        "workerSeconds": round(worker, 3),
        "speedup": round(worker / run.wall, 2) if run.wall > 0 else None,
        "rounds": [
            {
                "round": r["round"],
                "records": r["records"],
                "units": r["selected"],
                # Selected again but not run: unchanged since they failed earlier.
                "unchanged": r["unchanged"],
            }
            for r in journal.rounds(run_id)
        ],
        "limits": run.limits,
        "totals": dict(sorted(journal.unit_counts(run_id).items())),
        # Active seconds x allocated memory, the seeds' cost model (``compute``).
        "compute": compute.totals(journal, run_id),
        # What the units' requests through the gateway used, per API (none without one).
        "apis": [usage.as_dict() for usage in journal.usage_totals(run_id)],
        "attempts": dict(sorted(journal.attempt_counts(run_id).items())),
        # An agent task's attempts by what its output said (agents.taxonomy.Kind).
        "agentOutcomes": journal.attempt_kinds(run_id),
        # Host states (lost, quarantined) are events, not journal rows: the run's event
        # log, in its folder beside the journal, says them.
        "hosts": fleet.hosts(
            journal.host_attempts(run_id), journal.path.parent / "runs" / run_id / "events.jsonl"
        ),
        # The job's quarantined units: a count to alert on, and the first of them.
        **attention.summary(journal, run_id),
    }


def _summary_record(row: sqlite3.Row) -> dict[str, Any]:
    """``unit_record`` with the output tail, of a ``Journal.unit_summaries`` row."""
    collected = row["collected"]
    return {
        "unit": row["id"],
        "round": row["round"],
        "state": row["state"],
        "rung": row["rung"],
        "attempts": row["attempts"],
        "workerSeconds": round(row["worker_seconds"], 3),
        "reason": row["reason"],
        "origin": row["origin"],
        "collected": [] if collected == "[]" else [c["path"] for c in json.loads(collected)],
        **({"reusedFrom": row["reused_from"]} if row["reused_from"] else {}),
        "tail": row["tail"],
    }


def _row_record(row: UnitRow) -> dict[str, Any]:
    return {**unit_record(row), "tail": row.tail}


def _records(
    journal: Journal, run_id: str, records: Iterable[dict[str, Any]]
) -> Iterator[dict[str, Any]]:
    """Report records (with a ``tail`` key, dropped here), with their changes and the
    output tail of the units that did not succeed, fetched a page at a time."""
    with_changes = journal.has_changes(run_id)
    with_usage = journal.has_usage(run_id)
    budget = journal.unit_budget(run_id)
    with_memory = journal.compute_totals(run_id)["memory_max"] is not None
    for page in _pages(records, 500):
        compute.annotate(journal, run_id, page, with_memory=with_memory)
        keys = [(r["round"], r["unit"]) for r in page]
        usage = journal.usage_of(run_id, keys) if with_usage else {}
        by_unit: dict[tuple[int, str], list[dict[str, Any]]] = {}
        if with_changes:
            for change in journal.changes(run_id, keys):
                by_unit.setdefault((change["round"], change["unit"]), []).append(
                    {
                        "path": change["path"],
                        "added": change["added"],
                        "removed": change["removed"],
                        "state": change["state"],
                    }
                )
        for record in page:
            tail = record.pop("tail")
            key = (record["round"], record["unit"])
            record["changes"] = by_unit.get(key, [])
            if with_usage:
                record["usage"] = [u.as_dict() for u in usage.get(key, [])]
            if budget is not None:  # task.budget: the most the unit could spend
                record["budget"] = {"usd": budget}
            if record["state"] not in (UnitState.SUCCEEDED, UnitState.REUSED):
                record["outputTail"] = tail
            yield record


def _pages(records: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    iterator = iter(records)
    while page := list(itertools.islice(iterator, size)):
        yield page


def unit_records(journal: Journal, run_id: str) -> Iterator[dict[str, Any]]:
    """Every unit of every round of the run, in order, as report.json lists them."""
    return _records(journal, run_id, map(_summary_record, journal.unit_summaries(run_id)))


def build(journal: Journal, run_id: str) -> dict[str, Any]:
    """The whole report as one dict (every unit in memory: for small runs and tests;
    ``write`` and ``fanout report`` stream instead)."""
    return {
        **summary(journal, run_id),
        "units": list(unit_records(journal, run_id)),
        "failed": list(journal.failed_ids(run_id)),
    }


def write_json(journal: Journal, run_id: str, out: TextIO) -> None:
    """Write the report as JSON, one unit at a time: a 100k-unit run's report costs the
    memory of one page of units.  The run's fields are indented; each unit (and each
    failed id) is one line, which keeps 100k units greppable and lets the C encoder
    write them (an indented dump is pure Python and was half the time)."""
    head = json.dumps(summary(journal, run_id), indent=2, ensure_ascii=False)
    out.write(head[: -len("\n}")] + ',\n  "units": ')
    _write_list(out, unit_records(journal, run_id))
    out.write(',\n  "failed": ')
    _write_list(out, journal.failed_ids(run_id))
    out.write("\n}\n")


# One encoder for every unit: ``json.dumps`` with an option builds a new one per call.
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode


def _write_list(out: TextIO, values: Iterable[Any]) -> None:
    first = True
    for value in values:
        out.write(("[\n    " if first else ",\n    ") + _ENCODE(value))
        first = False
    out.write("[]" if first else "\n  ]")


def markdown_data(journal: Journal, run_id: str) -> dict[str, Any]:
    """What report.md shows, read with bounded queries: the run's summary and at most
    SHOWN_UNITS units for each of its sections (the first units, the failed ones, the
    ones that changed files), with the counts that say how many more report.json has."""
    first = list(itertools.islice(journal.units(run_id, batch=SHOWN_UNITS), SHOWN_UNITS))
    failed_count, failed = journal.failed_units(run_id, SHOWN_UNITS)
    changed_count, changed = journal.changed_units(run_id, SHOWN_UNITS)
    chosen: dict[tuple[int, str], UnitRow] = {}
    for row in (*first, *failed, *changed):
        chosen.setdefault((row.round, row.unit.id), row)
    # Selection order keeps the first SHOWN_UNITS units first, where the units table
    # takes them from.
    rows = sorted(chosen.values(), key=lambda r: (r.round, r.unit.index))
    return {
        **summary(journal, run_id),
        "units": list(_records(journal, run_id, map(_row_record, rows))),
        "failed": [r.unit.id for r in failed],
        "unitCount": journal.unit_count(run_id),
        "failedCount": failed_count,
        "changedCount": changed_count,
        "reusedUnits": skipped.reused_units(journal, run_id),
    }


def write(journal: Journal, run_id: str, directory: Path) -> Path:
    """Write report.json and report.md into ``directory``; returns the markdown path."""
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "report.json").open("w", encoding="utf-8") as out:
        write_json(journal, run_id, out)
    markdown = directory / "report.md"
    markdown.write_text(render_markdown(markdown_data(journal, run_id)))
    return markdown


def render_markdown(data: dict[str, Any]) -> str:
    """The report as markdown for a pull request comment, section by section.  Everything
    that came from a unit or a worker (ids, reasons, paths, output, notes) goes through
    ``safetext``, so none of it can add markup, HTML or control characters of its own."""
    lines = [
        *_headline(data),
        *_times(data),
        *_agent_outcomes(data),
        *_rounds(data),
        *skipped.markdown(data),
        *_limit_lines(data["limits"]),
        *compute.markdown(data["compute"]),
        *accounting.markdown(data.get("apis", [])),
        *fleet.markdown(data.get("hosts", [])),
        *_changed_files(data),
        *attention.quarantined_markdown(data),
        *attention.failures_markdown(data),
        *_units(data),
    ]
    return "\n".join(lines) + "\n"


def _headline(data: dict[str, Any]) -> list[str]:
    """The title, the units by state, the run's state and its note."""
    md = safetext.for_markdown
    totals = data["totals"]
    states = ", ".join(f"{count} {md(state)}" for state, count in totals.items()) or "no units"
    lines = [
        f"## fanout: {md(data['job'])} (run {safetext.code(data['run'])})",
        "",
        f"**{sum(totals.values())} unit(s)**: {states}. Run {md(data['state'])}.",
    ]
    if data["note"]:
        lines.append(f"_{md(data['note'])}_")
    return [*lines, ""]


def _times(data: dict[str, Any]) -> list[str]:
    """Wall time against summed worker time, the speed-up, the rounds and the attempts."""
    wall, worker = data["wallSeconds"], data["workerSeconds"]
    speedup = f"{data['speedup']:.1f}x" if data["speedup"] else "n/a"
    attempts = ", ".join(f"{n} {safetext.for_markdown(s)}" for s, n in data["attempts"].items())
    return [
        "| wall time | worker time | speed-up | rounds | attempts |",
        "| ---: | ---: | ---: | ---: | --- |",
        f"| {format_duration(wall)} | {format_duration(worker)} | {speedup} "
        f"| {len(data['rounds'])} | {attempts} |",
        "",
    ]


def _agent_outcomes(data: dict[str, Any]) -> list[str]:
    if not data.get("agentOutcomes"):
        return []
    md = safetext.for_markdown
    said = ", ".join(f"{n} {md(kind)}" for kind, n in data["agentOutcomes"].items())
    return [f"Agent attempts, as the agent reported them: {said}.", ""]


def _rounds(data: dict[str, Any]) -> list[str]:
    if not data["rounds"]:
        return []
    rounds = "; ".join(
        f"{r['round']}: {r['units']} unit(s) from {r['records']} record(s)" for r in data["rounds"]
    )
    return [f"Rounds: {rounds}", ""]


def _changed_files(data: dict[str, Any]) -> list[str]:
    """The files each shown unit changed, with their diffstat."""
    changed = [(u, c) for u in data["units"] for c in u["changes"]]
    if not changed:
        return []
    code = safetext.code
    lines = [
        "### Changed files",
        "",
        "| file | unit | round | +/- | state |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for unit, change in changed:
        lines.append(
            f"| {code(change['path'])} | {code(unit['unit'])} | {unit['round']} | "
            f"+{change['added']} -{change['removed']} | {safetext.for_markdown(change['state'])} |"
        )
    _more(lines, data.get("changedCount", 0), len({(u["round"], u["unit"]) for u, _ in changed}))
    return [*lines, ""]


def _units(data: dict[str, Any]) -> list[str]:
    """The first SHOWN_UNITS units, with their usage where the run called APIs."""
    md, code = safetext.for_markdown, safetext.code
    with_usage = bool(data.get("apis"))
    head, rule = accounting.unit_columns() if with_usage else ("", "")
    lines = [
        "### Units",
        "",
        "| unit | round | state | rung | attempts | time |" + head,
        "| --- | ---: | --- | --- | ---: | ---: |" + rule,
    ]
    for unit in data["units"][:SHOWN_UNITS]:
        lines.append(
            f"| {code(unit['unit'])} | {unit['round']} | {md(unit['state'])} "
            f"| {md(unit['rung']) or '-'} | {unit['attempts']} "
            f"| {format_duration(unit['workerSeconds'])} |"
            + (accounting.unit_cells(unit.get("usage", [])) if with_usage else "")
        )
    total = data.get("unitCount", len(data["units"]))
    if total > SHOWN_UNITS:
        lines.append(f"\n{total - SHOWN_UNITS} more unit(s) in report.json.")
    return lines


def _limit_lines(found: dict[str, dict[str, Any]]) -> list[str]:
    """The limits table (a limit's starts, throttles and pause, and the rate its ceiling
    learned: "-" where it learned none), then what each learned and from what.  An API's
    row (``api:<name>``) has only what its gateway window learned; a row an older fanout
    recorded has no learned fields."""
    if not found:
        return []
    md = safetext.for_markdown
    lines = [
        "| limit | configured starts/min | achieved starts/min | throttled | paused | learned |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    learned_lines = []
    for name, stats in found.items():
        configured = stats.get("configuredPerMinute")
        achieved = stats.get("achievedPerMinute")
        throttles = stats.get("throttles")
        paused = stats.get("pausedSeconds")
        known = Learned.from_dict(stats.get("learned") or {})
        lines.append(
            f"| {md(label(name))} "
            f"| {'-' if configured is None else f'{configured:g}'} "
            f"| {'-' if achieved is None else f'{achieved:.4g}'} "
            f"| {'-' if throttles is None else throttles} "
            f"| {'-' if paused is None else format_duration(paused)} "
            f"| {'-' if known is None else _per_window(known)} |"
        )
        if known is not None and stats.get("learnedText"):
            learned_lines.append(f"- {md(label(name))}: {md(stats['learnedText'])}")
    lines.append("")
    if learned_lines:
        lines += ["Learned limits:", "", *learned_lines, ""]
    return lines


def _per_window(learned: Learned) -> str:
    return f"{learned.per_window:.1f} per {format_duration(learned.window)}"


def _more(lines: list[str], count: int, shown: int) -> None:
    """The line saying a section of report.md was cut at SHOWN_UNITS units."""
    if count > shown:
        # After a blank line: a line right below a table would be read as its last row.
        lines += ["", f"{count - shown} more unit(s) in report.json.", ""]
