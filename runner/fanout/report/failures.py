"""report.md's failures: each unit whose latest round failed, once, grouped by its reason,
fitted into the room the rest of the report leaves.

A unit that failed in several rounds is one line, as its last round left it (a unit that
failed in round 1 and succeeded in round 2 is not failed).  Units that failed alike are
one group under their reason, the reasons with the most units first, because one cause
behind 400 failures is what a reader fixes first.  What fits is decided in this order,
each step only in the room the one before left:

1. every reason with its first unit (the reasons a budget cannot hold are counted);
2. the end of the output of the first unit of the first ``SHOWN_TAILS`` reasons, at
   most ``TAIL_CHARS`` each and a quarter of the room in all: units failing for one
   reason mostly print the same, and the logs hold every attempt's output whole;
3. the other units, dealt round-robin over the reasons (the second unit of each, then
   the third...), so no reason's units crowd out another's.

Whatever is left out is counted, and report.json lists it.  Everything shown came from a
unit or its worker (the id, the reason, already redacted when it was stored, the output)
and passes through ``safetext``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..journal import FailedUnit, Journal
from ..values import safetext
from . import budget

# Reasons whose first unit's output is shown, at most.
SHOWN_TAILS = 10
# The end of an output shown, in characters (the journal keeps runtime.outputTail).
TAIL_CHARS = 1_000
# A reason longer than this is shortened in its group's heading (report.json has it
# whole); ids are shortened to budget.ID_CHARS.
REASON_CHARS = 300
# The least a unit's line weighs ("- <code>a</code>: round 1, rung -, 1 attempt(s)"):
# no more units than BUDGET // UNIT_LINE_MIN could ever be shown, so no more are read.
UNIT_LINE_MIN = 48
READ = budget.BUDGET // UNIT_LINE_MIN


@dataclass(frozen=True, kw_only=True, slots=True)
class Group:
    """The failed units of one reason: how many there are, the first of them that were
    read (selection order), and the end of the first one's output ("" when not read)."""

    reason: str
    count: int
    units: tuple[FailedUnit, ...]
    tail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Failures:
    """A run's failed units: how many, for how many reasons, and the groups read."""

    count: int
    reasons: int
    groups: tuple[Group, ...]


NONE = Failures(count=0, reasons=0, groups=())


def read(journal: Journal, run_id: str) -> Failures:
    """The run's failed units as report.md can show them, in two grouped queries over the
    failed units (at most ``READ`` rows returned) and one for ``SHOWN_TAILS`` tails: a
    100k-unit run reads no more than a 100-unit one."""
    count, reasons = journal.failure_counts(run_id)
    if not count:
        return NONE
    by_reason: dict[str, list[FailedUnit]] = {}
    for unit in journal.failed_by_reason(run_id, READ):
        by_reason.setdefault(unit.reason, []).append(unit)
    firsts = [(units[0].round, units[0].id) for units in list(by_reason.values())[:SHOWN_TAILS]]
    tails = journal.tails(run_id, firsts)
    return Failures(
        count=count,
        reasons=reasons,
        groups=tuple(
            Group(
                reason=reason,
                count=units[0].in_group,
                units=tuple(units),
                tail=_end(tails.get((units[0].round, units[0].id), "")),
            )
            for reason, units in by_reason.items()
        ),
    )


def _end(output: str) -> str:
    """The last TAIL_CHARS characters of ``output``, from the start of a line where the
    cut leaves one whole."""
    output = output.rstrip()
    if len(output) <= TAIL_CHARS:
        return output
    kept = output[-TAIL_CHARS:]
    newline = kept.find("\n")
    return kept[newline + 1 :] if 0 <= newline < len(kept) - 1 else kept


def _unit_line(unit: FailedUnit) -> str:
    md = safetext.for_markdown
    again = f", failed in {unit.rounds} rounds" if unit.rounds > 1 else ""
    return (
        f"- {safetext.code(safetext.shorten(unit.id, budget.ID_CHARS))}: round {unit.round},"
        f" rung {md(unit.rung) or '-'}, {unit.attempts} attempt(s){again}"
    )


def _heading(group: Group) -> list[str]:
    reason = safetext.one_line(group.reason, REASON_CHARS) or "(no reason recorded)"
    return [f"#### {group.count} unit(s): {safetext.for_markdown(reason)}", ""]


def _more_line(group: Group, shown: int) -> str:
    return f"{group.count - shown} more unit(s) with this reason in report.json."


def _tail_block(group: Group) -> list[str]:
    html, first = safetext.for_html, group.units[0]
    return [
        f"<details><summary>The end of the output of"
        f" <code>{html(safetext.shorten(first.id, budget.ID_CHARS))}</code></summary>",
        "",
        safetext.code_fence(group.tail),
        "</details>",
        "",
    ]


def _rest_line(failures: Failures, admitted: list[Group]) -> str:
    units = failures.count - sum(g.count for g in admitted)
    return (
        f"{units} more failed unit(s), for {failures.reasons - len(admitted)} more reason(s),"
        ' in report.json (its "failed" list has every id).'
    )


def _dealt(groups: list[Group]) -> Iterator[int]:
    """Group indexes round-robin: each group's second unit, then each one's third..."""
    depth = 1
    while any(depth < len(g.units) for g in groups):
        yield from (i for i, g in enumerate(groups) if depth < len(g.units))
        depth += 1


def markdown(failures: Failures, room: int) -> list[str]:
    """The "Failed: needs a human" section in at most ``room`` (``budget.size``), in the
    order of priority the module's docstring gives; nothing without failed units."""
    if not failures.count:
        return []
    head = [
        "### Failed: needs a human",
        "",
        f"{failures.count} unit(s) failed, for {failures.reasons} reason(s); each is"
        " listed once, as its last round left it.",
        "",
    ]
    weigh = budget.lines_size
    # The closing count is always reserved: it costs a line, and it is what says that
    # the list is whole or not.
    used = weigh(head) + weigh([_rest_line(failures, []), ""])
    admitted: list[Group] = []
    for group in failures.groups:
        cost = weigh([*_heading(group), _unit_line(group.units[0])])
        cost += weigh(["", _more_line(group, 0), ""]) if group.count > 1 else weigh([""])
        if used + cost > room:
            break
        admitted.append(group)
        used += cost
    if not admitted:
        return []
    tails: set[int] = set()
    tail_room = used + room // 4
    for index, group in enumerate(admitted[:SHOWN_TAILS]):
        cost = weigh(_tail_block(group))
        if group.tail and used + cost <= min(room, tail_room):
            tails.add(index)
            used += cost
    shown = [1] * len(admitted)
    for index in _dealt(admitted):
        cost = weigh([_unit_line(admitted[index].units[shown[index]])])
        if used + cost > room:
            break
        shown[index] += 1
        used += cost
    lines = list(head)
    for index, group in enumerate(admitted):
        lines += _heading(group)
        lines += [_unit_line(unit) for unit in group.units[: shown[index]]]
        lines.append("")
        if group.count > shown[index]:
            lines += [_more_line(group, shown[index]), ""]
        if index in tails:
            lines += _tail_block(group)
    if len(admitted) < failures.reasons:
        lines += [_rest_line(failures, admitted), ""]
    return lines
