"""What one attempt of one unit runs: every template rendered for that attempt.

The argv lists are rendered element by element, so a unit value such as
``a b; rm -rf ~ $(x)`` is one literal argument and never meets a shell.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .spec import Rung, Spec
from .templates import Template
from .units import Unit, base_context

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
    """Render the task of ``unit`` for one attempt.  Raises RenderError."""
    rung = spec.retry.ladder[rung_index]
    context = {
        **base_context(spec, trigger),
        "unit": unit.context(),
        "rung": rung_context(rung, rung_index, spec),
        "attempt": attempt,
        "round": round_number,
        "last": dict(last),
    }

    def argv(parts: tuple[Template, ...]) -> tuple[str, ...]:
        return tuple(part.render(context) for part in parts)

    prompt = spec.task.prompt.render(context) if spec.task.prompt else ""
    if rung.prompt_suffix is not None:
        prompt += rung.prompt_suffix.render(context)
    env = {name: value.render(context) for name, value in spec.task.env.items()}
    env.update({name: value.render(context) for name, value in rung.env.items()})
    return Invocation(
        unit_id=unit.id,
        rung=rung.name,
        attempt=attempt,
        argv=argv(rung.command if rung.command is not None else spec.task.command),
        verify=argv(spec.task.verify),
        prompt=prompt,
        env=MappingProxyType(env),
        secrets=spec.task.secrets,
        timeout=rung.timeout if rung.timeout is not None else spec.task.timeout,
        stage=argv(spec.units.stage),
        collect=argv(spec.units.collect),
    )
