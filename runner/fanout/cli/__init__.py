"""The ``fanout`` command: parse arguments, make one library call, map the result to an
exit code.  Only this package reads the environment, prints and exits; heavy modules
are imported inside the commands that need them so ``fanout validate`` starts fast.

The typer app and its commands are imported when ``application()`` or ``main()`` is
called, not with the package: ``fanout/__main__.py`` answers ``--version`` and a plain
``validate`` (through ``cli.validating``) without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .app import Typer

__all__ = ["application", "main"]


def application() -> Typer:
    """The typer app with every command registered."""
    # Importing a command module registers its commands; the order here is --help's.
    from . import jobs, runs, viewing, recurring, scheduling, hosts  # noqa: F401  isort: skip
    from .app import app

    return app


def main() -> None:
    application()()
