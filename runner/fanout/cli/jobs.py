"""Commands about job files: validate, plan, init, schema."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ..errors import ExitCode, JobError, UsageError
from . import validating
from .app import JobFile, OutputFormat, app, environ, nothing_selected


@app.command(rich_help_panel="Job files")
def validate(
    files: Annotated[
        list[Path], typer.Argument(metavar="FILE", help="Job files to check.", show_default=False)
    ],
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format",
            help=(
                "text: file:line:col lines; json: an array of problems; github: GitHub "
                "Actions annotations (::error lines) on the job file's lines."
            ),
        ),
    ] = OutputFormat.text,
) -> None:
    """Check job files against the schema and fanout's rules.

    Exit 0 if all are valid, 2 if not.

    Every problem is reported at once as FILE:LINE:COL: key.path: what is wrong.
    Input commands are not run (see 'fanout plan' for that).
    """
    raise typer.Exit(validating.check(files, output.value))


class PlanFormat(StrEnum):
    text = "text"
    json = "json"
    markdown = "markdown"


@app.command(rich_help_panel="Job files")
def plan(
    file: JobFile,
    hosts: Annotated[
        Path | None, typer.Option("--hosts", help="A hosts file replacing runtime.hosts.")
    ] = None,
    output: Annotated[
        PlanFormat,
        typer.Option(
            "--format",
            help="text; json: the same facts and the estimate's figures for a program;"
            " markdown (with --base): a pull request comment under GitHub's 65,536"
            " characters.",
        ),
    ] = PlanFormat.text,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            metavar="REV",
            help="Compare the job file at git revision REV (HEAD~1, origin/main, a PR's"
            " base sha) with the work tree's: units added, removed and invalidated,"
            " sample units' prompts old and new, the estimates, the security surface,"
            " the next fires and the resolved diff.",
        ),
    ] = None,
    base_file: Annotated[
        Path | None,
        typer.Option(
            "--base-file",
            metavar="OLD",
            help="Like --base, with another job file as the old side.",
        ),
    ] = None,
    show_hash: Annotated[
        bool,
        typer.Option(
            "--hash",
            help="Print only the plan hash: what 'fanout run --expect-plan HASH' checks.",
        ),
    ] = False,
) -> None:
    """Show what 'fanout run' would do, without running any worker.

    The units selected now, the first unit's rendered prompt and command, concurrency,
    the pace the tightest rate limit allows, the next cron fires and the resolved job
    with defaults filled in.  Runs the input command.  Exit 3 if nothing is selected,
    2 if the first unit's task does not render (the plan is still shown).

    The estimate, from the job's earlier runs in the state directory: which selected
    units would run (each fingerprinted and sorted as the run would: reused,
    quarantined, run), how often a unit reached each rung and what an attempt there
    took, the run's expected attempts, active seconds and spend (p50 and p90), its wall
    time at the pace of its slots, limits and APIs (declared or learned), and a unit's
    p90 spend against task.budget and the run's against each API's budget.  With no
    earlier run it says so.

    --base REV (or --base-file OLD) reviews a change to the job like a Terraform plan:
    both sides are planned over the work tree's backlog as it is now, so what differs
    is what the change does.  Exit 0, or 2 if the new side is invalid.

    --hash prints the digest of the resolved job (every default filled in, paths
    relative to the job's folder): record it when the change is approved, and the
    scheduled run refuses a job that changed since ('fanout run --expect-plan HASH').
    """
    from .. import plan as planning
    from .. import spec

    if show_hash:
        from ..plan.approval import plan_hash

        print(plan_hash(spec.load(file, hosts_file=hosts)))
        return
    if base is not None or base_file is not None:
        print(_plan_diff(file, hosts, output, base, base_file), end="")
        return
    if output is PlanFormat.markdown:
        raise UsageError("--format markdown is the comment of a comparison: add --base REV")

    def make() -> str:
        job = spec.load(file, hosts_file=hosts)
        result = planning.make(job, environ=environ(), now=datetime.now(UTC))
        if output is PlanFormat.json:
            text = json.dumps(planning.to_json(result), indent=2) + "\n"
        else:
            text = planning.render_text(result)
        if result.units == 0:
            print(text)
            raise nothing_selected(file, result.unmatched)
        if result.problems:
            # A template that fails for the first unit (or a stage path every attempt
            # refuses) will fail the others: plan is the check before a run, so it fails
            # too, after showing the plan.
            print(text, end="")
            raise JobError(list(result.problems))
        return text

    print(make(), end="")


def _plan_diff(
    file: Path, hosts: Path | None, output: PlanFormat, base: str | None, base_file: Path | None
) -> str:
    """``fanout plan --base``: the job at ``base`` (or in ``base_file``) against the
    work tree's, in the format asked for."""
    from .. import spec
    from ..plan import diff, diffview, revision

    if base is not None and base_file is not None:
        raise UsageError("--base and --base-file both name the old side: give one")
    if base is not None:
        old_text, old_label = revision.at_revision(file, base)
    else:
        assert base_file is not None
        old_label = str(base_file)
        old_text = spec.read_text(base_file, old_label, what="job file")
    result = diff.make_diff(
        file,
        old_text=old_text,
        old_label=old_label,
        hosts_file=hosts,
        environ=environ(),
        now=datetime.now(UTC),
    )
    if output is PlanFormat.json:
        return json.dumps(diffview.to_json(result), indent=2) + "\n"
    if output is PlanFormat.markdown:
        return diffview.render_markdown(result)
    return diffview.render_text(result)


@app.command(rich_help_panel="Job files")
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the job file.")] = Path(
        "fanout.toml"
    ),
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite an existing job file and schema file.")
    ] = False,
) -> None:
    """Write a commented starter job file that validates as is, and fanout.schema.json
    beside it (unless one is there) for editors: the starter's #:schema line names it.

    Commit both.  Exit 2 if the job file exists (without --force).
    """
    from . import starter

    # Refusing to overwrite is a usage error (exit 2, like a bad argument), not a failure.
    if path.is_dir():
        print(f"fanout init: {path} is a directory; name the job file to write", file=sys.stderr)
        raise typer.Exit(ExitCode.JOB_INVALID)
    if path.exists() and not force:
        print(
            f"fanout init: {path} exists; use --force to overwrite it, or name another file",
            file=sys.stderr,
        )
        raise typer.Exit(ExitCode.JOB_INVALID)
    # The folder init runs in is the project's: the starter's workspace (see starter).
    written = starter.write(path, force=force, root=Path.cwd())
    if written.schema_copy is starter.SchemaCopy.STALE:
        print(
            f"kept {written.schema}, which differs from this fanout's schema; "
            f"refresh it with: fanout schema > {written.schema}",
            file=sys.stderr,
        )
    also = f" and {written.schema}" if written.schema_copy is starter.SchemaCopy.WRITTEN else ""
    print(f"wrote {path}{also}; next: fanout validate {path} && fanout plan {path}")


@app.command(rich_help_panel="Job files")
def schema() -> None:
    """Print the job file's JSON Schema (draft-07, for editors and CI)."""
    from ..spec.schema import schema_text

    print(schema_text(), end="")
