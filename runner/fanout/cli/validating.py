"""``fanout validate``'s work, without typer: check job files, print the problems in
the chosen format, return the exit code.

It is kept apart from the typer command (``cli.jobs.validate``) so that
``fanout validate FILE...``, the command a pre-commit hook or an editor runs on every
save, can be answered by ``fanout/__main__.py`` before typer and the other commands are
imported (a third of its start-up). Both paths call ``check``: one implementation.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ExitCode, JobError, Problem


def check(files: Sequence[Path], output: str = "text") -> int:
    """Check ``files`` and print what is wrong with them as ``output`` (``text``,
    ``json`` or ``github``: ``cli.app.OutputFormat``'s values): 0 if all are valid,
    JobError's code (2) if not."""
    return report(problems_in(files), len(files), output)


def problems_in(files: Sequence[Path]) -> list[Problem]:
    """Every problem of every file in ``files``; nothing printed."""
    from .. import spec

    problems: list[Problem] = []
    for file in files:
        try:
            spec.load(file, require_hosts=False)
        except JobError as exc:
            problems.extend(exc.problems)
    return problems


def report(problems: Sequence[Problem], files: int, output: str = "text") -> int:
    """Print ``problems`` (of ``files`` job files) as ``output``; the exit code."""
    code = int(JobError.exit_code if problems else ExitCode.OK)
    if output == "json":
        print(json.dumps([p.as_dict() for p in problems], indent=2))
        return code
    if output == "github":
        # The runner reads workflow commands from stdout; the summary stays on stderr.
        for problem in problems:
            print(github_annotation(problem))
    else:
        for problem in problems:
            print(problem, file=sys.stderr)
    bad = len({p.file for p in problems})
    if problems:
        print(f"{len(problems)} problem(s) in {bad} of {files} file(s)", file=sys.stderr)
    else:
        print(f"{files} job file(s) valid")
    return code


def github_annotation(problem: Problem) -> str:
    """``problem`` as a GitHub Actions workflow command, which the runner shows as an
    error annotation on that line of the file (in the log and the pull request's diff).

    Escaped as actions/toolkit's ``command.ts`` does: the message may not carry a raw
    ``%``, CR or LF (they end or corrupt the command); property values also not ``:``
    or ``,``, which separate properties.
    """
    where = ",".join(
        f"{name}={_escape_property(value)}"
        for name, value in (
            ("file", problem.file),
            ("line", str(problem.line)),
            ("col", str(problem.col)),
            ("title", "fanout"),
        )
    )
    text = f"{problem.key}: {problem.message}" if problem.key else problem.message
    return f"::error {where}::{_escape_data(text)}"


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")
