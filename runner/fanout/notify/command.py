"""Running ``notify.command``: the message as JSON on its stdin, in a process group of
its own (``backlog.child``) that is killed at the deadline, its output kept, redacted,
in ``notify.out`` beside the run's report.

It runs as ``backlog.child.ran`` runs a command: temporary files, not pipes, for its
streams, so a command that never reads its stdin, or a daemon it left holding a pipe,
cannot keep the run waiting past the deadline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from ..backlog import child
from ..values.quantities import duration_text
from ..values.redact import redact_bytes
from ..values.safetext import one_line

# What of each stream is kept in notify.out (its end: where a program says why it failed),
# and what of it is read to be redacted first: more than is kept, so that a secret cut
# at the start of what was read lies outside what is kept.
KEPT_BYTES = 64 * 1024
READ_BYTES = 1024 * 1024
# The output's last line, in the one line that says why the command failed.
SAID_CHARS = 200


async def run(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdin: bytes,
    deadline_s: float,
    out: Path,
    redacted: Sequence[str],
) -> str | None:
    """Run ``argv`` with ``stdin``; None if it exited 0 within ``deadline_s`` seconds,
    else why not, in one line.  Raises only CancelledError, after killing its group."""
    try:
        async with child.ran(argv, cwd=cwd, env=env, stdin=stdin, deadline_s=deadline_s) as done:
            failure = ""
            if done.code is None:
                failure = f"killed after {duration_text(deadline_s)} (notify.timeout)"
            elif done.code != 0:
                failure = (
                    f"exited {done.code}" if done.code > 0 else f"killed by signal {-done.code}"
                )
            output = _kept([done.stdout, done.stderr], redacted)
    except OSError as exc:
        return f"cannot start {argv[0]}: {exc.strerror or exc}"
    unwritten = _write(out, output)
    if failure:
        last = output.decode("utf-8", "replace").strip().splitlines()
        said = f": {one_line(last[-1], SAID_CHARS)}" if last else ""
        return f"{failure}{said}"
    return unwritten or None


def _kept(streams: list[IO[bytes]], redacted: Sequence[str]) -> bytes:
    """The end of the command's stdout, then of its stderr, redacted (whole, then cut:
    a secret is never cut in two before it is matched)."""
    kept = []
    for stream in streams:
        size = stream.seek(0, 2)
        stream.seek(max(0, size - READ_BYTES))
        kept.append(redact_bytes(stream.read(), redacted)[-KEPT_BYTES:])
    return b"".join(kept)


def _write(out: Path, output: bytes) -> str:
    try:
        out.write_bytes(output)
    except OSError as exc:
        return f"cannot write {out}: {exc.strerror or exc}"
    return ""
