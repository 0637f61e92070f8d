"""Line and column of every key and value in a TOML document.

tomllib parses but forgets positions, so this module re-scans the source text of a
document that tomllib already accepted and records, for each key path such as
``("retry", "ladder", 2, "vars", "model")``, where its key and its value start.
Arrays of tables get their index (``[[retry.ladder]]`` number three is index 2),
inline arrays and inline tables are followed to any depth.  Because the text is known
to be valid TOML the scanner can be small: it only needs to find where things start.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeAlias

KeyPath: TypeAlias = tuple[str | int, ...]

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


_Where: TypeAlias = Mapping[KeyPath, tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Positions:
    """Where each key path's key and value begin (1-based line and column).

    Read-only, so the loaded Spec can keep the positions of the text it was built from:
    a message located at run time points into that text even after the file on disk
    was edited or deleted (re-scanning the file then would point at the wrong line).
    """

    keys: _Where = field(default_factory=lambda: MappingProxyType({}))
    values: _Where = field(default_factory=lambda: MappingProxyType({}))
    # Multi-line strings whose first newline TOML trims: the value starts a line later.
    trimmed_newline: Set[KeyPath] = frozenset()
    # Multi-line strings: a template's line N is N - 1 lines below where the value starts
    # (in a one-line string an escaped newline starts a template line, not a file line).
    multiline: Set[KeyPath] = frozenset()

    def key(self, path: KeyPath) -> tuple[int, int]:
        """Position of the key itself, or of the nearest enclosing thing that has one."""
        return self._nearest(path, self.keys, self.values)

    def value(self, path: KeyPath) -> tuple[int, int]:
        """Position of the value, or of the nearest enclosing thing that has one."""
        return self._nearest(path, self.values, self.keys)

    @staticmethod
    def _nearest(path: KeyPath, first: _Where, second: _Where) -> tuple[int, int]:
        for end in range(len(path), 0, -1):
            prefix = path[:end]
            if prefix in first:
                return first[prefix]
            if prefix in second:
                return second[prefix]
        return (1, 1)


def too_deep(text: str, limit: int) -> tuple[int, int] | None:
    """Where arrays and inline tables in ``text`` first nest deeper than ``limit``
    (line, column), or None.  Runs before tomllib, on text that may not be TOML, so it
    only skips strings and comments well enough to count brackets."""
    depth = 0
    i = 0
    length = len(text)
    while i < length:
        ch = text[i]
        if ch == "#":
            end = text.find("\n", i)
            i = length if end < 0 else end
        elif ch in "\"'":
            quotes = ch * 3 if text.startswith(ch * 3, i) else ch
            i += len(quotes)
            while i < length and not text.startswith(quotes, i):
                if ch == '"' and text[i] == "\\":
                    i += 1
                elif len(quotes) == 1 and text[i] == "\n":
                    break  # an unterminated string: tomllib reports it
                i += 1
            i += len(quotes)
            continue
        elif ch in "[{":
            depth += 1
            if depth > limit:
                line = text.count("\n", 0, i) + 1
                return line, i - (text.rfind("\n", 0, i) + 1) + 1
        elif ch in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None


def huge_integer(text: str) -> tuple[int, int] | None:
    """Where the first integer of more than 4,300 digits is (Python refuses to read it)."""
    match = re.search(r"[0-9_]{4301,}", text)
    if match is None:
        return None
    line = text.count("\n", 0, match.start()) + 1
    return line, match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1


def scan(text: str) -> Positions:
    """Positions of every key and value in ``text``, which tomllib has already accepted."""
    return _Scanner(text).document()


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.line_starts = [0] + [n + 1 for n, ch in enumerate(text) if ch == "\n"]
        self.keys: dict[KeyPath, tuple[int, int]] = {}
        self.values: dict[KeyPath, tuple[int, int]] = {}
        self.trimmed_newline: set[KeyPath] = set()
        self.multiline: set[KeyPath] = set()
        # Arrays of tables seen so far and how many entries each has.
        self.aot_sizes: dict[KeyPath, int] = {}
        # Tables located only through a longer header so far (``task`` of ``[task.env]``).
        self.implicit: set[KeyPath] = set()

    def where(self, index: int) -> tuple[int, int]:
        line = bisect.bisect_right(self.line_starts, index)
        return line, index - self.line_starts[line - 1] + 1

    def peek(self, width: int = 1) -> str:
        return self.text[self.i : self.i + width]

    def skip_blank(self, newlines: bool) -> None:
        while self.i < len(self.text):
            ch = self.text[self.i]
            if ch in " \t\r" or (newlines and ch == "\n"):
                self.i += 1
            elif ch == "#":
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            else:
                return

    def document(self) -> Positions:
        table: KeyPath = ()
        while True:
            self.skip_blank(newlines=True)
            if self.i >= len(self.text):
                return Positions(
                    keys=MappingProxyType(self.keys),
                    values=MappingProxyType(self.values),
                    trimmed_newline=frozenset(self.trimmed_newline),
                    multiline=frozenset(self.multiline),
                )
            start = self.i
            if self.peek(2) == "[[":
                self.i += 2
                path = self.resolve(self.dotted_key())
                index = self.aot_sizes.get(path, 0)
                self.aot_sizes[path] = index + 1
                table = (*path, index)
                self.header_prefixes(path, start)
                self.keys.setdefault(path, self.where(start))
                self.keys[table] = self.where(start)
                self.i = self.text.index("]]", self.i) + 2
            elif self.peek() == "[":
                self.i += 1
                table = self.resolve(self.dotted_key())
                self.header_prefixes(table, start)
                self.keys.setdefault(table, self.where(start))
                self.i = self.text.index("]", self.i) + 1
            else:
                self.key_value(table)

    def header_prefixes(self, path: KeyPath, start: int) -> None:
        """A table defined only through a dotted header (``[task.env]`` without ``[task]``)
        is located at the first header that names it, not at 1:1."""
        if path in self.implicit:
            del self.keys[path]  # now declared by a header of its own
            self.implicit.discard(path)
        for end in range(1, len(path)):
            if path[:end] not in self.keys:
                self.keys[path[:end]] = self.where(start)
                self.implicit.add(path[:end])

    def resolve(self, parts: KeyPath) -> KeyPath:
        """Turn a header's dotted key into a concrete path, entering the latest entry of
        any array of tables it passes through (``[[a.b]]`` under ``[[a]]``)."""
        path: KeyPath = ()
        for n, part in enumerate(parts):
            path = (*path, part)
            if n < len(parts) - 1 and path in self.aot_sizes:
                path = (*path, self.aot_sizes[path] - 1)
        return path

    def key_value(self, table: KeyPath) -> None:
        key_start = self.i
        parts = self.dotted_key()
        # Each prefix of a dotted key (``vars.model = ...``) is located at the key too.
        for end in range(1, len(parts) + 1):
            self.keys.setdefault((*table, *parts[:end]), self.where(key_start))
        path = (*table, *parts)
        self.skip_blank(newlines=False)
        self.i += 1  # '='
        self.skip_blank(newlines=False)
        self.value(path)

    def dotted_key(self) -> KeyPath:
        parts: list[str | int] = []
        while True:
            self.skip_blank(newlines=False)
            ch = self.peek()
            if ch in "\"'":
                parts.append(self.string_key())
            else:
                start = self.i
                while self.i < len(self.text) and self.text[self.i] in _BARE_KEY:
                    self.i += 1
                parts.append(self.text[start : self.i])
            self.skip_blank(newlines=False)
            if self.peek() != ".":
                return tuple(parts)
            self.i += 1

    def string_key(self) -> str:
        quote = self.text[self.i]
        end = self.i + 1
        chars: list[str] = []
        while self.text[end] != quote:
            if quote == '"' and self.text[end] == "\\":
                width = {"u": 6, "U": 10}.get(self.text[end + 1], 2)
                chars.append(_unescape(self.text[end : end + width]))
                end += width
            else:
                chars.append(self.text[end])
                end += 1
        self.i = end + 1
        return "".join(chars)

    def value(self, path: KeyPath) -> None:
        self.values[path] = self.where(self.i)
        head3 = self.peek(3)
        if head3 in ('"""', "'''"):
            self.multiline.add(path)
            if self.text[self.i + 3 : self.i + 4] == "\n" or self.peek(5)[3:] == "\r\n":
                self.trimmed_newline.add(path)
            self.skip_multiline_string(head3)
        elif self.peek() in "\"'":
            self.string_key()
        elif self.peek() == "[":
            self.i += 1
            index = 0
            while True:
                self.skip_blank(newlines=True)
                if self.peek() == "]":
                    self.i += 1
                    return
                if self.peek() == ",":
                    self.i += 1
                    continue
                self.value((*path, index))
                index += 1
        elif self.peek() == "{":
            self.i += 1
            while True:
                self.skip_blank(newlines=False)
                if self.peek() == "}":
                    self.i += 1
                    return
                if self.peek() == ",":
                    self.i += 1
                    continue
                self.key_value(path)
        else:
            while self.i < len(self.text) and self.text[self.i] not in ",]}\n#":
                self.i += 1

    def skip_multiline_string(self, quotes: str) -> None:
        end = self.i + 3
        while True:
            if quotes == '"""' and self.text[end] == "\\":
                end += 2
                continue
            if self.text.startswith(quotes, end):
                # Up to two extra quotes may close the string ('""""' ends with one quote inside).
                end += 3
                while self.text[end : end + 1] == quotes[0]:
                    end += 1
                self.i = end
                return
            end += 1


_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def _unescape(escape: str) -> str:
    """One escape of a basic string: ``\\n``, ``\\u00e9``, ``\\U0001F4A5``."""
    if escape[1] in "uU":
        return chr(int(escape[2:], 16))
    return _ESCAPES.get(escape[1], escape[1:])
