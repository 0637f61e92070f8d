"""``fanout`` and ``python -m fanout``: the console script's entry point.

``fanout --version`` is answered here, before the command line interface (typer and
every command module) is imported: it is what a wrapper or a CI log runs to see which
fanout it has, and it should start as fast as the interpreter.
"""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        from . import __version__

        # What the app's eager --version option prints (cli.app._version).
        print(f"fanout {__version__}")
        return
    from .cli import main as run_cli

    run_cli()


if __name__ == "__main__":
    main()
