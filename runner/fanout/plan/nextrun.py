"""What ``fanout plan`` says of the next run (``estimate``): the units it would run,
what a unit took in the job's earlier runs, per rung and in all, the run's expected
attempts, active seconds, spend and wall time, and the budgets; as text lines and as
the ``next`` object of ``fanout plan --format json``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..journal.past import Spread
from ..spec import Spec
from ..values.quantities import format_duration, usd_text

if TYPE_CHECKING:
    from .estimate import Estimate, Sorting

_INDENT = " " * 10


def _usd(spread: Spread) -> str:
    return f"{usd_text(spread.mean)} (p50 {usd_text(spread.p50)}, p90 {usd_text(spread.p90)})"


def _seconds(spread: Spread) -> str:
    p50, p90 = format_duration(spread.p50), format_duration(spread.p90)
    return f"{format_duration(spread.mean)} (p50 {p50}, p90 {p90})"


def _units_line(sorting: Sorting) -> str:
    if not sorting.sorted:
        return f"{sorting.to_run:,} selected unit(s) would run (no earlier run to reuse)"
    again = f" ({sorting.again:,} of them unchanged since they failed)" if sorting.again else ""
    return (
        f"{sorting.to_run:,} of {sorting.selected:,} selected unit(s) would run{again},"
        f" {sorting.reused:,} reused, {sorting.quarantined:,} quarantined"
    )


def lines(estimate: Estimate, spec: Spec) -> list[str]:
    """The plan's "Estimate" lines."""
    sorting = estimate.sorting
    found = []
    if estimate.unfinished is not None:
        found.append(
            f"the job's last run {estimate.unfinished} did not finish: `fanout run` continues"
            " it; this estimates a new run (`fanout run --fresh`)"
        )
    units, projection = estimate.units, estimate.projection
    if units is None or projection is None:
        found.append(
            "no earlier run: no estimate"
            if not estimate.runs
            else "no unit settled after running in the earlier runs: no estimate"
        )
        found.append(_units_line(sorting))
        return _headed(found + _first(sorting))
    latest = estimate.runs[0]
    total = units.all.units
    sample = estimate.sample
    sampled = (
        f", {sample.units:,} of them sampled"
        if sample is not None and sample.units < sample.settled
        else ""
    )
    found.append(
        f"from {len(estimate.runs)} earlier run(s): {total:,.0f} unit(s) settled after"
        f" running{sampled} (latest {latest.id}: {latest.attempts:,} attempt(s),"
        f" {format_duration(latest.wall)} wall)"
    )
    found.append(_units_line(sorting))
    found += _first(sorting)
    # Spend where the runs recorded any (through the gateway, or an agent's own count).
    spent = bool(units.apis)
    ladder = {rung.name for rung in spec.retry.ladder}
    for rung in estimate.rungs:
        gone = "" if rung.rung in ladder else " (not in the ladder now)"
        cost = f" and costs {_usd(rung.cost_usd)}" if spent else ""
        found.append(
            f"rung {rung.rung}{gone}: reached by {rung.units:,.0f} of {total:,.0f} unit(s)"
            f" ({rung.units / total:.0%}), {rung.attempts / rung.units:.2f} attempt(s) each;"
            f" an attempt takes {_seconds(rung.seconds)}{cost}"
        )
    each = units.all
    found.append(
        f"a unit takes {each.attempts / total:.2f} attempt(s),"
        f" {format_duration(each.seconds / total)} active"
        + (f", and spends {_usd(units.spend)}" if spent else "")
    )
    gib = "" if projection.gib_seconds is None else f", {projection.gib_seconds:,.1f} GiB-seconds"
    spend = projection.spend
    found.append(
        f"next run: {projection.attempts:,.1f} attempt(s), {format_duration(projection.seconds)}"
        f" active{gib}"
        + (f", spend p50 {usd_text(spend.p50)}, p90 {usd_text(spend.p90)}" if spent else "")
    )
    if estimate.wall:
        top, *rest = estimate.wall
        then = "; then " + ", ".join(
            f"{bound.by} {format_duration(bound.seconds)}" for bound in rest[:3]
        )
        found.append(
            f"wall time about {format_duration(top.seconds)}, set by {top.by}"
            + (then if rest else "")
        )
    for budget in estimate.budgets:
        found.append(
            _budget_line(budget.name, budget.budget_usd, budget.p90_usd, budget.spent_all, total)
        )
    return _headed(found)


def _budget_line(
    name: str, budget: float, p90: float, spent_all: float | None, total: float
) -> str:
    verdict = "under" if p90 < budget else "OVER"
    if spent_all is not None:
        text = f"{name} {usd_text(budget)} per unit: a unit's p90 {usd_text(p90)} is {verdict} it"
        return text + f"; {spent_all:,.0f} of {total:,.0f} past unit(s) spent it all"
    return f"{name} {usd_text(budget)} per run: the run's p90 {usd_text(p90)} is {verdict} it"


def _first(sorting: Sorting) -> list[str]:
    if not sorting.sorted or sorting.to_run in (0, sorting.selected):
        return []
    more = sorting.to_run - len(sorting.first)
    return [f"first to run: {', '.join(sorting.first)}" + (f" and {more:,} more" if more else "")]


def _headed(found: list[str]) -> list[str]:
    return [f"{'Estimate' if n == 0 else '':<10}{line}" for n, line in enumerate(found)]


def _spread(spread: Spread, digits: int) -> dict[str, float]:
    return {
        "mean": round(spread.mean, digits),
        "p50": round(spread.p50, digits),
        "p90": round(spread.p90, digits),
    }


def document(estimate: Estimate) -> dict[str, Any]:
    """The estimate as ``fanout plan --format json`` gives it (``estimate`` null
    without history)."""
    sorting = estimate.sorting
    found: dict[str, Any] = {
        "units": {
            "selected": sorting.selected,
            "toRun": sorting.to_run,
            "again": sorting.again,
            "reused": sorting.reused,
            "quarantined": sorting.quarantined,
            "sorted": sorting.sorted,
            "firstToRun": list(sorting.first),
        },
        "unfinishedRun": estimate.unfinished,
        "sample": None
        if estimate.sample is None
        else {"settled": estimate.sample.settled, "sampled": estimate.sample.units},
        "history": [
            {
                "run": run.id,
                "state": run.state,
                "attempts": run.attempts,
                "wallSeconds": round(run.wall, 3),
            }
            for run in estimate.runs
        ],
        "estimate": None,
    }
    units, projection = estimate.units, estimate.projection
    if units is None or projection is None:
        return found
    each = units.all
    found["estimate"] = {
        "rungs": [
            {
                "rung": rung.rung,
                "units": round(rung.units),
                "reached": round(rung.units / each.units, 4),
                "attempts": round(rung.attempts),
                "attemptsPerUnit": round(rung.attempts / rung.units, 4),
                "attemptSeconds": _spread(rung.seconds, 3),
                "attemptUsd": _spread(rung.cost_usd, 6),
            }
            for rung in estimate.rungs
        ],
        "perUnit": {
            "units": round(each.units),
            "attempts": round(each.attempts / each.units, 4),
            "activeSeconds": round(each.seconds / each.units, 3),
            "spendUsd": _spread(units.spend, 6),
        },
        "next": {
            "units": projection.units,
            "attempts": round(projection.attempts, 2),
            "activeSeconds": round(projection.seconds, 3),
            "gibSeconds": None
            if projection.gib_seconds is None
            else round(projection.gib_seconds, 3),
            "spendUsd": _spread(projection.spend, 6),
            "apis": {
                name: {
                    "usage": {key: round(value, 2) for key, value in api.usage.items()},
                    "spendUsd": _spread(api.spend, 6),
                }
                for name, api in projection.apis.items()
            },
        },
        "wall": [{"by": bound.by, "seconds": round(bound.seconds, 3)} for bound in estimate.wall],
        "budgets": [
            {
                "budget": budget.name,
                "usd": budget.budget_usd,
                "p90Usd": round(budget.p90_usd, 6),
                "under": budget.under,
                **({} if budget.spent_all is None else {"spentAll": round(budget.spent_all)}),
            }
            for budget in estimate.budgets
        ],
    }
    return found
