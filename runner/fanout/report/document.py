"""The fan-in report of a run, built from the journal: ``report.json`` for machines and
``report.md`` ready to paste into a pull request comment.

It shows totals, wall time against summed worker time and the speed-up the pool
achieved, per-unit status with the rung reached and the attempts used, the files each
unit changed with a diffstat, and the failures grouped by reason with the end of some
outputs.  report.md keeps under GitHub's limit on a comment whatever the run did
(``budget``): the summary first, whole; then what needs a person (quarantined units,
failures), then the changed files and the units, which shrink first; and a line near
the top that says where the full detail is (report.json and the logs).
"""

from __future__ import annotations

import itertools
import json
import json.encoder as json_encoder
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from ..journal import Journal, UnitRow
from ..journal.ceilings import label
from ..outcome import UnitState
from ..values import safetext
from ..values.quantities import format_duration
from . import accounting, attention, budget, compute, failures, fleet, skipped

if TYPE_CHECKING:
    from ..pacing.ceiling import Learned

SHOWN_UNITS = 200

T = TypeVar("T")


def summary(journal: Journal, run_id: str) -> dict[str, Any]:
    """The run-level part of the report (everything but the unit lists), from
    aggregate queries: its cost does not grow with the units held in memory."""
    run = journal.run(run_id)
    worker = journal.worker_seconds(run_id)
    counts = journal.unit_counts(run_id)
    tally = journal.attempt_tally(run_id)
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
        "totals": dict(sorted(counts.items())),
        # Active seconds x allocated memory, the seeds' cost model (``compute``).
        "compute": compute.totals(journal, run_id, tally=tally, counts=counts),
        # What the units' requests through the gateway used, per API (none without one).
        "apis": [usage.as_dict() for usage in journal.usage_totals(run_id)],
        "attempts": tally.by_status(),
        # An agent task's attempts by what its output said (agents.taxonomy.Kind).
        "agentOutcomes": tally.by_kind(),
        # Host states (lost, quarantined) are events, not journal rows: the run's event
        # log, in its folder beside the journal, says them.
        "hosts": fleet.hosts(
            tally.by_host(), journal.path.parent / "runs" / run_id / "events.jsonl"
        ),
        # The job's quarantined units: a count to alert on, and the first of them.
        **attention.summary(journal, run_id),
    }


def _changes(
    journal: Journal, run_id: str, keys: list[tuple[int, str]]
) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """The changed files of a page of units, by (round, unit id)."""
    by_unit: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for change in journal.changes(run_id, keys):
        by_unit.setdefault((change["round"], change["unit"]), []).append(
            {
                "path": change["path"],
                "added": change["added"],
                "removed": change["removed"],
                "state": change["state"],
            }
        )
    return by_unit


def _pages(records: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(records)
    while page := list(itertools.islice(iterator, size)):
        yield page


def unit_lines(
    journal: Journal,
    run_id: str,
    *,
    with_memory: bool | None = None,
    units: Iterable[tuple[int, str]] | None = None,
) -> Iterator[str]:
    """Every unit of every round of the run in order (or those of ``units``, round and
    id pairs, in the order given), each as its line of report.json: compact JSON, one
    object a unit.  SQLite makes each object up to its ``changes``
    (``Journal.unit_objects``); a page of 500 at a time, the changes, usage, budget and
    the output tail of a unit that did not succeed are added here, with an encoder
    whose separators and escapes are SQLite's (``json_object``).  ``with_memory``:
    whether an attempt of the run declared a memory (``gibSeconds``), read here
    unless given."""
    with_changes = journal.has_changes(run_id)
    with_usage = journal.has_usage(run_id)
    budget = journal.unit_budget(run_id)
    if with_memory is None:
        with_memory = journal.attempt_tally(run_id).memory_max is not None
    # What every unit adds when it has nothing more: no changes, no usage, no budget.
    plain = _COMPACT({"changes": []})[1:]
    objects = journal.unit_objects(run_id, with_memory=with_memory, units=units)
    for page in _pages(objects, 500):
        keys = [(number, unit) for number, unit, _, _ in page]
        usage = journal.usage_of(run_id, keys) if with_usage else {}
        by_unit = _changes(journal, run_id, keys) if with_changes else {}
        for number, unit, head, tail in page:
            changes = by_unit.get((number, unit))
            if not (changes or with_usage or budget is not None or tail is not None):
                yield f"{head[:-1]},{plain}"
                continue
            more: dict[str, Any] = {"changes": changes or []}
            if with_usage:
                more["usage"] = [u.as_dict() for u in usage.get((number, unit), [])]
            if budget is not None:  # task.budget: the most the unit could spend
                more["budget"] = {"usd": budget}
            if tail is not None:
                more["outputTail"] = tail
            yield f"{head[:-1]},{_COMPACT(more)[1:]}"


def unit_records(
    journal: Journal,
    run_id: str,
    *,
    with_memory: bool | None = None,
    units: Iterable[tuple[int, str]] | None = None,
) -> Iterator[dict[str, Any]]:
    """The units as report.json lists them (``unit_lines``), as dicts."""
    return map(json.loads, unit_lines(journal, run_id, with_memory=with_memory, units=units))


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
    failed id) is one line, which keeps 100k units greppable, and SQLite writes most of
    a unit's line (``unit_lines``)."""
    run = summary(journal, run_id)
    head = json.dumps(run, indent=2, ensure_ascii=False)
    out.write(head[: -len("\n}")] + ',\n  "units": ')
    with_memory = run["compute"]["memoryBytes"] is not None
    _write_lines(out, unit_lines(journal, run_id, with_memory=with_memory))
    out.write(',\n  "failed": ')
    # None failed in its latest round (the totals count those): no scan for their ids.
    failed = journal.failed_ids(run_id) if run["totals"].get(str(UnitState.FAILED)) else ()
    _write_lines(out, map(_COMPACT, failed))
    out.write("\n}\n")


def _compact() -> Callable[[Any], str]:
    """One encoder for what report.json's unit lines add to SQLite's objects, with
    ``json_object``'s separators (none of Python's spaces) and the same escapes (both
    escape quotes, backslashes and control characters only, with the same short forms,
    and keep the rest as UTF-8).  ``JSONEncoder.encode`` makes a new C encoder per
    call, so the C encoder is made once, without the check for cycles (``markers``),
    which values read from the journal cannot have."""
    options = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
    make = getattr(json_encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython has the C encoder
        return options.encode
    encode = make(
        None,
        options.default,
        json_encoder.encode_basestring,
        None,
        options.key_separator,
        options.item_separator,
        options.sort_keys,
        options.skipkeys,
        options.allow_nan,
    )
    return lambda value: "".join(encode(value, 0))


_COMPACT = _compact()


def _write_lines(out: TextIO, lines: Iterable[str]) -> None:
    """A JSON list of ``lines`` (each a JSON value's text), one value a line."""
    first = True
    for page in _pages(lines, 500):
        out.write(("[\n    " if first else ",\n    ") + ",\n    ".join(page))
        first = False
    out.write("[]" if first else "\n  ]")


def markdown_data(journal: Journal, run_id: str) -> dict[str, Any]:
    """What report.md shows, read with bounded queries: the run's summary, at most
    SHOWN_UNITS units for the units and changed-files tables (the first units, the ones
    that changed files), the failed units grouped by reason (``failures.read``), with
    the counts that say how many more report.json has, and where that detail is."""
    first = list(itertools.islice(journal.units(run_id, batch=SHOWN_UNITS), SHOWN_UNITS))
    changed_count, changed = journal.changed_units(run_id, SHOWN_UNITS)
    chosen: dict[tuple[int, str], UnitRow] = {}
    for row in (*first, *changed):
        chosen.setdefault((row.round, row.unit.id), row)
    # Selection order keeps the first SHOWN_UNITS units first, where the units table
    # takes them from.
    rows = sorted(chosen.values(), key=lambda r: (r.round, r.unit.index))
    run = summary(journal, run_id)
    with_memory = run["compute"]["memoryBytes"] is not None
    keys = [(r.round, r.unit.id) for r in rows]
    return {
        **run,
        "units": list(unit_records(journal, run_id, with_memory=with_memory, units=keys)),
        "failures": failures.read(journal, run_id),
        "unitCount": journal.unit_count(run_id),
        "changedCount": changed_count,
        "reusedUnits": skipped.reused_units(journal, run_id),
        "detail": detail(journal, run_id),
    }


def detail(journal: Journal, run_id: str) -> dict[str, str]:
    """Where the run's full detail is, as report.md names it: report.json and the logs
    folder (``logs/<unit folder>/r<round>-a<attempt>.log``) in the run's folder.

    The report knows the state directory (the journal's folder), not the workspace, and
    ``fanout report`` may rebuild it from anywhere; a CI machine's absolute path tells
    the reader of a pull request nothing.  So the paths start at the state directory's
    name: in the usual layout (``runtime.stateDir`` left at ``.fanout``) that is the
    path relative to the workspace, as report.md names changed files."""
    run_folder = Path(journal.path.parent.name) / "runs" / run_id
    return {
        "json": (run_folder / "report.json").as_posix(),
        "logs": (run_folder / "logs").as_posix() + "/",
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
    """The report as markdown for a pull request comment, in at most ``budget.BUDGET``
    (``budget.size``).  The summary is whole; the sections below it are rendered into
    what it leaves, in order of priority: quarantined units (at least a third of it),
    failed units, then changed files and the units table, which shrink first.  Each
    says how many it left out.  ``budget.cut`` is the last guard, for a summary no
    section could foresee (thousands of hosts or limits).  Everything that came from a
    unit or a worker (ids, reasons, paths, output, notes) goes through ``safetext``, so
    none of it can add markup, HTML or control characters of its own."""
    top = [
        *_headline(data),
        *_detail(data),
        *_times(data),
        *_agent_outcomes(data),
        *_rounds(data),
        *skipped.markdown(data),
        *_limit_lines(data["limits"]),
        *compute.markdown(data["compute"]),
        *accounting.markdown(data.get("apis", [])),
        *fleet.markdown(data.get("hosts", [])),
    ]
    # Each section may take what the ones below it do not need, and at least its share:
    # quarantined units a third, failed units the rest, the tables half each.
    room = max(0, budget.BUDGET - budget.lines_size(top) - 2 * _LOW_RESERVE)
    failed_units = data.get("failures", failures.NONE)
    failed_wanted = budget.lines_size(failures.markdown(failed_units, room))
    quarantined = attention.quarantined_markdown(data, room - min(failed_wanted, room * 2 // 3))
    room -= budget.lines_size(quarantined)
    failed = failures.markdown(failed_units, room)
    room += 2 * _LOW_RESERVE - budget.lines_size(failed)
    units_wanted = budget.lines_size(_units(data, budget.BUDGET))
    changed = _changed_files(data, room - min(units_wanted, room // 2))
    units = _units(data, room - budget.lines_size(changed))
    lines = [*top, *quarantined, *failed, *changed, *units]
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(budget.cut(lines, budget.BUDGET, _cut_line(data))) + "\n"


# Kept for each of the two tables that shrink first, so the sections above them cannot
# leave them no room to say they exist and how many rows report.json has.
_LOW_RESERVE = 400


def _detail(data: dict[str, Any]) -> list[str]:
    """Where the full detail is (nothing for a dict without it, as ``build`` makes)."""
    if "detail" not in data:
        return []
    code = safetext.code
    return [
        f"Full detail: every unit with its reason and output tail in"
        f" {code(data['detail']['json'])}; each attempt's whole output in"
        f" {code(data['detail']['logs'])}.",
        "",
    ]


def _cut_line(data: dict[str, Any]) -> str:
    where = data.get("detail", {}).get("json", "report.json")
    return (
        f"This report was cut here to stay under GitHub's limit of"
        f" {budget.MARKDOWN_LIMIT:,} characters; the rest is in {safetext.code(where)}."
    )


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


def _changed_files(data: dict[str, Any], room: int) -> list[str]:
    """The files each shown unit changed, with their diffstat, in at most ``room``."""
    changed = [(u, c) for u in data["units"] for c in u["changes"]]
    if not changed:
        return []
    code = safetext.code
    head = [
        "### Changed files",
        "",
        "| file | unit | round | +/- | state |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    rows = (
        f"| {code(change['path'])} | {code(safetext.shorten(unit['unit'], budget.ID_CHARS))}"
        f" | {unit['round']} | +{change['added']} -{change['removed']}"
        f" | {safetext.for_markdown(change['state'])} |"
        for unit, change in changed
    )
    more_units = data.get("changedCount", 0) - len({(u["round"], u["unit"]) for u, _ in changed})
    units_line = [f"{more_units} more unit(s) changed files, in report.json.", ""]
    lines = budget.fit_rows(
        head,
        rows,
        room - (budget.lines_size(units_line) if more_units > 0 else 0),
        len(changed),
        "{count} more changed file(s) of these units in report.json.",
    )
    if lines and more_units > 0:
        lines += units_line  # fit_rows ends on a blank line: not read as a table row
    return lines


def _units(data: dict[str, Any], room: int) -> list[str]:
    """The first SHOWN_UNITS units, with their usage where the run called APIs, in at
    most ``room``."""
    md, code = safetext.for_markdown, safetext.code
    with_usage = bool(data.get("apis"))
    head, rule = accounting.unit_columns() if with_usage else ("", "")
    lines = [
        "### Units",
        "",
        "| unit | round | state | rung | attempts | time |" + head,
        "| --- | ---: | --- | --- | ---: | ---: |" + rule,
    ]
    rows = (
        f"| {code(safetext.shorten(unit['unit'], budget.ID_CHARS))} | {unit['round']}"
        f" | {md(unit['state'])} | {md(unit['rung']) or '-'} | {unit['attempts']}"
        f" | {format_duration(unit['workerSeconds'])} |"
        + (accounting.unit_cells(unit.get("usage", [])) if with_usage else "")
        for unit in data["units"][:SHOWN_UNITS]
    )
    total = data.get("unitCount", len(data["units"]))
    return budget.fit_rows(lines, rows, room, total, "{count} more unit(s) in report.json.")


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
    from ..pacing.ceiling import Learned  # here: pacing imports the spec, report.json never

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
