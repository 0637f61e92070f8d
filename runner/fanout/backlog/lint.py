"""Reading linters' text output (``format = "lint"``): one record per finding.

A finding is a line ``path:line[:col[:end_line:end_col]]: rest``.  ``rest`` is read for a
severity and a code in the shapes common linters print them, tried in this order:

====================  ===============================================================
pylint (parseable)    ``[C0414(useless-import-alias), obj] message``
pylint (text)         ``C0414: message (useless-import-alias)``
ruff, flake8          ``F401 message`` (ruff's ``[*]`` fixable mark is dropped)
eslint (``unix``)     ``message [Error/no-var]`` (``[Error]`` alone: a parse error)
gcc, mypy, shellcheck ``error: message [SC2086]`` (any severity word, any code last)
====================  ===============================================================

A record is ``{path, line, col, message, code, severity, notes}``; ``col``, ``code`` and
``severity`` are null when the line has none.  ``severity`` is the linter's own word,
lowercased (``error``, ``warning``, ``note``; pylint's category from its code's letter:
``convention``, ``refactor``, ``warning``, ``error``, ``fatal``, ``info``), so a job can
tell them apart however its linter spells them.  For pylint the message keeps the
symbol, as pylint's own text output shows it: ``Unused import sys (unused-import)``.

A note without a code of its own (mypy's ``note: "list" is invariant``, gcc's ``note:
declared here``) explains the finding before it: it goes into that finding's ``notes``
as ``{path, line, col, message}``, not into a record of its own.  A note with a code
(shellcheck's info and style findings print as ``note: ... [SC2086]``) is a finding,
and so is a note that no finding precedes (mypy's ``reveal_type``).  So a finding is
yielded when the next finding (or the end of the output) shows that no more notes
follow: the stream runs one finding behind the linter.

Lines that are not findings are skipped: summaries, gcc's ``In function`` lines,
source excerpts and caret lines (they start with whitespace), and a location with no
message after it (gcc's ``In file included from a.c:1:``).  Colour codes are dropped
first: the input command inherits the coordinator's environment, and a
``FORCE_COLOR`` set for CI colours some linters' output even into a pipe.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

# The path starts with a non-space (an indented line is a source excerpt or a caret
# line); mypy's --show-error-end adds ``end_line:end_col:`` after the column.
_LOCATION = re.compile(
    r"^(?P<path>[^\s:][^:\n]*?):(?P<line>\d+):"
    r"(?:(?P<col>\d+):(?:\d+:\d+:)?)?\s*(?P<rest>.*?)\s*$"
)
_COLOUR = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SEVERITY = re.compile(
    r"^(?P<severity>fatal error|error|warning|note|info|remark|hint|fatal)\s*:\s*(?P<rest>.*)$",
    re.IGNORECASE,
)
_PYLINT_PARSEABLE = re.compile(
    r"^\[(?P<code>[A-Z]\d{4})\((?P<symbol>[a-z0-9-]+)\), [^\]]*\]\s*(?P<message>.*)$"
)
_PYLINT_TEXT = re.compile(r"^(?P<code>[CRWEFI]\d{4}): (?P<message>.*) \((?P<symbol>[a-z0-9-]+)\)$")
_CODE_FIRST = re.compile(r"^(?P<code>[A-Z]{1,5}[0-9]{2,4})(?:\s+\[\*\])?(?:\s+|$)(?P<message>.*)$")
_ESLINT_UNIX = re.compile(
    r"^(?P<message>.*?)\s*\[(?P<severity>Error|Warning)(?:/(?P<code>\S+))?\]$"
)
_CODE_LAST = re.compile(r"^(?P<message>.*?)\s+\[(?P<code>-?[A-Za-z][\w./@-]*)\]$")
_PYLINT_CATEGORIES = {
    "C": "convention",
    "R": "refactor",
    "W": "warning",
    "E": "error",
    "F": "fatal",
    "I": "info",
}


@dataclass(frozen=True, slots=True)
class Finding:
    """A parsed line: where it points, its text without severity and code, and those."""

    path: str
    line: int
    col: int | None
    message: str
    code: str | None
    severity: str | None


def parse_line(text: str) -> Finding | None:
    """The finding on one line of a linter's output, or None for any other line."""
    located = _LOCATION.match(_COLOUR.sub("", text))
    if located is None or not located["rest"]:
        return None
    rest = located["rest"]
    severity: str | None = None
    if said := _SEVERITY.match(rest):
        severity, rest = said["severity"].lower(), said["rest"]
    code: str | None = None
    # A line with a severity word (gcc, mypy, shellcheck) has its code last, if any; the
    # other shapes print none, and a message's first word is never taken for a code.
    if severity is None and (pylint := _PYLINT_PARSEABLE.match(rest) or _PYLINT_TEXT.match(rest)):
        code = pylint["code"]
        severity = _PYLINT_CATEGORIES[code[0]]
        rest = f"{pylint['message']} ({pylint['symbol']})"
    elif severity is None and (first := _CODE_FIRST.match(rest)):
        code, rest = first["code"], first["message"]
    elif severity is None and (eslint := _ESLINT_UNIX.match(rest)):
        code, rest = eslint["code"], eslint["message"]
        severity = eslint["severity"].lower()
    elif last := _CODE_LAST.match(rest):
        code, rest = last["code"], last["message"]
    return Finding(
        path=located["path"],
        line=int(located["line"]),
        col=int(located["col"]) if located["col"] else None,
        message=rest,
        code=code,
        severity=severity,
    )


def parse(stream: IO[str], name: str) -> Iterator[tuple[dict[str, Any], str]]:
    """Each finding of a linter's output as a record and its origin (``name:line``),
    with the notes that follow it attached."""
    pending: tuple[dict[str, Any], str] | None = None
    for number, text in enumerate(stream, start=1):
        finding = parse_line(text.rstrip("\r\n"))
        if finding is None:
            continue
        if pending is not None and finding.severity == "note" and finding.code is None:
            pending[0]["notes"].append(
                {
                    "path": finding.path,
                    "line": finding.line,
                    "col": finding.col,
                    "message": finding.message,
                }
            )
            continue
        if pending is not None:
            yield pending
        pending = (_record(finding), f"{name}:{number}")
    if pending is not None:
        yield pending


def _record(finding: Finding) -> dict[str, Any]:
    return {
        "path": finding.path,
        "line": finding.line,
        "col": finding.col,
        "message": finding.message,
        "code": finding.code,
        "severity": finding.severity,
        "notes": [],
    }
