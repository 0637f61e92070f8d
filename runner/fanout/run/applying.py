"""Fan-in between rounds: a round's collected files compared with the workspace and
(when the run applies) written to it, each change journaled and each conflict told."""

from __future__ import annotations

from ..attempt import staging
from .round import Round


def fan_in(ctx: Round, *, apply: bool) -> int:
    """Compare (and, with ``apply``, write) the collected files of the round's
    succeeded and reused units to the workspace; how many files were written.  A reused
    unit's files are in the folder of the run that made them; those the workspace holds
    already are unchanged, not written again."""
    workspace = ctx.spec.runtime.workspace
    written = 0
    for row in ctx.journal.units_with_files(ctx.run_id, ctx.number):
        made_in = ctx.run_dir if row.reused_from is None else ctx.run_dir.parent / row.reused_from
        unit_dir = made_in / "units" / staging.unit_folder_name(row.unit.id)
        changes = staging.apply(
            workspace, row.unit.id, unit_dir, row.collected, row.staged, write=apply
        )
        ctx.journal.record_changes(ctx.run_id, ctx.number, changes)
        for change in changes:
            if change.state is staging.ChangeState.CONFLICT:
                ctx.events.emit(
                    "file.conflict", round=ctx.number, unit=row.unit.id, path=change.path
                )
        written += sum(1 for c in changes if c.state is staging.ChangeState.APPLIED)
    return written
