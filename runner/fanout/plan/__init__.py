"""What a run would do, for a reviewer: ``fanout plan``.

A Plan holds the resolved job, the units selected now, the first unit's rendered task,
the effective concurrency, the pace the tightest rate limit allows, each API's windows,
bottleneck and budget, the next cron fires, and the next run's estimate from the job's
earlier runs (``estimate``).  ``output`` turns it into the text the CLI prints, or JSON.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING

from ..attempt import invocation
from ..attempt.invocation import Invocation
from ..backlog.units import Unit, select
from ..errors import Problem
from ..journal import KeptCeiling
from ..pacing import limits
from ..spec import Spec
from ..spec.checks import paths
from ..spec.templates import RenderError
from ..values.quantities import size_text
from .document import to_document
from .output import render_fires, render_text, to_json

if TYPE_CHECKING:  # the journal and the run's modules load only for a plan's make
    from ..journal import Journal
    from .estimate import Estimate

__all__ = [
    "Plan",
    "TriggerFires",
    "make",
    "next_fires",
    "render_fires",
    "render_text",
    "to_document",
    "to_json",
]

SHOWN_UNITS = 10


@dataclass(frozen=True, kw_only=True, slots=True)
class TriggerFires:
    trigger: str
    expression: str
    timezone: str
    explanation: str
    times: tuple[datetime, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    spec: Spec
    records: int
    units: int
    truncated: bool
    first_units: tuple[Unit, ...]
    first_task: Invocation | None
    first_task_error: str | None
    # The same failure as a located problem: ``fanout plan`` exits 2 with it.
    first_task_problem: Problem | None
    concurrency: int
    sandbox: str
    fires: tuple[TriggerFires, ...]
    # Where each worker command resolves, and what cannot start (``commands``).
    commands: tuple[str, ...] = ()
    # Records ``units.where`` dropped.
    dropped: int = 0
    # Units dropped inside state directories, by directory (``units``).
    in_state_dirs: tuple[tuple[str, int], ...] = ()
    # The first unit's stage and collect paths that every unit's attempt would refuse.
    path_problems: tuple[Problem, ...] = ()
    # The [[apis]] keySecret variables the environment lacks (``fanout run`` refuses).
    missing_keys: tuple[str, ...] = ()
    # The selection's located warnings (files skipped, inputs.files patterns that matched
    # no file), and those patterns unlocated, for the message of a selection of nothing.
    warnings: tuple[str, ...] = ()
    unmatched: tuple[str, ...] = ()
    # What the job's last runs learned of its limits, where the next run starts.
    learned: tuple[KeptCeiling, ...] = ()
    # The variables [notify] names that the environment lacks (``fanout run`` refuses).
    missing_notify: tuple[str, ...] = ()
    # The next run's estimate from the job's earlier runs (``estimate``).
    estimate: Estimate | None = None

    @property
    def problems(self) -> tuple[Problem, ...]:
        """What makes ``fanout plan`` exit 2 after showing the plan."""
        first = (self.first_task_problem,) if self.first_task_problem else ()
        return first + self.path_problems


def make(
    spec: Spec,
    *,
    environ: Mapping[str, str],
    now: datetime,
    fires: int = 3,
    each: Callable[[Unit], None] | None = None,
) -> Plan:
    """Select the units and render the first task, without running anything but the
    input command.  ``each`` is given every selected unit, in order (``diff`` compares
    two revisions' units with it)."""
    from ..run import kept
    from ..spec.apikeys import without_keys
    from ..transports.preflight import plan_lines
    from . import estimate

    # The input command runs as in `fanout run`: without the [[apis]] keys.
    stage_paths = functools.partial(invocation.stage_paths, spec)
    selection = select(
        spec, environ=without_keys(spec, environ), count_all=True, stage_paths=stage_paths
    )
    journal = _journal(spec)
    try:
        learned = tuple(kept.kept(journal, spec)) if journal is not None else ()
        shown: list[Unit] = []
        sorting = estimate.sorter(spec, journal, environ)
        for unit in selection:
            if len(shown) < SHOWN_UNITS:
                shown.append(unit)
            sorting.add(unit)
            if each is not None:
                each(unit)
        next_run = estimate.make(spec, journal, sorting.done(), learned)
    finally:
        if journal is not None:
            journal.close()
    first_task, error, problem = None, None, None
    if shown:
        try:
            first_task = invocation.render(spec, shown[0])
        except RenderError as exc:
            error, problem = exc.located(), exc.problem()
            if problem is not None:
                reason = f"{problem.message} (rendering for unit {shown[0].id!r})"
                problem = replace(problem, message=reason)
    path_problems = _path_problems(spec, first_task) if first_task else ()
    return Plan(
        spec=spec,
        dropped=selection.dropped,
        in_state_dirs=tuple(selection.in_state_dirs.items()),
        path_problems=path_problems,
        records=selection.records,
        units=selection.selected,
        truncated=selection.truncated,
        first_units=tuple(shown),
        first_task=first_task,
        first_task_error=error,
        first_task_problem=problem,
        concurrency=limits.concurrency(spec),
        sandbox=describe_sandbox(spec),
        fires=next_fires(spec, now, fires),
        commands=tuple(plan_lines(spec, environ)),
        missing_keys=tuple(
            api.key_secret
            for api in spec.apis
            if api.key_secret is not None and api.key_secret not in environ
        ),
        warnings=tuple(selection.warnings),
        unmatched=tuple(selection.unmatched),
        learned=learned,
        estimate=next_run,
        missing_notify=tuple(
            name
            for name in (
                ([spec.notify.webhook_secret] if spec.notify.webhook_secret else [])
                + list(spec.notify.secrets)
            )
            if name not in environ
        )
        if spec.notify is not None
        else (),
    )


def _journal(spec: Spec) -> Journal | None:
    """The state directory's journal, read-only, so a plan creates no state; None where
    there is none, or one it cannot read (nothing learned, no history)."""
    from ..errors import StateError
    from ..journal import Journal

    path = spec.runtime.state_dir / "journal.sqlite"
    if not path.is_file():
        return None
    try:
        return Journal(path, read_only=True)
    except StateError:
        return None


def _path_problems(spec: Spec, task: Invocation) -> tuple[Problem, ...]:
    """The first unit's stage and collect paths that ``staging`` and ``collecting``
    would refuse for every attempt (an absolute path from a linter, above all), located
    with the way out."""
    problems = []
    for kind, templates, rendered in (
        ("stage", spec.units.stage, task.stage),
        ("collect", spec.units.collect, task.collect),
    ):
        for template, path in zip(templates, rendered, strict=True):
            refused = paths.refusal(kind, path, template.source, spec.runtime.workspace)
            if refused is None or template.at is None:
                continue  # a literal path was checked when the job was loaded
            file, line, col = template.at
            message = f"{refused} (rendered for unit {task.unit_id!r})"
            problems.append(
                Problem(file=file, line=line, col=col, key=template.key, message=message)
            )
    return tuple(problems)


def next_fires(spec: Spec, now: datetime, count: int) -> tuple[TriggerFires, ...]:
    return tuple(
        TriggerFires(
            trigger=trigger.name,
            expression=trigger.schedule.text,
            timezone=trigger.timezone,
            explanation=trigger.schedule.explain(),
            times=tuple(trigger.schedule.next_fires(now, count)),
        )
        for trigger in spec.triggers
    )


def describe_sandbox(spec: Spec) -> str:
    runtime = spec.runtime
    if runtime.ray is not None:
        address = runtime.ray.address
        cluster = "this machine's" if address == "auto" else f"{address}'s"
        where = f"{cluster} Ray cluster ({_ray_asks(spec)} a unit)"
    elif runtime.hosts:
        where = f"{len(runtime.hosts)} SSH host(s), {sum(h.slots for h in runtime.hosts)} slots"
    else:
        where = "this machine"
    kind: str = runtime.sandbox
    if kind == "auto" and runtime.ray is not None:
        kind = "auto (bwrap where a node has it)"
    elif kind == "auto" and not runtime.hosts:
        kind = "bwrap" if shutil.which("bwrap") else "none (bwrap not found: plain directories)"
    network = (
        "network: the API gateway only"
        if runtime.network == "apis"
        else "network on"
        if runtime.network
        else "no network"
    )
    return f"{where}, sandbox {kind}, {network}"


def _ray_asks(spec: Spec) -> str:
    """What each running unit holds on its node: "1 CPU, agent = 1, 2GiB"."""
    ray = spec.runtime.ray
    assert ray is not None
    asks = [f"{ray.cpus:g} CPU"]
    asks += [f"{name} = {amount:g}" for name, amount in ray.resources.items()]
    if spec.task.memory is not None:
        asks.append(size_text(spec.task.memory))
    asks += [f"label {key} = {value}" for key, value in ray.labels.items()]
    return ", ".join(asks)
