"""Jinja2 templates in job files: compiling, static checking and rendering.

Templates run in Jinja2's sandbox with StrictUndefined, so a template cannot reach
Python internals and a missing value is an error, never an empty string.  Because a
typo should fail validation rather than the 400th unit at 3 a.m., ``check`` walks each
template's syntax tree and reports every variable and attribute it cannot resolve.
Job files also hold Jinja *expressions* (``units.where``): the same sandbox, the same
filters and the same static check, evaluated to a value instead of rendered to text.
This is the only module that imports jinja2.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from .errors import Problem, did_you_mean

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
    """A template failed while rendering for one unit.

    ``key`` names the job-file key the template came from (``task.command[1]``) and
    ``at`` its file, line and column, when the job file was loaded with positions;
    ``str`` is the key and the reason, what a unit's ``template:`` failure shows.
    """

    def __init__(
        self, message: str, *, key: str = "", at: tuple[str, int, int] | None = None
    ) -> None:
        super().__init__(f"{key}: {message}" if key else message)
        self.message = message
        self.key = key
        self.at = at

    def problem(self) -> Problem | None:
        """The failure as a located job-file problem, if it is known where it is."""
        if self.at is None:
            return None
        file, line, col = self.at
        return Problem(file=file, line=line, col=col, key=self.key, message=self.message)

    def located(self) -> str:
        """``file:line:col: key: reason``, as validation problems read."""
        problem = self.problem()
        return str(problem) if problem else str(self)


class _Environment(SandboxedEnvironment):
    """Attribute syntax reads dict keys first, so ``unit.items`` is the unit's items
    and not ``dict.items``, and record fields named like dict methods still work."""

    # '**' and '*' can build a value that takes minutes or gigabytes (``9**9**9``,
    # ``'x' * 10**10``): refused like an oversized ``range``.  Intercepting them also stops
    # Jinja from folding such constants while compiling, i.e. during ``fanout validate``.
    intercepted_binops = frozenset({"**", "*"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            huge = _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1
            if huge and abs(left).bit_length() * right > _MAX_BITS:
                raise SecurityError("'**' would make a number of more than a million bits")
            return left**right
        for sized, count in ((left, right), (right, left)):
            sequence = isinstance(sized, str | list | tuple) and _is_int(count)
            if sequence and len(sized) * count > _MAX_REPEAT:
                raise SecurityError("'*' would repeat a value to more than a million items")
        return left * right


_TOO_DEEP = "the template is nested too deeply to check"
_MAX_BITS = 1 << 20
_MAX_REPEAT = 1 << 20


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class Template:
    source: str
    # None for plain text without template syntax: most argv elements ("ruff", "--fix").
    compiled: jinja2.Template | None
    # Where the template is in the job file, for render errors (see ``located``).
    key: str = field(default="", compare=False)
    at: tuple[str, int, int] | None = field(default=None, compare=False)

    def located(self, key: str, at: tuple[str, int, int]) -> Template:
        """This template, remembering that it is ``key`` at ``at`` (file, line, column)."""
        return replace(self, key=key, at=at)

    def render(self, context: Mapping[str, Any]) -> str:
        """The rendered text.  Whatever goes wrong inside the template (an undefined
        value, ``[].pop()``, a macro calling itself, a huge repetition) is a RenderError:
        a template is data from the job file, so its failure is the unit's, never a crash
        of fanout."""
        if self.compiled is None:
            return self.source
        with _failures_as_render_errors("template", self.key, self.at):
            return self.compiled.render(context)


@dataclass(frozen=True, slots=True)
class Expression:
    """A compiled Jinja expression (``record.errorCount > 0``), for values, not text."""

    source: str
    compiled: jinja2.environment.TemplateExpression = field(compare=False)
    key: str = field(default="", compare=False)
    at: tuple[str, int, int] | None = field(default=None, compare=False)

    def located(self, key: str, at: tuple[str, int, int]) -> Expression:
        """This expression, remembering that it is ``key`` at ``at`` (file, line, column)."""
        return replace(self, key=key, at=at)

    def evaluate(self, context: Mapping[str, Any]) -> Any:
        """The expression's value.  Whatever goes wrong inside it is a RenderError, as
        for templates: the expression is data from the job file."""
        with _failures_as_render_errors("expression", self.key, self.at):
            return self.compiled(**context)


@contextlib.contextmanager
def _failures_as_render_errors(
    what: str, key: str, at: tuple[str, int, int] | None
) -> Iterator[None]:
    """Whatever goes wrong while a template or an expression runs, as a RenderError."""
    try:
        yield
    except jinja2.TemplateError as exc:
        raise RenderError(_describe(exc), key=key, at=at) from None
    except RecursionError:
        hint = " (a macro that calls itself?)" if what == "template" else ""
        raise RenderError(f"the {what} recurses too deeply{hint}", key=key, at=at) from None
    except MemoryError:
        raise RenderError(f"the {what} ran out of memory", key=key, at=at) from None
    except Exception as exc:
        raise RenderError(f"{type(exc).__name__}: {exc}", key=key, at=at) from None


@dataclass(frozen=True, slots=True)
class _Analysis:
    undeclared: frozenset[str]
    lines: dict[str, int]
    local_names: frozenset[str]
    chains: tuple[tuple[tuple[str, ...], int], ...]


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
        self._expressions: dict[str, Expression] = {}
        self._analyses: dict[str, _Analysis] = {}

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
            raise TemplateProblem(self._syntax_message(exc), exc.lineno or 1) from None
        except RecursionError:
            raise TemplateProblem(_TOO_DEEP) from None

    def _syntax_message(self, exc: jinja2.TemplateSyntaxError) -> str:
        message = _describe(exc)
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
        analysis = self._analyse(source)
        problems: list[TemplateProblem] = []
        known = set(shapes) | set(self.env.globals)
        for name in sorted(analysis.undeclared - known):
            guess = did_you_mean(name, list(shapes))
            hint = f" (did you mean {guess!r}?)" if guess else f"; available: {', '.join(shapes)}"
            problems.append(
                TemplateProblem(f"undefined variable {name!r}{hint}", analysis.lines[name])
            )
        for chain, lineno in analysis.chains:
            if chain[0] in analysis.local_names or chain[0] not in shapes:
                continue
            problem = _check_chain(chain, shapes)
            if problem:
                problems.append(TemplateProblem(problem, lineno))
        return problems

    def _analyse(self, source: str) -> _Analysis:
        """What ``check`` needs of a template's syntax tree, once per source."""
        if source not in self._analyses:
            tree = self.env.parse(source)
            undeclared = frozenset(meta.find_undeclared_variables(tree))
            self._analyses[source] = _Analysis(
                undeclared=undeclared,
                lines={name: _line_of(tree, name) for name in undeclared},
                local_names=frozenset(
                    n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")
                ),
                chains=tuple(_chains(tree)),
            )
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
            elif current is node:
                # ``x[1:]`` or ``x[i]``: the chain ends here; ``x`` may still be a chain.
                walk(node.node)
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


def _describe(exc: jinja2.TemplateError) -> str:
    text = exc.message or type(exc).__name__
    return text.replace("'dict object'", "the value")
