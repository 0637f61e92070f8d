"""The ``fanout`` command: parse arguments, make one library call, map the result to an
exit code.  Only this package reads the environment, prints and exits; heavy modules
are imported inside the commands that need them so ``fanout validate`` starts fast.
"""

from __future__ import annotations

# Importing a command module registers its commands; the order here is --help's.
from . import jobs, runs, viewing, recurring, scheduling, hosts  # noqa: F401  isort: skip
from .app import app

__all__ = ["app", "main"]


def main() -> None:
    app()
