"""A command that publishing runs (git, the pull request's command): a child in a
process group of its own (``backlog.child``), killed at its deadline, its stdin, stdout
and stderr temporary files rather than pipes (a daemon left holding a pipe cannot keep
the run waiting), its output read back whole up to a bound."""

from __future__ import annotations

import asyncio
import tempfile
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
    """Run ``argv`` to its exit.  Raises CommandFailed (and only CancelledError
    otherwise, after killing its group)."""
    with (
        tempfile.TemporaryFile() as given,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        given.write(stdin)
        given.seek(0)
        try:
            proc = await child.start(
                list(argv), cwd=cwd, env=env, stdin=given, stdout=stdout, stderr=stderr
            )
        except OSError as exc:
            raise CommandFailed(f"cannot start {argv[0]}: {exc.strerror or exc}") from None
        try:
            async with asyncio.timeout(deadline_s):
                code = await proc.wait()
        except TimeoutError:
            raise CommandFailed(
                f"{argv[0]} killed after {duration_text(deadline_s)} (publish.timeout)"
            ) from None
        finally:
            proc.kill()  # its whole group, unless it exited by itself
            await proc.reaped()
        return Finished(code=code, stdout=_read(stdout, argv[0]), stderr=_read(stderr, argv[0]))


def _read(stream: IO[bytes], name: str) -> bytes:
    if stream.seek(0, 2) > OUTPUT_BOUND:
        raise CommandFailed(f"{name} wrote more than {OUTPUT_BOUND // 2**20} MiB")
    stream.seek(0)
    return stream.read()
