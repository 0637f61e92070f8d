"""The fan-in report of a run, built from the journal: ``report.json`` for machines and
``report.md`` ready to paste into a pull request comment.

It shows totals, wall time against summed worker time and the speed-up the pool
achieved, per-unit status with the rung reached and the attempts used, the files each
unit changed with a diffstat, and the failures with the end of their output.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from . import fleet, safetext
from .journal import Journal, UnitRow
from .quantities import format_duration

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
    }


def build(journal: Journal, run_id: str) -> dict[str, Any]:
    run = journal.run(run_id)
    rows = journal.units(run_id)
    changes = journal.changes(run_id)
    by_unit: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for change in changes:
        by_unit.setdefault((change["round"], change["unit"]), []).append(
            {
                "path": change["path"],
                "added": change["added"],
                "removed": change["removed"],
                "state": change["state"],
            }
        )
    worker = sum(r.worker_seconds for r in rows)
    latest: dict[str, UnitRow] = {}
    for row in rows:
        latest[row.unit.id] = row
    totals = Counter(str(r.state) for r in latest.values())
    units = []
    for row in rows:
        record = unit_record(row)
        record["changes"] = by_unit.get((row.round, row.unit.id), [])
        if str(row.state) != "succeeded":
            record["outputTail"] = row.tail
        units.append(record)
    attempts = journal.attempt_counts(run_id)
    return {
        "run": run.id,
        "job": run.job,
        "jobFile": run.job_file,
        "state": run.state,
        "note": run.note,
        "parent": run.parent,
        "started": run.started,
        "finished": run.finished,
        "wallSeconds": round(run.wall, 3),
        "workerSeconds": round(worker, 3),
        "speedup": round(worker / run.wall, 2) if run.wall > 0 else None,
        "rounds": [
            {"round": r["round"], "records": r["records"], "units": r["selected"]}
            for r in journal.rounds(run_id)
        ],
        "limits": run.limits,
        "totals": dict(sorted(totals.items())),
        "attempts": dict(sorted(attempts.items())),
        "units": units,
        "failed": sorted(uid for uid, r in latest.items() if str(r.state) == "failed"),
    }


def write(journal: Journal, run_id: str, directory: Path) -> Path:
    """Write report.json and report.md into ``directory``; returns the markdown path."""
    data = build(journal, run_id)
    data["hosts"] = fleet.hosts(journal.host_attempts(run_id), directory / "events.jsonl")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "report.json").write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    markdown = directory / "report.md"
    markdown.write_text(render_markdown(data))
    return markdown


def render_markdown(data: dict[str, Any]) -> str:
    """The report as markdown for a pull request comment.  Everything that came from a
    unit or a worker (ids, reasons, paths, output, notes) goes through ``safetext``, so
    none of it can add markup, HTML or control characters of its own."""
    md, code = safetext.for_markdown, safetext.code
    totals = data["totals"]
    units_total = sum(totals.values())
    lines = [f"## fanout: {md(data['job'])} (run {code(data['run'])})", ""]
    summary = ", ".join(f"{count} {md(state)}" for state, count in totals.items()) or "no units"
    lines.append(f"**{units_total} unit(s)**: {summary}. Run {md(data['state'])}.")
    if data["note"]:
        lines.append(f"_{md(data['note'])}_")
    lines.append("")
    wall, worker = data["wallSeconds"], data["workerSeconds"]
    speedup = f"{data['speedup']:.1f}x" if data["speedup"] else "n/a"
    attempts = ", ".join(f"{n} {md(s)}" for s, n in data["attempts"].items())
    lines += [
        "| wall time | worker time | speed-up | rounds | attempts |",
        "| ---: | ---: | ---: | ---: | --- |",
        f"| {format_duration(wall)} | {format_duration(worker)} | {speedup} "
        f"| {len(data['rounds'])} | {attempts} |",
        "",
    ]
    if data["rounds"]:
        lines.append(
            "Rounds: "
            + "; ".join(
                f"{r['round']}: {r['units']} unit(s) from {r['records']} record(s)"
                for r in data["rounds"]
            )
        )
        lines.append("")
    if data["limits"]:
        lines += [
            "| limit | configured starts/min | achieved starts/min | throttled | paused |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for name, stats in data["limits"].items():
            configured = stats["configuredPerMinute"]
            achieved = stats["achievedPerMinute"]
            lines.append(
                f"| {'all dispatch' if name == '*' else md(name)} "
                f"| {'-' if configured is None else f'{configured:g}'} "
                f"| {'-' if achieved is None else f'{achieved:.4g}'} "
                f"| {stats['throttles']} | {format_duration(stats['pausedSeconds'])} |"
            )
        lines.append("")
    lines += fleet.markdown(data.get("hosts", []))
    changed = [(u, c) for u in data["units"] for c in u["changes"]]
    if changed:
        lines += [
            "### Changed files",
            "",
            "| file | unit | round | +/- | state |",
            "| --- | --- | ---: | ---: | --- |",
        ]
        for unit, change in changed:
            lines.append(
                f"| {code(change['path'])} | {code(unit['unit'])} | {unit['round']} | "
                f"+{change['added']} -{change['removed']} | {md(change['state'])} |"
            )
        lines.append("")
    failures = [u for u in data["units"] if u["state"] == "failed" and u["unit"] in data["failed"]]
    if failures:
        lines += ["### Failed: needs a human", ""]
        html = safetext.for_html
        for unit in failures:
            # A raw HTML block up to the blank line: entities only, markdown is not read.
            lines.append(
                f"<details><summary><code>{html(unit['unit'])}</code>: {html(unit['reason'])}"
                f" (rung {html(unit['rung'])}, {unit['attempts']} attempt(s))</summary>"
            )
            lines += [
                "",
                safetext.code_fence(unit.get("outputTail", "").rstrip()[-3000:]),
                "</details>",
                "",
            ]
    lines += [
        "### Units",
        "",
        "| unit | round | state | rung | attempts | time |",
        "| --- | ---: | --- | --- | ---: | ---: |",
    ]
    for unit in data["units"][:SHOWN_UNITS]:
        lines.append(
            f"| {code(unit['unit'])} | {unit['round']} | {md(unit['state'])} "
            f"| {md(unit['rung'])} | {unit['attempts']} "
            f"| {format_duration(unit['workerSeconds'])} |"
        )
    if len(data["units"]) > SHOWN_UNITS:
        lines.append(f"\n{len(data['units']) - SHOWN_UNITS} more unit(s) in report.json.")
    return "\n".join(lines) + "\n"


def status_text(journal: Journal, run_id: str | None, job: str | None = None) -> str:
    """The text of ``fanout status``: recent runs, or one run's units by state."""
    if run_id is None:
        runs = journal.runs(job=job)
        if not runs:
            return "no runs yet\n"
        lines = ["run                   job                   state        round  units"]
        for run in runs:
            counts = journal.unit_counts(run.id)
            shown = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "-"
            lines.append(f"{run.id:<21} {run.job[:21]:<21} {run.state:<12} {run.round:>5}  {shown}")
        return "\n".join(lines) + "\n"
    run = journal.run(run_id)
    counts = journal.unit_counts(run_id)
    lines = [
        f"run {run.id} of {run.job}: {run.state}, round {run.round}"
        + (f" ({run.note})" if run.note else "")
    ]
    for state in ("succeeded", "failed", "running", "pending", "interrupted"):
        if counts.get(state):
            lines.append(f"  {state:<12} {counts[state]}")
    return "\n".join(lines) + "\n"
