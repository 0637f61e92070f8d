"""Worker output: streamed to a size-capped log file, with a bounded tail kept in memory.

The coordinator never holds a whole log.  Lines are redacted of secret values before
they reach the log, the tail or any scanner, and each line is offered to the throttle
scanner as it passes, so a ``Retry-After`` early in a long output is still seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

_LONGEST_LINE = 64 * 1024
REDACTED = b"[secret]"


class OutputCapture:
    def __init__(
        self,
        log_path: Path,
        *,
        log_limit: int,
        tail_limit: int,
        secrets: Iterable[str] = (),
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        self.log_path = log_path
        self.log_limit = log_limit
        self.tail_limit = tail_limit
        self.secrets = sorted({s.encode() for s in secrets if s}, key=len, reverse=True)
        self.on_line = on_line
        self.logged = 0
        self.total = 0
        self._tail = bytearray()
        self._partial = bytearray()
        self._log: BinaryIO | None = None
        self._truncated = False
        # Set when the log could not be written (a full disk under the state dir): the
        # attempt goes on and the tail is kept; the log stops there.  Never the unit's fault.
        self.storage_error: OSError | None = None

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        self._partial += data
        while True:
            newline = self._partial.find(b"\n")
            if newline < 0:
                if len(self._partial) > _LONGEST_LINE:
                    self._emit(bytes(self._partial))
                    self._partial.clear()
                return
            self._emit(bytes(self._partial[: newline + 1]))
            del self._partial[: newline + 1]

    def close(self) -> None:
        if self._partial:
            self._emit(bytes(self._partial))
            self._partial.clear()
        if self._log is not None:
            try:
                self._log.close()
            except OSError as exc:  # the last buffered bytes did not fit
                self.storage_error = self.storage_error or exc
            self._log = None

    def flush(self) -> None:
        """Push the log to disk now, so a full disk shows in ``storage_error``."""
        if self._log is not None and self.storage_error is None:
            try:
                self._log.flush()
            except OSError as exc:
                self.storage_error = exc

    @property
    def tail(self) -> str:
        return self._tail.decode("utf-8", "replace")

    def _emit(self, line: bytes) -> None:
        for secret in self.secrets:
            line = line.replace(secret, REDACTED)
        self._tail += line
        if len(self._tail) > self.tail_limit:
            del self._tail[: len(self._tail) - self.tail_limit]
        self._write(line)
        if self.on_line is not None:
            self.on_line(line.decode("utf-8", "replace"))

    def _write(self, line: bytes) -> None:
        if self._truncated or self.storage_error is not None:
            return
        try:
            self._write_log(line)
        except OSError as exc:
            self.storage_error = exc

    def _write_log(self, line: bytes) -> None:
        if self._log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_path.open("wb")
        room = self.log_limit - self.logged
        if len(line) > room:
            self._log.write(line[:room])
            self._log.write(b"\n[fanout: log truncated at %d bytes]\n" % self.log_limit)
            self._truncated = True
            self.logged = self.log_limit
            return
        self._log.write(line)
        self.logged += len(line)
