"""Helpers shared by the tests: writing job files and calling the CLI in-process."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path

from typer.testing import CliRunner

from fanout.cli import app

MINIMAL = """\
version = 1
name = "test-job"
[inputs]
items = ["a", "b"]
[task]
command = ["true"]
"""


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def cli(*args: str) -> Ran:
    """Run ``fanout ARGS`` in this process (the cwd is the test's)."""
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def write_job(directory: Path, text: str, name: str = "job.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path
