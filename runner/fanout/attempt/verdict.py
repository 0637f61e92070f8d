"""From what a worker did to an AttemptResult, the same way for every transport: its
output captured (log, tail, redaction, throttle scanning) and the rules that turn exit
codes, throttle signals and the collect step into a status."""

from __future__ import annotations

import asyncio
import tarfile
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING

from .. import agents
from ..agents.taxonomy import Kind, Reading
from ..errors import STORAGE_ERRNOS
from ..outcome import ApiUsage, AttemptResult, CollectedFile, Status
from ..pacing import signals as throttle
from ..values import safetext
from ..values.redact import redact_text
from .capture import OutputCapture
from .collecting import PathRefused

if TYPE_CHECKING:
    from .model import Attempt


def wall_clock() -> datetime:
    """Now on this machine's wall clock, aware: what an agent's words are read against
    ("resets 3:45pm", a quota's next midnight Pacific) and what their reset is waited
    from.  Both read this one clock (before, the one read ``datetime.now`` and the
    other ``time.time``), so a test can set the time of day for both."""
    return datetime.now().astimezone()


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
        reading = await self._reading(code, stage) if signal is None else None
        if reading is not None and reading.kind is not Kind.SUCCESS:
            return self._agent_result(reading, code, stage)
        more: dict[str, object] = {}
        if reading is not None:
            more = {"kind": str(reading.kind), "usage": _reported(self.attempt.agent, reading)}
        if code != 0:
            if signal is not None:
                reason = f"throttled ({signal.source})"
                return self.result(Status.THROTTLED, reason, exit_code=code, **throttled)
            reason = f"{stage} exited with status {code}"
            said = last_line(self.capture.tail)
            return self.result(
                Status.FAILED, f"{reason}: {said}" if said else reason, exit_code=code, **more
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
        return self.result(
            Status.SUCCEEDED, "ok", exit_code=0, collected=collected, **throttled, **more
        )

    async def _reading(self, code: int, stage: str) -> Reading | None:
        """What the agent's output says (None: the task names no agent, or a later step
        than the agent's own failed, which is that step's failure)."""
        agent = self.attempt.agent
        if agent is None or (stage != "worker" and code != 0):
            return None
        # In a thread: the log may be up to logLimit (10 MiB by default), and the
        # coordinator's loop meanwhile paces every other unit and the gateway's requests.
        return await asyncio.to_thread(self._read_log, agent, code)

    def _read_log(self, agent: str, code: int) -> Reading:
        try:
            with self.attempt.log_path.open("rb") as log:
                output = log.read(self.attempt.log_limit).decode(errors="replace")
        except OSError:
            output = self.capture.tail
        else:
            if self.capture.truncated:
                # The CLI's verdict is its last line (claude's stream-json `result`),
                # which a long session pushes past the log's cut: the tail holds it.
                output += "\n" + self.capture.tail
        return agents.read(agent, exit_code=code, output=output, now=wall_clock())

    def _agent_result(self, reading: Reading, code: int, stage: str) -> AttemptResult:
        """The result of an attempt whose agent said it did not succeed, by the one
        taxonomy (see ``agents.taxonomy``): what each class costs the unit."""
        agent = self.attempt.agent
        said = (
            f"{agent}: {reading.kind}: {reading.detail}"
            if reading.detail
            else f"{agent}: {reading.kind}"
        )
        common = {"kind": str(reading.kind), "usage": _reported(agent, reading), "exit_code": code}
        kind = reading.kind
        if kind in (Kind.OVERLOADED, Kind.RATE_LIMITED):
            return self.result(
                Status.THROTTLED,
                said,
                retry_after=reading.retry_after,
                limit_window=reading.window,
                **common,
            )
        if kind in (Kind.USAGE_WINDOW, Kind.DAILY_QUOTA):
            now = wall_clock().timestamp()
            wait = None if reading.reset_at is None else max(0.0, reading.reset_at - now)
            if wait is not None and wait <= self.attempt.longest_pause:
                # Parked: every start waits out the window, and no rung is used.
                return self.result(Status.THROTTLED, said, retry_after=wait, **common)
            when = _when(reading.reset_at)
            halt = f"{said}; `fanout run` continues the run{when}"
            return self.result(
                Status.INTERRUPTED, said, halt=halt, resume_at=reading.reset_at, **common
            )
        if kind is Kind.SPEND_CAP:
            halt = f"{said}; once the account has money again, `fanout run` continues the run"
            return self.result(Status.INTERRUPTED, said, halt=halt, **common)
        # A false success, a turn or budget limit, any other error: the unit's failure.
        return self.result(Status.FAILED, said, **common)

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
            return safetext.shorten(said, _SAID)
    return ""


def _reason(exc: OSError) -> str:
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def _reported(agent: str | None, reading: Reading) -> tuple[ApiUsage, ...]:
    """What the agent said it used, as usage under the agent's name (a gateway's own
    count, where there is one, replaces it: dispatch)."""
    counts = (reading.input_tokens, reading.output_tokens, reading.cost_usd)
    if agent is None or all(count is None for count in counts):
        return ()
    return (
        ApiUsage(
            api=agent,
            requests=0,
            input_tokens=reading.input_tokens or 0,
            output_tokens=reading.output_tokens or 0,
            cache_read_tokens=reading.cache_read_tokens or 0,
            cache_write_tokens=reading.cache_write_tokens or 0,
            cost_usd=reading.cost_usd or 0.0,
        ),
    )


def _when(reset_at: float | None) -> str:
    if reset_at is None:
        return " once the quota is back"
    return f" after {datetime.fromtimestamp(reset_at).astimezone().strftime('%Y-%m-%d %H:%M %Z')}"
