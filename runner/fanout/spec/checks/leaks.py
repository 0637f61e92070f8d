"""Refusing secret values written into a job file: known token formats anywhere, and
values under env names that say secret (the names go in task.secrets instead)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...errors import Problem
from ...values.tomlpos import KeyPath
from .context import Context, list_of, strings, table_of

# Token formats of well-known providers; a match anywhere in a job file is refused.
_SECRET_FORMATS = (
    (re.compile(r"sk-ant-[A-Za-z0-9_-]{20,}"), "an Anthropic API key"),
    (re.compile(r"sk-(proj-)?[A-Za-z0-9_-]{32,}"), "an OpenAI API key"),
    (re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"), "a GitHub token"),
    (re.compile(r"AKIA[0-9A-Z]{16}"), "an AWS access key"),
    (re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}"), "a Slack token"),
    (re.compile(r"AIza[0-9A-Za-z_-]{35}"), "a Google API key"),
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    # A webhook whose URL is its credential: whoever has it posts to the channel.
    (
        re.compile(r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9_/-]{8,}"),
        "a Slack webhook URL",
    ),
    (
        re.compile(r"discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]{20,}"),
        "a Discord webhook URL",
    ),
)
# A name whose words (between underscores) say it holds a secret: CRM_API_TOKEN, not
# CLAUDE_CODE_MAX_OUTPUT_TOKENS, a number that agents read (a word inside a word is
# not the word).
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|PRIVATE_?KEY|CREDENTIALS?)(?:_|$)", re.I
)


def check_secrets(doc: Mapping[str, Any], ctx: Context) -> list[Problem]:
    problems: list[Problem] = []
    flagged: set[KeyPath] = set()
    for path, value in strings(doc):
        for pattern, what in _SECRET_FORMATS:
            if pattern.search(value):
                flagged.add(path)
                # A secret pasted where its variable's name goes (the gateway's key
                # must not be in task.secrets: see checks.apis).
                names_one = path[:2] in (("task", "secrets"), ("notify", "secrets")) or (
                    path[-1:] in (("keySecret",), ("webhookSecret",))
                    and path[:1] in (("apis",), ("notify",))
                )
                if names_one:
                    where = "put its variable's name here"
                elif path == ("notify", "webhook"):
                    where = "name its variable in notify.webhookSecret"
                else:
                    where = "list its name in task.secrets"
                message = (
                    f"looks like {what}; never write a secret in a job file: export it on "
                    f"the coordinator and {where}"
                )
                problems.append(ctx.at_value(path, message))
                break
    secrets = list_of(table_of(doc, "task"), "secrets")
    ladder = list_of(table_of(doc, "retry"), "ladder")
    places: list[tuple[KeyPath, Any]] = [(("task",), doc.get("task"))]
    places += [(("retry", "ladder", i), rung) for i, rung in enumerate(ladder)]
    for place, table in places:
        env = table.get("env") if isinstance(table, dict) else None
        for name, value in env.items() if isinstance(env, dict) else ():
            path = (*place, "env", name)
            if name in secrets:
                message = (
                    f"{name!r} is listed in task.secrets; its value comes from the "
                    "coordinator's environment, not from env"
                )
                problems.append(ctx.at_key(path, message))
            elif (
                _SECRET_NAME.search(name)
                and isinstance(value, str)
                and value
                and "{{" not in value
                and path not in flagged
            ):
                message = (
                    f"{name!r} looks like a secret; do not write its value here: export "
                    f"{name} on the coordinator and list it in task.secrets"
                )
                problems.append(ctx.at_key(path, message))
    return problems
