"""Building the frozen values from a validated TOML document, and the conversions
between them and plain data (snake and camel case, freeze and thaw).

The document is first completed with the schema's defaults (``schema.with_defaults``),
so the builder reads every key that has a default as if it were written and repeats
no default value; ``.get`` is left for keys that may be absent with nothing assumed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
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
    Notify,
    NotifyEvent,
    Price,
    Publish,
    PublishCommits,
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
    """The Spec of a validated job document, one step for each table of the job file."""
    located = _LocatedTemplates(templates=templates, positions=positions, path=path)
    doc = with_defaults(written)
    inputs = _inputs(doc["inputs"], located)
    units = _units(doc["units"], located)
    # Before the task: an agent preset's environment depends on the APIs it speaks to.
    apis = tuple(api_from(raw) for raw in doc.get("apis", ()))
    return Spec(
        version=doc["version"],
        name=doc["name"],
        description=doc["description"],
        inputs=inputs,
        units=units,
        task=_task(doc["task"], apis, located),
        runtime=_runtime(doc["runtime"], workspace, hosts, hosts_file),
        limits=tuple(_limit(raw) for raw in doc.get("limits", ())),
        apis=apis,
        retry=_retry(doc["retry"], located),
        rounds=Rounds(max=doc["rounds"]["max"]),
        collect=Collect(apply=doc["collect"]["apply"]),
        aggregate=_aggregate(doc.get("aggregate"), located),
        notify=_notify(doc.get("notify"), located),
        publish=_publish(doc.get("publish"), located),
        triggers=tuple(_trigger(raw) for raw in doc.get("triggers", ())),
        file=path,
        templates=templates,
        positions=positions,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class _LocatedTemplates:
    """The job file's templates compiled, each knowing where it is written, so a render
    error names the file, line, column and key."""

    templates: Templates
    positions: Positions
    path: Path

    def template(self, source: str, key: KeyPath = ()) -> Template:
        compiled = self.templates.compile(source)
        if not key or compiled.compiled is None:
            return compiled
        line, col = self.positions.value(key)
        return compiled.located(key_name(key), (str(self.path), line, col))

    def expression(self, source: str, key: KeyPath) -> Expression:
        compiled = self.templates.compile_expression(source)
        line, col = self.positions.value(key)
        return compiled.located(key_name(key), (str(self.path), line, col))

    def argv(self, values: list[str] | None, key: KeyPath) -> tuple[Template, ...]:
        return tuple(self.template(v, (*key, n)) for n, v in enumerate(values or ()))

    def env(self, values: Mapping[str, str] | None, key: KeyPath) -> Mapping[str, Template]:
        return MappingProxyType({k: self.template(v, (*key, k)) for k, v in (values or {}).items()})


def _inputs(raw: Mapping[str, Any], located: _LocatedTemplates) -> Inputs:
    return Inputs(
        files=tuple(raw.get("files", ())),
        exclude=tuple(raw.get("exclude", ())),
        gitignore=raw["gitignore"],
        jsonl=raw.get("jsonl"),
        csv=raw.get("csv"),
        json=raw.get("json"),
        items=tuple(freeze(item) for item in raw.get("items", ())),
        command=located.argv(raw.get("command"), ("inputs", "command")),
        format=raw.get("format"),
        pointer=raw["pointer"],
        ok_exit_codes=tuple(raw["okExitCodes"]),
        timeout=parse_duration(raw["timeout"]),
    )


def _units(raw: Mapping[str, Any], located: _LocatedTemplates) -> Units:
    return Units(
        where=located.expression(raw["where"], ("units", "where")) if "where" in raw else None,
        group_by=raw.get("groupBy"),
        id=located.template(raw["id"]) if "id" in raw else None,
        limit=raw.get("limit"),
        stage=located.argv(raw.get("stage"), ("units", "stage")),
        collect=located.argv(raw.get("collect"), ("units", "collect")),
        version=raw["version"],
        reuse=raw["reuse"],
        quarantine_after=raw["quarantineAfter"],
    )


def _task(raw: Mapping[str, Any], apis: tuple[Api, ...], located: _LocatedTemplates) -> Task:
    """The task, with its agent preset's command and environment filled in where the job
    file left them out (``from_agent`` names what the preset filled)."""
    agent = raw.get("agent")
    args = located.argv(raw.get("args"), ("task", "args"))
    command = located.argv(raw.get("command"), ("task", "command"))
    env = located.env(raw.get("env"), ("task", "env"))
    from_agent: frozenset[str] = frozenset()
    if agent is not None:
        preset_env = _agent_environment(agent, apis)
        filled = {
            name: located.template(value) for name, value in preset_env.items() if name not in env
        }
        from_agent = frozenset(filled) | (frozenset() if command else {"command"})
        if not command:
            command = tuple(located.template(part) for part in presets.PRESETS[agent].argv) + args
        # The preset's variables first, in its order, then the job's (which win).
        env = MappingProxyType({**filled, **env})
    return Task(
        agent=agent,
        args=args,
        prompt=located.template(raw["prompt"], ("task", "prompt")) if "prompt" in raw else None,
        command=command,
        verify=located.argv(raw.get("verify"), ("task", "verify")),
        timeout=parse_duration(raw["timeout"]),
        memory=parse_size(raw["memory"]) if "memory" in raw else None,
        env=env,
        secrets=tuple(raw.get("secrets", ())),
        limits=tuple(raw["limits"]) if "limits" in raw else None,
        throttle_patterns=tuple(re.compile(p) for p in raw.get("throttlePatterns", ())),
        budget_usd=float(raw["budget"]["usd"]) if "budget" in raw else None,
        from_agent=from_agent,
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


def _runtime(
    raw: Mapping[str, Any], workspace: Path, hosts: tuple[Host, ...], hosts_file: Path | None
) -> Runtime:
    return Runtime(
        max_concurrent_tasks=raw["maxConcurrentTasks"],
        sandbox=raw["sandbox"],
        sandbox_root=raw["sandboxRoot"],
        unsandboxed_secrets=raw["unsandboxedSecrets"],
        image=raw.get("image"),
        network=raw["network"],
        hosts=hosts,
        ray=_ray(raw["ray"]) if "ray" in raw else None,
        workspace=workspace,
        state_dir=(workspace / raw["stateDir"]).resolve(),
        log_limit=parse_size(raw["logLimit"]),
        output_tail=parse_size(raw["outputTail"]),
        hosts_file=hosts_file,
    )


def _ray(raw: Mapping[str, Any]) -> Ray:
    return Ray(
        address=raw["address"],
        cpus=raw["cpus"],
        resources=MappingProxyType({k: float(v) for k, v in raw.get("resources", {}).items()}),
        labels=MappingProxyType(dict(raw.get("labels", {}))),
        gateway_host=raw["gatewayHost"],
        sandbox_root=raw["sandboxRoot"],
    )


def _limit(raw: Mapping[str, Any]) -> Limit:
    return Limit(
        name=raw["name"],
        requests=raw["requests"],
        per=parse_duration(raw["per"]),
        requests_per_task=raw["requestsPerTask"],
        max_in_flight=raw.get("maxInFlight"),
    )


def _retry(raw: Mapping[str, Any], located: _LocatedTemplates) -> Retry:
    return Retry(
        backoff=_backoff(raw["backoff"]),
        throttle=_throttle(raw["throttle"]),
        ladder=tuple(
            _rung(rung, ("retry", "ladder", n), located) for n, rung in enumerate(raw["ladder"])
        ),
    )


def _backoff(raw: Mapping[str, Any]) -> Backoff:
    return Backoff(
        initial=parse_duration(raw["initial"]),
        max=parse_duration(raw["max"]),
        jitter=raw["jitter"],
    )


def _throttle(raw: Mapping[str, Any]) -> Throttle:
    return Throttle(
        initial=parse_duration(raw["initial"]),
        max=parse_duration(raw["max"]),
        jitter=float(raw["jitter"]),
        learn=raw["learn"],
        max_attempts=raw["maxAttempts"],
        max_wait=parse_duration(raw["maxWait"]) if "maxWait" in raw else None,
    )


def _rung(raw: Mapping[str, Any], key: KeyPath, located: _LocatedTemplates) -> Rung:
    """One ``[[retry.ladder]]`` table; ``key`` is where it is (``retry.ladder.<n>``)."""
    return Rung(
        name=raw["name"],
        attempts=raw["attempts"],
        vars=MappingProxyType(dict(raw.get("vars", {}))),
        timeout=parse_duration(raw["timeout"]) if "timeout" in raw else None,
        memory=parse_size(raw["memory"]) if "memory" in raw else None,
        prompt_suffix=(
            located.template(raw["promptSuffix"], (*key, "promptSuffix"))
            if "promptSuffix" in raw
            else None
        ),
        command=located.argv(raw["command"], (*key, "command")) if "command" in raw else None,
        env=located.env(raw.get("env"), (*key, "env")),
    )


def _aggregate(raw: Mapping[str, Any] | None, located: _LocatedTemplates) -> Aggregate | None:
    if not raw:
        return None
    return Aggregate(
        command=located.argv(raw["command"], ("aggregate", "command")),
        timeout=parse_duration(raw["timeout"]),
    )


def _notify(raw: Mapping[str, Any] | None, located: _LocatedTemplates) -> Notify | None:
    if raw is None:
        return None
    return Notify(
        webhook=raw.get("webhook"),
        webhook_secret=raw.get("webhookSecret"),
        command=located.argv(raw.get("command"), ("notify", "command")),
        secrets=tuple(raw.get("secrets", ())),
        on=tuple(NotifyEvent(event) for event in raw["on"]),
        timeout=parse_duration(raw["timeout"]),
    )


def _publish(raw: Mapping[str, Any] | None, located: _LocatedTemplates) -> Publish | None:
    if raw is None:
        return None

    def template(key: str) -> Template:
        return located.template(raw[key], ("publish", key))

    return Publish(
        branch=template("branch"),
        remote=raw["remote"],
        base=raw.get("base"),
        commits=PublishCommits(raw["commits"]),
        message=template("message"),
        unit_message=template("unitMessage"),
        title=template("title"),
        pr=located.argv(raw["pr"], ("publish", "pr")),
        update=located.argv(raw["update"], ("publish", "update")),
        timeout=parse_duration(raw["timeout"]),
    )


def _trigger(raw: Mapping[str, Any]) -> Trigger:
    return Trigger(
        type=raw["type"],
        name=raw.get("name", raw["schedule"]),
        schedule=cron.parse(raw["schedule"], raw["timezone"]),
        timezone=raw["timezone"],
        overlap=raw["overlap"],
        catch_up=raw["catchUp"],
        starting_deadline=parse_duration(raw["startingDeadline"]),
        vars=MappingProxyType(dict(raw.get("vars", {}))),
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
