"""Jinja2 templates in job files: compiling, static checking and rendering.

Templates run in Jinja2's sandbox with StrictUndefined, so a template cannot reach
Python internals and a missing value is an error, never an empty string.  Because a
typo should fail validation rather than the 400th unit at 3 a.m., ``check`` walks each
template's syntax tree and reports every variable and attribute it cannot resolve.
Job files also hold Jinja *expressions* (``units.where``): the same sandbox, the same
filters and the same static check, evaluated to a value instead of rendered to text.
This package is the only place that imports jinja2: ``rendering`` owns the sandbox and
running a template, ``analysis`` the static check of its syntax tree, and this module
compiling (cached) and the filters that know the workspace.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta

from ...errors import did_you_mean
from . import analysis
from .analysis import (
    JOB_SHAPE,
    LAST_SHAPE,
    TRIGGER_SHAPE,
    UNIT_SHAPE,
    Analysis,
    Shape,
    TemplateProblem,
)
from .bounds import bounded, render_off_loop
from .rendering import Environment, Expression, RenderError, Template, describe

__all__ = [
    "JOB_SHAPE",
    "LAST_SHAPE",
    "TRIGGER_SHAPE",
    "UNIT_SHAPE",
    "Expression",
    "RenderError",
    "Shape",
    "Template",
    "TemplateProblem",
    "Templates",
    "bounded",
    "for_workspace",
    "is_template",
    "render_off_loop",
]

_TOO_DEEP = "the template is nested too deeply to check"


@contextlib.contextmanager
def _compiling() -> Iterator[None]:
    """How Jinja compiles here.  Bounded as a render is, since compiling folds constant
    filters (``'x' | center(10000000)`` runs while ``fanout validate`` compiles).  And no
    garbage collection: a template nested too deeply is found by Python's recursion
    limit (RecursionError, a problem, not a crash), and a collection that ran at that
    depth would run other objects' finalizers there, which then fail on the same limit
    (pytest saw them as unraisable exceptions)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with bounded():
            yield
    finally:
        if enabled:
            gc.enable()


class Templates:
    """Compiles job templates; filters that need the workspace know it."""

    def __init__(self, workspace: Path) -> None:
        self.workspace = workspace
        filters: dict[str, Callable[..., Any]] = {
            "relpath": self._relpath,
            "basename": os.path.basename,
            "dirname": os.path.dirname,
            "shquote": shlex.quote,
        }
        self.env = Environment(
            filters=filters,
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            keep_trailing_newline=True,
        )
        self._compiled: dict[str, Template] = {}
        self._expressions: dict[str, Expression] = {}
        self._analyses: dict[str, Analysis] = {}

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
            with _compiling():
                # Parsed once for both the checks' analysis and the compiler (a parse is
                # half of a template's check).  The compiler comes second: its optimizer
                # folds constants in place, and the checks read the tree as written.
                tree = self.env.parse(source)
                if source not in self._analyses:
                    self._analyses[source] = analysis.analyse(tree)
                return Template(source=source, compiled=self.env.from_string(tree))
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateProblem(self._syntax_message(exc), exc.lineno or 1) from None
        except RecursionError:
            raise TemplateProblem(_TOO_DEEP) from None

    def _syntax_message(self, exc: jinja2.TemplateSyntaxError) -> str:
        message = describe(exc)
        unknown = re.fullmatch(r"No (filter|test) named '(.+)'\.", exc.message or "")
        if unknown:
            kind, name = unknown.groups()
            known = self.env.filters if kind == "filter" else self.env.tests
            guess = did_you_mean(name, known)
            hint = f" (did you mean {guess!r}?)" if guess else ""
            message = f"unknown {kind} {name!r}{hint}"
        return message

    def compile_expression(self, source: str) -> Expression:
        """The compiled expression (cached).  Raises TemplateProblem if it does not parse
        as one expression (``record.a >``, or template syntax such as ``{{ x }}``)."""
        if source not in self._expressions:
            self._expressions[source] = self._compile_expression(source)
        return self._expressions[source]

    def _compile_expression(self, source: str) -> Expression:
        if source.lstrip().startswith(("{{", "{%")):
            # '{{ x }}' would parse as a set inside a dict: say what was meant instead.
            raise TemplateProblem(
                "an expression, not a template: write it without '{{ }}', "
                'e.g. where = "record.errorCount > 0"'
            )
        try:
            with _compiling():
                compiled = self.env.compile_expression(source, undefined_to_none=False)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateProblem(
                _expression_syntax(self._syntax_message(exc)), exc.lineno or 1
            ) from None
        except RecursionError:
            raise TemplateProblem("the expression is nested too deeply to check") from None
        return Expression(source=source, compiled=compiled)

    def check_expression(self, source: str, shapes: Mapping[str, Shape]) -> list[TemplateProblem]:
        """What ``check`` reports for templates, for the expression ``source``."""
        try:
            self.compile_expression(source)
        except TemplateProblem as exc:
            return [exc]
        try:
            # An expression that parses is the body of a one-output template, so the
            # template checks (undefined variables and attributes) apply as they are.
            return self._check("{{ " + source + " }}", shapes)
        except RecursionError:
            return [TemplateProblem("the expression is nested too deeply to check")]

    def check(self, source: str, shapes: Mapping[str, Shape]) -> list[TemplateProblem]:
        """Every variable or attribute ``source`` uses that ``shapes`` does not provide."""
        if not is_template(source):
            return []
        try:
            self.compile(source)  # syntax errors, unknown filters and tests
        except TemplateProblem as exc:
            return [exc]
        try:
            return self._check(source, shapes)
        except RecursionError:
            return [TemplateProblem(_TOO_DEEP)]

    def _check(self, source: str, shapes: Mapping[str, Shape]) -> list[TemplateProblem]:
        return analysis.problems(self._analyse(source), shapes, self.env.globals)

    def _analyse(self, source: str) -> Analysis:
        """What ``check`` needs of a template's syntax tree, once per source."""
        if source not in self._analyses:
            self._analyses[source] = analysis.analyse(self.env.parse(source))
        return self._analyses[source]

    def chains(self, source: str) -> list[tuple[tuple[str, ...], int]]:
        """Attribute chains rooted at a variable (``("rung", "vars", "model")``) in
        ``source``, each with the template line it is on (kept from ``check``)."""
        if not is_template(source):
            return []
        return list(self._analyse(source).chains)


@functools.lru_cache(maxsize=8)
def for_workspace(workspace: Path) -> Templates:
    """The process's Templates for ``workspace``: loading a job again (the scheduler at
    each fire, ``fanout validate`` over many files) compiles each template once."""
    return Templates(workspace)


def is_template(source: str) -> bool:
    """Whether ``source`` uses template syntax at all (else it renders as itself)."""
    return "{{" in source or "{%" in source or "{#" in source


def _expression_syntax(message: str) -> str:
    """Jinja's parser speaks of templates; an expression's syntax error should not."""
    if message == "chunk after expression":
        return "text follows the end of the expression (compare with '==', combine with 'and')"
    ended = re.fullmatch(
        r"unexpected (?:'end of template'|end of template)(?:, expected (.+)\.)?", message
    )
    if ended:
        return "the expression ends too early" + (f" (expected {ended[1]})" if ended[1] else "")
    return message
