"""Building the frozen values from a validated TOML document, and the conversions
between them and plain data (snake and camel case, freeze and thaw)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .. import cron
from ..quantities import parse_duration, parse_size
from ..schema import key_name
from ..templates import Expression, Template, Templates
from ..tomlpos import KeyPath, Positions
from .model import (
    DEFAULT_LADDER,
    Aggregate,
    Backoff,
    Collect,
    Host,
    Inputs,
    Limit,
    Retry,
    Rounds,
    Rung,
    Runtime,
    Spec,
    Task,
    Throttle,
    Trigger,
    Units,
)


def build(
    doc: Mapping[str, Any],
    path: Path,
    templates: Templates,
    workspace: Path,
    hosts: tuple[Host, ...],
    hosts_file: Path | None,
    positions: Positions,
) -> Spec:
    def tpl(source: str, key: KeyPath = ()) -> Template:
        """The compiled template, knowing where it is, so a render error is located."""
        compiled = templates.compile(source)
        if not key or compiled.compiled is None:
            return compiled
        line, col = positions.value(key)
        return compiled.located(key_name(key), (str(path), line, col))

    def expression(source: str, key: KeyPath) -> Expression:
        compiled = templates.compile_expression(source)
        line, col = positions.value(key)
        return compiled.located(key_name(key), (str(path), line, col))

    def argv(values: list[str] | None, key: KeyPath) -> tuple[Template, ...]:
        return tuple(tpl(v, (*key, n)) for n, v in enumerate(values or ()))

    def env(values: Mapping[str, str] | None, key: KeyPath) -> Mapping[str, Template]:
        return MappingProxyType({k: tpl(v, (*key, k)) for k, v in (values or {}).items()})

    def dur(value: str | None, default: float) -> float:
        return default if value is None else parse_duration(value)

    raw_inputs = doc["inputs"]
    inputs = Inputs(
        files=tuple(raw_inputs.get("files", ())),
        exclude=tuple(raw_inputs.get("exclude", ())),
        gitignore=raw_inputs.get("gitignore", True),
        jsonl=raw_inputs.get("jsonl"),
        csv=raw_inputs.get("csv"),
        json=raw_inputs.get("json"),
        items=tuple(freeze(item) for item in raw_inputs.get("items", ())),
        command=argv(raw_inputs.get("command"), ("inputs", "command")),
        format=raw_inputs.get("format"),
        pointer=raw_inputs.get("pointer", ""),
        ok_exit_codes=tuple(raw_inputs.get("okExitCodes", (0, 1))),
        timeout=dur(raw_inputs.get("timeout"), 600.0),
    )
    raw_units = doc.get("units", {})
    units = Units(
        where=expression(raw_units["where"], ("units", "where")) if "where" in raw_units else None,
        group_by=raw_units.get("groupBy"),
        id=tpl(raw_units["id"]) if "id" in raw_units else None,
        limit=raw_units.get("limit"),
        stage=argv(raw_units.get("stage"), ("units", "stage")),
        collect=argv(raw_units.get("collect"), ("units", "collect")),
    )
    raw_task = doc["task"]
    task = Task(
        prompt=tpl(raw_task["prompt"], ("task", "prompt")) if "prompt" in raw_task else None,
        command=argv(raw_task["command"], ("task", "command")),
        verify=argv(raw_task.get("verify"), ("task", "verify")),
        timeout=dur(raw_task.get("timeout"), 600.0),
        env=env(raw_task.get("env"), ("task", "env")),
        secrets=tuple(raw_task.get("secrets", ())),
        limits=tuple(raw_task["limits"]) if "limits" in raw_task else None,
        throttle_patterns=tuple(re.compile(p) for p in raw_task.get("throttlePatterns", ())),
    )
    raw_runtime = doc.get("runtime", {})
    runtime = Runtime(
        max_concurrent_tasks=raw_runtime.get("maxConcurrentTasks", 4),
        sandbox=raw_runtime.get("sandbox", "auto"),
        image=raw_runtime.get("image"),
        network=raw_runtime.get("network", False),
        hosts=hosts,
        workspace=workspace,
        state_dir=(workspace / raw_runtime.get("stateDir", ".fanout")).resolve(),
        log_limit=parse_size(raw_runtime.get("logLimit", "10MiB")),
        output_tail=parse_size(raw_runtime.get("outputTail", "4KiB")),
        hosts_file=hosts_file,
    )
    limits = tuple(
        Limit(
            name=raw["name"],
            requests=raw["requests"],
            per=parse_duration(raw["per"]),
            requests_per_task=raw.get("requestsPerTask", 1),
            max_in_flight=raw.get("maxInFlight"),
        )
        for raw in doc.get("limits", ())
    )
    raw_retry = doc.get("retry", {})
    raw_backoff = raw_retry.get("backoff", {})
    raw_throttle = raw_retry.get("throttle", {})
    retry = Retry(
        backoff=Backoff(
            initial=dur(raw_backoff.get("initial"), 10.0),
            max=dur(raw_backoff.get("max"), 600.0),
            jitter=raw_backoff.get("jitter", "full"),
        ),
        throttle=Throttle(
            initial=dur(raw_throttle.get("initial"), 5.0),
            max=dur(raw_throttle.get("max"), 600.0),
            jitter=float(raw_throttle.get("jitter", 0.5)),
            max_attempts=raw_throttle.get("maxAttempts", 10),
            max_wait=parse_duration(raw_throttle["maxWait"]) if "maxWait" in raw_throttle else None,
        ),
        ladder=tuple(
            Rung(
                name=raw["name"],
                attempts=raw.get("attempts", 1),
                vars=MappingProxyType(dict(raw.get("vars", {}))),
                timeout=parse_duration(raw["timeout"]) if "timeout" in raw else None,
                prompt_suffix=(
                    tpl(raw["promptSuffix"], ("retry", "ladder", n, "promptSuffix"))
                    if "promptSuffix" in raw
                    else None
                ),
                command=(
                    argv(raw["command"], ("retry", "ladder", n, "command"))
                    if "command" in raw
                    else None
                ),
                env=env(raw.get("env"), ("retry", "ladder", n, "env")),
            )
            for n, raw in enumerate(raw_retry.get("ladder", ()))
        )
        or DEFAULT_LADDER,
    )
    raw_aggregate = doc.get("aggregate")
    aggregate = (
        Aggregate(
            command=argv(raw_aggregate["command"], ("aggregate", "command")),
            timeout=dur(raw_aggregate.get("timeout"), 600.0),
        )
        if raw_aggregate
        else None
    )
    triggers = tuple(
        Trigger(
            name=raw.get("name", raw["schedule"]),
            schedule=cron.parse(raw["schedule"], raw.get("timezone", "UTC")),
            timezone=raw.get("timezone", "UTC"),
            overlap=raw.get("overlap", "skip"),
            catch_up=raw.get("catchUp", "none"),
            starting_deadline=dur(raw.get("startingDeadline"), 3600.0),
            vars=MappingProxyType(dict(raw.get("vars", {}))),
        )
        for raw in doc.get("triggers", ())
    )
    return Spec(
        version=doc["version"],
        name=doc["name"],
        description=doc.get("description", ""),
        inputs=inputs,
        units=units,
        task=task,
        runtime=runtime,
        limits=limits,
        retry=retry,
        rounds=Rounds(max=doc.get("rounds", {}).get("max", 1)),
        collect=Collect(apply=doc.get("collect", {}).get("apply", False)),
        aggregate=aggregate,
        triggers=triggers,
        file=path,
        templates=templates,
        positions=positions,
    )


def host_from(raw: Mapping[str, Any]) -> Host:
    """A Host from one validated inventory table."""
    values = _snake(raw)
    values.setdefault("name", raw["address"])
    values["labels"] = tuple(raw.get("labels", ()))
    return Host(**values)


def _snake(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {snake_case(key): value for key, value in raw.items()}


def snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def camel_case(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def freeze(value: Any) -> Any:
    """A deeply read-only copy of a TOML value (tables become mapping proxies)."""
    if isinstance(value, dict):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """A plain, mutable copy of a frozen value, as templates and JSON expect."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


def dataclass_fields(cls: type) -> list[str]:
    """Names of a spec dataclass's fields (used by the schema agreement test)."""
    assert is_dataclass(cls)
    return [f.name for f in fields(cls)]
