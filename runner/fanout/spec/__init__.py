"""The job file as frozen, typed values, and the one function that builds them: ``load``.

``load`` parses the TOML, validates it against the JSON Schema, runs the checks the
schema cannot express (``checks``), and only when everything passes builds (``build``)
the dataclasses of ``model``.  Field names mirror the schema's keys in snake_case (a
test holds them together); durations are seconds, sizes are bytes, templates are
compiled.  Below this package nothing sees the raw TOML dictionaries.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import checks, schema, tomlpos
from ..errors import JobError, Problem
from ..templates import Templates
from .build import build, camel_case, dataclass_fields, freeze, host_from, snake_case, thaw
from .model import (
    DEFAULT_LADDER,
    SOURCES,
    Aggregate,
    Backoff,
    Collect,
    Host,
    Inputs,
    JobValue,
    Limit,
    Retry,
    Rounds,
    Rung,
    Runtime,
    SourceKind,
    Spec,
    Task,
    Throttle,
    Trigger,
    Units,
)

__all__ = [
    "DEFAULT_LADDER",
    "SOURCES",
    "Aggregate",
    "Backoff",
    "Collect",
    "Host",
    "Inputs",
    "JobValue",
    "Limit",
    "Retry",
    "Rounds",
    "Rung",
    "Runtime",
    "SourceKind",
    "Spec",
    "Task",
    "Throttle",
    "Trigger",
    "Units",
    "camel_case",
    "dataclass_fields",
    "freeze",
    "host_from",
    "load",
    "load_hosts_file",
    "parse_toml",
    "snake_case",
    "thaw",
]


def load(path: Path | str, *, hosts_file: Path | None = None, require_hosts: bool = True) -> Spec:
    """Read, validate and freeze the job file at ``path``.

    Raises JobError carrying every problem found.  ``hosts_file`` replaces the job's
    ``runtime.hosts``.  With ``require_hosts=False`` a missing hosts file is not an
    error (``fanout validate`` runs where per-environment inventories are absent).
    """
    path = Path(path)
    shown = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise JobError(
            [Problem(file=shown, line=1, col=1, key="", message=_os_reason(exc))]
        ) from None
    except UnicodeDecodeError as exc:
        raise JobError(
            [Problem(file=shown, line=1, col=1, key="", message=f"not UTF-8 text ({exc.reason})")]
        ) from None
    document = parse_toml(text, shown)
    positions = tomlpos.scan(text)
    workspace = (path.parent / str(document.get("runtime", {}).get("workspace", "."))).resolve()
    templates = Templates(workspace)
    problems = schema.check(document, schema=schema.job_schema(), file=shown, positions=positions)
    context = checks.Context(file=shown, positions=positions, templates=templates, text=text)
    problems += checks.check_job(document, context)
    if problems:
        raise JobError(problems)
    hosts, found_hosts_file, host_problems = _hosts(document, path, hosts_file, require_hosts)
    if host_problems:
        raise JobError(host_problems)
    return build(document, path, templates, workspace, hosts, found_hosts_file)


def parse_toml(text: str, shown: str) -> dict[str, Any]:
    """tomllib.loads, with its syntax errors turned into a located Problem."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobError([_syntax_problem(str(exc), text, shown)]) from None


def _syntax_problem(message: str, text: str, shown: str) -> Problem:
    match = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if match:
        line, col = int(match.group(1)), int(match.group(2))
        message = message[: match.start()]
    else:
        message = re.sub(r"\s*\(at end of document\)$", "", message)
        line = text.count("\n") + 1
        col = len(text) - (text.rfind("\n") + 1) + 1
    reason = message[:1].lower() + message[1:]
    return Problem(file=shown, line=line, col=col, key="", message=f"invalid TOML: {reason}")


def _os_reason(exc: OSError) -> str:
    return f"cannot read the job file: {exc.strerror or exc}"


def _hosts(
    document: Mapping[str, Any], path: Path, override: Path | None, require: bool
) -> tuple[tuple[Host, ...], Path | None, list[Problem]]:
    raw = document.get("runtime", {}).get("hosts")
    if override is not None:
        raw = str(override.resolve())
    if isinstance(raw, list):
        return tuple(host_from(entry) for entry in raw if isinstance(entry, dict)), None, []
    if not isinstance(raw, str):
        return (), None, []
    hosts_path = path.parent / raw
    if not hosts_path.is_file():
        if not require:
            return (), hosts_path, []
        line, col = tomlpos.scan(path.read_text(encoding="utf-8")).value(("runtime", "hosts"))
        message = f"hosts file {str(hosts_path)!r} does not exist"
        return (
            (),
            hosts_path,
            [Problem(file=str(path), line=line, col=col, key="runtime.hosts", message=message)],
        )
    try:
        return load_hosts_file(hosts_path), hosts_path, []
    except JobError as exc:
        return (), hosts_path, exc.problems


def load_hosts_file(path: Path) -> tuple[Host, ...]:
    """The hosts of a separate hosts file (``[[hosts]]`` tables); JobError if invalid."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        message = f"cannot read the hosts file: {exc.strerror or exc}"
        raise JobError([Problem(file=str(path), line=1, col=1, key="", message=message)]) from None
    document = parse_toml(text, str(path))
    problems = schema.check(
        document,
        schema=schema.subschema("hostsFile"),
        file=str(path),
        positions=tomlpos.scan(text),
    )
    if problems:
        raise JobError(problems)
    return tuple(host_from(entry) for entry in document["hosts"])
