"""What a run would do, for a reviewer: ``fanout plan``.

A Plan holds the resolved job, the units selected now, the first unit's rendered task,
the effective concurrency, the pace the tightest rate limit allows and the next cron
fires.  ``render_text`` turns it into the text the CLI prints.
"""

from __future__ import annotations

import re
import shlex
import shutil
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tomli_w

from . import cron, invocation, limits
from .checks import paths
from .errors import Problem
from .invocation import Invocation
from .quantities import duration_text, format_duration, size_text
from .spec import Inputs, Spec, camel_case
from .templates import Expression, RenderError, Template
from .units import Unit, select

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
    # The first unit's stage and collect paths that every unit's attempt would refuse.
    path_problems: tuple[Problem, ...] = ()

    @property
    def problems(self) -> tuple[Problem, ...]:
        """What makes ``fanout plan`` exit 2 after showing the plan."""
        first = (self.first_task_problem,) if self.first_task_problem else ()
        return first + self.path_problems


def make(spec: Spec, *, environ: Mapping[str, str], now: datetime, fires: int = 3) -> Plan:
    """Select the units and render the first task, without running anything but the
    input command."""
    from .commands import plan_lines

    selection = select(spec, environ=environ, count_all=True)
    shown: list[Unit] = []
    for unit in selection:
        if len(shown) < SHOWN_UNITS:
            shown.append(unit)
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
    )


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
    where = (
        f"{len(runtime.hosts)} SSH host(s), {sum(h.slots for h in runtime.hosts)} slots"
        if runtime.hosts
        else "this machine"
    )
    kind: str = runtime.sandbox
    if kind == "auto" and not runtime.hosts:
        kind = "bwrap" if shutil.which("bwrap") else "none (bwrap not found: plain directories)"
    network = "network on" if runtime.network else "no network"
    return f"{where}, sandbox {kind}, {network}"


def iso(moment: datetime) -> str:
    text = moment.isoformat()
    return text.replace("+00:00", "Z") if moment.utcoffset() == UTC.utcoffset(None) else text


def render_text(plan: Plan) -> str:
    spec = plan.spec
    lines = [f"Job       {spec.name}" + (f": {spec.description}" if spec.description else "")]
    lines.append(f"File      {spec.file}")
    source = spec.inputs.source
    detail = shlex.join(t.source for t in spec.inputs.command) if source == "command" else ""
    lines.append(f"Inputs    {source}" + (f": {detail} ({spec.inputs.format})" if detail else ""))
    count = f"{plan.units:,} unit(s) from {plan.records:,} record(s)"
    if spec.units.where is not None:
        count += f", {plan.dropped:,} dropped by units.where"
    if spec.units.group_by:
        count += f", grouped by {spec.units.group_by}"
    if plan.truncated:
        count += f" (limit {spec.units.limit:,} per round)"
    lines.append(f"Units     {count}")
    lines.append(f"Workers   {plan.concurrency} at once on {plan.sandbox}")
    lines += plan.commands
    lines += _pace_lines(spec, plan.units)
    ladder = " -> ".join(
        f"{r.name} x{r.attempts}" + (f" ({duration_text(r.timeout)})" if r.timeout else "")
        for r in spec.retry.ladder
    )
    lines.append(f"Ladder    {ladder}; task timeout {duration_text(spec.task.timeout)}")
    apply = (
        "collected files applied" if spec.collect.apply else "collected files kept (use --apply)"
    )
    lines.append(f"Rounds    up to {spec.rounds.max}; {apply}")
    for fire in plan.fires:
        lines.append(f"Trigger   {fire.trigger!r} ({fire.timezone}): {fire.explanation}")
        for moment in fire.times:
            lines.append(f"            {iso(moment)}  ({iso(moment.astimezone(UTC))})")
    if plan.first_units:
        lines += ["", "First units:"]
        width = max(len(u.id) for u in plan.first_units)
        for unit in plan.first_units:
            items = f"{len(unit.items)} record(s)" if spec.units.group_by else unit.origin
            lines.append(f"  {unit.index + 1:>4}. {unit.id:<{width}}  {items}")
        if plan.units > len(plan.first_units):
            lines.append(f"        ... and {plan.units - len(plan.first_units):,} more")
    if plan.first_task_error:
        lines += ["", f"First unit's task does not render: {plan.first_task_error}"]
    if plan.path_problems:
        lines += ["", "First unit's files would be refused by every attempt:"]
        lines += [f"  {problem}" for problem in plan.path_problems]
    if plan.first_task:
        lines += ["", *_task_lines(plan.first_task)]
    resolved = tomli_w.dumps(to_document(spec), multiline_strings=True)
    lines += ["", "Resolved job (defaults filled in):", textwrap.indent(resolved.rstrip(), "  ")]
    return "\n".join(lines) + "\n"


def _pace_lines(spec: Spec, units: int) -> list[str]:
    paces = limits.paces(spec)
    if not paces:
        return ["Pace      no rate limits declared: dispatch is bounded by concurrency only"]
    lines = []
    for n, pace in enumerate(paces):
        limit = pace.limit
        per_minute = pace.tasks_per_second * 60
        mark = "  <- tightest" if n == 0 else ""
        lines.append(
            f"{'Pace' if n == 0 else '':<10}{limit.name}: {per_minute:,.4g} task(s)/min "
            f"({limit.requests} requests per {duration_text(limit.per)}, "
            f"{limit.requests_per_task} per task){mark}"
        )
    wall = limits.minimum_wall_time(spec, units)
    assert wall is not None
    lines.append(
        f"          {units:,} unit(s) x {paces[0].limit.requests_per_task} request(s) at "
        f"{paces[0].limit.requests}/{duration_text(paces[0].limit.per)}: at least "
        f"{format_duration(wall)}, {paces[0].limit.name} is the bottleneck"
        + (
            f" ({paces[0].tasks_per_window} task(s) fit a window)"
            if paces[0].limit.requests_per_task > 1
            else ""
        )
    )
    return lines


def _task_lines(task: Invocation) -> list[str]:
    lines = [f"First unit's task ({task.unit_id}, rung {task.rung}, attempt {task.attempt}):"]
    lines.append(f"  command  {shlex.join(task.argv)}")
    if task.verify:
        lines.append(f"  verify   {shlex.join(task.verify)}")
    if task.env:
        lines.append("  env      " + " ".join(f"{k}={shlex.quote(v)}" for k, v in task.env.items()))
    if task.secrets:
        lines.append(f"  secrets  {', '.join(task.secrets)} (values come from the environment)")
    lines.append(f"  timeout  {duration_text(task.timeout)}")
    if task.stage:
        lines.append(f"  stage    {' '.join(task.stage)}")
    if task.collect:
        lines.append(f"  collect  {' '.join(task.collect)}")
    if task.prompt:
        lines.append("  prompt (stdin):")
        lines += [f"    | {line}" for line in task.prompt.rstrip("\n").split("\n")]
    return lines


def render_fires(fires: tuple[TriggerFires, ...]) -> str:
    """``fanout triggers``: each trigger's reading, then its fires in its zone and UTC."""
    lines = []
    for fire in fires:
        named = f"{fire.trigger!r} " if fire.trigger != fire.expression else ""
        lines.append(f"{named}{fire.expression} ({fire.timezone}): {fire.explanation}")
        for moment in fire.times:
            lines.append(f"  {iso(moment)}  {iso(moment.astimezone(UTC))}")
    return "\n".join(lines) + "\n"


_SIZES = frozenset({"log_limit", "output_tail"})
_HIDDEN = frozenset({"file", "templates", "positions", "hosts_file"})


def to_document(value: Any, name: str = "") -> Any:
    """The job file ``value`` stands for, with every default filled in."""
    if isinstance(value, Template | Expression):
        return value.source
    if isinstance(value, cron.CronExpr):
        return value.text
    if isinstance(value, re.Pattern):
        return value.pattern
    if isinstance(value, Path):
        return str(value)
    if is_dataclass(value):
        document = {}
        skip = _HIDDEN | (_inapplicable_inputs(value) if isinstance(value, Inputs) else set())
        for item in fields(value):
            inner = getattr(value, item.name)
            if item.name in skip or inner is None or inner == () or inner == {}:
                continue
            document[camel_case(item.name)] = to_document(inner, item.name)
        return document
    if isinstance(value, Mapping):
        return {k: to_document(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [to_document(v) for v in value]
    # A float field of a dataclass is a duration (but jitter); a float in vars or items
    # is the user's number (0.7 stays 0.7, not "700ms").
    if isinstance(value, float) and name and name != "jitter":
        return duration_text(value)
    if isinstance(value, int) and not isinstance(value, bool) and name in _SIZES:
        return size_text(value)
    return value


def _inapplicable_inputs(inputs: Inputs) -> set[str]:
    """Input keys whose defaults mean nothing for this source (hidden by ``plan``)."""
    skip = set()
    if inputs.source != "files":
        skip |= {"gitignore", "exclude"}
    if inputs.source != "command":
        skip |= {"format", "ok_exit_codes", "timeout"}
    if not inputs.pointer:
        skip.add("pointer")
    return skip
