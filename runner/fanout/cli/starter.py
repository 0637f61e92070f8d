"""The commented starter job file ``fanout init`` writes, and the schema file beside it.

The data of each table is rendered by tomli-w; only the comments are written by hand,
so the starter is always valid TOML (a test also validates it against the schema).

The starter's ``#:schema ./fanout.schema.json`` names a file ``fanout init`` writes next
to the job file.  A relative path to a file committed with the jobs is the one reference
that resolves for every teammate, in every editor and in CI, offline: fanout publishes
no schema URL, and a ``file://`` path into the installed package breaks on the next
machine or virtualenv.  The copy can fall behind an upgraded fanout; ``fanout validate``
stays the authority, and ``fanout init`` says so when the copy it finds differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import tomli_w

from ..spec.schema import default, schema_text

SCHEMA_FILE = "fanout.schema.json"
_TASK = "/definitions/task"
_RUNTIME = "/definitions/runtime"
_BACKOFF = "/definitions/backoff"


class SchemaCopy(StrEnum):
    """What ``write`` did about the schema file beside the job file."""

    WRITTEN = "written"
    CURRENT = "current"  # already there, identical to this fanout's schema
    STALE = "stale"  # already there and different: kept, the user decides


@dataclass(frozen=True, kw_only=True, slots=True)
class Written:
    job: Path
    schema: Path
    schema_copy: SchemaCopy


_SECTIONS: list[tuple[str, dict[str, Any]]] = [
    (
        f"#:schema ./{SCHEMA_FILE}\n"
        "# A fanout job: one unit of work per file, each run by a short-lived worker in its\n"
        "# own sandbox.  Check it with `fanout validate` and `fanout plan` before `fanout run`.\n"
        f"# {SCHEMA_FILE} beside it (commit both) lets editors (taplo, Even Better TOML)\n"
        "# complete and check it; refresh it in this folder after upgrading fanout:\n"
        f"# fanout schema > {SCHEMA_FILE}",
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
        "# names of environment variables, never values.  For an agent CLI, write\n"
        '# agent = "claude" (or codex, gemini, aider, llm) in place of command: the preset\n'
        "# gives its headless command and a quiet environment, which `fanout plan` shows.",
        {
            "task": {
                "prompt": "Tidy {{ unit.id }} without changing its behaviour.\n",
                "command": ["sh", "-c", 'wc -l "$1"', "sh", "{{ unit.id }}"],
                # The starter spells out some defaults, so users see the knob and its
                # value; the value is the schema's, so the two cannot drift.
                "timeout": default(_TASK, "timeout"),
                "env": {"NO_COLOR": "1"},
                "secrets": [],
            }
        },
    ),
    (
        "# Where and how many: without hosts, units run in local sandboxes (bwrap if found).",
        {
            "runtime": {
                key: default(_RUNTIME, key) for key in ("maxConcurrentTasks", "sandbox", "network")
            }
        },
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
        "# APIs the workers call through fanout's gateway: every request of every worker is\n"
        "# paced, the real key stays on this machine (each attempt gets a token in tokenEnv),\n"
        '# and usage and cost are counted per unit.  Needs runtime.network = true or "apis".\n'
        "# [[apis]]\n"
        '# name = "anthropic"\n'
        '# upstream = "https://api.anthropic.com"\n'
        '# style = "anthropic"                 # sets ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY\n'
        '# keySecret = "ANTHROPIC_API_KEY"     # holds the real key; read by the gateway only\n'
        '# requests = { limit = 50, per = "1m" }\n'
        '# inputTokens = { limit = 30000, per = "1m" }\n'
        '# outputTokens = { limit = 8000, per = "1m" }\n'
        "# maxInFlight = 10\n"
        '# prices = { "claude-sonnet-*" = { input = 3.0, output = 15.0 } }   # USD per Mtok\n'
        "# budget = { usd = 20 }               # per run",
        {},
    ),
    (
        "# The retry ladder: rungs tried in order until a unit succeeds.",
        {
            "retry": {
                "backoff": {key: default(_BACKOFF, key) for key in ("initial", "max", "jitter")},
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


_WORKSPACE = (
    "# workspace: the folder `fanout init` ran in, relative to this file.  inputs, stage\n"
    "# and collect are relative to it, and the state directory (.fanout) is in it."
)


def text(workspace: str | None = None) -> str:
    """The starter; ``workspace`` is its ``runtime.workspace`` (None: the default, the
    job file's folder)."""
    parts = []
    for comment, data in _SECTIONS:
        if workspace is not None and "runtime" in data:
            comment = f"{comment}\n{_WORKSPACE}"
            data = {"runtime": {**data["runtime"], "workspace": workspace}}
        body = tomli_w.dumps(data, multiline_strings=True) if data else ""
        parts.append(f"{comment}\n{body}".rstrip("\n"))
    return "\n\n".join(parts) + "\n"


def workspace_for(path: Path, root: Path) -> str | None:
    """The ``runtime.workspace`` that makes ``root`` (the folder ``fanout init`` ran
    in) the workspace of a job file at ``path``, relative to the job's folder ("..");
    None when the job's folder is ``root`` (the default says it) or is not inside it.

    ``fanout init jobs/sweep.toml``, the layout the tutorial shows (jobs in a folder of
    their own, run from the repository), would otherwise look for ``src/**/*.py`` in
    ``jobs/``.  The default stays the job's folder, so a job runs the same from any
    directory (cron's ``cd`` need not match); the starter writes what it assumes."""
    folder = path.resolve().parent
    root = root.resolve()
    if folder == root or not folder.is_relative_to(root):
        return None
    return os.path.relpath(root, folder)


def write(path: Path, *, force: bool, root: Path) -> Written:
    """Write the starter to ``path`` and the schema beside it; ``root`` is the folder
    the starter takes as its workspace (see ``workspace_for``).  An existing schema file
    is replaced only with ``force``: it may be the copy a team reviewed and committed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text(workspace_for(path, root)), encoding="utf-8")
    schema = path.parent / SCHEMA_FILE
    current = schema_text()
    if schema.is_file() and not force:
        same = schema.read_text(encoding="utf-8") == current
        return Written(
            job=path, schema=schema, schema_copy=SchemaCopy.CURRENT if same else SchemaCopy.STALE
        )
    schema.write_text(current, encoding="utf-8")
    return Written(job=path, schema=schema, schema_copy=SchemaCopy.WRITTEN)
