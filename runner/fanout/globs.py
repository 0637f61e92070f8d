"""Glob patterns for selecting and staging files: '*', '?', '[...]' and '**' as a whole
path component, always relative to the workspace and never reaching outside it."""

from __future__ import annotations

import re
from collections.abc import Callable


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex matching workspace-relative POSIX paths that ``pattern`` selects.

    Raises ValueError naming what is wrong with the pattern.
    """
    if pattern.startswith("/"):
        raise ValueError(f"{pattern!r} is absolute; patterns are relative to the workspace")
    parts = pattern.split("/")
    if ".." in parts:
        raise ValueError(f"{pattern!r} leaves the workspace ('..' is not allowed)")
    if "" in parts:
        raise ValueError(f"{pattern!r} has an empty path component ('//' or a trailing '/')")
    return re.compile(_translate(pattern, parts, re.escape, "(?:[^/]+/)*") + r"\Z")


def _translate(pattern: str, parts: list[str], escape: Callable[[str], str], any_dirs: str) -> str:
    """The components of a glob as one regex; ``any_dirs`` is the dialect's spelling of
    zero or more whole directories (what a '**' that is not last stands for)."""
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            regex += ".*" if last else any_dirs
            continue
        if "**" in part:
            raise ValueError(
                f"{pattern!r}: '**' must be a whole path component, as in 'src/**/*.py'"
            )
        regex += _component(part, pattern, escape) + ("" if last else "/")
    return regex


def is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _component(part: str, pattern: str, escape: Callable[[str], str] = re.escape) -> str:
    """One path component of a glob as a regex; ``escape`` quotes literal characters
    (Python's ``re`` or POSIX extended, for find)."""
    out = ""
    i = 0
    while i < len(part):
        ch = part[i]
        if ch == "*":
            out += "[^/]*"
        elif ch == "?":
            out += "[^/]"
        elif ch == "[":
            end, negated, members = _bracket(part, i, pattern)
            out += _class_regex(negated, members, ere=escape is not re.escape)
            i = end
        else:
            out += escape(ch)
        i += 1
    return out


def _bracket(part: str, start: int, pattern: str) -> tuple[int, bool, list[tuple[str, str]]]:
    """The class opening at ``part[start]``: where its ']' is, whether it is negated and
    its members as (first, last) character ranges.

    Shell rules: '!' (or '^', as bash and git read it) right after '[' negates, a ']'
    right after that is a member, '-' between two characters is a range, anywhere else
    it is itself; a backslash is an ordinary character.  A reversed range ('[z-a]')
    matches nothing, which is never what was meant, so it is an error.
    """
    i = start + 1
    negated = part[i : i + 1] in ("!", "^")
    i += negated
    first = i
    while True:
        if i >= len(part):
            opening = part[start:first]
            hint = (
                f" (a ']' right after {opening!r} belongs to the class)"
                if part[first : first + 1] == "]"
                else ""
            )
            raise ValueError(f"{pattern!r}: '[' at position {start + 1} is never closed{hint}")
        if part[i] == "]" and i > first:
            break
        i += 1
    body = part[first:i]
    members: list[tuple[str, str]] = []
    n = 0
    while n < len(body):
        if n + 2 < len(body) and body[n + 1] == "-":
            low, high = body[n], body[n + 2]
            if low > high:
                raise ValueError(
                    f"{pattern!r}: the range '{low}-{high}' is reversed "
                    f"(did you mean '{high}-{low}'?)"
                )
            members.append((low, high))
            n += 3
        else:
            members.append((body[n], body[n]))
            n += 1
    return i, negated, members


def _class_regex(negated: bool, members: list[tuple[str, str]], *, ere: bool) -> str:
    """A bracket expression in Python's or POSIX's dialect; a negated class never
    matches '/', so it stays inside its path component like '*' and '?'."""
    if negated:
        members = [*members, ("/", "/")]
    if not ere:
        quoted = (re.escape(a) if a == b else f"{re.escape(a)}-{re.escape(b)}" for a, b in members)
        return "[" + ("^" if negated else "") + "".join(quoted) + "]"
    # POSIX brackets have no escapes: ']' goes first, '-' last, '^' never first, and
    # '[' last before '-' (so it cannot start '[:' or '[.').
    late = {"]": 0, "^": 2, "[": 3, "-": 4}
    ordered = sorted(members, key=lambda m: late.get(m[0], 1) if m[0] == m[1] else 1)
    if ordered and ordered[0] == ("^", "^") and not negated and len(ordered) == 1:
        return "\\^"
    if ordered and ordered[0] == ("^", "^") and not negated:
        ordered = [*ordered[1:2], ordered[0], *ordered[2:]]
    text = "".join(a if a == b else f"{a}-{b}" for a, b in ordered)
    return "[" + ("^" if negated else "") + text + "]"


_ERE_SPECIAL = set(".^$*+?()[]{}|\\")


def to_find_regex(pattern: str) -> str:
    """A POSIX extended regex for ``find . -regex`` selecting what ``pattern`` selects in
    ``select_files``: a plain path names a file or a whole directory, a glob matches files.
    Raises ValueError like ``compile_glob``."""
    compile_glob(pattern)  # the same checks and messages
    parts = pattern.split("/")
    if not is_glob(pattern):
        return r"\./" + "/".join(_ere_literal(p) for p in parts) + "(/.*)?"
    return r"\./" + _translate(pattern, parts, _ere_literal, "([^/]+/)*")


def _ere_literal(text: str) -> str:
    return "".join("\\" + ch if ch in _ERE_SPECIAL else ch for ch in text)
