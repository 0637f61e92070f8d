"""Where a problem is: the context every check reports through, and the defensive
readers checks use on the raw document."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import Problem
from ...values.tomlpos import KeyPath, Positions
from .. import schema
from ..templates import Templates


@dataclass(frozen=True, slots=True)
class Context:
    file: str
    positions: Positions
    templates: Templates
    text: str

    def at_value(self, path: KeyPath, message: str) -> Problem:
        line, col = self.positions.value(path)
        return Problem(
            file=self.file, line=line, col=col, key=schema.key_name(path), message=message
        )

    def at_key(self, path: KeyPath, message: str) -> Problem:
        line, col = self.positions.key(path)
        return Problem(
            file=self.file, line=line, col=col, key=schema.key_name(path), message=message
        )

    def in_template(self, path: KeyPath, lineno: int, message: str) -> Problem:
        """A problem on line ``lineno`` of the template at ``path``."""
        line, col = self.positions.value(path)
        if path not in self.positions.multiline:
            pass  # one line of the file, whatever escaped newlines it holds
        elif path in self.positions.trimmed_newline:
            line, col = line + lineno, 1
        elif lineno > 1:
            line, col = line + lineno - 1, 1
        return Problem(
            file=self.file, line=line, col=col, key=schema.key_name(path), message=message
        )


def repeated_names(doc: Any, key: str, noun: str, ctx: Context) -> list[Problem]:
    """A problem at each entry of the array of tables ``doc[key]`` whose ``name`` an
    earlier entry has already: "limit 'x' is already declared by limits[0]"."""
    problems = []
    first: dict[str, int] = {}
    for index, entry in enumerate(list_of(doc, key)):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            continue
        if name in first:
            message = f"{noun} {name!r} is already declared by {key}[{first[name]}]"
            problems.append(ctx.at_value((key, index, "name"), message))
        first.setdefault(name, index)
    return problems


def strings(value: Any, path: KeyPath = ()) -> Iterator[tuple[KeyPath, str]]:
    """Every string in a TOML value, with its key path."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from strings(item, (*path, index))


def table_of(doc: Any, key: str) -> Mapping[str, Any]:
    """``doc[key]`` if it is a table, else an empty one (the schema reported the rest)."""
    value = doc.get(key) if isinstance(doc, Mapping) else None
    return value if isinstance(value, dict) else {}


def list_of(doc: Any, key: str) -> list[Any]:
    """``doc[key]`` if it is an array, else an empty one."""
    value = doc.get(key) if isinstance(doc, Mapping) else None
    return value if isinstance(value, list) else []
