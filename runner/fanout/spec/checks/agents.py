"""What ``task.agent`` must satisfy beyond the schema: its ``args`` extend a command
the preset supplies, the agent can use the job's ``[[apis]]``, and it has a network."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import Problem
from ..apis import Style
from ..presets import PRESETS
from .context import Context, list_of, table_of


def check_agent(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    task = table_of(doc, "task")
    agent = task.get("agent")
    if not isinstance(agent, str) or agent not in PRESETS:  # absent, or the schema said
        return []
    problems = []
    if "args" in task and "command" in task:
        problems.append(
            ctx.at_key(
                ("task", "args"),
                "task.command replaces the preset's whole command, so these arguments "
                "would be dropped: put them in task.command, or remove task.command to "
                "extend the preset's",
            )
        )
    problems += _check_styles(agent, doc, ctx)
    problems += _check_network(agent, doc, ctx)
    return problems


def _check_network(agent: str, doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    """Every one of these agents calls a model API over the network: in a sandbox
    without one each unit would fail on a connection error, the ladder climbed for
    nothing.  A job with ``[[apis]]`` is told so by ``apis`` already."""
    runtime = table_of(doc, "runtime")
    if runtime.get("network", False) is not False or list_of(doc, "apis"):
        return []  # true, "apis", or a value the schema refused
    message = (
        f"agent {agent!r} calls its model's API, and a sandbox without network cannot "
        "reach it: set `runtime.network = true`"
    )
    if "network" in runtime:
        return [ctx.at_value(("runtime", "network"), message)]
    return [ctx.at_value(("task", "agent"), message)]


def _check_styles(agent: str, doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    """An agent whose API no ``[[apis]]`` entry is would call it past the gateway,
    unpaced and uncounted, while the job's author believes the gateway keeps it: an
    error, unless ``task.secrets`` hands the agent its own key, which says it calls its
    API directly on purpose.  Plain APIs are left out: they are the tools' HTTP APIs,
    never a model's.  A job without ``[[apis]]`` is fine (the agent's own key)."""
    preset = PRESETS[agent]
    apis = [
        (index, api)
        for index, api in enumerate(list_of(doc, "apis"))
        if isinstance(api, dict) and api.get("style") in tuple(Style)
    ]
    modelled = [(index, api) for index, api in apis if api.get("style") != Style.PLAIN]
    if not modelled or any(api.get("style") in preset.styles for _, api in modelled):
        return []
    secrets = list_of(table_of(doc, "task"), "secrets")
    if any(name in preset.key_envs for name in secrets):
        return []
    speaks = " or ".join(repr(str(style)) for style in preset.styles)
    declared = ", ".join(
        f"apis[{index}] {api.get('name')!r} is {api.get('style')!r}" for index, api in modelled
    )
    message = (
        f"agent {agent!r} calls a style {speaks} API and no [[apis]] entry has that style "
        f"({declared}), so its requests would bypass the gateway: add an [[apis]] entry "
        f"with style = {str(preset.styles[0])!r}, or list its own key "
        f"({preset.key_envs[0]!r}) in task.secrets to let it call its API directly"
    )
    return [ctx.at_value(("task", "agent"), message)]
