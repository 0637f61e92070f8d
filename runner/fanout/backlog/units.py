"""Splitting the backlog into units, each with a stable, unique id.

``select`` streams: without ``groupBy`` each record becomes a unit as soon as it is
read.  With ``groupBy`` every record must be read first (a group is complete only at
the end), but only record data is kept, never file contents.

``units.where`` is one filter on records, applied to each record as it is read, before
grouping, ids and ``units.limit``: a dropped record never becomes part of a unit, so a
group whose every record is dropped does not exist, and the limit counts kept units.
It sees ``record`` (plus ``job`` and ``trigger``), not ``unit``: there is no unit yet.
Its value must be a boolean; anything else (``record.messages``, a list) is an error
rather than Python's truthiness, because ``record.severity == 'error' or 'warning'``
is always truthy and would keep every record without a word.

A unit that would stage a file inside a fanout state directory is dropped, after its id
and before ``units.limit`` and the duplicate check: a linter run over the workspace
finds the copies a run collected (``.fanout/runs/*/units/``), which are fanout's, and
no worker may see them (``staging`` refuses them), so failing each such unit only
buried the real ones.  The round says once how many were dropped and where.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import JobError, Problem
from ..isolation import hidden
from ..spec import Spec
from ..spec.schema import key_name
from ..spec.templates import Expression, RenderError
from ..values import globs
from ..values.tomlpos import KeyPath
from . import sources
from .command import Started


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of work: its id, its position in the round, and its records."""

    id: str
    index: int
    items: tuple[Any, ...]
    origin: str
    group: Any = None
    # What decides its result, hashed (``run.fingerprints``), and the digest of what that
    # is made of before rendering; "" until the run computes them.
    fingerprint: str = ""
    inputs: str = ""

    @property
    def record(self) -> Any:
        return self.items[0]

    def printed(self, *, fingerprint: str | None = None, inputs: str | None = None) -> Unit:
        """This unit with its fingerprint or its inputs set (``run.fingerprints``).
        Built directly: ``dataclasses.replace`` took 3 µs, twice a unit of a run."""
        return Unit(
            id=self.id,
            index=self.index,
            items=self.items,
            origin=self.origin,
            group=self.group,
            fingerprint=self.fingerprint if fingerprint is None else fingerprint,
            inputs=self.inputs if inputs is None else inputs,
        )

    def context(self) -> dict[str, Any]:
        """The ``unit`` variable templates see."""
        return {
            "id": self.id,
            "index": self.index,
            "group": self.group,
            "items": list(self.items),
            "record": self.items[0],
        }


@dataclass(slots=True)
class Selection:
    """A stream of units; counts fill in as it is consumed."""

    units: Iterator[Unit]
    records: int = 0
    # Records ``units.where`` dropped (counted in ``records`` too).
    dropped: int = 0
    selected: int = 0
    # With a limit: whether records remained beyond it (known once the stream ends).
    truncated: bool = False
    # Located warnings about records skipped so far (a file name that cannot be a unit),
    # and about inputs.files patterns that matched no file.
    warnings: list[str] = field(default_factory=list)
    # Each inputs.files pattern that matched no file, said unlocated ("inputs.files[1]
    # 'lib/**/*.py' matches no file in /srv/repo"; known once the stream ends): why a
    # selection of nothing is empty, for the message that says so.
    unmatched: list[str] = field(default_factory=list)
    # Units dropped for staging a file inside a state directory, by that directory
    # (workspace-relative), in the order found.
    in_state_dirs: dict[str, int] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Unit]:
        return self.units


def base_context(spec: Spec, trigger: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Template variables that do not depend on the unit: ``job`` and ``trigger``."""
    return {
        "job": {"name": spec.name, "description": spec.description, "file": str(spec.file)},
        "trigger": dict(trigger)
        if trigger
        else {"name": "manual", "schedule": "", "vars": {}, "time": ""},
    }


def select(
    spec: Spec,
    *,
    environ: Mapping[str, str],
    trigger: Mapping[str, Any] | None = None,
    count_all: bool = False,
    command: Started | None = None,
    stage_paths: Callable[[Unit], Sequence[str]] = lambda unit: (),
) -> Selection:
    """The units ``spec`` selects now.  With ``count_all`` the stream keeps reading past
    ``units.limit`` so ``records`` counts the whole backlog (``fanout plan`` shows it).
    ``command``: the input command, started by a caller that owns it (see sources).
    ``stage_paths``: what a unit's first attempt stages (``invocation.stage_paths``);
    a unit naming a path inside a state directory is dropped (see above)."""
    context = base_context(spec, trigger)
    selection = Selection(units=iter(()))
    selection.units = _select(spec, environ, context, selection, count_all, command, stage_paths)
    return selection


def _select(
    spec: Spec,
    environ: Mapping[str, str],
    context: dict[str, Any],
    selection: Selection,
    count_all: bool,
    command: Started | None,
    stage_paths: Callable[[Unit], Sequence[str]],
) -> Iterator[Unit]:
    limit = spec.units.limit

    def skipped(path: str, reason: str) -> None:
        line, col = spec.positions.key(("inputs", "files"))
        selection.warnings.append(
            f"{spec.file}:{line}:{col}: inputs.files: skipped {path!a}: {reason}"
        )

    def unmatched(index: int) -> None:
        path: KeyPath = ("inputs", "files", index)
        line, col = spec.positions.value(path)
        what = f"{spec.inputs.files[index]!r} matches no file in {spec.runtime.workspace}"
        selection.unmatched.append(f"{key_name(path)} {what}")
        selection.warnings.append(f"{spec.file}:{line}:{col}: {key_name(path)}: {what}")

    stream = sources.records(
        spec,
        environ=environ,
        context=context,
        skipped=skipped,
        unmatched=unmatched,
        command=command,
    )
    seen: dict[str, str] = {}
    state_dirs: dict[str, bool] = {}  # folders looked at: whether each is a state dir
    kept = _kept(spec, stream, selection, context)
    try:
        for draft in _drafts(spec, kept, selection):
            if limit is not None and selection.selected >= limit:
                selection.truncated = True
                if not count_all:
                    return
                continue
            unit = _finish(spec, draft, selection.selected, context)
            state = _state_dir_staged(spec, stage_paths(unit), state_dirs)
            if state is not None:
                selection.in_state_dirs[state] = selection.in_state_dirs.get(state, 0) + 1
                continue
            if unit.id in seen:
                raise _duplicate(spec, unit, seen[unit.id])
            seen[unit.id] = unit.origin
            selection.selected += 1
            yield unit
    finally:
        # Said once, when the stream ends (a run emits it with the last batch).
        if selection.in_state_dirs:
            selection.warnings.append(state_dir_warning(spec, selection.in_state_dirs))


def _state_dir_staged(spec: Spec, paths: Sequence[str], known: dict[str, bool]) -> str | None:
    """The state directory (workspace-relative) that one of ``paths`` lies in, if any.
    Only named paths: a glob already skips every state directory (``staging``)."""
    workspace = spec.runtime.workspace
    for path in paths:
        if globs.is_glob(path):
            continue
        try:
            globs.check_relative(path)
        except ValueError:
            continue  # absolute, or with '..': refused at the attempt, with its reason
        state = hidden.state_dir_on_the_way(workspace, path, known)
        if state is not None:
            return state
    return None


def state_dir_warning(spec: Spec, counts: Mapping[str, int]) -> str:
    """The one warning for units dropped inside state directories, located at the
    input that selected them."""
    line, col = spec.positions.key(("inputs", spec.inputs.source))
    return (
        f"{spec.file}:{line}:{col}: inputs.{spec.inputs.source}: dropped "
        f"{state_dir_drops(counts)}: what they stage is fanout's own (copies and logs "
        "of earlier runs), which no worker sees"
    )


def state_dir_drops(counts: Mapping[str, int]) -> str:
    """How many units were dropped inside which state directories, in words:
    "43 unit(s) inside '.fanout', a fanout state directory"."""
    first, *rest = (f"{count:,} inside {path!r}" for path, count in counts.items())
    if not rest:
        return f"{first.replace(' inside', ' unit(s) inside', 1)}, a fanout state directory"
    listed = ", ".join([first, *rest[:-1]]) + f" and {rest[-1]}"
    total = sum(counts.values())
    return f"{total:,} unit(s): {listed}, fanout state directories"


@dataclass(slots=True)
class _Draft:
    items: list[Any]
    origin: str
    group: Any = None


def _kept(
    spec: Spec,
    stream: Iterator[sources.Record],
    selection: Selection,
    context: dict[str, Any],
) -> Iterator[sources.Record]:
    """The records ``units.where`` keeps (all of them without it), counting each read."""
    where = spec.units.where
    for record in stream:
        selection.records += 1
        if where is None:
            yield record
            continue
        try:
            value = where.evaluate({**context, "record": record.data})
        except RenderError as exc:
            raise _where_error(where, f"{exc.message} (evaluating for {record.origin})") from None
        if value is True:
            yield record
        elif value is False:
            selection.dropped += 1
        else:
            raise _where_error(where, _not_boolean(value, record.origin))


def _where_error(where: Expression, message: str) -> JobError:
    """A ``units.where`` failure, located at the expression (loaded specs know where)."""
    file, line, col = where.at or ("", 0, 0)
    return JobError([Problem(file=file, line=line, col=col, key="units.where", message=message)])


def _not_boolean(value: Any, origin: str) -> str:
    # Records are JSON (or TOML, CSV) data: say what came back in JSON's words.
    shown = json.dumps(value, ensure_ascii=False, default=str)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    if value is None:
        kind = "null"
    elif isinstance(value, list | tuple | dict | str | int | float):
        noun = (
            "array"
            if isinstance(value, list | tuple)
            else "object"
            if isinstance(value, dict)
            else "string"
            if isinstance(value, str)
            else "number"
        )
        kind = f"the {noun} {shown}"
    else:
        kind = f"a {type(value).__name__}"
    return (
        f"gave {kind} for {origin}, not true or false; compare the value, "
        "e.g. 'record.errorCount > 0' or 'record.messages | length > 0'"
    )


def _drafts(spec: Spec, stream: Iterator[sources.Record], selection: Selection) -> Iterator[_Draft]:
    group_by = spec.units.group_by
    if group_by is None:
        for record in stream:
            yield _Draft([record.data], record.origin)
        return
    groups: dict[str, _Draft] = {}
    for record in stream:
        value = _field(record.data, group_by)
        if value is _MISSING:
            raise _job_error(
                spec,
                ("units", "groupBy"),
                f"record {record.origin} has no field {group_by!r} to group by",
            )
        key = repr(value)
        if key in groups:
            groups[key].items.append(record.data)
        else:
            groups[key] = _Draft([record.data], record.origin, group=value)
    yield from groups.values()


_MISSING = object()


def _field(data: Any, dotted: str) -> Any:
    value = data
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _finish(spec: Spec, draft: _Draft, index: int, context: dict[str, Any]) -> Unit:
    items = tuple(draft.items)
    if spec.units.id is not None:
        partial = Unit(id="", index=index, items=items, origin=draft.origin, group=draft.group)
        unit_vars = {k: v for k, v in partial.context().items() if k != "id"}
        try:
            unit_id = spec.units.id.render({**context, "unit": unit_vars})
        except RenderError as exc:
            raise _job_error(
                spec, ("units", "id"), f"{exc} (rendering for {draft.origin})"
            ) from None
    else:
        unit_id = _default_id(spec, draft)
    unit_id = unit_id.strip()
    if not unit_id:
        raise _id_error(spec, draft, "is empty")
    if "\n" in unit_id or "\r" in unit_id or "\0" in unit_id:
        raise _id_error(spec, draft, "spans lines")
    try:
        unit_id.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, e.g. "\udcff" in a JSON string
        raise _id_error(spec, draft, "is not valid Unicode text") from None
    return Unit(id=unit_id, index=index, items=items, origin=draft.origin, group=draft.group)


def _default_id(spec: Spec, draft: _Draft) -> str:
    if draft.group is not None:
        return str(draft.group)
    record = draft.items[0]
    if spec.inputs.files:  # the one source (``inputs.source``, a loop over them all)
        return str(record["path"])
    if isinstance(record, str):
        return record
    if (
        isinstance(record, dict)
        and isinstance(record.get("id"), str | int)
        and not isinstance(record.get("id"), bool)
    ):
        return str(record["id"])
    raise _at_record(
        spec,
        draft.origin,
        "the record has no 'id' field; set units.id, e.g. id = \"{{ unit.record.email }}\"",
    )


def _id_error(spec: Spec, draft: _Draft, problem: str) -> JobError:
    """A unit id that cannot be one: located at ``units.id`` when that template made
    it, else at the record whose data it is (a job without a ``[units]`` table has no
    ``units.id`` to point at, and the file's first line is not where the problem is)."""
    if spec.units.id is not None:
        return _job_error(spec, ("units", "id"), f"the unit id for {draft.origin} {problem}")
    return _at_record(spec, draft.origin, f"the unit id {problem}")


def _duplicate(spec: Spec, unit: Unit, first: str) -> JobError:
    """A duplicate id, located where the second record is: an inline item in the job
    file, else the record in its input (``data.jsonl:251``), since the data is what
    repeats itself even when a ``units.id`` template renders the ids."""
    message = f"duplicate unit id {unit.id!r}"
    if _INLINE_ITEM.fullmatch(unit.origin):
        message = f"{message} (from {first} and {unit.origin})"
        if spec.units.id is not None:
            return _job_error(spec, ("units", "id"), message)
        return _at_record(spec, unit.origin, message)
    return _at_record(spec, unit.origin, f"{message} (first at {first})")


_INLINE_ITEM = re.compile(r"inputs\.items\[(\d+)\]")


def _at_record(spec: Spec, origin: str, message: str) -> JobError:
    """A problem located at a record: an inline item in the job file, else the record's
    line in its input (``data.jsonl:251``; a JSON document's records have no line)."""
    item = _INLINE_ITEM.fullmatch(origin)
    if item:
        return _job_error(spec, ("inputs", "items", int(item.group(1))), message)
    where = re.fullmatch(r"(?P<source>.+):(?P<line>\d+)", origin)
    source, line = (where["source"], int(where["line"])) if where else (origin, 0)
    return JobError([Problem(file=source, line=line, col=0, key="", message=message)])


def _job_error(spec: Spec, path: KeyPath, message: str) -> JobError:
    positions = spec.positions
    line, col = positions.value(path) if isinstance(path[-1], int) else positions.key(path)
    problem = Problem(file=str(spec.file), line=line, col=col, key=key_name(path), message=message)
    return JobError([problem])
