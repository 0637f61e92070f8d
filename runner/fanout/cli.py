"""The ``fanout`` command: parse arguments, make one library call, map the result to an
exit code.  Only this module reads the environment, prints and exits; heavy modules
are imported inside the commands that need them so ``fanout validate`` starts fast.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from . import __version__
from .errors import FanoutError, JobError

app = typer.Typer(
    name="fanout",
    help=(
        "Run a backlog of independent units on short-lived, sandboxed workers.\n\n"
        "A TOML job file declares where the backlog comes from, how it splits into units, "
        "what each worker runs, how fast (rate limits), how persistently (a retry ladder) "
        "and when (cron triggers).  Start with 'fanout init', check with 'fanout validate' "
        "and 'fanout plan', then 'fanout run'."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

T = TypeVar("T")

JobFile = Annotated[
    Path,
    typer.Argument(help="The job file (TOML).", exists=False, dir_okay=False, show_default=False),
]


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


def _call(action: Callable[[], T]) -> T:
    """Run one library call; a FanoutError becomes its message on stderr and its exit code."""
    try:
        return action()
    except FanoutError as exc:
        print(str(exc) if str(exc) else type(exc).__name__, file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise typer.Exit(130) from None


def _environ() -> dict[str, str]:
    """The coordinator's environment for input commands and local workers.  The
    directory of the Python running fanout goes first on PATH, so tools installed
    beside fanout (in its virtualenv) are found without activating it."""
    environ = dict(os.environ)
    tools = os.path.dirname(sys.executable)
    environ["PATH"] = os.pathsep.join([tools, environ.get("PATH", os.defpath)])
    return environ


def _version(value: bool) -> None:
    if value:
        print(f"fanout {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Run a backlog of independent units on short-lived, sandboxed workers."""


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Job files to check.", show_default=False)],
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format", help="text: file:line:col lines; json: an array for CI annotations."
        ),
    ] = OutputFormat.text,
) -> None:
    """Check job files against the schema and fanout's rules; exit 0 if all are valid, 2 if not.

    Every problem is reported at once as FILE:LINE:COL: key.path: what is wrong.
    Input commands are not run (see 'fanout plan' for that).
    """
    from . import spec

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


@app.command()
def plan(
    file: JobFile,
    hosts: Annotated[
        Path | None, typer.Option("--hosts", help="A hosts file replacing runtime.hosts.")
    ] = None,
) -> None:
    """Show what 'fanout run' would do: the units selected now, the first unit's rendered
    prompt and command, concurrency, the pace the tightest rate limit allows, the next
    cron fires and the resolved job with defaults filled in.  Runs the input command;
    runs no worker.  Exit 3 if nothing is selected.
    """
    from . import plan as planning
    from . import spec
    from .errors import NothingSelected

    def make() -> str:
        job = spec.load(file, hosts_file=hosts)
        result = planning.make(job, environ=_environ(), now=datetime.now(UTC))
        text = planning.render_text(result)
        if result.units == 0:
            print(text)
            raise NothingSelected(f"nothing selected: the inputs of {file} yield no units")
        return text

    print(_call(make), end="")


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the job file.")] = Path(
        "fanout.toml"
    ),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter job file that validates as is."""
    from . import starter

    if path.exists() and not force:
        print(f"{path} exists; use --force to overwrite it", file=sys.stderr)
        raise typer.Exit(1)
    path.write_text(starter.text(), encoding="utf-8")
    print(f"wrote {path}; next: fanout validate {path} && fanout plan {path}")


@app.command()
def schema() -> None:
    """Print the job file's JSON Schema (draft-07, for editors and CI)."""
    from .schema import schema_text

    print(schema_text(), end="")


def main() -> None:
    app()
