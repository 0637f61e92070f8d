"""The commented starter job file ``fanout init`` writes.

The data of each table is rendered by tomli-w; only the comments are written by hand,
so the starter is always valid TOML (a test also validates it against the schema).
"""

from __future__ import annotations

from typing import Any

import tomli_w

_SECTIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "# A fanout job: one unit of work per file, each run by a short-lived worker in its\n"
        "# own sandbox.  Check it with `fanout validate` and `fanout plan` before `fanout run`.\n"
        "# `fanout schema > fanout.schema.json` lets editors (taplo, Even Better TOML) check it.\n"
        "#:schema ./fanout.schema.json",
        {"version": 1, "name": "my-sweep", "description": "One worker per Python file"},
    ),
    (
        "# Where the backlog comes from.  Exactly one source: files (globs), jsonl, csv, json,\n"
        "# items (inline), or command (its output read as json, jsonl, lines, csv or lint).",
        {"inputs": {"files": ["src/**/*.py"], "exclude": ["**/vendor/**"]}},
    ),
    (
        "# How records become units.  stage: workspace files copied into the sandbox;\n"
        "# collect: sandbox files copied back when the unit succeeds.",
        {"units": {"stage": ["{{ unit.id }}"], "collect": ["{{ unit.id }}"]}},
    ),
    (
        "# What each worker runs.  The prompt is written to the command's stdin; each argv\n"
        "# element is rendered on its own and never passes through a shell.  Secrets are\n"
        "# names of environment variables, never values.",
        {
            "task": {
                "prompt": "Tidy {{ unit.id }} without changing its behaviour.\n",
                "command": ["sh", "-c", 'wc -l "$1"', "sh", "{{ unit.id }}"],
                "timeout": "10m",
                "env": {"NO_COLOR": "1"},
                "secrets": [],
            }
        },
    ),
    (
        "# Where and how many: without hosts, units run in local sandboxes (bwrap if found).",
        {"runtime": {"maxConcurrentTasks": 4, "sandbox": "auto", "network": False}},
    ),
    (
        "# Rate limits of the APIs workers call; dispatch follows the tightest one.\n"
        "# [[limits]]\n"
        '# name = "anthropic"\n'
        "# requests = 50\n"
        '# per = "1m"\n'
        "# requestsPerTask = 4",
        {},
    ),
    (
        "# The retry ladder: rungs tried in order until a unit succeeds.",
        {
            "retry": {
                "backoff": {"initial": "10s", "max": "10m", "jitter": "full"},
                "ladder": [
                    {"name": "first", "attempts": 1},
                    {
                        "name": "with-context",
                        "attempts": 1,
                        "promptSuffix": "\nThe previous attempt failed:\n{{ last.outputTail }}\n",
                    },
                ],
            }
        },
    ),
    (
        "# When `fanout schedule` runs the job.\n"
        "# [[triggers]]\n"
        '# type = "cron"\n'
        '# schedule = "0 3 * * 1-5"\n'
        '# timezone = "Europe/Berlin"\n'
        '# overlap = "skip"',
        {},
    ),
]


def text() -> str:
    parts = []
    for comment, data in _SECTIONS:
        body = tomli_w.dumps(data, multiline_strings=True) if data else ""
        parts.append(f"{comment}\n{body}".rstrip("\n"))
    return "\n\n".join(parts) + "\n"
