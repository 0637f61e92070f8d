"""What a run did not run again, and why, for report.md: the units it reused (unchanged
since an earlier run's success, whose result counts: each with the run it came from)
and, per round, the units that round did not retry (unchanged since they failed in an
earlier round of the run).  Quarantined units are ``attention``'s: a person must act.

report.json has the same: each reused unit's record its ``reusedFrom``, each round
its ``unchanged``.
"""

from __future__ import annotations

from typing import Any

from ..journal import Journal
from ..outcome import UnitState
from ..values import safetext

# Reused units report.md names at most: they are the uneventful ones (report.json lists
# every unit, each reused one with its reusedFrom).
SHOWN_REUSED = 20


def reused_units(journal: Journal, run_id: str) -> list[dict[str, str]]:
    """The run's first ``SHOWN_REUSED`` reused units, in round and selection order, each
    with the run its result came from."""
    rows = journal.units_in_state(run_id, UnitState.REUSED, SHOWN_REUSED)
    return [{"unit": row.unit.id, "from": row.reused_from or ""} for row in rows]


def markdown(data: dict[str, Any]) -> list[str]:
    """The reused units, grouped by the run each came from, then one line per round that
    did not retry units."""
    lines: list[str] = []
    reused = data.get("reusedUnits", [])
    count = data["totals"].get(UnitState.REUSED, 0)
    if count and reused:
        code = safetext.code
        by_run: dict[str, list[str]] = {}
        for item in reused:
            by_run.setdefault(item["from"], []).append(code(item["unit"]))
        sources = "; ".join(
            f"from run {code(run)}: {', '.join(units)}" for run, units in by_run.items()
        )
        more = f"; and {count - len(reused)} more in report.json" if count > len(reused) else ""
        lines += [
            f"Reused, not run: {count} unit(s) unchanged since they succeeded in an earlier"
            f" run ({sources}{more}).",
            "",
        ]
    for item in data["rounds"]:
        unchanged, number = item.get("unchanged", 0), item["round"]
        if unchanged:
            since = "round 1" if number == 2 else f"round {number - 1} or before"
            lines += [
                f"Round {number}: {unchanged} unit(s) not retried: unchanged since they"
                f" failed in {since}.",
                "",
            ]
    return lines
