"""What needs a person: a job's quarantined units (each failed the same way, unchanged,
in ``units.quarantineAfter`` runs in a row, and no run starts it until it changes or
``fanout release`` lets it), for the report, ``fanout status`` and ``fanout release``.
A run's failed units are ``failures``'.

Which streaks quarantine is the ``units.quarantineAfter`` the run (for status: the
job's latest run) recorded, so neither status nor the report needs the job file.  The
quarantined units are as the journal has them when the report is made: the report a
run writes at its end lists those it leaves, and ``fanout report RUN`` later lists
those still quarantined then.  Everything shown of a unit came from it or its worker
(the id, the reason, already redacted when it was stored) and passes through
``safetext`` on its way to a terminal or to markdown.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..journal import Journal, NeedsPerson, RunRow, Streak
from ..values import safetext
from ..values.quantities import usd_text
from . import budget

# Quarantined units report.md, report.json and ``fanout status`` list at most (the
# count says how many there are): a broken upstream can quarantine a whole backlog.
SHOWN_QUARANTINED = 200
# A quarantined unit's last reason is cut to this on one line (the run's report of the
# failure has it whole).
REASON_LIMIT = 160


def needs_person(journal: Journal, run_id: str, limit: int = SHOWN_QUARANTINED) -> NeedsPerson:
    """The quarantined units of ``run_id``'s job, those the run quarantined first."""
    run = journal.run(run_id)
    after = journal.quarantine_after(run_id) or 0
    return journal.needs_person(run.job, after, limit=limit, run_id=run_id)


def summary(journal: Journal, run_id: str) -> dict[str, Any]:
    """report.json's fields: ``quarantined``, how many of the job's units are
    quarantined (what a cron wrapper alerts on); ``newlyQuarantined``, how many of them
    this run quarantined; ``quarantineAfter``, the runs in a row that quarantine (null:
    a run an older fanout recorded); ``needsPerson``, the first ``SHOWN_QUARANTINED``
    of them (this run's first, then the longest failing), each its streak with ``new``
    (this run quarantined it)."""
    found = needs_person(journal, run_id)
    return {
        "quarantineAfter": journal.quarantine_after(run_id),
        "quarantined": found.count,
        "newlyQuarantined": found.new,
        "needsPerson": [
            {**streak.as_dict(), "new": streak.last_run == run_id} for streak in found.shown
        ],
    }


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _local(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M")


def _runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _reason(text: str) -> str:
    return safetext.one_line(text, REASON_LIMIT, ellipsis="...")


def quarantined_markdown(data: dict[str, Any], room: int) -> list[str]:
    """report.md's "Quarantined: needs a person" section (nothing without any), in at
    most ``room`` (``budget.size``): the rows that fit, and how many more there are."""
    if not data.get("quarantined"):
        return []
    md, code = safetext.for_markdown, safetext.code
    count, new = data["quarantined"], data["newlyQuarantined"]
    lines = [
        "### Quarantined: needs a person",
        "",
        f"{count} unit(s) failed the same way, unchanged, in {data['quarantineAfter']} or"
        " more runs in a row: no run starts them until they change or"
        " `fanout release JOB UNIT...` lets them."
        + (f" This run quarantined {new} of them (new)." if new else ""),
        "",
        "| unit | failure | runs | first seen | last seen | spent | last reason |",
        "| --- | --- | ---: | --- | --- | ---: | --- |",
    ]
    rows = (
        f"| {code(safetext.shorten(streak['unit'], budget.ID_CHARS))}"
        f"{' (new)' if streak['new'] else ''}"
        f" | {md(streak['failure'])} | {streak['runs']} | {_utc(streak['firstSeen'])}"
        f" | {_utc(streak['lastSeen'])} | {usd_text(streak['costUsd'])}"
        f" | {md(_reason(streak['reason']))} |"
        for streak in data["needsPerson"]
    )
    return budget.fit_rows(lines, rows, room, count, "{count} more quarantined unit(s).")


def status_lines(journal: Journal, run: RunRow, *, shown: int, indent: str = "") -> list[str]:
    """``fanout status``'s "needs a person" lines for the job of ``run`` (the job's
    latest run, or the run asked about): how many of its units are quarantined, the
    command that releases one, and each (at most ``shown``) with its failure, runs,
    first and last seen (local time), what it spent and its last reason."""
    found = needs_person(journal, run.id, limit=shown)
    if not found.count:
        return []
    term = safetext.for_terminal
    release_command = f"fanout release {shlex.quote(run.job_file)} UNIT..."
    lines = [
        f"{indent}needs a person: {found.count} quarantined unit(s) of {term(run.job)}"
        f" ({term(release_command)} lets one run again)"
    ]
    cells = [
        (
            term(streak.unit),
            term(streak.failure),
            _runs(streak.runs),
            f"since {_local(streak.first_at)}",
            f"last {_local(streak.last_at)}",
            usd_text(streak.cost_usd),
            term(_reason(streak.reason)),
        )
        for streak in found.shown
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))] if cells else []
    lines += [
        (f"{indent}  " + "  ".join(c.ljust(widths[i]) for i, c in enumerate(row))).rstrip()
        for row in cells
    ]
    if found.count > len(found.shown):
        lines.append(f"{indent}  and {found.count - len(found.shown)} more (-n N lists more)")
    return lines


@dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    """What ``fanout release`` did for one unit: ``released`` its streak, or not
    (``streak`` None: the unit has no failures on record)."""

    unit: str
    released: bool
    streak: Streak | None


def release(journal: Journal, job: str, after: int, units: Sequence[str]) -> list[Release]:
    """Release each of ``units`` of ``job`` that is quarantined now (``after`` runs
    failing alike, not released): the next run starts it, and a failure there starts
    its streak from one.  A unit that is not quarantined is left as it is: releasing a
    streak that has not reached ``after`` would throw its count away."""
    streaks = journal.streaks(job, units)
    done: list[Release] = []
    for unit in dict.fromkeys(units):
        streak = streaks.get(unit)
        if streak is None or not _quarantines(streak, after):
            done.append(Release(unit=unit, released=False, streak=streak))
            continue
        released = journal.release(job, unit)
        done.append(Release(unit=unit, released=released is not None, streak=released))
    return done


def _quarantines(streak: Streak, after: int) -> bool:
    return after > 0 and streak.runs >= after and not streak.released


def release_text(job: str, after: int, done: Sequence[Release]) -> tuple[str, str]:
    """What ``fanout release`` says: the units it released, each with its streak (for
    stdout), and why each other unit was not released (for stderr)."""
    term = safetext.for_terminal
    said, refused = [], []
    for item in done:
        unit, streak = term(item.unit), item.streak
        if item.released and streak is not None:
            said.append(
                f"released {unit}: it failed the same way ({term(streak.failure)}) in"
                f" {_runs(streak.runs)} in a row since {_local(streak.first_at)}, spending"
                f" {usd_text(streak.cost_usd)}; last: {term(_reason(streak.reason))}."
                " The next run starts it."
            )
        elif streak is None:
            refused.append(
                f"fanout release: {unit} is not quarantined: {term(job)} has no failure"
                " of it on record"
            )
        elif after <= 0:
            refused.append(
                f"fanout release: {unit} is not quarantined: units.quarantineAfter is 0,"
                " which quarantines nothing"
            )
        elif streak.released:
            refused.append(
                f"fanout release: {unit} is not quarantined: it was released, and the next"
                " run starts it"
            )
        else:
            refused.append(
                f"fanout release: {unit} is not quarantined: it failed the same way in"
                f" {_runs(streak.runs)} in a row, and {_runs(after)} quarantine it"
            )
    return "".join(line + "\n" for line in said), "".join(line + "\n" for line in refused)
