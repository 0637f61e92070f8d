"""Events a run emits as it goes: the JSONL event log and the progress display both
read them.  An event is a flat JSON object with ``event`` and ``time`` keys.

A sink is an observer: whatever goes wrong in one (a closed console, a full disk under
the event log, a bug in the display) never reaches the code that emitted the event,
which is dispatch, in the middle of settling a unit.  ``on_failure`` decides what
becomes of a failed sink; by default it is dropped and its error kept in ``failures``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

Sink = Callable[[dict[str, Any]], None]
FailureHook = Callable[[Sink, Exception], None]


class Events:
    """Fans each event out to every sink (event log, progress display, tests)."""

    def __init__(self, *sinks: Sink, on_failure: FailureHook | None = None) -> None:
        self.sinks = list(sinks)
        self.on_failure: FailureHook = on_failure or self.drop
        # (sink, error) for each sink dropped.  A dropped sink stays in ``sinks`` (whoever
        # added it removes it) but is no longer called.
        self.failures: list[tuple[Sink, Exception]] = []

    def add(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def drop(self, sink: Sink, exc: Exception) -> None:
        """The default ``on_failure``: stop calling ``sink``, remember why."""
        self.failures.append((sink, exc))

    def dropped(self, sink: Sink) -> bool:
        return any(failed is sink for failed, _ in self.failures)

    def emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        for sink in list(self.sinks):
            if self.failures and self.dropped(sink):
                continue
            try:
                sink(record)
            except Exception as exc:
                try:
                    self.on_failure(sink, exc)
                except Exception as hook_failed:  # the hook is a sink's keeper, not an exit
                    self.drop(sink, hook_failed)


class EventLog:
    """Appends events to a JSONL file.  Lines are flushed at least every half second
    (the journal, not this log, is what a crash must not lose)."""

    FLUSH_EVERY = 0.5

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._stream: TextIO | None = path.open("a", encoding="utf-8")
        self._flushed = time.monotonic()

    def __call__(self, record: dict[str, Any]) -> None:
        if self._stream is not None:
            try:
                self._stream.write(json.dumps(record, ensure_ascii=False) + "\n")
                now = time.monotonic()
                if now - self._flushed >= self.FLUSH_EVERY:
                    self._stream.flush()
                    self._flushed = now
            except OSError:  # a full disk: the log stops here; the journal decides the run
                self.close()

    def flush(self) -> None:
        """Write out what is buffered (the report reads the log's host states)."""
        if self._stream is not None:
            try:
                self._stream.flush()
            except OSError:
                self.close()

    def close(self) -> None:
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.close()
            self._stream = None
