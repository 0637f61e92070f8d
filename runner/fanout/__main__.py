"""``fanout`` and ``python -m fanout``: the console script's entry point.

Two commands are answered here, before the command line interface (typer and every
command module, a third of ``validate``'s start-up) is imported:

- ``fanout --version``: what a wrapper or a CI log runs to see which fanout it has; it
  should start as fast as the interpreter.
- ``fanout validate FILE...`` with no option: what a pre-commit hook or an editor runs
  on every save.  It calls the two halves of ``cli.validating.check``, which the typer
  command calls.  Anything else (an option, ``--help``, ``-`` for stdin) goes to the full CLI,
  and so does an unexpected error while checking (before anything is printed): the CLI
  checks again, and its one outermost handler reports the error.
"""

from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args == ["--version"]:
        from . import __version__

        # What the app's eager --version option prints (cli.app._version).
        print(f"fanout {__version__}")
        return
    if len(args) > 1 and args[0] == "validate" and not any(a.startswith("-") for a in args):
        _validate(args[1:])
    from .cli import main as run_cli

    run_cli()


def _validate(files: list[str]) -> None:
    """Exit with ``fanout validate FILES``'s code, or return to let the CLI do it."""
    from pathlib import Path

    from .cli import validating
    from .cli.console import closed_console
    from .errors import ExitCode

    paths = [Path(file) for file in files]
    try:
        problems = validating.problems_in(paths)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)  # what the CLI's handler says (cli.app)
        sys.exit(ExitCode.INTERRUPTED)
    except Exception:  # nothing printed yet: the CLI checks again, its handler reports
        return
    try:
        code = validating.report(problems, len(paths))
    except BrokenPipeError:  # `fanout validate x | head`: as the CLI's handler does
        if not closed_console():
            raise
        code = ExitCode.CONSOLE_CLOSED
    sys.exit(code)


if __name__ == "__main__":
    main()
