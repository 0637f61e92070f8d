"""What report.html shows of a run, as compact JSON-ready data: the summary (the same
as report.json's), one row per unit (its latest round), every attempt (for the
timeline), the throttle pauses and per-API request windows, and per-unit detail
(``detail``) up to a byte budget, so a 10,000-unit run's page stays small.

Units and attempts are arrays of arrays with a key list (``unitKeys``,
``attemptKeys``), not a dict per row: a 10,000-unit run's rows are about 1 MB."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..journal import Journal
from ..outcome import UnitState
from ..report import document
from . import detail, timeline

# One row per unit id: its latest round, what report.json's totals count.
UNIT_KEYS = ("unit", "state", "rung", "host", "round", "attempts", "seconds", "cost", "reason")
ATTEMPT_KEYS = (
    "unit",
    "round",
    "n",
    "rung",
    "host",
    "start",
    "end",
    "status",
    "exit",
    "kind",
    "reason",
)
# A reason longer than this is cut in the table row; the unit's detail has it whole.
REASON_CHARS = 300

Transcripts = Callable[[str | None, bytes], list[dict[str, Any]]]


def no_transcript(agent: str | None, output: bytes) -> list[dict[str, Any]]:
    """The default transcript reader: none (``agents.transcript.parse`` plugs in here)."""
    return []


def build(
    journal: Journal,
    run_id: str,
    run_dir: Path,
    *,
    job: Any = None,
    transcript_of: Transcripts = no_transcript,
    detail_budget: int = detail.BUDGET,
) -> dict[str, Any]:
    """The page's data for ``run_id``.  ``job``: the run's loaded Spec, when its job file
    can still be loaded (each attempt's argv, prompt and env names are re-rendered from
    it); ``transcript_of``: reads an agent attempt's log into turns."""
    summary = document.summary(journal, run_id)
    attempts = _attempts(journal, run_id)
    hosts: dict[tuple[int, str], str] = {}
    for row in attempts:
        hosts[(row[1], row[0])] = row[4]
    units, order = _units(journal, run_id, hosts)
    events = timeline.read_events(run_dir / "events.jsonl")
    return {
        "version": 1,
        "summary": summary,
        # The job's agent preset (the page shows each attempt's transcript), if known.
        "agent": None if job is None else job.task.agent,
        "spend": round(sum(u[7] or 0 for u in units), 6),
        "budget": journal.unit_budget(run_id),
        "unitKeys": list(UNIT_KEYS),
        "units": units,
        "attemptKeys": list(ATTEMPT_KEYS),
        "attempts": attempts,
        "lanes": timeline.lanes(attempts),
        "pauses": timeline.pauses(events),
        "apis": timeline.api_windows(journal, run_id, summary, attempts),
        "details": detail.details(
            journal,
            run_id,
            run_dir,
            order,
            job=job,
            transcript_of=transcript_of,
            budget=detail_budget,
        ),
    }


def _attempts(journal: Journal, run_id: str) -> list[list[Any]]:
    rows = journal.attempt_rows(run_id)
    return [
        [
            r["unit"],
            r["round"],
            r["n"],
            r["rung"],
            r["host"] or "local",
            round(r["started"], 3),
            None if r["finished"] is None else round(r["finished"], 3),
            r["status"] or "running",
            r["exit_code"],
            r["kind"],
            _short(r["reason"]),
        ]
        for r in rows
    ]


def _units(
    journal: Journal, run_id: str, hosts: dict[tuple[int, str], str]
) -> tuple[list[list[Any]], list[tuple[int, str, str]]]:
    """The unit rows, and (round, id, state) of each in the order details are chosen:
    the units that did not succeed first (what a reader opens), then the rest."""
    costs = journal.unit_costs(run_id)
    rows = journal.latest_units(run_id)
    units = []
    for r in rows:
        key = (r["round"], r["id"])
        cost = costs.get(key)
        units.append(
            [
                r["id"],
                r["state"],
                str(r["rung"]),
                hosts.get(key, ""),
                r["round"],
                r["attempts"],
                round(r["worker_seconds"], 3),
                None if cost is None else round(cost, 6),
                _short(r["reason"]),
            ]
        )
    fine = (UnitState.SUCCEEDED, UnitState.REUSED)
    order = sorted(
        ((u[4], u[0], u[1]) for u in units), key=lambda k: k[2] in fine
    )  # stable: selection order within each part
    return units, order


def _short(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def to_json(data: dict[str, Any]) -> str:
    """The data as JSON safe inside an HTML ``<script>`` element: every ``<`` written
    as ``\\u003c`` so no value can close the element or open a comment, and ``://`` as
    ``:\\/\\/`` so the page holds no URL a scanner could take for a request it makes."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("://", ":\\/\\/")
