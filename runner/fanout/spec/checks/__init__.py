"""What a job file must satisfy beyond its schema.

Templates compile and refer only to variables that will exist (down to which rung sets
which ``rung.vars``), so does the ``units.where`` expression, literal stage and collect
paths can be staged and collected, referenced limits exist, durations read sensibly, cron
schedules and time zones are valid, globs and regular expressions are well formed,
``[[apis]]`` can be kept (``apis``), ``[notify]`` can send (``notify``), ``[publish]``
names a branch (``publish``), and no secret value is written into the file.  Every
check reads the raw document defensively: a value of the wrong type was already
reported by the schema and is skipped here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ...errors import Problem, did_you_mean
from ...values import cron, globs
from ...values.quantities import parse_duration, parse_size
from ...values.tomlpos import KeyPath
from .. import schema
from ..templates import JOB_SHAPE, LAST_SHAPE, TRIGGER_SHAPE, UNIT_SHAPE, Shape, is_template
from . import agents, apis, leaks, notify, paths, publish
from .context import Context, list_of, repeated_names, strings, table_of

__all__ = ["Context", "check_job", "schema_values"]

_RUNG_SHAPE: dict[str, Shape] = {
    "name": None,
    "index": None,
    "attempts": None,
    "timeout": None,
    "vars": None,
}


def check_job(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    problems += _check_durations(doc, ctx)
    problems += _check_templates(doc, ctx)
    problems += _check_units(doc, ctx)
    problems += _check_limits(doc, ctx)
    problems += apis.check_apis(doc, ctx)
    problems += agents.check_agent(doc, ctx)
    problems += _check_inputs(doc, ctx)
    problems += _check_runtime(doc, ctx)
    problems += _check_retry(doc, ctx)
    problems += _check_triggers(doc, ctx)
    problems += notify.check_notify(doc, ctx)
    problems += publish.check_publish(doc, ctx)
    problems += leaks.check_secrets(doc, ctx)
    problems += _check_nul_in_paths(doc, ctx)
    problems += _check_integer_range(doc, ctx)
    return problems


_INT64 = range(-(2**63), 2**63)


def _check_integer_range(doc: Any, ctx: Context, path: KeyPath = ()) -> list[Problem]:
    """TOML integers are 64-bit (the spec says a parser must refuse others; tomllib reads
    any size): a 300-digit count is a mistake, and would overflow where it is used."""
    if isinstance(doc, dict):
        items: Iterable[tuple[str | int, Any]] = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        if isinstance(doc, int) and not isinstance(doc, bool) and doc not in _INT64:
            digits = len(str(abs(doc)))
            return [
                ctx.at_value(
                    path, f"an integer of {digits} digits is out of range; TOML integers are 64-bit"
                )
            ]
        return []
    return [p for key, item in items for p in _check_integer_range(item, ctx, (*path, key))]


def _check_nul_in_paths(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    """No file name can hold a NUL byte, and the OS refuses one with a ValueError deep in
    pathlib; say so where it is written.  (A NUL in a unit's data is the unit's problem,
    refused when it is rendered, so ``inputs.items`` is not checked here.)"""
    problems = []
    roots: list[tuple[KeyPath, Any]] = [
        (("runtime",), table_of(doc, "runtime")),
        (("units", "stage"), table_of(doc, "units").get("stage")),
        (("units", "collect"), table_of(doc, "units").get("collect")),
    ]
    roots += [(("inputs", k), v) for k, v in table_of(doc, "inputs").items() if k != "items"]
    for root, value in roots:
        for path, text in strings(value, root):
            if "\0" in text:
                problems.append(ctx.at_value(path, "contains a NUL character ('\\u0000')"))
    return problems


def schema_values(
    value: Any, node: Mapping[str, Any], ref: str, path: KeyPath = ()
) -> Iterator[tuple[KeyPath, Any]]:
    """Every (path, value) in ``value`` that the schema types as ``ref`` (e.g. a duration)."""
    definitions = schema.job_schema()["definitions"]
    while "$ref" in node:
        if node["$ref"] == ref:
            yield path, value
            return
        node = definitions[node["$ref"].rsplit("/", 1)[1]]
    if isinstance(value, dict):
        properties = node.get("properties", {})
        extra = node.get("additionalProperties")
        for key, item in value.items():
            sub = properties.get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                yield from schema_values(item, sub, ref, (*path, key))
    elif isinstance(value, list) and isinstance(node.get("items"), dict):
        for index, item in enumerate(value):
            yield from schema_values(item, node["items"], ref, (*path, index))
    for option in node.get("oneOf", ()):
        if "$ref" in option or "items" in option:
            yield from schema_values(value, option, ref, path)


def _check_durations(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems = []
    # Values the schema refused are reported once, by the schema; the rest are parsed.
    for kind, parse in (("duration", parse_duration), ("size", parse_size)):
        for path, value in schema_values(doc, schema.job_schema(), f"#/definitions/{kind}"):
            if schema.conforms(kind, value):
                try:
                    parse(value)
                except ValueError as exc:
                    problems.append(ctx.at_value(path, str(exc)))
    backoff = table_of(table_of(doc, "retry"), "backoff")
    if _durations_inverted(backoff):
        problems.append(
            ctx.at_value(("retry", "backoff", "max"), "must not be shorter than 'initial'")
        )
    throttle = table_of(table_of(doc, "retry"), "throttle")
    if _durations_inverted(throttle):
        problems.append(
            ctx.at_value(("retry", "throttle", "max"), "must not be shorter than 'initial'")
        )
    return problems


def _durations_inverted(table: Mapping[str, Any]) -> bool:
    try:
        return parse_duration(table["max"]) < parse_duration(table["initial"])
    except (KeyError, TypeError, ValueError):
        return False


def _template_roots(path: KeyPath) -> dict[str, Shape]:
    """Which variables a template at ``path`` can see."""
    outside_units: dict[str, Shape] = {"job": JOB_SHAPE, "trigger": TRIGGER_SHAPE}
    if path[0] in ("inputs", "aggregate", "notify"):
        return outside_units
    if path[0] == "publish":
        return {**outside_units, **publish.roots(path)}
    if path[:2] == ("units", "id"):
        without_id = {k: v for k, v in UNIT_SHAPE.items() if k != "id"}
        return {**outside_units, "unit": without_id}
    if path[0] == "units":
        return {**outside_units, "unit": UNIT_SHAPE, "round": None}
    return {
        **outside_units,
        "unit": UNIT_SHAPE,
        "round": None,
        "rung": _RUNG_SHAPE,
        "attempt": None,
        "last": LAST_SHAPE,
    }


def _rungs_using(path: KeyPath, doc: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any]]]:
    """The ladder rungs on which the template at ``path`` is rendered."""
    ladder = [r for r in list_of(table_of(doc, "retry"), "ladder") if isinstance(r, dict)]
    rungs: list[tuple[int, Mapping[str, Any]]] = list(enumerate(ladder))
    rungs = rungs or [(-1, rung) for rung in schema.default("/definitions/retry", "ladder")]
    if path[:2] == ("retry", "ladder"):
        index = path[2]
        return [(i, r) for i, r in rungs if i == index]
    if path[:2] in (("task", "command"), ("task", "args")):
        return [(i, r) for i, r in rungs if "command" not in r]
    return rungs


def _check_templates(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    for path, source in schema_values(doc, schema.job_schema(), "#/definitions/template"):
        if not isinstance(source, str):
            continue
        roots = _template_roots(path)
        found = ctx.templates.check(source, roots)
        for problem in found:
            problems.append(ctx.in_template(path, problem.lineno, problem.message))
        if found or "rung" not in roots:
            continue
        for chain, lineno in _rung_var_uses(source, ctx):
            for index, rung in _rungs_using(path, doc):
                names = rung.get("vars", {}) if isinstance(rung.get("vars"), dict) else {}
                if chain not in names:
                    where = (
                        f" (retry.ladder[{index}])"
                        if index >= 0
                        else " (no [[retry.ladder]] is declared)"
                    )
                    message = f"'rung.vars.{chain}' is not set by rung {rung.get('name')!r}{where}"
                    problems.append(ctx.in_template(path, lineno, message))
    return problems


def _rung_var_uses(source: str, ctx: Context) -> list[tuple[str, int]]:
    return [
        (chain[2], lineno)
        for chain, lineno in ctx.templates.chains(source)
        if len(chain) >= 3 and chain[:2] == ("rung", "vars")
    ]


# What ``units.where`` sees: each record, before it belongs to a unit.
WHERE_SHAPE: dict[str, Shape] = {"record": None, "job": JOB_SHAPE, "trigger": TRIGGER_SHAPE}


def _check_units(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    units = table_of(doc, "units")
    where = units.get("where")
    if isinstance(where, str) and where:
        for found in ctx.templates.check_expression(where, WHERE_SHAPE):
            message = found.message
            if message.startswith("undefined variable 'unit'"):
                message = (
                    "'unit' does not exist yet: units.where keeps or drops each record "
                    "before records become units; use 'record'"
                )
            problems.append(ctx.in_template(("units", "where"), found.lineno, message))
    workspace = ctx.templates.workspace
    for kind in ("stage", "collect"):
        for index, source in enumerate(list_of(units, kind)):
            # A template is checked by ``fanout plan`` once it renders for the first unit.
            if isinstance(source, str) and source and not is_template(source):
                refused = paths.refusal(kind, source, source, workspace)
                if refused is not None and "\0" not in source:
                    problems.append(ctx.at_value(("units", kind, index), refused))
    return problems


def _check_limits(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems = []
    names: dict[str, int] = {}
    for index, limit in enumerate(list_of(doc, "limits")):
        name = limit.get("name") if isinstance(limit, dict) else None
        requests = limit.get("requests") if isinstance(limit, dict) else None
        per_task = (
            limit.get("requestsPerTask", schema.default("/definitions/limit", "requestsPerTask"))
            if isinstance(limit, dict)
            else None
        )
        if isinstance(requests, int) and isinstance(per_task, int) and 0 < requests < per_task:
            problems.append(
                ctx.at_value(
                    ("limits", index, "requestsPerTask"),
                    f"a task making {per_task} requests never fits in {requests} per window",
                )
            )
        if isinstance(name, str):
            names.setdefault(name, index)
    problems += repeated_names(doc, "limits", "limit", ctx)
    wanted = table_of(doc, "task").get("limits")
    if isinstance(wanted, list):
        for index, name in enumerate(wanted):
            if isinstance(name, str) and name not in names:
                guess = did_you_mean(name, names)
                hint = (
                    f" (did you mean {guess!r}?)"
                    if guess
                    else (
                        f"; declared: {', '.join(names)}"
                        if names
                        else "; no [[limits]] are declared"
                    )
                )
                problems.append(
                    ctx.at_value(("task", "limits", index), f"unknown limit {name!r}{hint}")
                )
    return problems


def _check_inputs(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems = []
    inputs = table_of(doc, "inputs")
    for key in ("files", "exclude"):
        patterns = inputs.get(key)
        if isinstance(patterns, list):
            for index, pattern in enumerate(patterns):
                if isinstance(pattern, str) and pattern:
                    try:
                        globs.compile_glob(pattern, hidden=key == "exclude")
                    except ValueError as exc:
                        problems.append(ctx.at_value(("inputs", key, index), str(exc)))
    if "pointer" in inputs and not ("json" in inputs or inputs.get("format") == "json"):
        problems.append(
            ctx.at_key(
                ("inputs", "pointer"),
                "only applies to 'json' inputs or a command with format = 'json'",
            )
        )
    if "command" in inputs and "format" not in inputs:
        problems.append(
            ctx.at_key(
                ("inputs", "command"),
                "needs 'format' (json, jsonl, lines, csv or lint) to read its output",
            )
        )
    patterns = table_of(doc, "task").get("throttlePatterns")
    if isinstance(patterns, list):
        for index, pattern in enumerate(patterns):
            if isinstance(pattern, str):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    problems.append(
                        ctx.at_value(
                            ("task", "throttlePatterns", index), f"not a regular expression: {exc}"
                        )
                    )
    return problems


def _check_runtime(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems = []
    runtime = table_of(doc, "runtime")
    if runtime.get("sandbox") == "podman" and "image" not in runtime:
        problems.append(ctx.at_value(("runtime", "sandbox"), "podman needs runtime.image"))
    if "image" in runtime and runtime.get("sandbox") != "podman":
        problems.append(ctx.at_key(("runtime", "image"), "only applies with sandbox = 'podman'"))
    if _relative_root(runtime):
        problems.append(
            ctx.at_value(("runtime", "sandboxRoot"), 'must be "auto" or an absolute path')
        )
    hosts = runtime.get("hosts")
    if isinstance(hosts, list):
        seen: dict[str, int] = {}
        for index, host in enumerate(hosts):
            if isinstance(host, dict) and isinstance(host.get("address"), str):
                name = str(host.get("name", host["address"]))
                if name in seen:
                    problems.append(
                        ctx.at_key(
                            ("runtime", "hosts", index),
                            f"host {name!r} is already declared by runtime.hosts[{seen[name]}]; "
                            "give one a distinct 'name'",
                        )
                    )
                seen.setdefault(name, index)
    problems += _check_ray(runtime, ctx)
    return problems


def _check_ray(runtime: Mapping[str, Any], ctx: Context) -> list[Problem]:
    """``runtime.ray``: one place units run (not SSH hosts as well), a sandbox a node
    can give (podman is this machine's), and a network the nodes can give (``"apis"``
    binds the coordinator's unix socket into each sandbox: the nodes have none)."""
    ray = runtime.get("ray")
    if not isinstance(ray, dict):
        return []
    problems = []
    if "hosts" in runtime:
        problems.append(
            ctx.at_key(
                ("runtime", "ray"),
                "runtime.ray and runtime.hosts are exclusive: units run on a Ray cluster"
                " or on SSH hosts, not both",
            )
        )
    if runtime.get("sandbox") == "podman":
        problems.append(
            ctx.at_value(
                ("runtime", "sandbox"),
                "podman sandboxes run on this machine only; use bwrap or none with runtime.ray",
            )
        )
    if runtime.get("network") == "apis":
        problems.append(
            ctx.at_value(
                ("runtime", "network"),
                'network "apis" binds the gateway\'s unix socket into local and SSH sandboxes'
                " only; with runtime.ray set network = true (workers reach the gateway at"
                " runtime.ray.gatewayHost)",
            )
        )
    if _relative_root(ray):
        problems.append(
            ctx.at_value(
                ("runtime", "ray", "sandboxRoot"), 'must be "auto" or an absolute path on the nodes'
            )
        )
    return problems


def _check_retry(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems = []
    ladder = table_of(doc, "retry").get("ladder")
    if isinstance(ladder, list):
        seen: dict[str, int] = {}
        for index, rung in enumerate(ladder):
            name = rung.get("name") if isinstance(rung, dict) else None
            if isinstance(name, str):
                if name in seen:
                    problems.append(
                        ctx.at_value(
                            ("retry", "ladder", index, "name"),
                            f"rung {name!r} is already declared by retry.ladder[{seen[name]}]",
                        )
                    )
                seen.setdefault(name, index)
    return problems


def _check_triggers(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    triggers = doc.get("triggers")
    if not isinstance(triggers, list):
        return problems
    for index, trigger in enumerate(triggers):
        if not isinstance(trigger, dict):
            continue
        for key, parse in (("schedule", cron.parse), ("timezone", cron.zone)):
            value = trigger.get(key)
            if isinstance(value, str) and value:
                try:
                    parse(value)
                except ValueError as exc:
                    problems.append(ctx.at_value(("triggers", index, key), str(exc)))
    return problems


def _relative_root(table: Mapping[str, Any]) -> bool:
    """Whether ``table``'s ``sandboxRoot`` (runtime's, or runtime.ray's) is neither
    ``auto`` nor an absolute path."""
    root = table.get("sandboxRoot")
    return isinstance(root, str) and root != "auto" and not root.startswith("/")
