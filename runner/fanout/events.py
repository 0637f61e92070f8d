"""Events a run emits as it goes: the JSONL event log and the progress display both
read them.  An event is a flat JSON object with ``event`` and ``time`` keys."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

Sink = Callable[[dict[str, Any]], None]


class Events:
    """Fans each event out to every sink (event log, progress display, tests)."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = list(sinks)

    def add(self, sink: Sink) -> None:
        self.sinks.append(sink)

    def emit(self, event: str, **fields: Any) -> None:
        record = {"event": event, "time": round(time.time(), 3), **fields}
        for sink in self.sinks:
            sink(record)


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
