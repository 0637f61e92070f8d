"""Worker output: streamed to a size-capped log file, with a bounded tail kept in memory.

The coordinator never holds a whole log.  The byte stream is redacted of secret values
(``redact``: across line and chunk boundaries, multi-line values included) before it
reaches the log, the tail or any scanner, and each redacted line is offered to the
throttle scanner as it passes, so a ``Retry-After`` early in a long output is still seen.

A log that cannot be written (a full disk, say) never fails the attempt: the log stops
there, the tail and the scanner go on, and the first error is kept in ``storage_error``
for the caller to act on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from ..values.redact import Redactor

# A line longer than this goes to the scanner in pieces of this size.
_LONGEST_LINE = 64 * 1024


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
        self.on_line = on_line
        self.logged = 0
        self.total = 0
        # The first error writing the log; from then on the log is left as it is.
        self.storage_error: OSError | None = None
        self._redactor = Redactor(secrets)
        self._tail = bytearray()
        self._partial = bytearray()
        self._log: BinaryIO | None = None
        self._truncated = False
        self._closed = False

    def feed(self, data: bytes) -> None:
        # Output after close (a reader cancelled too late) would reopen and truncate the
        # log: the attempt's output is over once its capture is closed.
        if self._closed or not data:
            return
        self.total += len(data)
        self._pass_on(self._redactor.feed(data))

    def close(self) -> None:
        """Flush what was held back and close the log; later calls do nothing."""
        if self._closed:
            return
        self._closed = True
        self._pass_on(self._redactor.close())
        if self._partial:
            self._scan(bytes(self._partial))
            self._partial.clear()
        if self._log is not None:
            log, self._log = self._log, None
            try:
                log.close()
            except OSError as exc:  # the buffered end of the log did not fit
                self._failed(exc)

    @property
    def truncated(self) -> bool:
        """The log was cut at ``log_limit``: its end is only in the tail."""
        return self._truncated

    @property
    def tail(self) -> str:
        return self._tail.decode("utf-8", "replace")

    def _pass_on(self, data: bytes) -> None:
        """Redacted bytes to the tail, the log and (line by line) the scanner."""
        if not data:
            return
        if len(data) >= self.tail_limit:
            self._tail[:] = data[len(data) - self.tail_limit :]
        else:
            self._tail += data
            if len(self._tail) > self.tail_limit:
                del self._tail[: len(self._tail) - self.tail_limit]
        self._write(data)
        if self.on_line is None:
            return
        self._partial += data
        start = 0
        while (newline := self._partial.find(b"\n", start)) >= 0:
            self._scan(bytes(self._partial[start : newline + 1]))
            start = newline + 1
        del self._partial[:start]
        if len(self._partial) > _LONGEST_LINE:
            self._scan(bytes(self._partial))
            self._partial.clear()

    def _scan(self, line: bytes) -> None:
        if self.on_line is not None:
            self.on_line(line.decode("utf-8", "replace"))

    def _write(self, data: bytes) -> None:
        if self._truncated or self.storage_error is not None:
            return
        try:
            if self._log is None:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                self._log = self.log_path.open("wb")
            room = self.log_limit - self.logged
            if len(data) > room:
                self._log.write(data[:room])
                self._log.write(b"\n[fanout: log truncated at %d bytes]\n" % self.log_limit)
                self._truncated = True
                self.logged = self.log_limit
                return
            self._log.write(data)
            self.logged += len(data)
        except OSError as exc:
            self._failed(exc)

    def _failed(self, error: OSError) -> None:
        if self.storage_error is None:
            self.storage_error = error
        if self._log is not None:
            log, self._log = self._log, None
            # The same disk refusing the same buffered bytes again.
            with contextlib.suppress(OSError):
                log.close()
