"""Which files an attempt collects, decided on the coordinator for every transport.

A sandbox only lists what its work directory holds (``Entry``: a path and its kind,
symlinks never followed) and hands over the files it is asked for.  The rule is here,
once, with the one glob compiler (``globs``):

- a glob selects the regular files it matches; symlinks and other kinds are skipped;
- a plain path names a file, or a directory taken whole (its regular files); one that
  names a fifo, socket or device fails the attempt (collecting nothing in silence
  would pass the unit);
- a plain path that is, or goes through, a symlink fails the attempt: the worker made
  it, fanout never follows one, and where it leads is the worker's choice (``/etc``,
  ``~/.ssh``), so saying so beats collecting nothing in silence;
- a name that is not UTF-8 fails the attempt (a journal, a report and a workspace
  write-back all need text), naming the file;
- nothing in a ``.git`` folder is collected: a directory taken whole leaves its
  ``.git`` folders out, and a plain path into one fails the attempt.  A hook or a
  config (``core.fsmonitor``, ``core.hooksPath``) a worker wrote there would run the
  worker's code on the workspace the next time anyone there runs git.  (A glob never
  matches a name starting with a dot.)

Names are checked as paths, never as globs: ``notes[draft.md`` is a file name like
any other.  ``target`` is the one way a collected name becomes a path under the unit
folder (no ``..``, nothing absolute, no symlink on the way).
"""

from __future__ import annotations

import enum
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..values import globs


class PathRefused(Exception):
    """A rendered stage or collect path, or a collected name, that would leave its folder."""


class Kind(enum.Enum):
    FILE = "f"
    LINK = "l"
    DIR = "d"
    OTHER = "o"  # a fifo, socket or device: never collected

    @classmethod
    def of_mode(cls, mode: int) -> Kind:
        """The kind of an ``lstat`` result's ``st_mode``."""
        if stat.S_ISLNK(mode):
            return cls.LINK
        if stat.S_ISREG(mode):
            return cls.FILE
        if stat.S_ISDIR(mode):
            return cls.DIR
        return cls.OTHER


@dataclass(frozen=True, slots=True)
class Entry:
    """One thing in a sandbox's work directory: its relative POSIX path and kind."""

    path: str
    kind: Kind


@dataclass(frozen=True, slots=True)
class _Pattern:
    text: str
    glob: re.Pattern[str] | None  # None: a plain path


@dataclass(frozen=True, slots=True)
class Collect:
    """An attempt's collect patterns, compiled once when the attempt is made."""

    patterns: tuple[_Pattern, ...] = ()

    @classmethod
    def compile(cls, patterns: Sequence[str]) -> Collect:
        """Raises PathRefused for a pattern that is absolute, has ``..`` or is malformed."""
        compiled = []
        for text in patterns:
            try:
                matcher = globs.compile_glob(text)
            except ValueError as exc:
                raise PathRefused(f"collect: {exc}") from None
            compiled.append(_Pattern(text, matcher if globs.is_glob(text) else None))
        return cls(tuple(compiled))

    def __bool__(self) -> bool:
        return bool(self.patterns)

    @property
    def roots(self) -> tuple[str, ...]:
        """The top-level names a sandbox must list (``.``: all of it).  Top-level only:
        listing ``a/b`` would follow ``a`` if the worker made it a symlink."""
        roots: dict[str, None] = {}
        for pattern in self.patterns:
            first = pattern.text.split("/", 1)[0]
            if globs.is_glob(first):
                return (".",)
            roots[first] = None
        return tuple(roots)

    def select(self, entries: Iterable[Entry]) -> list[str]:
        """The relative paths to collect from ``entries`` (a sandbox's listing of
        ``roots``), in pattern order, then in path order (component by component, so
        the order is the coordinator's whatever order a sandbox lists in).  Raises
        PathRefused (see the module docstring)."""
        listed = sorted(entries, key=lambda entry: entry.path.split("/"))
        kinds = {entry.path: entry.kind for entry in listed}
        chosen: dict[str, None] = {}
        for pattern in self.patterns:
            if pattern.glob is not None:
                for path, kind in kinds.items():
                    if kind is Kind.FILE and pattern.glob.match(path):
                        chosen[_text(path)] = None
                continue
            parts = pattern.text.split("/")
            if _in_git(pattern.text):
                raise PathRefused(
                    f"collect: {pattern.text!r} is in a .git folder; fanout never collects"
                    " git's own files (a hook or a config a worker wrote there would run on"
                    " the workspace)"
                )
            for depth in range(1, len(parts) + 1):
                on_the_way = "/".join(parts[:depth])
                if kinds.get(on_the_way) is Kind.LINK:
                    raise PathRefused(
                        f"collect: {pattern.text!r} goes through a symlink the worker made"
                        f" ({on_the_way!r}); fanout never follows one"
                    )
            named = kinds.get(pattern.text)
            if named is Kind.OTHER:
                raise PathRefused(
                    f"collect: {pattern.text!r} is a fifo, socket or device the worker made;"
                    " fanout collects regular files only"
                )
            if named is Kind.FILE:
                chosen[pattern.text] = None
            elif named is Kind.DIR:
                below = pattern.text + "/"
                for path, inner in kinds.items():
                    if inner is Kind.FILE and path.startswith(below) and not _in_git(path):
                        chosen[_text(path)] = None
        return list(chosen)


def _in_git(path: str) -> bool:
    """Whether ``path`` is, or is inside, a ``.git`` folder (in any case: git refuses
    ``.GIT`` too, for the filesystems that fold case)."""
    return any(part.casefold() == ".git" for part in path.split("/"))


def _text(name: str) -> str:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise PathRefused(
            f"collect: {name.encode('utf-8', 'surrogateescape')!r} is not a UTF-8 file name"
        ) from None
    return name


def target(destination: Path, name: str) -> Path:
    """Where collected ``name`` goes under ``destination``, its folders made; raises
    PathRefused for a name that is not a plain relative path or whose way down
    ``destination`` holds a symlink (fanout makes none there, so one is an attack)."""
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise PathRefused(f"collect: {name!r} is not a path inside the sandbox")
    path = destination
    for part in parts[:-1]:
        path = path / part
        if path.is_symlink():
            raise PathRefused(f"collect: {name!r} leaves the unit folder")
        path.mkdir(parents=True, exist_ok=True)
    final = path / parts[-1]
    if final.is_symlink():
        raise PathRefused(f"collect: {name!r} leaves the unit folder")
    return final
