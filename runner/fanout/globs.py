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
            end = part.find("]", i + 2)
            if end < 0:
                raise ValueError(f"{pattern!r}: '[' at position {i + 1} is never closed")
            body = part[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out += "[" + body.replace("\\", "\\\\") + "]"
            i = end
        else:
            out += escape(ch)
        i += 1
    return out


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
