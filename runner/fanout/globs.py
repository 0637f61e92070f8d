"""Glob patterns for selecting and staging files: '*', '?', '[...]' and '**' as a whole
path component, always relative to the workspace and never reaching outside it."""

from __future__ import annotations

import re


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
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
            continue
        if "**" in part:
            raise ValueError(
                f"{pattern!r}: '**' must be a whole path component, as in 'src/**/*.py'"
            )
        regex += _component(part, pattern) + ("" if last else "/")
    return re.compile(regex + r"\Z")


def is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _component(part: str, pattern: str) -> str:
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
            out += re.escape(ch)
        i += 1
    return out
