"""What the gateway has to say about the requests it refuses and the limits it meets,
one line per kind at most once a ``WINDOW``: a unit can send thousands of bad requests
a second, and each must not cost a line (2,000 malformed requests printed 1.1 MB of
aiohttp tracebacks, 1,800 idle connections 260 MB of asyncio's).

The first of a kind is said at once; the next ones within the window are counted, and
said with the first that comes after it ("... (41 more like it since the last line)"),
or when the gateway closes.  Lines go out as ``notice`` events, which the console and
the run's log show.  ``server_logger`` is the logger aiohttp's server is given instead
of its own: each record it would have printed (with a traceback) becomes a complaint
of its exception's kind.  Nothing of the request itself is repeated (it may carry a
token): only the kind of what was wrong.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..events import Events

WINDOW = 60.0


@dataclass(slots=True)
class _Kind:
    message: str
    said_at: float
    unsaid: int = 0


class Complaints:
    def __init__(self, events: Events, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._events = events
        self._clock = clock
        self._kinds: dict[str, _Kind] = {}

    def say(self, kind: str, message: str) -> None:
        """``message`` (a whole sentence, "fanout gateway: ..."), unless a line of the
        same ``kind`` was said less than ``WINDOW`` seconds ago: then it is counted."""
        now = self._clock()
        known = self._kinds.get(kind)
        if known is not None and now - known.said_at < WINDOW:
            known.unsaid += 1
            return
        more = (
            f" ({known.unsaid} more like it since the last line)" if known and known.unsaid else ""
        )
        self._kinds[kind] = _Kind(message=message, said_at=now)
        self._events.emit("notice", message=message + more)

    def flush(self) -> None:
        """Says what was counted and not yet said (the gateway is closing)."""
        for known in self._kinds.values():
            if known.unsaid:
                self._events.emit(
                    "notice", message=f"{known.message} ({known.unsaid} more like it since)"
                )
                known.unsaid = 0

    def server_logger(self) -> logging.Logger:
        """A logger for aiohttp's server: what it logs becomes complaints (it logs a
        traceback for each malformed request, and for an error in a handler)."""
        logger = logging.Logger("fanout.gateway.server", logging.DEBUG)
        logger.propagate = False
        logger.addHandler(_Handler(self))
        return logger


class _Handler(logging.Handler):
    def __init__(self, complaints: Complaints) -> None:
        super().__init__(logging.DEBUG)
        self._complaints = complaints

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return  # aiohttp's debug chatter: no request refused, nothing gone wrong
        kind = type(error).__name__
        status = getattr(error, "code", None)
        if isinstance(status, int) and 400 <= status < 500:
            message = (
                f"fanout gateway: a worker sent a malformed HTTP request ({kind}),"
                f" answered {status}"
            )
        else:  # the gateway's own bug: said as a line, the run goes on
            message = f"fanout gateway: internal error while serving a request ({kind})"
        self._complaints.say(f"server:{kind}", message)
