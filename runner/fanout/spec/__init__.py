"""The job file as frozen, typed values, and the one function that builds them: ``load``.

``load`` parses the TOML, validates it against the JSON Schema, runs the checks the
schema cannot express (``checks``), and only when everything passes builds (``build``)
the dataclasses of ``model``.  Field names mirror the schema's keys in snake_case (a
test holds them together); durations are seconds, sizes are bytes, templates are
compiled.  Below this package nothing sees the raw TOML dictionaries.
"""

from __future__ import annotations

import re
import stat
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import JobError, Problem
from ..values import tomlpos
from . import checks, schema
from .build import build, camel_case, dataclass_fields, freeze, host_from, snake_case, thaw
from .model import (
    DEFAULT_LADDER,
    SOURCES,
    Aggregate,
    Api,
    Backoff,
    Collect,
    Host,
    Inputs,
    JobValue,
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
    SourceKind,
    Spec,
    Task,
    Throttle,
    Trigger,
    Units,
    Window,
)
from .templates import for_workspace

__all__ = [
    "DEFAULT_LADDER",
    "SOURCES",
    "Aggregate",
    "Api",
    "Backoff",
    "Collect",
    "Host",
    "Inputs",
    "JobValue",
    "Limit",
    "Notify",
    "NotifyEvent",
    "Price",
    "Publish",
    "PublishCommits",
    "Ray",
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
    "Window",
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


def load(
    path: Path | str,
    *,
    hosts_file: Path | None = None,
    require_hosts: bool = True,
    text: str | None = None,
    shown: str | None = None,
) -> Spec:
    """Read, validate and freeze the job file at ``path``.

    Raises JobError carrying every problem found.  ``hosts_file`` replaces the job's
    ``runtime.hosts``.  With ``require_hosts=False`` a missing hosts file is not an
    error (``fanout validate`` runs where per-environment inventories are absent).
    ``text``: the job file's text as it was elsewhere (at a git revision, for ``fanout
    plan --base``), read as if it were at ``path``, so its relative paths resolve as the
    work tree's do; ``shown`` names it in problems ("jobs/sweep.toml@HEAD~1").
    """
    path = Path(path)
    shown = shown or str(path)
    if text is None:
        text = read_text(path, shown, what="job file")
    document = parse_toml(text, shown)
    positions = tomlpos.scan(text)
    runtime = document.get("runtime")
    runtime = runtime if isinstance(runtime, dict) else {}
    workspace_name = runtime.get("workspace", schema.default("/definitions/runtime", "workspace"))
    if not isinstance(workspace_name, str) or "\0" in workspace_name:
        workspace_name = "."  # the schema or the checks report it
    workspace = (path.parent / workspace_name).resolve()
    templates = for_workspace(workspace)
    problems = schema.check(document, schema=schema.job_schema(), file=shown, positions=positions)
    context = checks.Context(file=shown, positions=positions, templates=templates, text=text)
    problems += checks.check_job(document, context)
    if problems:
        raise JobError(problems)
    hosts, found_hosts_file, host_problems = _hosts(
        document, path, positions, hosts_file, require_hosts
    )
    if host_problems:
        raise JobError(host_problems)
    return build(document, path, templates, workspace, hosts, found_hosts_file, positions)


# Job files are a few kilobytes; reading stops here so ``fanout validate /dev/zero`` (or
# a runaway generator) ends with a message instead of eating the machine's memory.
MAX_FILE_BYTES = 16 * 2**20
# tomllib recurses once per nested array or inline table and gives up near 1,000 with a
# RecursionError; nothing sensible nests beyond a few levels.
MAX_NESTING = 100
_BOM = "\ufeff"


def read_text(path: Path, shown: str, *, what: str) -> str:
    """The file's text; JobError (located at 1:1) if it is unreadable, not UTF-8 or too
    large.  A UTF-8 byte-order mark (Windows editors write one) is dropped: it is
    invisible in every editor, so refusing it would be a puzzle, not a help."""

    def problem(message: str) -> JobError:
        return JobError([Problem(file=shown, line=1, col=1, key="", message=message)])

    try:
        if stat.S_ISCHR(path.stat().st_mode) or stat.S_ISBLK(path.stat().st_mode):
            # /dev/zero never ends, a terminal waits for typing: neither is a job file.
            raise problem(f"is a device ({path.resolve()}), not a {what}")
        with path.open("rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise problem(f"cannot read the {what}: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL in the path
        raise problem(f"cannot read the {what}: {exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise problem(f"the {what} is larger than {MAX_FILE_BYTES // 2**20} MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        message = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise JobError([Problem(file=shown, line=line, col=col, key="", message=message)]) from None
    return text.removeprefix(_BOM)


def parse_toml(text: str, shown: str) -> dict[str, Any]:
    """tomllib.loads, with its syntax errors turned into a located Problem."""
    deep = tomlpos.too_deep(text, MAX_NESTING)
    if deep is not None:
        message = f"invalid TOML: arrays and inline tables nest more than {MAX_NESTING} deep"
        raise JobError([Problem(file=shown, line=deep[0], col=deep[1], key="", message=message)])
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobError([_syntax_problem(str(exc), text, shown)]) from None
    except ValueError as exc:
        # Python refuses to convert integers of more than 4,300 digits.
        huge = tomlpos.huge_integer(text)
        line, col = huge or (1, 1)
        message = f"invalid TOML: {exc}"
        if huge is not None:
            message = "invalid TOML: an integer has more than 4300 digits"
        raise JobError([Problem(file=shown, line=line, col=col, key="", message=message)]) from None
    except RecursionError:
        message = "invalid TOML: the document nests too deeply"
        raise JobError([Problem(file=shown, line=1, col=1, key="", message=message)]) from None


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


def _hosts(
    document: Mapping[str, Any],
    path: Path,
    positions: tomlpos.Positions,
    override: Path | None,
    require: bool,
) -> tuple[tuple[Host, ...], Path | None, list[Problem]]:
    runtime = document.get("runtime")
    raw = runtime.get("hosts") if isinstance(runtime, dict) else None
    if override is not None:
        raw = str(override.resolve())
    if isinstance(raw, list):
        return tuple(host_from(entry) for entry in raw if isinstance(entry, dict)), None, []
    if not isinstance(raw, str):
        return (), None, []
    hosts_path = path.parent / raw
    try:
        found, why = hosts_path.is_file(), "does not exist"
    except OSError as exc:  # a name the file system refuses (too long, say)
        found, why = False, f"cannot be read: {(exc.strerror or str(exc)).lower()}"
    if not found:
        if not require:
            return (), hosts_path, []
        line, col = positions.value(("runtime", "hosts"))
        message = f"hosts file {str(hosts_path)!r} {why}"
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
    text = read_text(path, str(path), what="hosts file")
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
