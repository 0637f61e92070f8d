"""Glob patterns for selecting and staging files: '*', '?', '[...]' and '**' as a whole
path component, always relative to the workspace and never reaching outside it.

Hidden names (a path component starting with '.') are matched only by a pattern
component that starts with a literal '.', as in bash without ``dotglob``, Python's
``glob.glob`` and ``fnmatch``'s FNM_PERIOD: ``src/**/*.py`` does not pick
``src/.cache/e.py`` and ``**`` does not descend into ``.venv`` or ``.git``, while
``.github/**/*.yml`` and ``src/.*`` say what they mean.  Tools park caches, virtual
environments and editor state in hidden folders that git usually, but not always,
ignores; a sweep that edits ``.mypy_cache`` or collects a worker's ``.pytest_cache``
back into the workspace is never what was meant.  A plain path (not a glob) names a
file or takes a directory whole, hidden files included (``stage = ["."]``).
``exclude`` patterns are compiled with ``hidden=True``: leaving out ``**/*.min.js``
means every one of them, also inside a hidden folder an include named explicitly.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path


def compile_glob(pattern: str, *, hidden: bool = False) -> re.Pattern[str]:
    """A regex matching workspace-relative POSIX paths that ``pattern`` selects; with
    ``hidden``, wildcards also match names starting with '.'.

    Raises ValueError naming what is wrong with the pattern.
    """
    parts = _parts(pattern)
    return re.compile(_translate(pattern, parts, hidden=hidden) + r"\Z")


# What a file name and a path can be (bytes): Linux's NAME_MAX and PATH_MAX, which
# counts the NUL that ends it.  Longer, a path can never name a file: the system
# refuses it (ENAMETOOLONG), and a glob that long is only slow to compile.
NAME_MAX = 255
PATH_MAX = 4096


def _parts(pattern: str) -> list[str]:
    size = _bytes(pattern)
    if size >= PATH_MAX:
        raise ValueError(
            f"{_shown(pattern)} is {size:,} bytes long; a path can be {PATH_MAX - 1:,} at most"
        )
    if pattern.startswith("/"):
        raise ValueError(f"{pattern!r} is absolute; patterns are relative to the workspace")
    parts = pattern.split("/")
    if ".." in parts:
        raise ValueError(f"{pattern!r} leaves the workspace ('..' is not allowed)")
    if "" in parts:
        raise ValueError(f"{pattern!r} has an empty path component ('//' or a trailing '/')")
    for part in parts:
        if not is_glob(part) and (size := _bytes(part)) > NAME_MAX:
            raise ValueError(
                f"{_shown(pattern)} has a name of {size:,} bytes; a file name can be"
                f" {NAME_MAX} at most"
            )
    return parts


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _shown(pattern: str) -> str:
    """``pattern`` quoted for a message, cut short if it is long."""
    return repr(pattern if len(pattern) <= 60 else pattern[:50] + "…")


def _translate(pattern: str, parts: list[str], *, hidden: bool) -> str:
    """The components of a glob as one regex."""
    # One visible (or, with ``hidden``, any) path component, and a '/' after each one.
    name = "[^/]+" if hidden else "[^/.][^/]*"
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            # Last, it is every path below (one component or more); else zero or more
            # whole directories.
            regex += f"{name}(?:/{name})*" if last else f"(?:{name}/)*"
            continue
        if "**" in part:
            raise ValueError(
                f"{pattern!r}: '**' must be a whole path component, as in 'src/**/*.py'"
            )
        regex += _component(part, pattern, hidden=hidden) + ("" if last else "/")
    return regex


def is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _component(part: str, pattern: str, *, hidden: bool) -> str:
    """One path component of a glob as a regex.  Unless ``hidden`` or the component
    starts with a literal '.', its first character may not be a '.'."""
    pieces = _pieces(part, pattern)
    if hidden or part.startswith("."):
        return "".join(_piece_regex(t) for t in pieces)
    regex = _visible(pieces)
    if regex is None:
        raise ValueError(
            f"{pattern!r}: {part!r} can only match a name starting with '.', and such names "
            "are matched by a literal '.' (write '.name', not '[.]name')"
        )
    return regex


# A piece of a component: "*", "?", a literal character, or a bracket class as
# (negated, members).
_Piece = str | tuple[bool, list[tuple[str, str]]]


def _pieces(part: str, pattern: str) -> list[_Piece]:
    pieces: list[_Piece] = []
    i = 0
    while i < len(part):
        if part[i] == "[":
            i, negated, members = _bracket(part, i, pattern)
            pieces.append((negated, members))
        else:
            pieces.append(part[i])
        i += 1
    return pieces


def _piece_regex(piece: _Piece) -> str:
    if isinstance(piece, tuple):
        return _class_regex(*piece)
    if piece == "*":
        return "[^/]*"
    if piece == "?":
        return "[^/]"
    return re.escape(piece)


def _visible(pieces: list[_Piece]) -> str | None:
    """``pieces`` as a regex whose first character is not '.', or None if none can be.

    Without lookahead, a leading '*' becomes two branches: it matches
    something starting with a visible character, or nothing and the rest starts
    visibly.  Only the second branch recurses, so the regex stays linear in length."""
    if not pieces:
        return ""
    first, rest = pieces[0], pieces[1:]
    tail = "".join(_piece_regex(t) for t in rest)
    if first == "*":
        some = "[^/.][^/]*" + tail
        none = _visible(rest)
        return some if none is None else f"(?:{some}|{none})"
    if first == "?":
        return "[^/.]" + tail
    if isinstance(first, tuple):
        negated, members = first
        members = [*members, (".", ".")] if negated else _without_dot(members)
        if not members:
            return None
        return _class_regex(negated, members) + tail
    return None if first == "." else re.escape(first) + tail


def _without_dot(members: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Class members without '.', a range through it split in two (and without the
    '/' that follows it, which no class matches)."""
    kept = []
    for low, high in members:
        if low <= "." <= high:
            kept += [(low, "-")] if low < "." else []
            kept += [("0", high)] if high >= "0" else []
        else:
            kept.append((low, high))
    return kept


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


def _class_regex(negated: bool, members: list[tuple[str, str]]) -> str:
    """A bracket expression; a negated class never matches '/', so it stays inside its
    path component like '*' and '?'."""
    if negated:
        members = [*members, ("/", "/")]
    quoted = (re.escape(a) if a == b else f"{re.escape(a)}-{re.escape(b)}" for a, b in members)
    return "[" + ("^" if negated else "") + "".join(quoted) + "]"


def check_relative(pattern: str) -> None:
    """Raise ValueError for a path ``compile_glob`` refuses whatever it holds: absolute,
    leaving the workspace (``..``) or with an empty component; cheaper than compiling."""
    _parts(pattern)


def walk(top: Path, descend: Callable[[Path], bool] = lambda _: True) -> Iterator[os.DirEntry[str]]:
    """Every entry under the directory ``top`` that is not a directory, in ``os.walk``'s
    order (each folder's entries by name, then its folders), without recursion: a
    worker's write-back or a workspace sets the depth, and ``os.walk`` recurses on
    Python 3.11 (a tree 1,000 deep met its recursion limit).  A symlink to a directory
    is neither yielded nor followed, as ``os.walk`` does; a directory is descended
    into when ``descend(path)``; one that cannot be read is left out."""
    folders = [top]
    while folders:
        try:
            with os.scandir(folders.pop()) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            continue
        below = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if not is_dir:
                yield entry
            elif not entry.is_symlink() and descend(Path(entry.path)):
                below.append(Path(entry.path))
        folders.extend(reversed(below))
