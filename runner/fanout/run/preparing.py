"""Preparing one attempt of a unit on the coordinator: its templates rendered, its files
staged and its collect globs compiled, into the one ``Attempt`` value a transport runs."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ..attempt import invocation, staging
from ..attempt.collecting import Collect, PathRefused
from ..attempt.model import Attempt
from ..attempt.sandbox import StagedFile
from ..backlog.units import Unit
from ..spec import presets
from ..spec.templates import RenderError, render_off_loop
from .ladder import Progress
from .round import Round


@dataclass(frozen=True, kw_only=True, slots=True)
class Prepared:
    """An attempt ready to run, and the hashes of the files staged for it (the journal
    keeps those of a success, so fan-in sees a file changed since it was staged)."""

    attempt: Attempt
    staged_hashes: dict[str, str]


@dataclass(frozen=True, kw_only=True, slots=True)
class Unprepared:
    """An attempt that cannot run: a template failed, or a staged or collected path is
    refused.  It fails without a worker, and the ladder goes on."""

    reason: str


async def prepare(ctx: Round, unit: Unit, progress: Progress) -> Prepared | Unprepared:
    """Attempt number ``progress.attempts`` of ``unit``, on the rung ``progress`` is on."""
    try:
        task = await _rendered(ctx, unit, progress)
        staged = staging.stage(ctx.spec.runtime.workspace, task.stage)
        staged_hashes = staging.staged_hashes(staged)
        collect = Collect.compile(task.collect)
    except (RenderError, PathRefused) as exc:
        return Unprepared(reason=f"template: {exc}" if isinstance(exc, RenderError) else str(exc))
    attempt = _attempt(ctx, unit, progress.attempts, task, staged, collect)
    return Prepared(attempt=attempt, staged_hashes=staged_hashes)


async def _rendered(ctx: Round, unit: Unit, progress: Progress) -> invocation.Invocation:
    # Off the event loop, bounded (templates.bounds): a prompt's long loop runs in a
    # worker thread while the gateway and the other units go on.  A job whose text has
    # no template renders by copying it, on the loop (``invocation.templated``).
    render = functools.partial(
        invocation.render,
        ctx.spec,
        unit,
        rung_index=progress.rung,
        attempt=progress.attempts,
        round_number=ctx.number,
        last=progress.last or invocation.NO_LAST_ATTEMPT,
        trigger=ctx.trigger,
    )
    return await render_off_loop(render) if ctx.templated else render()


def _attempt(
    ctx: Round,
    unit: Unit,
    number: int,
    task: invocation.Invocation,
    staged: tuple[StagedFile, ...],
    collect: Collect,
) -> Attempt:
    spec = ctx.spec
    folder = staging.unit_folder_name(unit.id)
    return Attempt(
        run_id=ctx.run_id,
        unit_id=unit.id,
        round=ctx.number,
        number=number,
        invocation=task,
        staged=staged,
        collect=collect,
        collect_dir=ctx.run_dir / "units" / folder,
        log_path=ctx.run_dir / "logs" / folder / f"r{ctx.number}-a{number}.log",
        log_limit=spec.runtime.log_limit,
        tail_limit=spec.runtime.output_tail,
        network=spec.runtime.network,
        throttle_patterns=spec.task.throttle_patterns,
        secrets=ctx.secrets,
        keys=ctx.keys,
        agent=spec.task.agent,
        longest_pause=spec.retry.throttle.max,
        agent_api=presets.api_of(spec.task.agent, ((a.name, a.style) for a in spec.apis)),
    )
