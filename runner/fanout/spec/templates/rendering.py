"""Running templates: the sandbox they run in (dict keys before attributes, every
step bounded by ``bounds``), the compiled ``Template`` and ``Expression``, and how
whatever goes wrong inside them becomes a RenderError."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, cast

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

from ...errors import Problem
from . import bounds


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
    """Jinja's sandbox, bounded (``bounds``): each step of a render spends the active
    Budget, and a step that could make far more than it is given is checked first.
    Attribute syntax reads dict keys first, so ``unit.items`` is the unit's items and
    not ``dict.items``, and record fields named like dict methods still work."""

    # '**', '*', '+' and '%' can each build a value far larger than their operands
    # (``9**9**9``, ``'x' * 10**10``, ``'%999999999d' % 1``).  Intercepting them also
    # stops Jinja from folding such constants while compiling (``fanout validate``).
    intercepted_binops = frozenset({"**", "*", "+", "%"})

    def __init__(self, *, filters: Mapping[str, Callable[..., Any]], **options: Any) -> None:
        super().__init__(**options)
        self.code_generator_class = _Generator
        self.filters.update(
            filters, join=bounds.join, sum=bounds.sum_, tojson=bounds.tojson, pprint=bounds.pprint_
        )
        self.filters = {
            name: _stepped(function, bounds.FILTER_CHECKS.get(name))
            for name, function in self.filters.items()
        }
        tests = cast(dict[str, Callable[..., Any]], self.tests)
        self.tests = {name: _stepped(function, None) for name, function in tests.items()}
        self.globals["lipsum"] = bounds.lipsum

    def getattr(self, obj: Any, attribute: str) -> Any:
        if (budget := bounds.active()) is not None:
            budget.step()
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if (budget := bounds.active()) is not None:
            budget.step()
        return super().getitem(obj, argument)

    def call(self, context: Any, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = bounds.active()
        if budget is not None:
            budget.step()
        args = bounds.check_method(obj, args, kwargs)
        result = super().call(context, obj, *args, **kwargs)
        if budget is not None:
            budget.step(bounds.size_of(result))
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        bounds.check_format(value.__self__)
        return wrapped

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = bounds.active()
        if budget is not None:
            budget.step()
        if operator == "**":
            huge = _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1
            if huge and abs(left).bit_length() * right > bounds.BITS:
                raise SecurityError("'**' would make a number of more than a million bits")
        elif operator == "*":
            for sized, count in ((left, right), (right, left)):
                sequence = isinstance(sized, str | list | tuple) and _is_int(count)
                if sequence and len(sized) * count > bounds.ITEMS:
                    raise SecurityError("'*' would repeat a value to more than a million items")
        elif operator == "+" and isinstance(left, str | list | tuple):
            bounds.afford(bounds.size_of(left) + bounds.size_of(right))
        elif operator == "%":
            bounds.check_percent("%", left)
        result = self.binop_table[operator](left, right)
        if budget is not None:
            budget.step(bounds.size_of(result))
        return result

    # Called from the code ``_Generator`` writes.

    def counted(self, iterable: Any) -> Any:
        """A loop's iterable, a step taken for each item."""
        budget = bounds.active()
        return iterable if budget is None else _counting(iterable, budget)

    def concatenated(self, join: Callable[[Any], str], values: tuple[Any, ...]) -> str:
        """``a ~ b``, its size afforded before it is made."""
        bounds.afford(sum(len(v) if isinstance(v, str) else len(str(v)) for v in values))
        text = join(values)
        if (budget := bounds.active()) is not None:
            budget.step(len(text))
        return text

    def written(self, text: str) -> str:
        """Text a template writes (to its output, a macro's or a block's): a step."""
        if (budget := bounds.active()) is not None:
            budget.step(len(text))
        return text


def _counting(iterable: Any, budget: bounds.Budget) -> Iterator[Any]:
    for item in iterable:
        budget.step()
        yield item


def _stepped(function: Callable[..., Any], check: Callable[..., None] | None) -> Callable[..., Any]:
    """A filter or test that takes a step of the active Budget and is charged what it
    returns; with ``check``, refused first if that one step would make too much."""
    passed = 1 if getattr(function, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if check is not None and len(args) > passed:
            with contextlib.suppress(TypeError, ValueError):  # the filter's own to raise
                check(*args[passed:], **kwargs)
        result = function(*args, **kwargs)
        if (budget := bounds.active()) is not None:
            budget.step(bounds.size_of(result))
        return result

    return bounded


class _Generator(CodeGenerator):
    """Jinja's code generator, every loop, concatenation and write through the
    environment's budgeted methods (``counted``, ``concatenated``, ``written``): a
    loop that calls nothing still takes its steps, and text a macro or a block
    collects is charged as it is written, not only when it reaches the output."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        iterable = node.iter
        node.iter = nodes.Call(
            nodes.EnvironmentAttribute("counted"), [iterable], [], None, None, lineno=node.lineno
        )
        try:
            super().visit_For(node, frame)
        finally:
            node.iter = iterable

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # Jinja's choice of join, as its own visit_Concat makes it.
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        else:
            join = "str_join"
        self.write(f"environment.concatenated({join}, (")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))")

    def _output_const_repr(self, group: Iterable[Any]) -> str:
        return f"environment.written({super()._output_const_repr(group)})"

    def _output_child_pre(
        self, node: nodes.Expr, frame: Frame, finalize: CodeGenerator._FinalizeInfo
    ) -> None:
        self.write("environment.written(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(
        self, node: nodes.Expr, frame: Frame, finalize: CodeGenerator._FinalizeInfo
    ) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")


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
        value, ``[].pop()``, a macro calling itself, a huge repetition, a render past its
        Budget) is a RenderError: a template is data from the job file, so its failure is
        the unit's, never a crash of fanout."""
        if self.compiled is None:
            return self.source
        with bounds.bounded(), _failures_as_render_errors("template", self.key, self.at):
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
        with bounds.bounded(), _failures_as_render_errors("expression", self.key, self.at):
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
