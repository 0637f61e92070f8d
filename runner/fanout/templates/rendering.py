"""Running templates: the sandbox they run in (dict keys before attributes, no
arithmetic that takes minutes or gigabytes), the compiled ``Template`` and
``Expression``, and how whatever goes wrong inside them becomes a RenderError."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from ..errors import Problem


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


class Environment(SandboxedEnvironment):
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
        raise RenderError(describe(exc), key=key, at=at) from None
    except RecursionError:
        hint = " (a macro that calls itself?)" if what == "template" else ""
        raise RenderError(f"the {what} recurses too deeply{hint}", key=key, at=at) from None
    except MemoryError:
        raise RenderError(f"the {what} ran out of memory", key=key, at=at) from None
    except Exception as exc:
        raise RenderError(f"{type(exc).__name__}: {exc}", key=key, at=at) from None


def describe(exc: jinja2.TemplateError) -> str:
    """Jinja's message for ``exc``, speaking of a value rather than a ``dict object``."""
    text = exc.message or type(exc).__name__
    return text.replace("'dict object'", "the value")
