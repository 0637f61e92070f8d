"""A command that publishing runs (git, the pull request's command): run as
``backlog.child.ran`` runs one (a process group of its own, killed at its deadline,
temporary files for its streams), its output read back whole up to a bound."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..backlog import child
from ..values.quantities import duration_text
from ..values.safetext import one_line

# What of a command's output is read back: git status over a large tree is a few MB,
# and a pull request command says a line or two.  More is refused, not cut (a listing
# cut short would hide changed files).
OUTPUT_BOUND = 64 * 1024 * 1024
# A failure's reason, in the one line publish.failed shows.
SAID_CHARS = 300


class CommandFailed(Exception):
    """A command that could not start, ran past its deadline or said too much: one line."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Finished:
    code: int
    stdout: bytes
    stderr: bytes

    def said(self) -> str:
        """The last line the command wrote (stderr first: where a program says why)."""
        for stream in (self.stderr, self.stdout):
            lines = stream.decode("utf-8", "replace").strip().splitlines()
            if lines:
                return one_line(lines[-1], SAID_CHARS)
        return ""


async def run(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    deadline_s: float,
    stdin: bytes = b"",
) -> Finished:
    """Run ``argv`` to its exit (``backlog.child.ran``).  Raises CommandFailed (and only
    CancelledError otherwise, after killing its group)."""
    try:
        async with child.ran(argv, cwd=cwd, env=env, stdin=stdin, deadline_s=deadline_s) as done:
            if done.code is None:
                raise CommandFailed(
                    f"{argv[0]} killed after {duration_text(deadline_s)} (publish.timeout)"
                )
            return Finished(
                code=done.code,
                stdout=_read(done.stdout, argv[0]),
                stderr=_read(done.stderr, argv[0]),
            )
    except OSError as exc:
        raise CommandFailed(f"cannot start {argv[0]}: {exc.strerror or exc}") from None


def _read(stream: IO[bytes], name: str) -> bytes:
    if stream.seek(0, 2) > OUTPUT_BOUND:
        raise CommandFailed(f"{name} wrote more than {OUTPUT_BOUND // 2**20} MiB")
    stream.seek(0)
    return stream.read()
