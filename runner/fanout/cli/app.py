"""What every command shares: the typer app, common arguments and options, and the one
outermost handler around every command, which turns a FanoutError into its message and
exit code, Ctrl-C into exit 130 and anything unexpected into one line, a log file and
exit 70."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup
from typer.models import CommandFunctionType

from .. import __version__
from ..errors import INTERNAL_ERROR_EXIT, ExitCode, FanoutError, NothingSelected
from ..values.safetext import one_line
from .console import closed_console

if TYPE_CHECKING:
    from ..spec import Spec

# Exits, --help and usage errors: typer prints and exits with them as it always has.
_TYPER_EXITS = (typer.Exit, typer.Abort, typer.TyperException)

# An internal error's message, on the one line that says it (its whole text is in the log).
_SUMMARY_LIMIT = 300

# The traceback log is rotated (one old copy kept) beyond this size.
LOG_LIMIT_BYTES = 1 << 20


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for inner in group.exceptions:
        if isinstance(inner, BaseExceptionGroup):
            yield from _leaves(inner)
        else:
            yield inner


def unwrap(exc: BaseException) -> BaseException:
    """The one exception a user is told about: a TaskGroup's ExceptionGroup holding one
    FanoutError is that error, any other group is its first exception."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    leaves = list(_leaves(exc))
    ours = [leaf for leaf in leaves if isinstance(leaf, FanoutError)]
    if len(ours) == 1:
        return ours[0]
    return leaves[0] if leaves else exc


def log_path() -> Path:
    """Where tracebacks go: ``$XDG_CACHE_HOME/fanout/fanout.log`` (XDG base directories:
    a cache is what may be deleted any time), else ``~/.cache/fanout/fanout.log``."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    return base / "fanout" / "fanout.log"


def report_internal_error(exc: BaseException) -> int:
    """Tell the user, in one line on stderr, that fanout itself failed, append the
    traceback (with the version and argv) to the log, and return exit code 70.

    If the log cannot be written the traceback goes to stderr instead: at 3 a.m. a
    traceback on the console is better than none anywhere."""
    said = one_line(str(exc), _SUMMARY_LIMIT, ellipsis="...")
    summary = f"fanout: internal error: {type(exc).__name__}: {said}"
    details = "".join(traceback.format_exception(exc))
    entry = (
        f"--- {time.strftime('%Y-%m-%dT%H:%M:%S%z')} fanout {__version__} pid {os.getpid()}\n"
        f"argv: {sys.argv!r}\n{details}\n"
    )
    path = log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size > LOG_LIMIT_BYTES:
            path.replace(path.with_name(path.name + ".1"))
        with path.open("a", encoding="utf-8", errors="backslashreplace") as log:
            log.write(entry)
    except OSError as problem:
        print(f"{summary}; the log {path} is not writable ({problem.strerror})", file=sys.stderr)
        print(details, file=sys.stderr, end="")
    else:
        print(f"{summary}; details in {path}", file=sys.stderr)
    return INTERNAL_ERROR_EXIT


def _exit_for(exc: BaseException) -> typer.Exit:
    """The exit for an exception escaping a command: a FanoutError's message and code,
    anything else reported as an internal error."""
    exc = unwrap(exc)
    if isinstance(exc, BrokenPipeError) and closed_console():
        # `fanout status | head`: the reader has what it wanted.  Say nothing more (there
        # is nobody to say it to) and exit as a tool killed by SIGPIPE reports.  (`fanout
        # run` stops its run instead: 130.)
        return typer.Exit(ExitCode.CONSOLE_CLOSED)
    if isinstance(exc, FanoutError):
        _say(str(exc) if str(exc) else type(exc).__name__)
        return typer.Exit(exc.exit_code)
    if isinstance(exc, KeyboardInterrupt):
        _say("interrupted")
        return typer.Exit(ExitCode.INTERRUPTED)
    return typer.Exit(report_internal_error(exc))


def _say(message: str) -> None:
    """The last word on stderr, which may be a closed pipe itself (`2>&1 | head`)."""
    try:
        print(message, file=sys.stderr)
    except OSError:
        closed_console()


# typer passes click's Context to the methods below; typer 0.28 vendors click privately
# (typer._click) and exports only its own subclass, typer.Context, which an override may
# not narrow the parameter to: so the parameter is Any.


class _Commands(TyperGroup):
    """The command group, with the one outermost handler around every command: a
    FanoutError (or a group holding one) becomes its message on stderr and its exit
    code, Ctrl-C exit 130, anything else an internal error."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except _TYPER_EXITS:
            raise  # typer's own usage errors, --help and exits keep working as they do
        except (Exception, KeyboardInterrupt) as exc:
            raise _exit_for(exc) from None
        except BaseExceptionGroup as group:
            raise _exit_for(group) from None


class Command(TyperCommand):
    """A command whose usage line names its arguments the way man pages do:
    ``fanout run [OPTIONS] FILE``, ``fanout validate [OPTIONS] FILE...``,
    ``fanout status [OPTIONS] [RUN]``.  typer 0.28 writes a required argument as
    ``{file}``, which reads like braces to type, in lowercase like a literal word."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
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
    cls=_Commands,
    # Plain help text: paragraphs re-flow to the terminal width, brackets stay brackets.
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)

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


# spec.model.Overlap's words, spelled here because the CLI may not import the spec at
# start-up (a quarter of a second); tests/test_schema.py holds both to the schema.
class OverlapPolicy(StrEnum):
    SKIP = "skip"
    QUEUE = "queue"
    REPLACE = "replace"


def nothing_selected(file: Path, unmatched: Sequence[str]) -> NothingSelected:
    """The error of a selection of nothing (plan's and run's): the job, and each
    inputs.files pattern that matched no file, the likely reason."""
    why = f" ({'; '.join(unmatched)})" if unmatched else ""
    return NothingSelected(f"nothing selected: the inputs of {file} yield no units{why}")


def environ() -> dict[str, str]:
    """The coordinator's environment for input commands and local workers.  The
    directory of the Python running fanout goes first on PATH, so tools installed
    beside fanout (in its virtualenv) are found without activating it."""
    values = dict(os.environ)
    tools = os.path.dirname(sys.executable)
    values["PATH"] = os.pathsep.join([tools, values.get("PATH", os.defpath)])
    return values


# prctl(2): PR_SET_DUMPABLE, PR_GET_DUMPABLE.
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def sealed_environ(jobs: Iterable[Spec]) -> dict[str, str]:
    """The coordinator's environment (``environ``) for runs of ``jobs``, after which the
    keys and secrets leave this process's own: the variables their [[apis]]
    ``keySecret``, ``task.secrets`` and ``[notify]`` (the webhook's URL, the command's
    secrets) name are unset, and the returned mapping is the only place they live (the
    gateway, the workers and the notifier get them from it, each fire of ``fanout
    schedule`` too), so no process fanout starts inherits them.

    unsetenv leaves the environment block the kernel shows in /proc/PID/environ as it
    was at exec, and the mapping is in memory (/proc/PID/mem): so the process is made
    non-dumpable, which makes both readable by root alone, not by a worker of the same
    user (and writes no core dump).  Its children are dumpable again after their exec;
    fanout reads only their /proc entries and its own, which it still may."""
    from ..spec.apikeys import secret_names

    values = environ()
    for name in {name for job in jobs for name in secret_names(job)}:
        os.environ.pop(name, None)
    problem = set_dumpable(False)
    if problem is not None:
        _say(
            f"fanout: cannot make this process non-dumpable ({problem}): a worker running"
            " as this user could read the keys and secrets in its /proc entries"
        )
    return values


def set_dumpable(dumpable: bool) -> str | None:
    """PR_SET_DUMPABLE on Linux (a no-op elsewhere): why it failed, or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, int(dumpable), 0, 0, 0) != 0:
        return os.strerror(ctypes.get_errno())
    return None


def dumpable() -> bool:
    """Whether this process is dumpable (True off Linux, where nothing was changed)."""
    if not sys.platform.startswith("linux"):
        return True
    import ctypes

    return bool(ctypes.CDLL(None).prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))


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
