"""report.md's size: GitHub's limit, the budget the report is rendered against, rows
fitted into a share of it, and the guard that cuts a finished document below it.

GitHub refuses a pull request body or comment over 65,536 characters, and a report that
does not fit is a report nobody reads.  The report is kept to ``BUDGET``, a margin below
the limit, counted the way GitHub may count it (``size``), so it fits whatever the units
printed: sections are rendered into the room left to them (``fit_rows``), and ``cut``
is the last guard, for whatever a section did not foresee.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# GitHub's limit on a pull request body or comment, in characters.
MARKDOWN_LIMIT = 65_536
# Kept free below the limit: a CI step that posts the report often adds a line of its
# own (a heading, the ``<!-- marker -->`` a bot finds its comment by, a link to the job).
MARGIN = 1_536
# The most report.md may weigh, in ``size``'s units: the report stays strictly under
# MARKDOWN_LIMIT even after a wrapper adds MARGIN characters.
BUDGET = MARKDOWN_LIMIT - MARGIN
# An id listed in report.md is shortened to this many characters (report.json has it
# whole): one unit's 10,000-character id must not take the room of fifty units.
ID_CHARS = 200


def size(text: str) -> int:
    """What ``text`` weighs against GitHub's limit, counted high on purpose: in UTF-16
    code units (a character outside the BMP, an emoji in a unit id, counts two in a
    browser's ``maxlength``), and each newline twice (a report pasted into GitHub's form
    is sent with CRLF line ends)."""
    return len(text.encode("utf-16-le")) // 2 + text.count("\n")


def lines_size(lines: Iterable[str]) -> int:
    """The weight of ``lines`` joined as ``render`` joins them, a newline after each."""
    return sum(size(line) + 2 for line in lines)


def fit_rows(head: list[str], rows: Iterable[str], room: int, total: int, more: str) -> list[str]:
    """``head`` and as many of ``rows`` as fit in ``room`` with the line saying how many
    of ``total`` were left out (``more`` formatted with ``count``), or nothing when not
    even the head and that line fit.  ``rows`` is read only as far as it fits."""
    used = lines_size(head)
    tail_room = lines_size(["", more.format(count=total), ""])
    lines, shown = list(head), 0
    for row in rows:
        weight = size(row) + 2
        if used + weight + tail_room > room:
            break
        lines.append(row)
        used += weight
        shown += 1
    if used + (tail_room if shown < total else 0) > room:
        return []
    if shown < total:
        # After a blank line: a line right below a table would be read as its last row.
        lines += ["", more.format(count=total - shown)]
    return [*lines, ""]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Open:
    """Where a scan of the document stands: inside a code fence (its backticks) or
    inside a ``<details>`` block."""

    fence: str = ""
    details: bool = False


def _after(line: str, state: _Open) -> _Open:
    stripped = line.strip()
    if state.fence:
        # CommonMark: a fence closes on a run of at least its own backticks, alone.
        closes = stripped.startswith(state.fence) and not stripped.strip("`")
        return _Open(details=state.details) if closes else state
    if stripped.startswith("```"):
        fence = stripped[: len(stripped) - len(stripped.lstrip("`"))]
        return _Open(fence=fence, details=state.details)
    if stripped.startswith("<details>"):
        return _Open(details=True)
    if stripped.startswith("</details>"):
        return _Open()
    return state


def cut(lines: list[str], budget: int, closing: str) -> list[str]:
    """``lines`` if they weigh at most ``budget``; else the longest run of their first
    lines that, with a blank line and ``closing`` (what was cut, where the rest is),
    weighs at most ``budget``, ending at a line where no code fence or ``<details>``
    block is open, so the markdown that remains renders as it would have whole."""
    if lines_size(lines) <= budget:
        return lines
    room = budget - lines_size(["", closing])
    used, state, keep = 0, _Open(), 0
    for number, line in enumerate(lines):
        used += size(line) + 2
        if used > room:
            break
        state = _after(line, state)
        if state == _Open():
            keep = number + 1
    return [*lines[:keep], "", closing]
