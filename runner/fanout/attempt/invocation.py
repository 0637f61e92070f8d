"""What one attempt of one unit runs: every template rendered for that attempt.

The argv lists are rendered element by element, so a unit value such as
``a b; rm -rf ~ $(x)`` is one literal argument and never meets a shell.

What a program can receive is decided here, once, for every transport: a rendered
value holding a NUL byte (argv, environment and C strings end at NUL: a transport
would cut the value there or fail to start the program) or a string that is not
valid UTF-8 (a lone surrogate from JSON ``"\\ud800"``, which no pipe can carry), or an
argument or environment value longer than the kernel passes to a program, is refused
as a RenderError, a per-unit ``template:`` failure, before any process starts.

All the templates of one attempt render under one Budget (``templates.bounds``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass
from types import MappingProxyType
from typing import Any

from ..backlog.units import Unit, base_context
from ..spec import Rung, Spec
from ..spec.templates import Expression, RenderError, Template, bounded

NO_LAST_ATTEMPT: Mapping[str, Any] = MappingProxyType(
    {"status": "", "reason": "", "exitCode": None, "outputTail": "", "rung": "", "attempt": 0}
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Invocation:
    unit_id: str
    rung: str
    attempt: int
    argv: tuple[str, ...]
    verify: tuple[str, ...]
    prompt: str
    env: Mapping[str, str]
    secrets: tuple[str, ...]
    timeout: float
    # Bytes this attempt is allocated (the rung's, else the task's), None if undeclared:
    # the report bills it; a transport that can reserve memory (Ray) passes it on.
    memory: int | None = None
    stage: tuple[str, ...]
    collect: tuple[str, ...]


def rung_context(rung: Rung, index: int, spec: Spec) -> dict[str, Any]:
    return {
        "name": rung.name,
        "index": index,
        "attempts": rung.attempts,
        "timeout": rung.timeout if rung.timeout is not None else spec.task.timeout,
        "vars": dict(rung.vars),
    }


def render(
    spec: Spec,
    unit: Unit,
    *,
    rung_index: int = 0,
    attempt: int = 1,
    round_number: int = 1,
    last: Mapping[str, Any] = NO_LAST_ATTEMPT,
    trigger: Mapping[str, Any] | None = None,
) -> Invocation:
    """Render the task of ``unit`` for one attempt, every template under one Budget
    (the active one, else its own).  Raises RenderError."""
    with bounded():
        return _render(spec, unit, rung_index, attempt, round_number, last, trigger)


def _render(
    spec: Spec,
    unit: Unit,
    rung_index: int,
    attempt: int,
    round_number: int,
    last: Mapping[str, Any],
    trigger: Mapping[str, Any] | None,
) -> Invocation:
    rung = spec.retry.ladder[rung_index]
    context = _context(spec, unit, rung_index, attempt, round_number, last, trigger)

    rung_key = f"retry.ladder[{rung_index}]"

    def argv(parts: tuple[Template, ...], key: str) -> tuple[str, ...]:
        return tuple(
            _rendered(part, context, f"{key}[{i}]", argument=True) for i, part in enumerate(parts)
        )

    def paths(parts: tuple[Template, ...], key: str) -> tuple[str, ...]:
        return tuple(_rendered(part, context, f"{key}[{i}]") for i, part in enumerate(parts))

    prompt = _rendered(spec.task.prompt, context, "task.prompt") if spec.task.prompt else ""
    if rung.prompt_suffix is not None:
        prompt += _rendered(rung.prompt_suffix, context, f"{rung_key}.promptSuffix")
    env = {
        name: _rendered(value, context, f"task.env.{name}", variable=name)
        for name, value in spec.task.env.items()
    }
    env.update(
        {
            name: _rendered(value, context, f"{rung_key}.env.{name}", variable=name)
            for name, value in rung.env.items()
        }
    )
    if rung.command is not None:
        command = argv(rung.command, f"{rung_key}.command")
    else:
        command = argv(spec.task.command, "task.command")
    return Invocation(
        unit_id=unit.id,
        rung=rung.name,
        attempt=attempt,
        argv=command,
        verify=argv(spec.task.verify, "task.verify"),
        prompt=prompt,
        env=MappingProxyType(env),
        secrets=spec.task.secrets,
        timeout=rung.timeout if rung.timeout is not None else spec.task.timeout,
        memory=rung.memory if rung.memory is not None else spec.task.memory,
        stage=paths(spec.units.stage, "units.stage"),
        collect=paths(spec.units.collect, "units.collect"),
    )


def templated(spec: Spec) -> bool:
    """Whether anything in ``spec`` runs Jinja: a template (text with ``{{``, ``{%`` or
    ``{#``) or an expression.  Without either, rendering an attempt copies the job's
    text, so ``run.preparing`` does it on the event loop instead of in a thread (the
    hand-off was most of the coordinator's work for such a unit).  Every field of the
    spec is looked at, not a list of those ``render`` reads, so a field added later
    cannot be missed: at worst an unrendered one sends every attempt to the thread."""
    return any(
        isinstance(found, Expression) or found.compiled is not None for found in _jinja(spec)
    )


def _jinja(value: Any) -> Iterator[Template | Expression]:
    if isinstance(value, Template | Expression):
        yield value
    elif is_dataclass(value) and not isinstance(value, type):
        for item in fields(value):
            yield from _jinja(getattr(value, item.name))
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _jinja(item)
    elif isinstance(value, tuple | list | frozenset | set):
        for item in value:
            yield from _jinja(item)


def stage_paths(
    spec: Spec, unit: Unit, *, round_number: int = 1, trigger: Mapping[str, Any] | None = None
) -> tuple[str, ...]:
    """What the first attempt of ``unit`` stages (``units.stage`` rendered, and nothing
    else of the task), for the selection to drop a unit inside a state directory.  A
    template that fails gives nothing: the attempt fails with its reason."""
    if not spec.units.stage:
        return ()
    context = _context(spec, unit, 0, 1, round_number, NO_LAST_ATTEMPT, trigger)
    try:
        return tuple(part.render(context) for part in spec.units.stage)
    except RenderError:
        return ()


def _context(
    spec: Spec,
    unit: Unit,
    rung_index: int,
    attempt: int,
    round_number: int,
    last: Mapping[str, Any],
    trigger: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The variables an attempt's templates see."""
    return {
        **base_context(spec, trigger),
        "unit": unit.context(),
        "rung": rung_context(spec.retry.ladder[rung_index], rung_index, spec),
        "attempt": attempt,
        "round": round_number,
        "last": dict(last),
    }


# What one argument of a program, or one NAME=value of its environment, can be: Linux's
# MAX_ARG_STRLEN (32 pages), with the NUL that ends it.  Past it the program does not
# start (E2BIG, "Argument list too long"), on this machine or on a host alike.
ARGUMENT_MAX = 131072


def _rendered(
    template: Template,
    context: Mapping[str, Any],
    key: str,
    *,
    argument: bool = False,
    variable: str = "",
) -> str:
    """``template`` rendered, if a program can be given the value (as an ``argument``, or
    as the environment ``variable``, if it is one); else a RenderError naming ``key``,
    at the template's place in the job file."""
    value = template.render(context)
    reason = _unpassable(value)
    if reason is None and (argument or variable):
        size = len(value.encode()) + (len(variable.encode()) + 1 if variable else 0)
        if size >= ARGUMENT_MAX:
            what = "an environment variable" if variable else "an argument"
            reason = f"the value is {size:,} bytes; {what} can be {ARGUMENT_MAX - 1:,} at most"
    if reason is not None:
        raise RenderError(reason, key=key, at=template.at)
    return value


def _unpassable(value: str) -> str | None:
    """Why a program cannot be given ``value``, or None if it can."""
    if "\0" in value:
        return "the value contains a NUL byte (unit values cannot pass NUL to a program)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = value[exc.start]
        return (
            f"the value is not valid UTF-8 (a lone surrogate U+{ord(char):04X} at"
            f" character {exc.start}; unit values must be text)"
        )
    return None
