"""Running ``inputs.command`` on the coordinator, and saying why it failed.

The command runs with fanout's own environment (less the ``[[apis]]`` keys, which the
caller leaves out: ``apikeys.without_keys``), as the job's author wrote it, and
unsandboxed: listing issues or changed files commonly needs a token (``GH_TOKEN``) or a
tool's configuration from the environment, and the units' sandboxes are for the units.
Its stderr, which a failure quotes, is redacted of the values of ``task.secrets``: the
message goes to the console and into the journal.  Every failure is located at the
job file's ``inputs.command`` (or ``inputs.timeout``), and an exit status that
``okExitCodes`` refuses comes with the exact TOML line that would accept it.

Two ways to start it, one set of rules (``_Command``: the argv, what messages show, the
exit check).  A run uses ``running``: the command is an asyncio subprocess (``child``)
in its own process group, and a cancelled run (Ctrl-C, SIGTERM, a replaced scheduled
run) kills that group at once.  Its stdout is read on the event loop into a bounded
``Feed`` that the selection's parsers, which stay synchronous generators, read in a
worker thread.  Decision: the parsers stay synchronous rather than the whole source
becoming async, because the same parsers read files and ``fanout plan`` selects without
an event loop, and one parser per format is what keeps the formats' rules in one
place; the cost is one thread hop per batch of units, which the selection paid already.
What makes the thread safe to leave: it never blocks on the pipe itself but on the
feed, which the leaving owner abandons (the thread raises at once, whether or not a
process outside the group still holds the pipe), and the owner then waits for it.
``fanout plan`` uses ``started``: a plain process read by the calling thread, where a
Ctrl-C is a KeyboardInterrupt in that thread, which kills the group on its way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shlex
import signal
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..errors import InputFailed, Problem
from ..spec import Spec
from ..spec.templates import RenderError
from ..values.redact import Redactor, redact_text
from . import child
from .feed import Feed

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
    check of how it ended (call it once stdout is read).  Read and checked by one thread
    at a time: the caller's, or the selection's worker thread in a run."""

    stdout: IO[str]
    name: str
    check_exit: Callable[[], None]


@dataclass(frozen=True, slots=True)
class _Command:
    """The command as rendered for this selection, and what its messages may show."""

    spec: Spec
    argv: list[str]
    shown: str
    secrets: list[str]

    def start_failed(self, exc: OSError) -> InputFailed:
        message = f"input command did not start ({exc.strerror or exc}): {self.shown}"
        return _failed(self.spec, "command", message)

    def check(self, returncode: int, timed_out: bool, stderr: IO[bytes]) -> None:
        """Raise InputFailed unless the command ended with an accepted status."""
        spec = self.spec
        if timed_out:
            key = "timeout" if _written(spec, ("inputs", "timeout")) else "command"
            seconds = spec.inputs.timeout
            message = f"input command timed out after {seconds:g}s: {self.shown}"
            raise _failed(spec, key, message)
        ok = spec.inputs.ok_exit_codes
        if returncode in ok:
            return
        excerpt = stderr_excerpt(stderr, self.secrets)
        detail = f":\n{excerpt}" if excerpt else " (it printed nothing on stderr)"
        if returncode < 0:
            what = f"was killed by {_signal_name(-returncode)}"
            raise _failed(spec, "command", f"input command {what}: {self.shown}{detail}")
        advice = exit_advice(self.argv, returncode, ok)
        message = f"input command exited with status {returncode}: {self.shown}{detail}"
        raise _failed(spec, "command", f"{message}\n{advice}")


def _prepare(spec: Spec, environ: Mapping[str, str], context: Mapping[str, Any]) -> _Command:
    secrets = [environ[name] for name in spec.task.secrets if name in environ]
    try:
        argv = [part.render(context) for part in spec.inputs.command]
    except RenderError as exc:
        raise _failed(spec, "command", str(exc)) from None
    return _Command(
        spec=spec, argv=argv, shown=redact_text(shlex.join(argv), secrets), secrets=secrets
    )


def _text(stream: IO[bytes]) -> IO[str]:
    return io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")


@contextlib.contextmanager
def started(
    spec: Spec, environ: Mapping[str, str], context: Mapping[str, Any]
) -> Iterator[Started]:
    """Start ``spec``'s input command for a caller without an event loop (``fanout
    plan``); on leaving, a command still running is killed with its process group (a
    ``units.limit`` stops reading early, a Ctrl-C unwinds the reading thread itself)."""
    command = _prepare(spec, environ, context)
    with tempfile.TemporaryFile() as stderr:
        try:
            process = subprocess.Popen(
                command.argv,
                cwd=spec.runtime.workspace,
                env=dict(environ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            raise command.start_failed(exc) from None
        deadline = _Deadline(process, spec.inputs.timeout)
        try:
            assert process.stdout is not None

            def check_exit() -> None:
                returncode = process.wait()
                command.check(returncode, deadline.expired, stderr)

            yield Started(
                stdout=_text(process.stdout),
                name=f"output of {command.argv[0]}",
                check_exit=check_exit,
            )
        finally:
            deadline.cancel()
            if process.poll() is None:
                _kill_group(process)
                process.wait()


@contextlib.asynccontextmanager
async def running(
    spec: Spec, environ: Mapping[str, str], context: Mapping[str, Any]
) -> AsyncIterator[Started]:
    """Start ``spec``'s input command on the running event loop, for the selection's
    worker thread to read (see the module docstring).  On leaving (the selection ended,
    stopped at ``units.limit``, failed, or the run was cancelled) a command still running
    is killed with its process group at once, and a thread still reading its output or
    waiting for its exit is woken (it raises)."""
    command = _prepare(spec, environ, context)
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryFile() as stderr:
        read_end, write_end = os.pipe()
        try:
            proc = await child.start(
                command.argv,
                cwd=spec.runtime.workspace,
                env=environ,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=stderr,
            )
        except OSError as exc:
            os.close(read_end)
            raise command.start_failed(exc) from None
        finally:
            os.close(write_end)  # the command holds it now: end of file when it is done
        stream = Feed(loop)
        deadline = _CommandTime(loop, spec.inputs.timeout, proc, stream)
        reading = os.fdopen(read_end, "rb", 0)
        pipe: asyncio.BaseTransport | None = None
        try:
            pipe, _ = await loop.connect_read_pipe(stream.protocol, reading)

            def check_exit() -> None:
                returncode = proc.wait_in_thread()
                if returncode is None:
                    raise InputFailed("input command stopped: the run is ending")
                command.check(returncode, deadline.expired, stderr)

            name = f"output of {command.argv[0]}"
            yield Started(
                stdout=_text(io.BufferedReader(stream, 1 << 16)), name=name, check_exit=check_exit
            )
        finally:
            deadline.cancel()
            proc.kill()
            stream.abandon()
            proc.release()
            if pipe is not None:
                pipe.close()
            else:
                reading.close()
            # Prompt: the group was sent SIGKILL (or the command had exited).
            await proc.reaped()


class _CommandTime:
    """A run's input command's timeout, on the event loop: SIGKILL its group once it
    has had ``seconds`` of its own, and remember that it did.  Its own time is not
    what the selection held it back: a backlog bigger than the feed waits on its pipe
    while the units already read are dispatched (for hours, with agents), so that wait
    (``Feed.held``) is added to the deadline; and a command that has exited by itself
    did not time out, however long what it wrote waits to be read."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, proc: child.Child, feed: Feed
    ) -> None:
        self._loop, self._proc, self._feed = loop, proc, feed
        self._credited = 0.0
        self.expired = False
        self._handle = loop.call_later(seconds, self._expire)

    def _expire(self) -> None:
        if self._proc.returncode is not None:
            return
        held = self._feed.held()
        if held > self._credited:
            self._handle = self._loop.call_later(held - self._credited, self._expire)
            self._credited = held
            return
        self.expired = True
        self._proc.kill()

    def cancel(self) -> None:
        self._handle.cancel()


class _Deadline:
    """Kills a process group when ``seconds`` have passed; remembers that it did."""

    def __init__(self, process: subprocess.Popen[bytes], seconds: float) -> None:
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
