"""The plan as ``fanout plan`` prints it: the text a reviewer reads (``render_text``),
the JSON a program reads (``to_json``), and the cron fires ``fanout triggers`` lists."""

from __future__ import annotations

import json
import shlex
import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import tomli_w

from ..attempt.invocation import Invocation
from ..backlog.units import state_dir_drops
from ..journal.ceilings import label
from ..pacing import limits
from ..spec import Rung, Spec
from ..values.quantities import duration_text, size_text, usd_text
from . import apis, nextrun
from .document import to_document

if TYPE_CHECKING:
    from . import Plan, TriggerFires


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
    lines += _publish_lines(spec)
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
    if plan.estimate is not None:
        lines += nextrun.lines(plan.estimate, spec)
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


def _publish_lines(spec: Spec) -> list[str]:
    """Where a finished run's changes go: the branch (as written), remote and base."""
    publish = spec.publish
    if publish is None:
        return []
    base = publish.base or "the branch checked out"
    return [
        f"Publish   {publish.branch.source} to {publish.remote}, a pull request into {base}"
        f" (one commit per {publish.commits}; a failure is logged, the exit code stays)"
    ]


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


def to_json(plan: Plan) -> dict[str, Any]:
    """``fanout plan --format json``: the plan's facts and figures for a program (a CI
    step that checks the estimate against a budget, say).  The first unit's rendered
    task is in it as the worker would get it; the resolved job as ``fanout plan``'s
    text shows it, as JSON."""
    spec = plan.spec
    task = plan.first_task
    return {
        "job": spec.name,
        "file": str(spec.file),
        "units": plan.units,
        "records": plan.records,
        "dropped": plan.dropped,
        "truncated": plan.truncated,
        "firstUnits": [unit.id for unit in plan.first_units],
        "concurrency": plan.concurrency,
        "sandbox": plan.sandbox,
        "minimumWallSeconds": limits.minimum_wall_time(spec, plan.units),
        "learned": [
            {"limit": label(row.name), "text": row.text, "run": row.run} for row in plan.learned
        ],
        "missingKeys": list(plan.missing_keys),
        "missingNotify": list(plan.missing_notify),
        "warnings": list(plan.warnings),
        "problems": [problem.as_dict() for problem in plan.problems],
        "firstTask": None
        if task is None
        else {
            "unit": task.unit_id,
            "rung": task.rung,
            "argv": list(task.argv),
            "prompt": task.prompt,
            "verify": list(task.verify),
            "stage": list(task.stage),
            "collect": list(task.collect),
        },
        "next": None if plan.estimate is None else nextrun.document(plan.estimate),
        "fires": [
            {
                "trigger": fire.trigger,
                "times": [iso(moment) for moment in fire.times],
            }
            for fire in plan.fires
        ],
        "resolved": to_document(spec),
    }
