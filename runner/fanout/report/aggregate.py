"""The aggregate command: run on the coordinator once a run has ended, with the run's
results as JSONL on its stdin, its output redacted into ``aggregate.out``.

Its environment is a worker's, not the coordinator's: ``PATH``, ``HOME`` (tools that
post the report keep their login there), ``LANG``, ``FANOUT_RUN_ID``, ``FANOUT_REPORT``
(this run's report.md) and the values of ``task.secrets`` (a team may need a token to
post the report); never the real keys of ``[[apis]]``, which its output is redacted of
all the same, as are gateway tokens.  A failure here (a template, the command, the
disk, its timeout, an interrupt) is an ``aggregate.failed`` event: the units have
settled and the journal and the report are written, so it changes nothing of the run.

It is an asyncio subprocess (``child``) in its own process group: a Ctrl-C during it
kills the group at once, and the output it wrote so far is kept.  Its stdin, stdout and
stderr are temporary files, not pipes, so neither a command that never reads its
stdin nor a daemon it left holding a pipe can keep the run waiting.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..backlog import child
from ..backlog.units import base_context
from ..events import Events
from ..spec import Spec
from ..spec.templates import RenderError
from ..values.redact import redact_bytes


async def run(
    spec: Spec,
    *,
    run_id: str,
    run_dir: Path,
    results: Iterable[str],
    trigger: Mapping[str, Any] | None,
    secrets: Mapping[str, str],
    environ: Mapping[str, str],
    events: Events,
    keys: Sequence[str] = (),
) -> None:
    """Run ``spec``'s aggregate command over ``results`` (JSONL lines, each ending in a
    newline).  Raises only CancelledError, after the command's group is killed."""
    assert spec.aggregate is not None
    try:
        argv = [part.render(base_context(spec, trigger)) for part in spec.aggregate.command]
    except RenderError as exc:
        events.emit("aggregate.failed", reason=f"template: {exc}")
        return
    env = {
        "PATH": environ.get("PATH", os.defpath),
        "HOME": environ.get("HOME", "/nonexistent"),
        "LANG": "C.UTF-8",
        "FANOUT_RUN_ID": run_id,
        "FANOUT_REPORT": str(run_dir / "report.md"),
        **secrets,
    }
    out = run_dir / "aggregate.out"
    with (
        tempfile.TemporaryFile() as stdin,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        for line in results:
            # A lone surrogate in a unit's values must not cost the whole aggregate.
            stdin.write(line.encode("utf-8", "replace"))
        stdin.seek(0)
        try:
            proc = await child.start(
                argv,
                cwd=spec.runtime.workspace,
                env=env,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
            )
        except OSError as exc:
            reason = f"cannot start {argv[0]}: {exc.strerror or exc}"
            events.emit("aggregate.failed", reason=reason)
            return
        failure, code = "", None
        try:
            async with asyncio.timeout(spec.aggregate.timeout):
                code = await proc.wait()
        except TimeoutError:
            failure = f"timed out after {spec.aggregate.timeout:g}s"
        except asyncio.CancelledError:
            failure = "interrupted"
            raise
        finally:
            proc.kill()  # its whole group, unless it exited by itself
            await proc.reaped()  # prompt: SIGKILL
            # Kept on the way out too: what a timed-out or interrupted one printed.
            unwritten = _keep_output(out, [stdout, stderr], [*secrets.values(), *keys])
            failure = failure or unwritten
            if failure:
                events.emit("aggregate.failed", reason=failure, output=str(out))
            else:
                events.emit("aggregate.finished", exit=code, output=str(out))


def _keep_output(out: Path, streams: list[IO[bytes]], redacted: Sequence[str]) -> str:
    """Write the command's stdout, then its stderr, redacted, to ``out``; what failed."""
    output = []
    for stream in streams:
        stream.seek(0)
        output.append(redact_bytes(stream.read(), redacted))
    try:
        out.write_bytes(b"".join(output))
    except OSError as exc:
        return f"cannot write {out}: {exc.strerror or exc}"
    return ""
