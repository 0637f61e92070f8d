"""What ``[notify]`` must satisfy beyond the schema: somewhere to send to, one way of
giving the webhook's URL, a URL fanout can POST to, and no ``[[apis]]`` key handed to
its command.  No message here repeats a URL: a pasted one may be a credential."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from ...errors import Problem
from ...values.tomlpos import KeyPath
from .context import Context, list_of, table_of

_SHAPE = "write it as http(s)://host[:port][/path][?query]"


def check_notify(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    if not isinstance(doc.get("notify"), dict):
        return []
    notify = table_of(doc, "notify")
    problems = []
    if not any(key in notify for key in ("webhook", "webhookSecret", "command")):
        problems.append(
            ctx.at_key(
                ("notify",),
                "says nowhere to send: set webhookSecret (the variable that holds the"
                " webhook's URL), webhook, or command",
            )
        )
    if "webhook" in notify and "webhookSecret" in notify:
        problems.append(
            ctx.at_key(
                ("notify", "webhookSecret"),
                "webhook and webhookSecret both give the webhook's URL: keep one"
                " (webhookSecret for a URL that is a credential, as a Slack webhook's is)",
            )
        )
    url = notify.get("webhook")
    refused = webhook_refusal(url) if isinstance(url, str) and url else None
    if refused is not None:
        problems.append(ctx.at_value(("notify", "webhook"), refused))
    keys = {api.get("keySecret") for api in list_of(doc, "apis") if isinstance(api, dict)}
    named: list[tuple[KeyPath, Any]] = [(("notify", "webhookSecret"), notify.get("webhookSecret"))]
    named += [(("notify", "secrets", i), name) for i, name in enumerate(list_of(notify, "secrets"))]
    for path, name in named:
        if isinstance(name, str) and name in keys:
            problems.append(
                ctx.at_value(
                    path,
                    f"{name!r} is an [[apis]] keySecret: the real key stays with the gateway;"
                    " remove it here",
                )
            )
    return problems


def webhook_refusal(url: str) -> str | None:
    """Why fanout cannot POST to ``url`` (without repeating it), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 (a port that is no number raises here)
    except ValueError:
        return f"is not a URL; {_SHAPE}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"is not an http(s) URL; {_SHAPE}"
    if parts.username is not None or parts.password is not None:
        # urllib would not send them, and a password has no place in a job file.
        return (
            "holds credentials (user:password@), which fanout does not send; a URL that is"
            " a credential goes in the variable webhookSecret names"
        )
    if any(char.isspace() for char in url):
        return f"holds white space; {_SHAPE}"
    return None
