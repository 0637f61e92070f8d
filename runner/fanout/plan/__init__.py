"""What a run would do, for a reviewer: ``fanout plan``.

A Plan holds the resolved job, the units selected now, the first unit's rendered task,
the effective concurrency, the pace the tightest rate limit allows, each API's windows,
bottleneck and budget, and the next cron fires.  ``render_text`` turns it into the text
the CLI prints.
"""

from __future__ import annotations

import functools
import json
import shlex
import shutil
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import tomli_w

from ..attempt import invocation
from ..attempt.invocation import Invocation
from ..backlog.units import Unit, select, state_dir_drops
from ..errors import Problem
from ..journal import KeptCeiling
from ..pacing import limits
from ..spec import Rung, Spec
from ..spec.checks import paths
from ..spec.templates import RenderError
from ..values.quantities import duration_text, size_text, usd_text
from . import apis
from .document import to_document

__all__ = [
    "Plan",
    "TriggerFires",
    "make",
    "next_fires",
    "render_fires",
    "render_text",
    "to_document",
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

    @property
    def problems(self) -> tuple[Problem, ...]:
        """What makes ``fanout plan`` exit 2 after showing the plan."""
        first = (self.first_task_problem,) if self.first_task_problem else ()
        return first + self.path_problems


def make(spec: Spec, *, environ: Mapping[str, str], now: datetime, fires: int = 3) -> Plan:
    """Select the units and render the first task, without running anything but the
    input command."""
    from ..spec.apikeys import without_keys
    from ..transports.preflight import plan_lines

    # The input command runs as in `fanout run`: without the [[apis]] keys.
    stage_paths = functools.partial(invocation.stage_paths, spec)
    selection = select(
        spec, environ=without_keys(spec, environ), count_all=True, stage_paths=stage_paths
    )
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
        learned=learned_before(spec),
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


def learned_before(spec: Spec) -> tuple[KeptCeiling, ...]:
    """What earlier runs of the job learned that its next run starts from, read from
    the state directory's journal if there is one; read-only, so a plan creates no state
    (and a journal it cannot read shows nothing learned)."""
    from ..errors import StateError
    from ..journal import Journal
    from ..run import kept

    path = spec.runtime.state_dir / "journal.sqlite"
    if not path.is_file():
        return ()
    try:
        journal = Journal(path, read_only=True)
    except StateError:
        return ()
    try:
        return tuple(kept.kept(journal, spec))
    finally:
        journal.close()


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
    if plan.in_state_dirs:
        count += f", dropped {state_dir_drops(dict(plan.in_state_dirs))}"
    if spec.units.group_by:
        count += f", grouped by {spec.units.group_by}"
    if plan.truncated:
        count += f" (limit {spec.units.limit:,} per round)"
    lines.append(f"Units     {count}")
    lines += [f"          {warning}" for warning in plan.warnings]
    lines.append(f"Workers   {plan.concurrency} at once on {plan.sandbox}")
    lines += plan.commands
    lines += apis.pace_lines(spec, plan.units)
    lines += apis.learned_lines(plan.learned)
    lines += apis.api_lines(spec, plan.missing_keys)
    lines += _notify_lines(spec, plan.missing_notify)
    ladder = " -> ".join(f"{r.name} x{r.attempts}" + _rung_overrides(r) for r in spec.retry.ladder)
    lines.append(f"Ladder    {ladder}; task timeout {duration_text(spec.task.timeout)}")
    if spec.task.budget_usd is not None:
        lines.append(
            f"Budget    {usd_text(spec.task.budget_usd)} per unit (task.budget), over all"
            " its attempts in the run; once spent the unit fails"
        )
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
        lines += ["", *_task_lines(plan.first_task, spec)]
    resolved = tomli_w.dumps(to_document(spec), multiline_strings=True)
    lines += ["", "Resolved job (defaults filled in):", textwrap.indent(resolved.rstrip(), "  ")]
    return "\n".join(lines) + "\n"


def _notify_lines(spec: Spec, missing: tuple[str, ...]) -> list[str]:
    """Where the run's ending is told, and of which endings: the webhook by its
    variable (or its host), never its URL."""
    notify = spec.notify
    if notify is None:
        return []
    from ..notify import webhook_name

    def named(name: str) -> str:
        return f"${name} NOT SET (`fanout run` refuses)" if name in missing else f"${name}"

    to = []
    if notify.webhook_secret is not None:
        to.append(f"webhook {named(notify.webhook_secret)}")
    elif notify.webhook is not None:
        to.append(f"webhook {webhook_name(notify)}")
    if notify.command:
        command = shlex.join(part.source for part in notify.command)
        given = f" with {', '.join(named(s) for s in notify.secrets)}" if notify.secrets else ""
        to.append(f"command {command} (the message on stdin{given})")
    on = ", ".join(str(event) for event in notify.on)
    within = duration_text(notify.timeout)
    head = f"Notify    on {on} (within {within} each; a failure is logged, the exit code stays)"
    return [head, *(f"            {line}" for line in to)]


def _rung_overrides(rung: Rung) -> str:
    """A rung's own timeout and memory, as the ladder line shows them: " (30s, 4GiB)"."""
    own = [duration_text(rung.timeout)] if rung.timeout else []
    own += [size_text(rung.memory)] if rung.memory is not None else []
    return f" ({', '.join(own)})" if own else ""


def _task_lines(task: Invocation, spec: Spec) -> list[str]:
    lines = [f"First unit's task ({task.unit_id}, rung {task.rung}, attempt {task.attempt}):"]
    agent = spec.task.agent
    if agent is None:
        lines.append(f"  command  {shlex.join(task.argv)}")
    else:
        lines += _agent_lines(task, spec, agent)
    if task.verify:
        lines.append(f"  verify   {shlex.join(task.verify)}")
    if task.env and agent is None:
        lines.append("  env      " + " ".join(f"{k}={shlex.quote(v)}" for k, v in task.env.items()))
    if task.secrets:
        lines.append(f"  secrets  {', '.join(task.secrets)} (values come from the environment)")
    lines.append(f"  timeout  {duration_text(task.timeout)}")
    if task.memory is not None:
        # The report's GiB-seconds; locally and over SSH no transport enforces it.
        billed = "per attempt, billed x its active seconds"
        lines.append(f"  memory   {size_text(task.memory)} {billed}")
    if task.stage:
        lines.append(f"  stage    {' '.join(task.stage)}")
    if task.collect:
        lines.append(f"  collect  {' '.join(task.collect)}")
    if task.prompt:
        lines.append("  prompt (stdin):")
        lines += [f"    | {line}" for line in task.prompt.rstrip("\n").split("\n")]
    return lines


def _agent_lines(task: Invocation, spec: Spec, agent: str) -> list[str]:
    """The command and environment of an agent's task, one variable a line, each value
    the preset filled in marked as such: a reviewer sees what the job did not say."""
    mark = f"   (from task.agent = {json.dumps(agent)})"
    rung = spec.retry.ladder[0]  # the first task is the first rung's
    filled = spec.task.from_agent
    command = shlex.join(task.argv)
    if rung.command is None and "command" in filled:
        extended = " and task.args" if spec.task.args else ""
        command += mark.replace(")", f"{extended})")
    lines = [f"  agent    {agent}: its output is read for the attempt's fate, usage and cost"]
    lines.append(f"  command  {command}")
    for n, (name, value) in enumerate(task.env.items()):
        line = f"{'env' if n == 0 else '':<9}{name}={shlex.quote(value)}"
        lines.append(f"  {line}{mark if name in filled and name not in rung.env else ''}")
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
