"""Building the frozen values from a validated TOML document, and the conversions
between them and plain data (snake and camel case, freeze and thaw).

The document is first completed with the schema's defaults (``schema.with_defaults``),
so the builder reads every key that has a default as if it were written and repeats
no default value; ``.get`` is left for keys that may be absent with nothing assumed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..values import cron
from ..values.quantities import parse_duration, parse_size
from ..values.tomlpos import KeyPath, Positions
from . import presets
from .apis import FACTS, Style
from .model import (
    Aggregate,
    Api,
    Backoff,
    Collect,
    Host,
    Inputs,
    Limit,
    Price,
    Ray,
    Retry,
    Rounds,
    Rung,
    Runtime,
    Spec,
    Task,
    Throttle,
    Trigger,
    Units,
    Window,
)
from .schema import key_name, with_defaults
from .templates import Expression, Template, Templates


def build(
    written: Mapping[str, Any],
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

    doc = with_defaults(written)
    raw_inputs = doc["inputs"]
    inputs = Inputs(
        files=tuple(raw_inputs.get("files", ())),
        exclude=tuple(raw_inputs.get("exclude", ())),
        gitignore=raw_inputs["gitignore"],
        jsonl=raw_inputs.get("jsonl"),
        csv=raw_inputs.get("csv"),
        json=raw_inputs.get("json"),
        items=tuple(freeze(item) for item in raw_inputs.get("items", ())),
        command=argv(raw_inputs.get("command"), ("inputs", "command")),
        format=raw_inputs.get("format"),
        pointer=raw_inputs["pointer"],
        ok_exit_codes=tuple(raw_inputs["okExitCodes"]),
        timeout=parse_duration(raw_inputs["timeout"]),
    )
    raw_units = doc["units"]
    units = Units(
        where=expression(raw_units["where"], ("units", "where")) if "where" in raw_units else None,
        group_by=raw_units.get("groupBy"),
        id=tpl(raw_units["id"]) if "id" in raw_units else None,
        limit=raw_units.get("limit"),
        stage=argv(raw_units.get("stage"), ("units", "stage")),
        collect=argv(raw_units.get("collect"), ("units", "collect")),
    )
    apis = tuple(api_from(raw) for raw in doc.get("apis", ()))
    raw_task = doc["task"]
    agent = raw_task.get("agent")
    args = argv(raw_task.get("args"), ("task", "args"))
    command = argv(raw_task.get("command"), ("task", "command"))
    task_env = env(raw_task.get("env"), ("task", "env"))
    from_agent: frozenset[str] = frozenset()
    if agent is not None:
        preset_env = _agent_environment(agent, apis)
        filled = {name: tpl(value) for name, value in preset_env.items() if name not in task_env}
        from_agent = frozenset(filled) | (frozenset() if command else {"command"})
        if not command:
            command = tuple(tpl(part) for part in presets.PRESETS[agent].argv) + args
        # The preset's variables first, in its order, then the job's (which win).
        task_env = MappingProxyType({**filled, **task_env})
    task = Task(
        agent=agent,
        args=args,
        prompt=tpl(raw_task["prompt"], ("task", "prompt")) if "prompt" in raw_task else None,
        command=command,
        verify=argv(raw_task.get("verify"), ("task", "verify")),
        timeout=parse_duration(raw_task["timeout"]),
        memory=parse_size(raw_task["memory"]) if "memory" in raw_task else None,
        env=task_env,
        secrets=tuple(raw_task.get("secrets", ())),
        limits=tuple(raw_task["limits"]) if "limits" in raw_task else None,
        throttle_patterns=tuple(re.compile(p) for p in raw_task.get("throttlePatterns", ())),
        budget_usd=float(raw_task["budget"]["usd"]) if "budget" in raw_task else None,
        from_agent=from_agent,
    )
    raw_runtime = doc["runtime"]
    runtime = Runtime(
        max_concurrent_tasks=raw_runtime["maxConcurrentTasks"],
        sandbox=raw_runtime["sandbox"],
        unsandboxed_secrets=raw_runtime["unsandboxedSecrets"],
        image=raw_runtime.get("image"),
        network=raw_runtime["network"],
        hosts=hosts,
        ray=_ray(raw_runtime["ray"]) if "ray" in raw_runtime else None,
        workspace=workspace,
        state_dir=(workspace / raw_runtime["stateDir"]).resolve(),
        log_limit=parse_size(raw_runtime["logLimit"]),
        output_tail=parse_size(raw_runtime["outputTail"]),
        hosts_file=hosts_file,
    )
    limits = tuple(
        Limit(
            name=raw["name"],
            requests=raw["requests"],
            per=parse_duration(raw["per"]),
            requests_per_task=raw["requestsPerTask"],
            max_in_flight=raw.get("maxInFlight"),
        )
        for raw in doc.get("limits", ())
    )
    raw_retry = doc["retry"]
    raw_backoff = raw_retry["backoff"]
    raw_throttle = raw_retry["throttle"]
    retry = Retry(
        backoff=Backoff(
            initial=parse_duration(raw_backoff["initial"]),
            max=parse_duration(raw_backoff["max"]),
            jitter=raw_backoff["jitter"],
        ),
        throttle=Throttle(
            initial=parse_duration(raw_throttle["initial"]),
            max=parse_duration(raw_throttle["max"]),
            jitter=float(raw_throttle["jitter"]),
            learn=raw_throttle["learn"],
            max_attempts=raw_throttle["maxAttempts"],
            max_wait=parse_duration(raw_throttle["maxWait"]) if "maxWait" in raw_throttle else None,
        ),
        ladder=tuple(
            Rung(
                name=raw["name"],
                attempts=raw["attempts"],
                vars=MappingProxyType(dict(raw.get("vars", {}))),
                timeout=parse_duration(raw["timeout"]) if "timeout" in raw else None,
                memory=parse_size(raw["memory"]) if "memory" in raw else None,
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
            for n, raw in enumerate(raw_retry["ladder"])
        ),
    )
    raw_aggregate = doc.get("aggregate")
    aggregate = (
        Aggregate(
            command=argv(raw_aggregate["command"], ("aggregate", "command")),
            timeout=parse_duration(raw_aggregate["timeout"]),
        )
        if raw_aggregate
        else None
    )
    triggers = tuple(
        Trigger(
            type=raw["type"],
            name=raw.get("name", raw["schedule"]),
            schedule=cron.parse(raw["schedule"], raw["timezone"]),
            timezone=raw["timezone"],
            overlap=raw["overlap"],
            catch_up=raw["catchUp"],
            starting_deadline=parse_duration(raw["startingDeadline"]),
            vars=MappingProxyType(dict(raw.get("vars", {}))),
        )
        for raw in doc.get("triggers", ())
    )
    return Spec(
        version=doc["version"],
        name=doc["name"],
        description=doc["description"],
        inputs=inputs,
        units=units,
        task=task,
        runtime=runtime,
        limits=limits,
        apis=apis,
        retry=retry,
        rounds=Rounds(max=doc["rounds"]["max"]),
        collect=Collect(apply=doc["collect"]["apply"]),
        aggregate=aggregate,
        triggers=triggers,
        file=path,
        templates=templates,
        positions=positions,
    )


def _agent_environment(agent: str, apis: tuple[Api, ...]) -> dict[str, str]:
    """The agent preset's environment for this job's ``[[apis]]``: the output cap is
    derived from the tightest outputTokens window of the APIs the agent speaks to."""
    speaks = presets.PRESETS[agent].styles
    windows = [
        api.output_tokens.limit
        for api in apis
        if api.style in speaks and api.output_tokens is not None
    ]
    return presets.environment(
        agent, styles=(api.style for api in apis), output_tokens=min(windows, default=None)
    )


def api_from(raw: Mapping[str, Any]) -> Api:
    """An Api from one validated ``[[apis]]`` table.  An unset ``baseUrlEnv`` or
    ``tokenEnv`` is the style's usual variable (``apistyles.FACTS``: it depends on the
    style, so it cannot be a schema default); ``checks`` made sure plain names both."""
    style = Style(raw["style"])
    facts = FACTS[style]
    base_url_env = raw.get("baseUrlEnv", facts.base_url_env)
    token_env = raw.get("tokenEnv", facts.token_env)
    assert base_url_env is not None, "checked: style plain names baseUrlEnv"
    assert token_env is not None, "checked: style plain names tokenEnv"

    def window(key: str) -> Window | None:
        written = raw.get(key)
        if written is None:
            return None
        return Window(limit=written["limit"], per=parse_duration(written["per"]))

    def price(written: Mapping[str, Any]) -> Price:
        def optional(key: str) -> float | None:
            return float(written[key]) if key in written else None

        return Price(
            input=float(written["input"]),
            output=float(written["output"]),
            cache_read=optional("cacheRead"),
            cache_write=optional("cacheWrite"),
        )

    budget = raw.get("budget")
    return Api(
        name=raw["name"],
        # Without its trailing "/": the worker's path, which starts with one, is
        # appended, and "https://host/v1/" + "/messages" would ask for "//messages".
        upstream=raw["upstream"].rstrip("/"),
        style=style,
        base_url_env=base_url_env,
        token_env=token_env,
        key_secret=raw.get("keySecret"),
        requests=window("requests"),
        input_tokens=window("inputTokens"),
        output_tokens=window("outputTokens"),
        max_in_flight=raw.get("maxInFlight"),
        # TOML keeps a table's keys in file order: the first glob that matches wins.
        prices=tuple((glob, price(p)) for glob, p in raw.get("prices", {}).items()),
        budget_usd=float(budget["usd"]) if budget is not None else None,
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


def _ray(raw: Mapping[str, Any]) -> Ray:
    return Ray(
        address=raw["address"],
        cpus=raw["cpus"],
        resources=MappingProxyType({k: float(v) for k, v in raw.get("resources", {}).items()}),
        labels=MappingProxyType(dict(raw.get("labels", {}))),
        gateway_host=raw["gatewayHost"],
        sandbox_root=raw["sandboxRoot"],
    )


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
