"""Reading the backlog: records from files, JSONL, CSV, JSON, inline items or a command.

Every source is a generator of ``Record``s, so a 100,000-line JSONL file yields its
first record after parsing one line.  A record is plain data plus where it came from
(``data/contacts.jsonl:17``), which error messages quote.  File contents are never
read: a file record is its path and name parts.
"""

from __future__ import annotations

import csv
import json
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import InputFailed
from ..spec import Spec, thaw
from ..values import globs
from . import command as inputcommand
from . import lint


@dataclass(frozen=True, slots=True)
class Record:
    data: Any
    origin: str


def records(
    spec: Spec,
    *,
    environ: Mapping[str, str],
    context: Mapping[str, Any],
    skipped: Callable[[str, str], None] = lambda path, reason: None,
    unmatched: Callable[[int], None] = lambda index: None,
    command: inputcommand.Started | None = None,
) -> Iterator[Record]:
    """The records of ``spec``'s single input source, in source order.  ``skipped``
    hears of each file the files source refuses (its path and why), ``unmatched`` of
    each ``inputs.files`` pattern that matched no file (its index, once the walk has
    ended).  ``command`` is the input command already started by a caller that owns it
    (a run, see inputcommand); without it, this starts the command itself."""
    inputs = spec.inputs
    workspace = spec.runtime.workspace
    kind = inputs.source
    if kind == "files":
        yield from _files(spec, skipped, unmatched)
    elif kind == "items":
        for index, item in enumerate(inputs.items):
            yield Record(thaw(item), f"inputs.items[{index}]")
    elif kind == "jsonl":
        assert inputs.jsonl is not None
        with _open(workspace, inputs.jsonl) as stream:
            yield from parse_jsonl(stream, inputs.jsonl)
    elif kind == "csv":
        assert inputs.csv is not None
        with _open(workspace, inputs.csv) as stream:
            yield from parse_csv(stream, inputs.csv)
    elif kind == "json":
        assert inputs.json is not None
        with _open(workspace, inputs.json) as stream:
            yield from parse_json(stream.read(), inputs.json, inputs.pointer)
    elif command is not None:
        yield from _command_records(spec, command)
    else:
        with inputcommand.started(spec, environ, context) as started:
            yield from _command_records(spec, started)


def _open(workspace: Path, name: str) -> IO[str]:
    path = workspace / name
    try:
        return path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise InputFailed(f"cannot read input {name}: {exc.strerror or exc}") from None


def parse_jsonl(stream: IO[str], name: str) -> Iterator[Record]:
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            yield Record(json.loads(line), f"{name}:{number}")
        except json.JSONDecodeError as exc:
            raise InputFailed(f"{name}:{number}: not a JSON line: {exc.msg}") from None


def parse_csv(stream: IO[str], name: str) -> Iterator[Record]:
    reader = csv.DictReader(stream)
    try:
        for row in reader:
            yield Record(dict(row), f"{name}:{reader.line_num}")
    except csv.Error as exc:
        raise InputFailed(f"{name}:{reader.line_num}: not CSV: {exc}") from None


def parse_json(text: str, name: str, pointer: str) -> Iterator[Record]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFailed(f"{name}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None
    value = document
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        elif isinstance(value, dict) and token in value:
            value = value[token]
        else:
            raise InputFailed(f"{name}: JSON Pointer {pointer!r} finds nothing at {token!r}")
    if not isinstance(value, list):
        where = f"at {pointer!r}" if pointer else "at the top level"
        raise InputFailed(
            f"{name}: expected an array of records {where}, found {type(value).__name__}"
        )
    for index, item in enumerate(value):
        yield Record(item, f"{name}{pointer}/{index}")


def parse_lint(stream: IO[str], name: str) -> Iterator[Record]:
    """Linter findings (see ``lint``); other lines (summaries) are skipped."""
    for record, origin in lint.parse(stream, name):
        yield Record(record, origin)


def parse_lines(stream: IO[str], name: str) -> Iterator[Record]:
    for number, line in enumerate(stream, start=1):
        text = line.rstrip("\r\n")
        if text.strip():
            yield Record(text, f"{name}:{number}")


_STREAM_READERS = {"jsonl": parse_jsonl, "csv": parse_csv, "lint": parse_lint, "lines": parse_lines}


def _command_records(spec: Spec, command: inputcommand.Started) -> Iterator[Record]:
    """Records from the input command's stdout.  Streaming formats yield while the
    command still runs; a JSON document is parsed once the command has succeeded."""
    inputs = spec.inputs
    if inputs.format == "json":
        text = command.stdout.read()
        command.check_exit()
        yield from parse_json(text, command.name, inputs.pointer)
    else:
        yield from _STREAM_READERS[str(inputs.format)](command.stdout, command.name)
        command.check_exit()


def _files(
    spec: Spec, skipped: Callable[[str, str], None], unmatched: Callable[[int], None]
) -> Iterator[Record]:
    inputs = spec.inputs
    workspace = spec.runtime.workspace
    include = [globs.compile_glob(p) for p in inputs.files]
    # Leaving out '**/*.min.js' means all of them, in hidden folders too (see globs).
    exclude = [globs.compile_glob(p, hidden=True) for p in inputs.exclude]
    state = _relative(spec.runtime.state_dir, workspace)
    # The patterns no file has matched yet (before exclude: a pattern whose files are
    # all excluded did match); each is tried only until it first matches.
    unseen = dict(enumerate(include))
    for path in sorted(_candidates(workspace, inputs.gitignore)):
        if state and (path == state or path.startswith(state + "/")):
            continue
        for index in [i for i, p in unseen.items() if p.match(path)]:
            del unseen[index]
        if any(p.match(path) for p in include) and not any(p.match(path) for p in exclude):
            refused = _unnameable(path)
            if refused:
                skipped(path, refused)
                continue
            yield Record(file_record(path), path)
    for index in unseen:
        unmatched(index)


def _unnameable(path: str) -> str:
    """Why a file cannot be a unit, or "".  Such a file is skipped, not a job error: one
    odd name in a tree must not stop a backlog, and its name is never rendered into an
    argv, a prompt or a report.  (Not UTF-8: the OS gave bytes that decode to surrogates.)"""
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        return "its name holds a line break or another control character"
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8"
    return ""


def file_record(path: str) -> dict[str, str]:
    pure = Path(path)
    return {
        "path": path,
        "name": pure.name,
        "stem": pure.stem,
        "suffix": pure.suffix,
        "dir": pure.parent.as_posix(),
    }


def _relative(path: Path, root: Path) -> str | None:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return None


def _candidates(workspace: Path, gitignore: bool) -> list[str]:
    """Workspace-relative paths of regular files, without what git ignores (if asked)."""
    if gitignore:
        listed = _git_files(workspace)
        if listed is not None:
            return [p for p in listed if (workspace / p).is_file()]
    entries = globs.walk(workspace, lambda path: path.name != ".git")
    return [Path(entry.path).relative_to(workspace).as_posix() for entry in entries]


def _git_files(workspace: Path) -> list[str] | None:
    try:
        result = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=workspace,
            capture_output=True,
            check=False,
        )
    except OSError:
        return None
    if result.returncode != 0:
        return None  # not a git repository
    return sorted({p for p in result.stdout.decode("utf-8", "surrogateescape").split("\0") if p})
