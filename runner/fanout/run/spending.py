"""An attempt on its worker, and what it spends: awaited so that a stop of the round
lets it finish (``Round.stop``), given a gateway token of its own that is revoked when
it ends, however it ends, its usage in the journal (the gateway's count, written as its
requests start and end and when it ends; else what its agent reported), and the unit
held to ``task.budget``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import replace

from ..attempt.model import ApiAccess, Attempt
from ..backlog.units import Unit
from ..outcome import ApiUsage, AttemptResult, Status, unit_budget_spent
from .round import Round


async def run(ctx: Round, attempt: Attempt) -> AttemptResult:
    """Run ``attempt`` on the round's transport, through the gateway if there is one."""
    if ctx.gateway is not None:
        return await _through_gateway(ctx, attempt)
    result = await _in_worker(ctx, ctx.transport.run(attempt))
    # What the agent said it used: no gateway counted it.
    ctx.journal.record_usage(ctx.run_id, ctx.number, attempt.unit_id, attempt.number, result.usage)
    return result


async def _through_gateway(ctx: Round, attempt: Attempt) -> AttemptResult:
    """Run ``attempt`` with a token of its own for the gateway, revoked when it ends
    (however it ends).  The gateway writes its usage to the journal as its requests
    start and end (see ``gateway.books``), and once more at the revoke: a killed
    attempt's spending counts toward the budgets when the run resumes."""
    gateway = ctx.gateway
    assert gateway is not None
    ends = asyncio.get_running_loop().time() + attempt.deadline
    # The unit's budget goes with its token, less what its earlier attempts spent
    # (any API, resumed runs included): the gateway refuses its requests once the rest
    # is gone, and the dispatcher then fails the unit (see ``dispatch``).
    budget = ctx.spec.task.budget_usd
    token = gateway.grant(
        unit=attempt.unit_id,
        attempt=attempt.number,
        deadline=ends,
        budget_usd=budget,
        round=ctx.number,
        spent_usd=0.0
        if budget is None
        else ctx.journal.unit_spent(ctx.run_id, attempt.unit_id, ctx.number),
    )
    access = tuple(
        ApiAccess(api.name, api.base_url_env, api.token_env, token) for api in ctx.spec.apis
    )
    usage: tuple[ApiUsage, ...] = ()
    try:
        result = await _in_worker(ctx, ctx.transport.run(replace(attempt, apis=access)))
    finally:
        usage = gateway.revoke(token)
    if not usage and result.usage:  # its agent called its API past the gateway
        usage = result.usage
        ctx.journal.record_usage(ctx.run_id, ctx.number, attempt.unit_id, attempt.number, usage)
    if gateway.stopped is not None and result.status is not Status.SUCCEEDED:
        # Money ran out under it (its requests got the gateway's refusal): not the
        # unit's failure, so no rung is used and the resumed run runs it again.
        reason = f"stopped for money: {gateway.stopped}"
        return replace(result, status=Status.INTERRUPTED, reason=reason, usage=usage)
    return replace(result, usage=usage)


def budget_spent(ctx: Round, unit: Unit) -> str | None:
    """Why the unit may spend no more (``task.budget``, counted from the journal's
    usage of the unit in this run: the gateway's count, else what its agent reported),
    None while it may, or without a budget."""
    budget = ctx.spec.task.budget_usd
    if budget is None:
        return None
    return unit_budget_spent(budget, ctx.journal.unit_spent(ctx.run_id, unit.id, ctx.number))


async def _in_worker(ctx: Round, running: Awaitable[AttemptResult]) -> AttemptResult:
    """Await an attempt's worker; a stop of the round lets it finish (see ``Round.stop``)."""
    with ctx.units.working():
        return await running
