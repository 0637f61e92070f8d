"""Running ``inputs.command`` on the coordinator, and saying why it failed.

The command runs with fanout's own environment, as the job's author wrote it, and
unsandboxed: listing issues or changed files commonly needs a token (``GH_TOKEN``) or a
tool's configuration from the environment, and the units' sandboxes are for the units.
Its stderr, which a failure quotes, is redacted of the values of ``task.secrets``: the
message goes to the console and into the journal.  Every failure is located at the
job file's ``inputs.command`` (or ``inputs.timeout``), and an exit status that
``okExitCodes`` refuses comes with the exact TOML line that would accept it.
"""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .errors import InputFailed, Problem
from .redact import Redactor, redact_text
from .spec import Spec
from .templates import RenderError

# How much of a failed command's stderr its message quotes: the first line (where a
# usage error starts) and the last few thousand bytes (where a traceback ends).
_EXCERPT_HEAD = 300
_EXCERPT_TAIL = 4000

# pylint's exit status is a bit mask: 1 fatal, 2 error, 4 warning, 8 refactor,
# 16 convention, 32 usage error.  A run that only found messages exits with an even
# status up to 30; a fatal message or a usage error should still stop the job.
_PYLINT_FINDINGS = tuple(range(0, 31, 2))


@dataclass(frozen=True, slots=True)
class Started:
    """A running input command: its stdout as text, a name for record origins, and the
    check of how it ended (call it once stdout is read)."""

    stdout: IO[str]
    name: str
    check_exit: _Check


@contextlib.contextmanager
def started(
    spec: Spec, environ: Mapping[str, str], context: Mapping[str, Any]
) -> Iterator[Started]:
    """Start ``spec``'s input command; on leaving, a command still running is killed
    with its process group (a ``units.limit`` stops reading early)."""
    secrets = [environ[name] for name in spec.task.secrets if name in environ]
    try:
        argv = [part.render(context) for part in spec.inputs.command]
    except RenderError as exc:
        raise _failed(spec, "command", str(exc)) from None
    shown = redact_text(shlex.join(argv), secrets)
    with tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen(
                argv,
                cwd=spec.runtime.workspace,
                env=dict(environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            message = f"input command did not start ({exc.strerror or exc}): {shown}"
            raise _failed(spec, "command", message) from None
        deadline = _Deadline(process, spec.inputs.timeout)
        try:
            assert process.stdout is not None
            stdout = io.TextIOWrapper(
                process.stdout, encoding="utf-8", errors="replace", newline=""
            )
            check = _Check(spec, process, deadline, stderr, shown, argv, secrets)
            yield Started(stdout=stdout, name=f"output of {argv[0]}", check_exit=check)
        finally:
            deadline.cancel()
            if process.poll() is None:
                _kill_group(process)
                process.wait()


class _Deadline:
    """Kills a process group when ``seconds`` have passed; remembers that it did."""

    def __init__(self, process: subprocess.Popen[bytes], seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._process = process
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def _expire(self) -> None:
        self.expired = True
        _kill_group(self._process)

    def cancel(self) -> None:
        self._timer.cancel()


@dataclass(frozen=True, slots=True)
class _Check:
    spec: Spec
    process: subprocess.Popen[bytes]
    deadline: _Deadline
    stderr: IO[bytes]
    shown: str
    argv: list[str]
    secrets: list[str]

    def __call__(self) -> None:
        """Raise InputFailed unless the command ended with an accepted status."""
        returncode = self.process.wait()
        spec = self.spec
        if self.deadline.expired:
            key = "timeout" if _written(spec, ("inputs", "timeout")) else "command"
            message = f"input command timed out after {self.deadline.seconds:g}s: {self.shown}"
            raise _failed(spec, key, message)
        ok = spec.inputs.ok_exit_codes
        if returncode in ok:
            return
        excerpt = stderr_excerpt(self.stderr, self.secrets)
        detail = f":\n{excerpt}" if excerpt else " (it printed nothing on stderr)"
        if returncode < 0:
            what = f"was killed by {_signal_name(-returncode)}"
            raise _failed(spec, "command", f"input command {what}: {self.shown}{detail}")
        advice = exit_advice(self.argv, returncode, ok)
        message = f"input command exited with status {returncode}: {self.shown}{detail}"
        raise _failed(spec, "command", f"{message}\n{advice}")


def exit_advice(argv: list[str], returncode: int, ok: tuple[int, ...]) -> str:
    """What to do about an exit status that ``okExitCodes`` refuses: the exact TOML
    line that accepts it, in case it means the command worked."""
    refused = f"status {returncode} is not in inputs.okExitCodes {list(ok)}"
    words = {Path(word).name for arg in argv for word in arg.split()}
    if "pylint" in words and 0 < returncode < 64:
        return (
            f"{refused}; pylint's status is a bit mask (1 fatal, 2 error, 4 warning, "
            "8 refactor, 16 convention, 32 usage error), and this line under [inputs] "
            "accepts every run that only found messages:\n"
            f"    okExitCodes = {list(_PYLINT_FINDINGS)}"
        )
    return (
        f"{refused}; if it means the command worked (linters exit non-zero when they "
        "find something), this line under [inputs] accepts it:\n"
        f"    okExitCodes = {sorted({*ok, returncode})}"
    )


def stderr_excerpt(stderr: IO[bytes], secrets: list[str]) -> str:
    """The first line and the tail of ``stderr``, redacted of ``secrets`` as one stream
    (so a secret cut by the excerpt's edge is redacted anyway)."""
    stderr.seek(0)
    redactor = Redactor(secrets)
    head = tail = b""
    total = 0
    while True:
        chunk = stderr.read(1 << 16)
        piece = redactor.feed(chunk) if chunk else redactor.close()
        if b"\n" not in head:
            head = (head + piece)[:_EXCERPT_HEAD]
        # One byte more than is shown: whether the shown part starts a line.
        tail = (tail + piece)[-(_EXCERPT_TAIL + 1) :]
        total += len(piece)
        if not chunk:
            break
    if total > len(tail):
        first, broke, _ = head.partition(b"\n")
        rest = tail[1:] if tail[:1] == b"\n" else tail.partition(b"\n")[2]
        skipped = max(0, total - len(first) - len(broke) - len(rest))
        tail = first + f"\n[... {skipped} bytes ...]\n".encode() + rest
    return tail.decode("utf-8", "replace").rstrip()


def _signal_name(number: int) -> str:
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def _failed(spec: Spec, key: str, message: str) -> InputFailed:
    """An InputFailed located at ``inputs.<key>`` in the job file."""
    line, col = spec.positions.key(("inputs", key))
    problem = Problem(file=str(spec.file), line=line, col=col, key=f"inputs.{key}", message=message)
    return InputFailed(str(problem))


def _written(spec: Spec, path: tuple[str, ...]) -> bool:
    return path in spec.positions.keys


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
