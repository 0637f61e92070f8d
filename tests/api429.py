"""A small HTTP API on loopback with a real rate limit: N requests per fixed window,
answering 429 with Retry-After beyond that, and logging every request it sees."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Api:
    limit: int
    window: float
    exhausted_first_window: bool = False
    log: list[tuple[float, int]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _counts: dict[int, int] = field(default_factory=dict)

    def hit(self) -> tuple[int, int]:
        """(status, Retry-After seconds) for a request arriving now."""
        with self._lock:
            now = time.monotonic() - self.started
            window = int(now // self.window)
            used = self._counts.get(
                window, self.limit if window == 0 and self.exhausted_first_window else 0
            )
            if used >= self.limit:
                self.log.append((now, 429))
                return 429, max(1, math.ceil((window + 1) * self.window - now))
            self._counts[window] = used + 1
            self.log.append((now, 200))
            return 200, 0


def serve(api: Api) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, retry_after = api.hit()
            self.send_response(status)
            if retry_after:
                self.send_header("Retry-After", str(retry_after))
            self.end_headers()
            self.wfile.write(b"slow down\n" if status == 429 else b"ok\n")

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"
