"""What ``[[apis]]`` must satisfy beyond the schema: the sandbox can reach the gateway,
the real key stays out of the sandbox, the gateway's variables are its own, and each
API's settings mean something for its style.  And what the sandbox must hide when
workers get tokens or ``task.secrets`` (``exposure``)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import Problem
from ...isolation.exposure import Handed, hides, network_refusal
from ...values.tomlpos import KeyPath
from ..apis import FACTS, Style
from ..presets import PRESETS
from .context import Context, list_of, repeated_names, table_of

# The keys a style that reads no usage cannot keep: nothing would count the tokens
# or the cost, so a token window would only ever hold estimates and a budget would
# never be reached.
_USAGE_KEYS = ("inputTokens", "outputTokens", "prices", "budget")
# What the gateway puts in each variable, for the messages.
_VARIABLES = {"baseUrlEnv": "its URL", "tokenEnv": "a per-attempt token"}
# What fanout sets in every worker's environment itself (``attempt.Attempt.environment``):
# the gateway's value would replace it, and a worker without its PATH or HOME fails in
# ways that never mention the API.
_WORKER_VARIABLES = frozenset({"PATH", "HOME", "TMPDIR"})
_WORKER_PREFIX = "FANOUT_"
# The agents whose result says what the attempt cost (claude's ``total_cost_usd``,
# aider's session cost; codex and gemini report tokens only, which fanout does not
# price without a gateway): only their spending counts toward a task.budget when no
# priced [[apis]] entry counts it.
_COSTING_AGENTS = frozenset({"claude", "aider"})


def check_apis(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    apis = [(i, api) for i, api in enumerate(list_of(doc, "apis")) if isinstance(api, dict)]
    unit_budget = _check_unit_budget(doc, apis, ctx) + _check_sandbox(doc, ctx)
    if not apis:
        return unit_budget + _check_apis_network(doc, ctx)
    problems = unit_budget + _check_network(doc, ctx)
    problems += repeated_names(doc, "apis", "api", ctx)
    for index, api in apis:
        problems += _check_upstream(api, index, ctx)
        problems += _check_style(api, index, ctx)
        if "budget" in api and "prices" not in api and api.get("style") != Style.PLAIN:
            problems.append(_budget_needs_prices(("apis", index, "budget"), ctx))
    problems += _check_variables(doc, apis, ctx)
    return problems


def _budget_needs_prices(path: KeyPath, ctx: Context, why: str = "") -> Problem:
    return ctx.at_key(
        path,
        "a budget needs prices: without them every request costs $0 and the budget never "
        f"stops anything{why}",
    )


def _check_unit_budget(
    doc: Mapping[str, Any], apis: Sequence[tuple[int, Mapping[str, Any]]], ctx: Context
) -> list[Problem]:
    """``task.budget`` counts priced gateway usage, else the cost the agent reports:
    with neither, every unit's spending is $0 and the budget is never reached."""
    task = table_of(doc, "task")
    if "budget" not in task:
        return []
    if any("prices" in api and api.get("style") != Style.PLAIN for _, api in apis):
        return []
    agent = task.get("agent")
    if agent in _COSTING_AGENTS:
        # The gateway's count of the agent's requests replaces what the agent says
        # (dispatch._through_gateway): through an unpriced API it is $0.
        styles = PRESETS[agent].styles
        through = next((i for i, api in apis if api.get("style") in styles), None)
        if through is None:
            return []
        why = (
            f" (no [[apis]] entry has prices, and agent {agent!r} calls apis[{through}]"
            " through the gateway, whose count replaces the cost the agent reports)"
        )
    elif isinstance(agent, str):
        why = f" (no [[apis]] entry has prices, and agent {agent!r} reports no cost)"
    else:
        why = " (no [[apis]] entry has prices, and a task without an agent reports no cost)"
    return [_budget_needs_prices(("task", "budget"), ctx, why)]


def _check_network(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    runtime = table_of(doc, "runtime")
    network = runtime.get("network", False)
    if network is True or network == "apis" or not isinstance(network, bool):
        return []  # not a boolean nor "apis": the schema said so
    message = (
        'a job with [[apis]] needs runtime.network = true or "apis": its workers reach '
        "the gateway over the network, and a sandbox without network cannot reach even "
        'the coordinator\'s loopback; set `runtime.network = "apis"` (only the gateway '
        "is reachable) or `runtime.network = true`"
    )
    if "network" in runtime:
        return [ctx.at_value(("runtime", "network"), message)]
    return [ctx.at_key(("apis", 0), message)]


def _check_sandbox(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    """A sandbox written in the file that cannot do what the job needs of it: hide the
    other units from workers given tokens or secrets (``exposure``), or give network
    "apis".  ``auto`` is decided where the run starts (``commands``, the transports)."""
    runtime = table_of(doc, "runtime")
    kind = runtime.get("sandbox")
    if kind not in ("none", "podman"):
        return []  # auto and bwrap, or a value the schema refused
    problems = []
    secrets = list_of(table_of(doc, "task"), "secrets")
    handed = Handed(tokens=bool(list_of(doc, "apis")), secrets=bool(secrets))
    if handed and not hides(kind) and runtime.get("unsandboxedSecrets") is not True:
        where = f"sandbox {kind!r} runs workers in plain directories"
        fix = "use sandbox 'bwrap' (or 'auto' where bubblewrap works)"
        problems.append(ctx.at_value(("runtime", "sandbox"), handed.refusal(where, fix)))
    # With runtime.ray, network "apis" is refused for the cluster's own reason.
    refusal = network_refusal(kind, fix="use sandbox 'bwrap' (or 'auto' where bubblewrap works)")
    if runtime.get("network") == "apis" and refusal is not None and "ray" not in runtime:
        problems.append(ctx.at_value(("runtime", "network"), refusal))
    return problems


def _check_apis_network(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    """``network = "apis"`` in a job without [[apis]]: its workers would reach nothing."""
    if table_of(doc, "runtime").get("network") != "apis":
        return []
    return [
        ctx.at_value(
            ("runtime", "network"),
            'runtime.network = "apis" lets workers reach only the API gateway, and this job '
            "has no [[apis]]: its workers would reach nothing; declare the APIs they call "
            "in [[apis]], or set `runtime.network = false` (no network) or `true`",
        )
    ]


def _check_upstream(api: Mapping[str, Any], index: int, ctx: Context) -> list[Problem]:
    upstream = api.get("upstream")
    if not isinstance(upstream, str) or not upstream:
        return []
    reason = _upstream_refusal(upstream)
    if reason is None:
        return []
    return [ctx.at_value(("apis", index, "upstream"), reason)]


def _upstream_refusal(upstream: str) -> str | None:
    shape = "write it as http(s)://host[:port][/path]"
    try:
        url = urllib.parse.urlsplit(upstream)
        url.port  # noqa: B018 (a port that is no number raises here)
    except ValueError:
        return f"{upstream!r} is not a URL; {shape}"
    if url.scheme not in ("http", "https") or not url.hostname:
        return f"{upstream!r} is not an http(s) URL; {shape}"
    # A key in the URL would sit in the job file, the plan and every log line that
    # names the upstream; it belongs in the coordinator's environment (keySecret).
    if url.username is not None or url.password is not None:
        return f"{upstream!r} holds credentials; put the key in keySecret's variable instead"
    # The gateway appends each worker's own path and query: a fixed query or a
    # fragment here would be dropped or doubled.
    if url.query or url.fragment or upstream.endswith(("?", "#")):
        return f"{upstream!r} has a query or fragment; {shape}"
    return None


def _check_style(api: Mapping[str, Any], index: int, ctx: Context) -> list[Problem]:
    if api.get("style") != Style.PLAIN:
        return []
    problems = []
    for key, what in (("baseUrlEnv", "the gateway's URL"), ("tokenEnv", "its token")):
        if key not in api:
            problems.append(
                ctx.at_value(
                    ("apis", index, "style"),
                    f"style 'plain' has no usual variables: name the worker's variable "
                    f"for {what} in {key}",
                )
            )
    for key in _USAGE_KEYS:
        if key in api:
            problems.append(
                ctx.at_key(
                    ("apis", index, key),
                    "style 'plain' reads no usage, so token limits, prices and a budget "
                    "cannot be kept; use the API's own style, or pace it by requests",
                )
            )
    return problems


def _variables(api: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(key, variable, written) of the worker variables the gateway sets for ``api``."""
    style = api.get("style")
    # A style the schema refused has no defaults to claim.
    facts = FACTS[Style(style)] if style in tuple(Style) else None
    found = []
    for key in _VARIABLES:
        written = api.get(key)
        if isinstance(written, str):
            found.append((key, written, True))
        elif key not in api and facts is not None:  # a wrong type: the schema said so
            default = facts.base_url_env if key == "baseUrlEnv" else facts.token_env
            if default is not None:
                found.append((key, default, False))
    return found


def _check_variables(
    doc: Mapping[str, Any], apis: Sequence[tuple[int, Mapping[str, Any]]], ctx: Context
) -> list[Problem]:
    problems = []
    # Each variable the gateway sets, by the API (and key) that claimed it first: a
    # worker has one value per variable, so two APIs (or one API's URL and token)
    # cannot share one.
    owners: dict[str, str] = {}
    meaning: dict[str, str] = {}
    for index, api in apis:
        for key, variable, written in _variables(api):
            here = f"apis[{index}].{key}"
            if written and (variable in _WORKER_VARIABLES or variable.startswith(_WORKER_PREFIX)):
                problems.append(
                    ctx.at_value(
                        ("apis", index, key),
                        f"{variable!r} is a variable fanout sets for every worker; "
                        f"choose another name",
                    )
                )
            if variable in owners:
                default = "" if written else f" (the default of style {api.get('style')!r})"
                message = (
                    f"{variable!r}{default} is already {owners[variable]}; a worker has one "
                    f"value per variable: set {key} to another name"
                )
                path: KeyPath = ("apis", index, key) if written else ("apis", index, "style")
                problems.append(ctx.at_value(path, message))
            owners.setdefault(variable, here)
            meaning.setdefault(variable, _VARIABLES[key])
    keys: dict[str, int] = {}  # each keySecret, by the first API that names it
    for index, api in apis:
        if isinstance(api.get("keySecret"), str):
            keys.setdefault(api["keySecret"], index)
    for position, name in enumerate(list_of(table_of(doc, "task"), "secrets")):
        if not isinstance(name, str):
            continue
        if name in keys:
            message = (
                f"{name!r} is apis[{keys[name]}].keySecret: the real key stays with the "
                "gateway, and listing it here would put it in every sandbox; remove it "
                "(the worker gets a per-attempt token instead)"
            )
        elif name in owners:
            # A secret is put in the environment last: it would replace the gateway's.
            message = (
                f"{name!r} is set by the gateway to {meaning[name]} ({owners[name]}), "
                "which this secret would replace; remove it here"
            )
        else:
            continue
        problems.append(ctx.at_value(("task", "secrets", position), message))
    places: list[tuple[KeyPath, Any]] = [(("task",), doc.get("task"))]
    ladder = list_of(table_of(doc, "retry"), "ladder")
    places += [(("retry", "ladder", i), rung) for i, rung in enumerate(ladder)]
    for place, table in places:
        for name in table_of(table, "env"):
            if name in owners:
                problems.append(
                    ctx.at_key(
                        (*place, "env", name),
                        f"{name!r} is set by the gateway to {meaning[name]} ({owners[name]}); "
                        "remove it here",
                    )
                )
    return problems
