"""``fanout plan --base``'s output: the text a reviewer reads in a terminal, the
markdown of a pull request comment (``render_markdown``, always under GitHub's
65,536 characters), and the JSON a tool reads (``to_json``).

Both texts say the same things in the same order: the verdict (units added, removed,
invalidated; the plan hash each side has), the security surface where it changed, the
next run's estimate on each side and the difference, the sample units old beside new,
the triggers' next fires, and the resolved job's diff.  Everything a unit or the job
file says passes through ``safetext`` on its way to markdown.
"""

from __future__ import annotations

import difflib
import json
import shlex
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from ..attempt.invocation import Invocation
from ..report import budget
from ..values import safetext
from ..values.quantities import format_duration, usd_text
from . import TriggerFires
from .diff import Diff, Sample, Side
from .output import iso

# Lines of a sample's prompt diff, and of the resolved job's diff, shown at most.
SAMPLE_LINES = 60
RESOLVED_LINES = 300


def _estimate(side: Side) -> dict[str, Any] | None:
    """A side's next run in figures (None: that side has no plan)."""
    plan = side.plan
    if plan is None:
        return None
    found: dict[str, Any] = {"selected": plan.units, "toRun": plan.units, "reused": 0}
    estimate = plan.estimate
    if estimate is None:
        return found
    sorting = estimate.sorting
    found.update(toRun=sorting.to_run, reused=sorting.reused, quarantined=sorting.quarantined)
    projection = estimate.projection
    if projection is not None:
        found["attempts"] = round(projection.attempts, 1)
        found["activeSeconds"] = round(projection.seconds, 1)
        if estimate.units is not None and estimate.units.apis:  # the runs recorded spend
            found["spendP50"] = round(projection.spend.p50, 4)
            found["spendP90"] = round(projection.spend.p90, 4)
    if estimate.wall:
        found["wallSeconds"] = round(estimate.wall[0].seconds, 1)
        found["wallSetBy"] = estimate.wall[0].by
    found["budgets"] = [
        {"name": b.name, "budgetUsd": b.budget_usd, "p90Usd": round(b.p90_usd, 4), "under": b.under}
        for b in estimate.budgets
    ]
    return found


def dst_marks(times: tuple[datetime, ...], now: datetime) -> list[str]:
    """For each fire, "" or the UTC offset change since the fire before it (the first:
    since ``now``): "DST: UTC+01:00 -> UTC+02:00"."""
    marks = []
    before = now.astimezone(times[0].tzinfo) if times else now
    for moment in times:
        old, new = before.utcoffset() or timedelta(), moment.utcoffset() or timedelta()
        marks.append(f"DST: UTC{_offset(old)} -> UTC{_offset(new)}" if old != new else "")
        before = moment
    return marks


def _offset(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _argv(task: Invocation | None, error: str | None) -> str:
    if error is not None:
        return f"(does not render: {error})"
    return "(none)" if task is None else shlex.join(task.argv)


def _prompt_lines(task: Invocation | None) -> list[str]:
    if task is None or not task.prompt:
        return []
    return task.prompt.rstrip("\n").split("\n")


def sample_diff(sample: Sample) -> list[str]:
    """The sample's argv and prompt, old beside new, as a unified diff (every line as
    context when nothing changed)."""
    old = [f"argv: {_argv(sample.old, sample.old_error)}", *_prompt_lines(sample.old)]
    new = [f"argv: {_argv(sample.new, sample.new_error)}", *_prompt_lines(sample.new)]
    if sample.old is None and sample.old_error is None:
        old = []
    if sample.new is None and sample.new_error is None:
        new = []
    lines = list(
        difflib.unified_diff(old, new, "old", "new", n=max(len(old), len(new)), lineterm="")
    )
    if not lines:  # unchanged: the unit as both sides render it
        return [f" {line}" for line in new]
    return lines[2:]  # without the ---/+++ header: the section names the sides


def _money(value: float | None) -> str:
    return "-" if value is None else usd_text(value)


def _seconds(value: float | None) -> str:
    return "-" if value is None else format_duration(value)


def _delta(old: float | None, new: float | None, shown: Callable[[float], str]) -> str:
    if old is None or new is None:
        return "-"
    change = new - old
    sign = "+" if change >= 0 else "-"
    return sign + shown(abs(change))


def _estimate_rows(diff: Diff) -> list[tuple[str, str, str, str]]:
    old, new = _estimate(diff.old) or {}, _estimate(diff.new) or {}
    rows: list[tuple[str, str, str, str]] = []
    for key, name, shown in (
        ("selected", "units selected", lambda v: f"{v:,.0f}"),
        ("toRun", "units that would run", lambda v: f"{v:,.0f}"),
        ("reused", "units reused", lambda v: f"{v:,.0f}"),
        ("attempts", "attempts", lambda v: f"{v:,.1f}"),
        ("wallSeconds", "wall time", format_duration),
        ("spendP50", "spend p50", usd_text),
        ("spendP90", "spend p90", usd_text),
    ):
        a, b = old.get(key), new.get(key)
        if a is None and b is None:
            continue
        rows.append(
            (
                name,
                "-" if a is None else shown(a),
                "-" if b is None else shown(b),
                _delta(a, b, shown),
            )
        )
    return rows


def _budget_lines(diff: Diff) -> list[str]:
    lines = []
    for label, side in (("old", diff.old), ("new", diff.new)):
        for row in (_estimate(side) or {}).get("budgets", []):
            verdict = "under" if row["under"] else "OVER"
            lines.append(
                f"{label}: {row['name']} {usd_text(row['budgetUsd'])}: p90"
                f" {usd_text(row['p90Usd'])} is {verdict} it"
            )
    return lines


def _verdict(diff: Diff) -> list[str]:
    lines = []
    if diff.old.spec is None or diff.old.problems:
        said = (
            "is invalid there, or could not be planned: every unit counts as added"
            if diff.old.problems
            else "does not exist there: the change adds it"
        )
        lines.append(f"The job at the base {said}.")
    lines.append(
        f"Units: {diff.added:,} added, {diff.removed:,} removed, {diff.invalidated:,}"
        f" invalidated (they run again), {diff.unchanged:,} unchanged."
    )
    return lines


def _fires(fires: tuple[TriggerFires, ...], now: datetime) -> list[str]:
    lines = []
    for fire in fires:
        lines.append(f"{fire.trigger} ({fire.timezone}): {fire.explanation}")
        for moment, mark in zip(fire.times, dst_marks(fire.times, now), strict=True):
            utc = iso(moment.astimezone(UTC))
            lines.append(f"  {iso(moment)}  ({utc})" + (f"  {mark}" if mark else ""))
    return lines


def _jsonish(value: Any) -> str:
    return "(not set)" if value is None else json.dumps(value, ensure_ascii=False)


def render_text(diff: Diff) -> str:
    """The comparison for a terminal."""
    term = safetext.for_terminal
    lines = [f"Plan diff  {term(diff.old.label)} -> {term(diff.new.label)}", ""]
    lines += _verdict(diff)
    for name, ids in (
        ("added", diff.added_ids),
        ("removed", diff.removed_ids),
        ("invalidated", diff.invalidated_ids),
    ):
        total = getattr(diff, name)
        if ids:
            more = f" and {total - len(ids):,} more" if total > len(ids) else ""
            lines.append(f"  {name}: {', '.join(term(i) for i in ids)}{more}")
    lines.append(
        f"Plan hash  {diff.old.plan_hash or '-'} -> {diff.new.plan_hash}"
        f"  (approve with: fanout run --expect-plan {diff.new.plan_hash})"
    )
    lines += [f"  the base's job: {term(problem)}" for problem in diff.old.problems]
    lines += ["", "Security surface:"]
    if not diff.surface:
        lines.append("  unchanged")
    for change in diff.surface:
        lines.append(f"  CHANGED {change.key} ({change.meaning})")
        lines.append(f"    old: {term(_jsonish(change.old))}")
        lines.append(f"    new: {term(_jsonish(change.new))}")
    lines += ["", "Next run (from the job's history here):"]
    for name, old, new, delta in _estimate_rows(diff):
        lines.append(f"  {name:<22} {old:>12} -> {new:>12}  ({delta})")
    lines += [f"  {line}" for line in _budget_lines(diff)]
    for sample in diff.samples:
        lines += ["", f"Sample unit {term(sample.unit)} ({sample.change}):"]
        lines += [f"  {term(line)}" for line in _cut(sample_diff(sample), SAMPLE_LINES)]
    if diff.new.plan is not None and diff.new.plan.fires:
        lines += ["", "Triggers, next fires:"]
        lines += [f"  {term(line)}" for line in _fires(diff.new.plan.fires, diff.now)]
    lines += ["", "Resolved job diff (defaults filled in):"]
    shown = _cut(list(diff.resolved_diff), RESOLVED_LINES) or ["  (no change)"]
    lines += [term(line) for line in shown]
    return "\n".join(lines) + "\n"


def _cut(lines: list[str], limit: int) -> list[str]:
    if len(lines) <= limit:
        return lines
    return [*lines[:limit], f"... {len(lines) - limit:,} more line(s)"]


def render_markdown(diff: Diff) -> str:
    """The comparison as a pull request comment, under ``budget.BUDGET`` (report.md's
    measure of GitHub's limit, with room for the marker a workflow adds):
    the summary and the surface always, then the estimate, the samples, the fires and
    the resolved diff as long as they fit (a fenced block cut at a line, closed)."""
    md, code = safetext.for_markdown, safetext.code
    head = [
        f"### fanout plan: {code(diff.new.label)} against {code(diff.old.label)}",
        "",
        *[md(line) for line in _verdict(diff)],
        "",
    ]
    for name, ids in (
        ("Added", diff.added_ids),
        ("Removed", diff.removed_ids),
        ("Invalidated", diff.invalidated_ids),
    ):
        total = getattr(diff, name.lower())
        if ids:
            more = f" and {total - len(ids):,} more" if total > len(ids) else ""
            shown = (code(safetext.shorten(i, budget.ID_CHARS)) for i in ids)
            head.append(f"- {name}: {', '.join(shown)}{more}")
    if any((diff.added_ids, diff.removed_ids, diff.invalidated_ids)):
        head.append("")
    head += [
        f"Plan hash: {code(diff.new.plan_hash or '-')} (was {code(diff.old.plan_hash or '-')})."
        f" Approve it with `fanout run --expect-plan {diff.new.plan_hash}`.",
        "",
    ]
    if diff.old.problems:
        head += ["The base's job:", "", _fence(list(diff.old.problems)), ""]
    head += ["#### Security surface", ""]
    if not diff.surface:
        head += ["Unchanged.", ""]
    else:
        head += ["| changed | what it is | old | new |", "| --- | --- | --- | --- |"]
        for change in diff.surface:
            head.append(
                f"| :warning: {code(change.key)} | {md(change.meaning)}"
                f" | {code(_jsonish(change.old)[:300])} | {code(_jsonish(change.new)[:300])} |"
            )
        head.append("")
    rows = _estimate_rows(diff)
    sections: list[list[str]] = []
    if rows:
        table = [
            "#### Next run (from the job's history)",
            "",
            "| | old | new | change |",
            "| --- | ---: | ---: | ---: |",
            *[f"| {name} | {old} | {new} | {delta} |" for name, old, new, delta in rows],
            "",
        ]
        table += [f"- {md(line)}" for line in _budget_lines(diff)]
        sections.append([*table, ""])
    for sample in diff.samples:
        sections.append(
            [
                f"<details><summary>Sample unit <code>{safetext.for_html(sample.unit)}</code>"
                f" ({sample.change}): prompt and argv, old and new</summary>",
                "",
                _fence(_cut(sample_diff(sample), SAMPLE_LINES), "diff"),
                "",
                "</details>",
                "",
            ]
        )
    if diff.new.plan is not None and diff.new.plan.fires:
        sections.append(["#### Next fires", "", _fence(_fires(diff.new.plan.fires, diff.now)), ""])
    resolved = list(diff.resolved_diff) or ["(no change)"]
    sections.append(
        [
            "<details><summary>Resolved job diff (defaults filled in)</summary>",
            "",
            _fence(_cut(resolved, RESOLVED_LINES), "diff"),
            "",
            "</details>",
            "",
        ]
    )
    lines, rest = list(head), _REST
    for section in sections:
        if budget.lines_size([*lines, *section, rest]) > budget.BUDGET:
            lines.append(rest)
            break
        lines += section
    # The head alone may not fit (a job whose every surface key changed to pages of
    # text): cut it at a line where no block is open.
    return "\n".join(budget.cut(lines, budget.BUDGET, rest)) + "\n"


_REST = "_The rest did not fit in a comment: run `fanout plan --base` locally._"


def _fence(lines: list[str], language: str = "") -> str:
    """A fenced code block no line of ``lines`` can close early, its language named
    (GitHub colours a ``diff`` block's lines)."""
    fence, _, rest = safetext.code_fence("\n".join(lines)).partition("\n")
    return f"{fence}{language}\n{rest}"


def to_json(diff: Diff) -> dict[str, Any]:
    """The comparison for a tool."""

    def sample(item: Sample) -> dict[str, Any]:
        def task(value: Invocation | None, error: str | None) -> Any:
            if error is not None:
                return {"error": error}
            if value is None:
                return None
            return {"argv": list(value.argv), "prompt": value.prompt}

        return {
            "unit": item.unit,
            "change": item.change,
            "old": task(item.old, item.old_error),
            "new": task(item.new, item.new_error),
        }

    fires = diff.new.plan.fires if diff.new.plan is not None else ()
    return {
        "old": {
            "label": diff.old.label,
            "exists": diff.old.spec is not None,
            "problems": list(diff.old.problems),
            "planHash": diff.old.plan_hash,
            "next": _estimate(diff.old),
        },
        "new": {
            "label": diff.new.label,
            "planHash": diff.new.plan_hash,
            "next": _estimate(diff.new),
        },
        "units": {
            "added": diff.added,
            "removed": diff.removed,
            "invalidated": diff.invalidated,
            "unchanged": diff.unchanged,
            "addedIds": list(diff.added_ids),
            "removedIds": list(diff.removed_ids),
            "invalidatedIds": list(diff.invalidated_ids),
        },
        "surface": [
            {"key": c.key, "meaning": c.meaning, "old": c.old, "new": c.new} for c in diff.surface
        ],
        "samples": [sample(item) for item in diff.samples],
        "fires": [
            {
                "trigger": fire.trigger,
                "times": [iso(moment) for moment in fire.times],
                "dst": dst_marks(fire.times, diff.now),
            }
            for fire in fires
        ],
        "resolvedDiff": list(diff.resolved_diff),
    }
