"""``fanout view --serve``: the page on 127.0.0.1, its data read afresh for each
``/data.json`` so the page follows a run in progress.  The server sends the page's
policy as a header too, with ``connect-src 'self'``: the page may fetch its data and
nothing else.  It answers only a request that names it by its loopback address (the
``Host`` header), so a web page cannot read a run by DNS rebinding."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import page

Load = Callable[[], dict[str, Any]]
CONNECT = "'self'"


class Server(ThreadingHTTPServer):
    """Serves ``load()`` (a fresh ``data.build``) as the page and as ``/data.json``."""

    daemon_threads = True

    def __init__(self, load: Load, port: int = 0) -> None:
        self.load = load
        # One build at a time: each opens the journal read-only and reads the run.
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"

    def fresh(self) -> dict[str, Any]:
        with self.lock:
            return self.load()


class _Handler(BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        if self.headers.get("Host", "") not in {f"127.0.0.1:{port}", f"localhost:{port}"}:
            # DNS rebinding: a page on another site that points its own name at
            # 127.0.0.1 would otherwise read the run's logs and prompts.
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST)
            return
        path = self.path.split("?", 1)[0]
        if path == "/":
            body = page.render(self.server.fresh(), connect=CONNECT).encode("utf-8")
            kind = "text/html; charset=utf-8"
        elif path == "/data.json":
            body = json.dumps(self.server.fresh(), ensure_ascii=False).encode("utf-8")
            kind = "application/json"
        else:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", page.policy(connect=CONNECT))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a request line per poll would bury the console."""
