"""POSTing a message to a webhook: the standard library's ``urllib.request`` in a thread
of its own, waited for on the event loop until a deadline.

Decided here, once:

- One try.  A run's end is rare and a webhook that is down now is likely down in a
  second too; the failure is said in the run's log instead.
- https is verified against the system's certificate authorities (``ssl``'s default
  context); http is allowed (a relay on your own network).
- No proxy: ``HTTPS_PROXY`` and the like are not read (the gateway does not read them
  either), so the message goes to the URL's host or nowhere.  Behind a proxy, use a
  ``command`` (``curl --proxy ...``).
- No redirect is followed: a 3xx is a failure.  A redirect would send the message
  somewhere the job file never named.
- A 2xx answer is success; anything else fails with its status and the first line of
  its body (Slack says ``invalid_token`` or ``no_service`` there).
- The deadline bounds the whole exchange.  The thread's socket operations are bounded
  by it too, and at the deadline its sockets are shut down, which wakes a thread
  blocked reading; name resolution alone cannot be woken, so the thread is a daemon
  that never holds up the process's exit, and nothing waits for it after the deadline.

No message here holds the URL: the caller names the webhook (a variable's name, or a
host), since a webhook's URL is often its credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import socket
import ssl
import threading
import urllib.error
import urllib.request
from typing import Any

from .. import __version__
from ..values.quantities import duration_text

# What of an error answer's body is read, for the one line that says why.
DETAIL_BYTES = 512
DETAIL_CHARS = 120


async def post(url: str, body: bytes, *, deadline_s: float) -> str | None:
    """POST ``body`` (JSON) to ``url``; None once a 2xx answer came within
    ``deadline_s`` seconds, else why not (one line, without the URL).  Raises only
    CancelledError."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str | None] = loop.create_future()
    connections = _Connections()

    def work() -> None:
        try:
            outcome = _exchange(url, body, deadline_s, connections)
        except Exception as exc:  # the thread's last word: said, never raised
            outcome = _why(exc, deadline_s)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, answer, outcome)

    threading.Thread(target=work, name="fanout-notify-webhook", daemon=True).start()
    try:
        async with asyncio.timeout(deadline_s):
            return await answer
    except TimeoutError:
        return _no_answer(deadline_s)
    finally:
        connections.abort()


def _settle(answer: asyncio.Future[str | None], outcome: str | None) -> None:
    if not answer.done():
        answer.set_result(outcome)


def _no_answer(timeout: float) -> str:
    return f"no answer within {duration_text(timeout)} (notify.timeout)"


def _exchange(url: str, body: bytes, timeout: float, connections: _Connections) -> str | None:
    request = urllib.request.Request(  # noqa: S310 (the schema and checks allow http(s) only)
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json; charset=utf-8",
            "User-Agent": f"fanout/{__version__}",
        },
    )
    opener = _opener(connections, https=request.type == "https")
    with opener.open(request, timeout=timeout) as response:
        response.read(DETAIL_BYTES)
        return None


def _why(exc: BaseException, timeout: float) -> str:
    """One line saying why the exchange failed."""
    if isinstance(exc, urllib.error.HTTPError):
        detail = ""
        with contextlib.suppress(Exception):
            text = exc.read(DETAIL_BYTES).decode("utf-8", "replace").strip()
            detail = text.splitlines()[0][:DETAIL_CHARS] if text else ""
        redirect = ", a redirect, which is not followed" if 300 <= exc.code < 400 else ""
        said = f": {detail}" if detail else ""
        return f"answered {exc.code} ({exc.reason}{redirect}){said}"
    reason: Any = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return _no_answer(timeout)
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"its certificate was refused: {reason.verify_message}"
    if isinstance(reason, OSError) and reason.strerror:
        return f"cannot connect: {reason.strerror}"
    if isinstance(reason, http.client.HTTPException | OSError):
        return f"the exchange failed: {type(reason).__name__}: {reason}"
    return f"fanout internal error: {type(exc).__name__}"


class _Connections:
    """The connections a request opened, so the waiting side can shut them down at
    its deadline (a thread blocked on a socket has no other way out)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[http.client.HTTPConnection] = []
        self._aborted = False

    def track(self, connection: http.client.HTTPConnection) -> http.client.HTTPConnection:
        """``connection``, to be shut down at the deadline; past it, no connection."""
        with self._lock:
            if self._aborted:
                raise TimeoutError("the deadline passed before the connection was made")
            self._open.append(connection)
        return connection

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            opened = list(self._open)
        for connection in opened:
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _HTTP(urllib.request.HTTPHandler):
    def __init__(self, connections: _Connections) -> None:
        super().__init__()
        self.connections = connections

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        def connect(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            return self.connections.track(http.client.HTTPConnection(host, **kwargs))

        return self.do_open(connect, req)


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, connections: _Connections, context: ssl.SSLContext) -> None:
        super().__init__(context=context)
        self.connections = connections
        self.verified = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        def connect(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            return self.connections.track(http.client.HTTPSConnection(host, **kwargs))

        return self.do_open(connect, req, context=self.verified)


def _opener(connections: _Connections, *, https: bool) -> urllib.request.OpenerDirector:
    """An opener with only what a webhook needs: http, or https verified, and errors as
    HTTPError; no proxy, redirect, cookie, ftp, file or data handler.  The TLS context
    is made for https alone: loading the system's authorities takes about 20 ms."""
    opener = urllib.request.OpenerDirector()
    scheme: urllib.request.BaseHandler = (
        _HTTPS(connections, ssl.create_default_context()) if https else _HTTP(connections)
    )
    for handler in (
        scheme,
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        urllib.request.UnknownHandler(),
    ):
        opener.add_handler(handler)
    return opener
