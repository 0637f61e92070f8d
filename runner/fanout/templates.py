"""Jinja2 templates in job files: compiling, static checking and rendering.

Templates run in Jinja2's sandbox with StrictUndefined, so a template cannot reach
Python internals and a missing value is an error, never an empty string.  Because a
typo should fail validation rather than the 400th unit at 3 a.m., ``check`` walks each
template's syntax tree and reports every variable and attribute it cannot resolve.
This is the only module that imports jinja2.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.sandbox import SandboxedEnvironment

from .errors import did_you_mean

# What each template variable offers; None means "any attribute" (record fields).
Shape = Mapping[str, "Shape | None"] | None

UNIT_SHAPE: dict[str, Shape] = {
    "id": None,
    "index": None,
    "group": None,
    "items": None,
    "record": None,
}
LAST_SHAPE: dict[str, Shape] = {
    "status": None,
    "reason": None,
    "exitCode": None,
    "outputTail": None,
    "rung": None,
    "attempt": None,
}
JOB_SHAPE: dict[str, Shape] = {"name": None, "description": None, "file": None}
TRIGGER_SHAPE: dict[str, Shape] = {"name": None, "schedule": None, "vars": None, "time": None}


class TemplateProblem(Exception):
    """A template that does not compile or refers to something that will not exist."""

    def __init__(self, message: str, lineno: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.lineno = lineno


class RenderError(Exception):
    """A template failed while rendering for one unit."""


class _Environment(SandboxedEnvironment):
    """Attribute syntax reads dict keys first, so ``unit.items`` is the unit's items
    and not ``dict.items``, and record fields named like dict methods still work."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)


@dataclass(frozen=True, slots=True)
class Template:
    source: str
    # None for plain text without template syntax: most argv elements ("ruff", "--fix").
    compiled: jinja2.Template | None

    def render(self, context: Mapping[str, Any]) -> str:
        if self.compiled is None:
            return self.source
        try:
            return self.compiled.render(context)
        except jinja2.TemplateError as exc:
            raise RenderError(_describe(exc)) from None
        except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError) as exc:
            raise RenderError(f"{type(exc).__name__}: {exc}") from None


class Templates:
    """Compiles job templates; filters that need the workspace know it."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        env = _Environment(
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
        )
        filters: dict[str, Callable[..., Any]] = {
            "relpath": self._relpath,
            "basename": os.path.basename,
            "dirname": os.path.dirname,
            "shquote": shlex.quote,
            # Jinja's own tojson escapes <, > and & for HTML; prompts want plain JSON.
            "tojson": lambda value, indent=None: json.dumps(
                value, indent=indent, ensure_ascii=False, default=str
            ),
        }
        env.filters.update(filters)
        self.env = env
        self._compiled: dict[str, Template] = {}
        self._chains: dict[str, list[tuple[tuple[str, ...], int]]] = {}

    def _relpath(self, path: str) -> str:
        """A path relative to the workspace (absolute paths from linters become stable ids)."""
        candidate = Path(path)
        if not candidate.is_absolute():
            return path
        try:
            return candidate.resolve().relative_to(self.workspace.resolve()).as_posix()
        except ValueError:
            return path

    def variables(self, source: str) -> frozenset[str]:
        """The variables ``source`` reads (``unit``, ``rung``, ...), guarded or not."""
        if not is_template(source):
            return frozenset()
        return frozenset(meta.find_undeclared_variables(self.env.parse(source)))

    def compile(self, source: str) -> Template:
        """The compiled template (cached: validation and loading compile the same text)."""
        if source not in self._compiled:
            self._compiled[source] = self._compile(source)
        return self._compiled[source]

    def _compile(self, source: str) -> Template:
        if not is_template(source):
            return Template(source=source, compiled=None)
        try:
            return Template(source=source, compiled=self.env.from_string(source))
        except jinja2.TemplateSyntaxError as exc:
            message = _describe(exc)
            unknown = re.fullmatch(r"No (filter|test) named '(.+)'\.", exc.message or "")
            if unknown:
                kind, name = unknown.groups()
                known = self.env.filters if kind == "filter" else self.env.tests
                guess = did_you_mean(name, known)
                hint = f" (did you mean {guess!r}?)" if guess else ""
                message = f"unknown {kind} {name!r}{hint}"
            raise TemplateProblem(message, exc.lineno or 1) from None

    def check(self, source: str, shapes: Mapping[str, Shape]) -> list[TemplateProblem]:
        """Every variable or attribute ``source`` uses that ``shapes`` does not provide."""
        if not is_template(source):
            return []
        try:
            self.compile(source)  # syntax errors, unknown filters and tests
        except TemplateProblem as exc:
            return [exc]
        tree = self.env.parse(source)
        self._chains[source] = _chains(tree)
        problems: list[TemplateProblem] = []
        known = set(shapes) | set(self.env.globals)
        for name in sorted(meta.find_undeclared_variables(tree) - known):
            guess = did_you_mean(name, list(shapes))
            hint = f" (did you mean {guess!r}?)" if guess else f"; available: {', '.join(shapes)}"
            problems.append(
                TemplateProblem(f"undefined variable {name!r}{hint}", _line_of(tree, name))
            )
        local_names = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
        for chain, lineno in self._chains[source]:
            if chain[0] in local_names or chain[0] not in shapes:
                continue
            problem = _check_chain(chain, shapes)
            if problem:
                problems.append(TemplateProblem(problem, lineno))
        return problems

    def chains(self, source: str) -> list[tuple[tuple[str, ...], int]]:
        """Attribute chains rooted at a variable (``("rung", "vars", "model")``) in
        ``source``, each with the template line it is on (kept from ``check``)."""
        if not is_template(source):
            return []
        if source not in self._chains:
            self._chains[source] = _chains(self.env.parse(source))
        return self._chains[source]


def is_template(source: str) -> bool:
    """Whether ``source`` uses template syntax at all (else it renders as itself)."""
    return "{{" in source or "{%" in source or "{#" in source


def _check_chain(chain: tuple[str, ...], shapes: Mapping[str, Shape]) -> str | None:
    shape: Shape = shapes[chain[0]]
    for depth, attribute in enumerate(chain[1:], start=1):
        if shape is None:
            return None
        if attribute not in shape:
            owner = ".".join(chain[:depth])
            guess = did_you_mean(attribute, list(shape))
            hint = f" (did you mean {guess!r}?)" if guess else f"; it has: {', '.join(shape)}"
            return f"{owner!r} has no attribute {attribute!r}{hint}"
        shape = shape[attribute]
    return None


def _chains(tree: nodes.Node) -> list[tuple[tuple[str, ...], int]]:
    found: list[tuple[tuple[str, ...], int]] = []

    def walk(node: nodes.Node) -> None:
        if _guarded(node):
            # `x | default(...)` and `x is defined` may name what does not exist.
            for child in node.iter_child_nodes(exclude=("node",)):
                walk(child)
            return
        if isinstance(node, nodes.Getattr | nodes.Getitem):
            parts: list[str] = []
            current: nodes.Node = node
            while True:
                if isinstance(current, nodes.Getattr):
                    parts.insert(0, current.attr)
                    current = current.node
                elif isinstance(current, nodes.Getitem) and isinstance(current.arg, nodes.Const):
                    parts.insert(0, str(current.arg.value))
                    current = current.node
                else:
                    break
            if isinstance(current, nodes.Name) and current.ctx == "load":
                found.append(((current.name, *parts), node.lineno))
            else:
                walk(current)
            if isinstance(node, nodes.Getitem) and not isinstance(node.arg, nodes.Const):
                walk(node.arg)
            return
        for child in node.iter_child_nodes():
            walk(child)

    walk(tree)
    return found


def _guarded(node: nodes.Node) -> bool:
    if isinstance(node, nodes.Filter):
        return node.name in ("default", "d")
    if isinstance(node, nodes.Test):
        return node.name in ("defined", "undefined")
    return False


def _line_of(tree: nodes.Node, name: str) -> int:
    for node in tree.find_all(nodes.Name):
        if node.name == name:
            return int(node.lineno)
    return 1


def _describe(exc: jinja2.TemplateError) -> str:
    text = exc.message or type(exc).__name__
    return text.replace("'dict object'", "the value")
