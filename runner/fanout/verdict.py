"""From what a worker did to an AttemptResult, the same way for every transport: its
output captured (log, tail, redaction, throttle scanning) and the rules that turn exit
codes, throttle signals and the collect step into a status."""

from __future__ import annotations

import tarfile
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from . import throttle
from .capture import OutputCapture
from .collecting import PathRefused
from .errors import STORAGE_ERRNOS
from .outcome import AttemptResult, CollectedFile, Status
from .redact import redact_text

if TYPE_CHECKING:
    from .attempt import Attempt


class Verdict:
    """Watches one attempt's output and decides its result."""

    def __init__(self, attempt: Attempt, *, host: str = "local") -> None:
        self.attempt = attempt
        self.host = host
        self.started = time.monotonic()
        self.scanner = throttle.Scanner(attempt.throttle_patterns)
        self.capture = OutputCapture(
            attempt.log_path,
            log_limit=attempt.log_limit,
            tail_limit=attempt.tail_limit,
            secrets=attempt.redacted,
            on_line=self.scanner.line,
        )

    def result(self, status: Status, reason: str, **more: object) -> AttemptResult:
        """The attempt's result.  Its output is over: the capture is closed first, so the
        tail holds what redaction held back.  A log that could not be written (a full
        disk) does not change what the worker did: the status stands, ``storage_error``
        says why the log is incomplete, and dispatch stops the run on it."""
        self.capture.close()
        lost_log = self.capture.storage_error
        if lost_log is not None and "storage_error" not in more:
            more["storage_error"] = _reason(lost_log)
        return AttemptResult(
            status=status,
            # A reason can quote what the worker made (a collected file's name).
            reason=redact_text(reason, self.attempt.redacted),
            duration=time.monotonic() - self.started,
            output_tail=self.capture.tail,
            host=self.host,
            **more,  # type: ignore[arg-type]
        )

    async def decide(
        self,
        *,
        code: int | None,
        stage: str,
        control: str | None,
        collect: Callable[[], Awaitable[tuple[CollectedFile, ...]]],
    ) -> AttemptResult:
        """The result of a finished attempt: ``code`` of its last ``stage`` (None: it
        timed out), the control file's text, and ``collect`` to run on success."""
        self.capture.close()  # the last line, without its newline, is scanned too
        if code is None:
            return self.result(
                Status.TIMEOUT, f"timed out after {self.attempt.invocation.timeout:g}s"
            )
        signal = throttle.classify(
            code, self.scanner.signal, throttle.from_control(control) if control else None
        )
        throttled = {
            "retry_after": signal.retry_after if signal else None,
            "throttled_limit": signal.limit if signal else None,
        }
        if code != 0:
            if signal is not None:
                reason = f"throttled ({signal.source})"
                return self.result(Status.THROTTLED, reason, exit_code=code, **throttled)
            reason = f"{stage} exited with status {code}"
            said = last_line(self.capture.tail)
            return self.result(
                Status.FAILED, f"{reason}: {said}" if said else reason, exit_code=code
            )
        try:
            collected = await collect()
        except OSError as exc:
            if exc.errno not in STORAGE_ERRNOS:
                return self.result(Status.FAILED, f"collect: {exc}", exit_code=0)
            # The unit did its work; fanout could not keep it.  Not the unit's fault:
            # interrupted, so the next `fanout run` runs the unit again.
            reason = f"collect: fanout could not store the files: {exc}"
            return self.result(Status.INTERRUPTED, reason, exit_code=0, storage_error=_reason(exc))
        except (PathRefused, tarfile.TarError) as exc:
            reason = str(exc) if isinstance(exc, PathRefused) else f"collect: {exc}"
            return self.result(Status.FAILED, reason, exit_code=0)
        return self.result(Status.SUCCEEDED, "ok", exit_code=0, collected=collected, **throttled)

    def close(self) -> None:
        self.capture.close()


# A reason is one line of a terminal, a report row and ``last.reason``: the worker's
# last words, not its whole output (that is in the log and in ``last.outputTail``).
_SAID = 200


def last_line(output: str) -> str:
    """The last non-blank line of a worker's (redacted) output, cut to a reason's size:
    what a failing tool says last is what went wrong (``bwrap: execvp claude: No such
    file or directory``, the guard's ``fanout: cannot start X``, an exception's line)."""
    for line in reversed(output.splitlines()):
        said = line.strip()
        if said:
            return said if len(said) <= _SAID else said[: _SAID - 1] + "…"
    return ""


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]
