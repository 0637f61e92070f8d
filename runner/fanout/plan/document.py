"""The resolved job ``fanout plan`` prints: the job file a ``Spec`` stands for, with
every default filled in."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from ..pacing import limits
from ..spec import Api, Inputs, Notify, Window, camel_case
from ..spec.templates import Expression, Template
from ..values import cron
from ..values.quantities import duration_text, size_text

_SIZES = frozenset({"log_limit", "output_tail", "memory"})
# ``from_agent`` is the plan's note, and ``args`` are already in the resolved command.
_HIDDEN = frozenset({"file", "templates", "positions", "hosts_file", "from_agent", "args"})


def to_document(value: Any, name: str = "") -> Any:
    """The job file ``value`` stands for, with every default filled in."""
    if isinstance(value, Template | Expression):
        return value.source
    if isinstance(value, cron.CronExpr):
        return value.text
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Api):
        return _api_document(value)
    if isinstance(value, Notify):
        return _notify_document(value)
    if is_dataclass(value):
        document = {}
        skip = _HIDDEN | (_inapplicable_inputs(value) if isinstance(value, Inputs) else set())
        for item in fields(value):
            inner = getattr(value, item.name)
            if item.name in skip or inner is None or inner == () or inner == {}:
                continue
            if item.name == "budget_usd":  # task.budget: dollars as written, no duration
                document["budget"] = {"usd": inner}
                continue
            document[camel_case(item.name)] = to_document(inner, item.name)
        return document
    if isinstance(value, Mapping):
        return {k: to_document(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_document(v) for v in value]
    # A float field of a dataclass is a duration (but jitter); a float in vars or items
    # is the user's number (0.7 stays 0.7, not "700ms").
    if isinstance(value, float) and name and name != "jitter":
        return duration_text(value)
    if isinstance(value, int) and not isinstance(value, bool) and name in _SIZES:
        return size_text(value)
    return value


def _inapplicable_inputs(inputs: Inputs) -> set[str]:
    """Input keys whose defaults mean nothing for this source (hidden by ``plan``)."""
    skip = set()
    if inputs.source != "files":
        skip |= {"gitignore", "exclude"}
    if inputs.source != "command":
        skip |= {"format", "ok_exit_codes", "timeout"}
    if not inputs.pointer:
        skip.add("pointer")
    return skip


def _api_document(api: Api) -> dict[str, Any]:
    """An ``[[apis]]`` table as written: its floats are dollars, not durations, its
    budget a table and its prices a table by glob (``to_document`` reads fields)."""
    document: dict[str, Any] = {
        "name": api.name,
        "upstream": api.upstream,
        "style": str(api.style),
        "baseUrlEnv": api.base_url_env,
        "tokenEnv": api.token_env,
    }
    if api.key_secret is not None:
        document["keySecret"] = api.key_secret
    for field_name, key in limits.WINDOW_KEYS:
        window: Window | None = getattr(api, field_name)
        if window is not None:
            document[key] = {"limit": window.limit, "per": duration_text(window.per)}
    if api.max_in_flight is not None:
        document["maxInFlight"] = api.max_in_flight
    if api.prices:
        document["prices"] = {
            glob: {
                camel_case(item.name): getattr(price, item.name)
                for item in fields(price)
                if getattr(price, item.name) is not None
            }
            for glob, price in api.prices
        }
    if api.budget_usd is not None:
        document["budget"] = {"usd": api.budget_usd}
    return document


def _notify_document(notify: Notify) -> dict[str, Any]:
    """``[notify]`` as written, but for a webhook URL written in the file, shown cut to
    its scheme and host: a webhook's path is often its key, and a plan goes to CI logs."""
    from ..notify import webhook_name

    document: dict[str, Any] = {}
    if notify.webhook is not None:
        document["webhook"] = webhook_name(notify)
    if notify.webhook_secret is not None:
        document["webhookSecret"] = notify.webhook_secret
    if notify.command:
        document["command"] = [part.source for part in notify.command]
    if notify.secrets:
        document["secrets"] = list(notify.secrets)
    document["on"] = [str(event) for event in notify.on]
    document["timeout"] = duration_text(notify.timeout)
    return document
