"""What every command shares: the typer app, common arguments and options, and
``call``, which turns a FanoutError into its message and exit code."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from typer import _click
from typer.core import TyperArgument, TyperCommand
from typer.models import CommandFunctionType

from .. import __version__
from ..errors import FanoutError


class Command(TyperCommand):
    """A command whose usage line names its arguments the way man pages do:
    ``fanout run [OPTIONS] FILE``, ``fanout validate [OPTIONS] FILE...``,
    ``fanout status [OPTIONS] [RUN]``.  typer 0.28 writes a required argument as
    ``{file}``, which reads like braces to type, in lowercase like a literal word."""

    # typer 0.28 vendors click as typer._click; its Context is what typer passes here.
    def collect_usage_pieces(self, ctx: _click.Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if not isinstance(param, TyperArgument):
                continue  # options add nothing beyond [OPTIONS]
            name = (param.metavar or param.name or "").strip("[]").upper()
            if param.nargs != 1 and not name.endswith("..."):
                name += "..."
            pieces.append(name if param.required else f"[{name}]")
        return pieces


class Typer(typer.Typer):
    """typer.Typer whose commands are ``Command``s (every command module uses this)."""

    def command(
        self, *args: Any, cls: type[TyperCommand] | None = None, **kwargs: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(*args, cls=cls or Command, **kwargs)


app = Typer(
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
    # Plain help text: paragraphs re-flow to the terminal width, brackets stay brackets.
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)

T = TypeVar("T")

JobFile = Annotated[
    Path,
    typer.Argument(
        metavar="FILE",
        help="The job file (TOML).",
        exists=False,
        dir_okay=False,
        show_default=False,
    ),
]


class OutputFormat(StrEnum):
    text = "text"
    json = "json"
    github = "github"


class OverlapPolicy(StrEnum):
    SKIP = "skip"
    QUEUE = "queue"
    REPLACE = "replace"


def call(action: Callable[[], T]) -> T:
    """Run one library call; a FanoutError becomes its message on stderr and its exit code."""
    try:
        return action()
    except FanoutError as exc:
        print(str(exc) if str(exc) else type(exc).__name__, file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise typer.Exit(130) from None


def environ() -> dict[str, str]:
    """The coordinator's environment for input commands and local workers.  The
    directory of the Python running fanout goes first on PATH, so tools installed
    beside fanout (in its virtualenv) are found without activating it."""
    values = dict(os.environ)
    tools = os.path.dirname(sys.executable)
    values["PATH"] = os.pathsep.join([tools, values.get("PATH", os.defpath)])
    return values


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


HostsOption = Annotated[
    Path | None,
    typer.Option(
        "--hosts", help="A hosts file replacing runtime.hosts (inventories per environment)."
    ),
]


StateDir = Annotated[
    Path,
    typer.Option("--state-dir", help="fanout's state directory (runtime.stateDir of the job)."),
]
