"""What a change to a job file does, before anything runs: ``fanout plan --base REV``.

Two revisions of one job (the file at a git revision, or another file, against the work
tree's) are each planned as ``fanout plan`` plans them, over the same backlog: both
select from the work tree as it is now, so what differs is what the change to the job
does, not what the data did since.  Then:

- the resolved jobs (defaults filled in) are diffed line by line;
- each unit is fingerprinted on both sides (``run.fingerprints``, as a run would): a
  unit only the new side selects is *added*, one only the old side selects *removed*,
  one on both sides whose fingerprint differs *invalidated* (an earlier success of it
  is not reused, and it runs again), and the rest unchanged;
- three sample units are rendered on both sides (invalidated first, then added, then
  removed, then unchanged), their prompt and argv shown old beside new;
- each side's estimate of the next run (the job's history in the state directory)
  gives attempts, wall time and spend, and the difference;
- the security surface (``SURFACE``) is compared key by key, and a change called out;
- the new side's triggers give their next fires, a change of UTC offset (DST) marked.

Holding the old side's units (to render a sample of them) costs memory in proportion
to the backlog, as a run's selection of one round does.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import tomli_w

from ..attempt import invocation
from ..attempt.invocation import Invocation
from ..backlog.units import Unit
from ..errors import FanoutError, JobError
from ..run.fingerprints import Fingerprints, agent_version
from ..spec import Spec
from ..spec.templates import RenderError
from . import Plan, make
from .approval import plan_hash, resolved

# Sample units rendered on both sides.
SAMPLES = 3
# Unit ids listed for each of added, removed and invalidated (the counts are whole).
SHOWN_IDS = 10
# Next fires of each trigger.
FIRES = 5

# The keys of the resolved job that decide what a worker may reach and what runs
# outside a sandbox, by the path of each in the resolved document: a change to any is
# called out.  ``*`` is each item of a list, and the names after it the fields kept.
SURFACE: tuple[tuple[str, str], ...] = (
    ("runtime.network", "what the workers may reach"),
    ("runtime.sandbox", "how a worker is isolated"),
    ("runtime.image", "the podman image workers run in"),
    ("runtime.hosts", "the hosts units run on"),
    ("runtime.ray", "the Ray cluster units run on"),
    ("task.secrets", "secrets given to every worker"),
    ("task.env", "the workers' environment"),
    ("task.agent", "the agent preset"),
    ("task.command", "the worker's command (an agent's flags: its allowed tools, its mode)"),
    ("task.verify", "the command that judges a unit"),
    ("retry.ladder.*.command,env", "each rung's command and environment"),
    ("apis.*.name,upstream,keySecret,style", "each API's upstream and key"),
    ("inputs.command", "the input command (runs on this machine, outside any sandbox)"),
    ("notify", "where the run's ending is sent"),
    ("publish", "where the run's changes are pushed"),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Side:
    """One revision of the job, planned."""

    label: str
    # None: the job did not exist there (the change adds it), or it is invalid there.
    spec: Spec | None
    plan: Plan | None
    problems: tuple[str, ...] = ()
    resolved_text: str = ""
    plan_hash: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    unit: str
    # added, removed, invalidated or unchanged.
    change: str
    old: Invocation | None
    new: Invocation | None
    old_error: str | None = None
    new_error: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class SurfaceChange:
    key: str
    meaning: str
    old: Any
    new: Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Diff:
    old: Side
    new: Side
    added: int = 0
    removed: int = 0
    invalidated: int = 0
    unchanged: int = 0
    added_ids: tuple[str, ...] = ()
    removed_ids: tuple[str, ...] = ()
    invalidated_ids: tuple[str, ...] = ()
    samples: tuple[Sample, ...] = ()
    resolved_diff: tuple[str, ...] = ()
    surface: tuple[SurfaceChange, ...] = ()
    now: datetime = field(default_factory=datetime.now)

    @property
    def changed(self) -> bool:
        """Whether the change does anything at all."""
        return bool(self.resolved_diff) or self.old.spec is None


def make_diff(
    path: Path,
    *,
    old_text: str | None,
    old_label: str,
    hosts_file: Path | None,
    environ: Mapping[str, str],
    now: datetime,
) -> Diff:
    """Plan the job at ``path`` and its earlier text ``old_text`` (None: the change adds
    the job), and compare them.  JobError when the new side is invalid."""
    from .. import spec as specs

    new_spec = specs.load(path, hosts_file=hosts_file)
    old_spec: Spec | None = None
    old_problems: tuple[str, ...] = ()
    if old_text is not None:
        try:
            old_spec = specs.load(path, hosts_file=hosts_file, text=old_text, shown=old_label)
        except JobError as exc:  # shown, not fatal: the change may fix it
            old_problems = tuple(str(problem) for problem in exc.problems)
    versions: dict[str | None, str] = {}

    def printer(spec: Spec) -> Fingerprints:
        if spec.task.agent not in versions:
            versions[spec.task.agent] = agent_version(spec, environ)
        return Fingerprints(spec, trigger=None, agent_version=versions[spec.task.agent])

    old_units: dict[str, tuple[Unit, str]] = {}
    old_plan = None
    if old_spec is not None:
        prints = printer(old_spec)

        def keep(unit: Unit) -> None:
            old_units[unit.id] = (unit, prints.of(unit).fingerprint or "")

        try:
            old_plan = _plan(old_spec, environ, now, keep)
        except FanoutError as exc:
            # Its input command fails now, say: the new side may be the fix, and is
            # still planned; every unit then counts as added.
            old_units.clear()
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            old_problems = (f"it could not be planned: {said}",)
    tally = _Tally(old_units)
    new_prints = printer(new_spec)
    new_plan = _plan(
        new_spec, environ, now, lambda unit: tally.add(unit, new_prints.of(unit).fingerprint)
    )
    removed = [unit_id for unit_id in old_units if unit_id not in tally.seen]
    old_side = _side(old_label, old_spec, old_plan, old_problems)
    new_side = _side(str(path), new_spec, new_plan, ())
    return Diff(
        old=old_side,
        new=new_side,
        added=tally.added,
        removed=len(removed),
        invalidated=tally.invalidated,
        unchanged=tally.unchanged,
        added_ids=tuple(tally.added_ids),
        removed_ids=tuple(removed[:SHOWN_IDS]),
        invalidated_ids=tuple(tally.invalidated_ids),
        samples=_samples(old_spec, new_spec, tally, old_units, removed),
        resolved_diff=tuple(
            difflib.unified_diff(
                old_side.resolved_text.splitlines(),
                new_side.resolved_text.splitlines(),
                old_label,
                str(path),
                n=2,
                lineterm="",
            )
        ),
        surface=surface_changes(
            resolved(old_spec) if old_spec is not None else {}, resolved(new_spec)
        ),
        now=now,
    )


def _plan(
    spec: Spec, environ: Mapping[str, str], now: datetime, each: Callable[[Unit], None]
) -> Plan:
    return make(spec, environ=environ, now=now, fires=FIRES, each=each)


def _side(label: str, spec: Spec | None, plan: Plan | None, problems: tuple[str, ...]) -> Side:
    if spec is None:
        return Side(label=label, spec=None, plan=None, problems=problems)
    text = tomli_w.dumps(resolved(spec), multiline_strings=True)
    return Side(
        label=label,
        spec=spec,
        plan=plan,
        problems=problems,
        resolved_text=text,
        plan_hash=plan_hash(spec),
    )


class _Tally:
    """The new side's units against the old side's, as the new selection finds them."""

    def __init__(self, old: dict[str, tuple[Unit, str]]) -> None:
        self._old = old
        self.seen: set[str] = set()
        self.added = self.invalidated = self.unchanged = 0
        self.added_ids: list[str] = []
        self.invalidated_ids: list[str] = []
        # The first units of each kind, to sample (at most SAMPLES each).
        self.firsts: dict[str, list[Unit]] = {"invalidated": [], "added": [], "unchanged": []}

    def add(self, unit: Unit, fingerprint: str | None) -> None:
        self.seen.add(unit.id)
        before = self._old.get(unit.id)
        if before is None:
            self.added += 1
            kind = "added"
            if len(self.added_ids) < SHOWN_IDS:
                self.added_ids.append(unit.id)
        elif before[1] != fingerprint:
            self.invalidated += 1
            kind = "invalidated"
            if len(self.invalidated_ids) < SHOWN_IDS:
                self.invalidated_ids.append(unit.id)
        else:
            self.unchanged += 1
            kind = "unchanged"
        if len(self.firsts[kind]) < SAMPLES:
            self.firsts[kind].append(unit)


def _samples(
    old_spec: Spec | None,
    new_spec: Spec,
    tally: _Tally,
    old_units: dict[str, tuple[Unit, str]],
    removed: list[str],
) -> tuple[Sample, ...]:
    """Up to SAMPLES units rendered on both sides, one of each change in turn
    (invalidated, added, removed, unchanged) so a reviewer sees each kind the change
    makes, the changed kinds first."""
    kinds: list[list[tuple[str, Unit | None, Unit | None]]] = [
        [("invalidated", old_units[u.id][0], u) for u in tally.firsts["invalidated"]],
        [("added", None, u) for u in tally.firsts["added"]],
        [("removed", old_units[i][0], None) for i in removed[:SAMPLES]],
        [("unchanged", old_units[u.id][0], u) for u in tally.firsts["unchanged"]],
    ]
    picked = [kind[turn] for turn in range(SAMPLES) for kind in kinds if turn < len(kind)]
    samples = []
    for kind, old_unit, new_unit in picked[:SAMPLES]:
        old, old_error = _render(old_spec, old_unit)
        new, new_error = _render(new_spec, new_unit)
        unit_id = (new_unit or old_unit).id  # type: ignore[union-attr]
        samples.append(
            Sample(
                unit=unit_id,
                change=kind,
                old=old,
                new=new,
                old_error=old_error,
                new_error=new_error,
            )
        )
    return tuple(samples)


def _render(spec: Spec | None, unit: Unit | None) -> tuple[Invocation | None, str | None]:
    if spec is None or unit is None:
        return None, None
    try:
        return invocation.render(spec, unit), None
    except RenderError as exc:
        return None, exc.located()


def surface_changes(old: Any, new: Any) -> tuple[SurfaceChange, ...]:
    """The keys of ``SURFACE`` whose values differ between two resolved jobs."""
    found = []
    for key, meaning in SURFACE:
        before, after = _at(old, key), _at(new, key)
        if before != after:
            found.append(
                SurfaceChange(key=key.split(".*")[0], meaning=meaning, old=before, new=after)
            )
    return tuple(found)


def _at(document: Any, key: str) -> Any:
    """The value at a ``SURFACE`` path ("apis.*.name,upstream": each API's name and
    upstream), None where it is not set."""
    head, star, fields = key.partition(".*.")
    value = document
    for part in head.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if not star:
        return value
    names = fields.split(",")
    return [
        {name: item.get(name) for name in names if item.get(name) is not None}
        for item in value or []
        if isinstance(item, dict)
    ]
