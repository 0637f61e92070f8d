"""Commands about job files: validate, plan, init, schema."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from ..errors import JobError
from .app import JobFile, OutputFormat, app, call, environ


@app.command(rich_help_panel="Job files")
def validate(
    files: Annotated[list[Path], typer.Argument(help="Job files to check.", show_default=False)],
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format", help="text: file:line:col lines; json: an array for CI annotations."
        ),
    ] = OutputFormat.text,
) -> None:
    """Check job files against the schema and fanout's rules.

    Exit 0 if all are valid, 2 if not.

    Every problem is reported at once as FILE:LINE:COL: key.path: what is wrong.
    Input commands are not run (see 'fanout plan' for that).
    """
    from .. import spec

    problems = []
    for file in files:
        try:
            spec.load(file, require_hosts=False)
        except JobError as exc:
            problems.extend(exc.problems)
    if output is OutputFormat.json:
        print(json.dumps([p.as_dict() for p in problems], indent=2))
    else:
        for problem in problems:
            print(problem, file=sys.stderr)
        bad = len({p.file for p in problems})
        if problems:
            print(f"{len(problems)} problem(s) in {bad} of {len(files)} file(s)", file=sys.stderr)
        else:
            print(f"{len(files)} job file(s) valid")
    raise typer.Exit(JobError.exit_code if problems else 0)


@app.command(rich_help_panel="Job files")
def plan(
    file: JobFile,
    hosts: Annotated[
        Path | None, typer.Option("--hosts", help="A hosts file replacing runtime.hosts.")
    ] = None,
) -> None:
    """Show what 'fanout run' would do, without running any worker.

    The units selected now, the first unit's rendered prompt and command, concurrency,
    the pace the tightest rate limit allows, the next cron fires and the resolved job
    with defaults filled in.  Runs the input command.  Exit 3 if nothing is selected,
    2 if the first unit's task does not render (the plan is still shown).
    """
    from .. import plan as planning
    from .. import spec
    from ..errors import NothingSelected

    def make() -> str:
        job = spec.load(file, hosts_file=hosts)
        result = planning.make(job, environ=environ(), now=datetime.now(UTC))
        text = planning.render_text(result)
        if result.units == 0:
            print(text)
            raise NothingSelected(f"nothing selected: the inputs of {file} yield no units")
        if result.first_task_problem is not None:
            # A template that fails for the first unit will fail for the others: plan is
            # the check before a run, so it fails too, after showing the plan.
            print(text, end="")
            raise JobError([result.first_task_problem])
        return text

    print(call(make), end="")


@app.command(rich_help_panel="Job files")
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the job file.")] = Path(
        "fanout.toml"
    ),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter job file that validates as is."""
    from .. import starter

    if path.exists() and not force:
        print(f"{path} exists; use --force to overwrite it", file=sys.stderr)
        raise typer.Exit(1)
    path.write_text(starter.text(), encoding="utf-8")
    print(f"wrote {path}; next: fanout validate {path} && fanout plan {path}")


@app.command(rich_help_panel="Job files")
def schema() -> None:
    """Print the job file's JSON Schema (draft-07, for editors and CI)."""
    from ..schema import schema_text

    print(schema_text(), end="")
