"""The gateway's connections: how many it holds, and for how long one may sit idle.

A connection comes before its request, and so before any token says whose it is, so
the first bound is global: the gateway holds at most ``cap`` connections at once
(``connection_cap``: a quarter of the coordinator's soft ``RLIMIT_NOFILE``, at most
1024).  Each request it sends upstream holds one more file, so the gateway's files stay
under half the limit, and the run keeps the rest.  (asyncio's own server accepted until
``accept`` failed with EMFILE, then logged a traceback each time it tried again: 1,800
idle connections from one unit gave 260 MB of stderr and a run without files.)

At the cap, a new connection closes the one that has been idle longest (no request
being handled on it), so however many connections a unit opens and leaves idle, the
next request still gets in; only when every connection is busy with a request does the
gateway stop accepting, and further connections wait in the kernel's backlog, holding
none of the coordinator's files, until one is free.

The second bound is time: a connection on which no request is being handled (before
its first request, between two, or while its headers trickle in) is closed after
``idle_timeout`` seconds.  That is the header read timeout (a slowloris connection is
closed whatever it sends) and the keep-alive timeout at once; it is longer than the
idle timeouts of agents' HTTP clients (undici 4 s, httpx 5 s, aiohttp 15 s), so a
client closes its idle connection before the gateway does and never races it.

Once a request's token names its attempt, the attempt's own bounds apply
(``admission``).  ``Connection.on_close`` is how they learn that a connection went.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import resource
import socket
from collections.abc import Callable, Iterator

from .complaints import Complaints

IDLE_TIMEOUT = 20.0
MAX_CONNECTIONS = 1024
# After ``accept`` failed for want of files (the run holds them), try again this late.
ACCEPT_RETRY = 1.0
_OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# The listening socket itself is unusable (closed under the loop): a bug, not a peer.
_BROKEN = frozenset({errno.EBADF, errno.EINVAL, errno.ENOTSOCK, errno.EOPNOTSUPP})


def connection_cap(soft_limit: int | None = None) -> int:
    """How many connections the gateway holds at once: a quarter of the soft limit on
    open files (``soft_limit``, else the process's own), at least 16, at most
    ``MAX_CONNECTIONS``.  Each connection may hold one upstream connection as well."""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft_limit // 4))


class Connection(asyncio.Protocol):
    """One accepted connection: aiohttp's protocol inside, the idle timer around it."""

    def __init__(self, inner: asyncio.Protocol, owner: Connections) -> None:
        self._inner = inner
        self._owner = owner
        self._transport: asyncio.Transport | None = None
        self._handling = 0
        self._timer: asyncio.TimerHandle | None = None
        self.counted = False  # one of the ``cap`` open connections
        # Called once when the connection is gone (an attempt's count of connections).
        self.on_close: list[Callable[[], None]] = []
        # Whose the connection is counted as (``admission``), once a request said so.
        self.attempt: object | None = None

    # -- asyncio.Protocol: everything goes on to aiohttp's protocol ---------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._owner._opened(self)
        self._inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self._inner.connection_lost(exc)
        finally:
            transport, self._transport = self._transport, None
            if transport is not None:
                self._owner._closed(self, transport)
            callbacks, self.on_close = self.on_close, []
            for callback in callbacks:
                callback()

    # -- the idle timer --------------------------------------------------------------

    @contextlib.contextmanager
    def handling(self) -> Iterator[None]:
        """While a request on this connection is being handled it is not idle."""
        self._handling += 1
        self._owner._busy(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            yield
        finally:
            self._handling -= 1
            if self._handling == 0 and self._transport is not None:
                self._owner._idle_again(self)
                self._arm()

    def close(self) -> None:
        """Closes the connection once what was written to it is sent."""
        if self._transport is not None:
            self._transport.close()

    def evict(self) -> None:
        """Closes the idle connection now, for a new one."""
        if self._transport is not None:
            self._transport.abort()

    def _arm(self) -> None:
        if self._transport is not None and self._handling == 0:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self._owner.idle_timeout, self._expire)

    def _expire(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is None or self._handling:
            return
        # Idle with nothing left to send: a plain close.  With bytes its peer does not
        # read, a close would wait for ever for them to leave: abort.
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()


class Connections:
    """Accepts on the gateway's sockets, ``cap`` connections at most, all of them."""

    def __init__(
        self, *, complaints: Complaints, cap: int | None = None, idle_timeout: float = IDLE_TIMEOUT
    ) -> None:
        self.cap = connection_cap() if cap is None else cap
        self.idle_timeout = idle_timeout
        self._complaints = complaints
        # Accepted and not yet gone (some may not be set up yet).
        self._held = 0
        self._open: dict[asyncio.Transport, Connection] = {}
        # The connections no request is being handled on, the one idle longest first.
        self._idle: dict[Connection, None] = {}
        self._changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._open)

    def of(self, transport: asyncio.BaseTransport | None) -> Connection | None:
        """The connection a request came on (None once it is gone)."""
        return self._open.get(transport) if isinstance(transport, asyncio.Transport) else None

    async def serve(
        self, listener: socket.socket, protocol: Callable[[], asyncio.Protocol]
    ) -> None:
        """Accepts on ``listener`` (non-blocking, listening) until cancelled, each
        connection served by a fresh ``protocol()``.  At the cap, a new connection
        makes the one idle longest close (a slowloris one, most likely; a worker's
        kept-alive one opens again when it needs to): the cap is kept, and a request
        gets through however many connections a unit opens.  With every connection
        busy with a request, accepting waits for one to end or go idle."""
        loop = asyncio.get_running_loop()
        while True:
            while self._held >= self.cap and not self._idle:
                self._complaints.say(
                    "connections-busy",
                    f"fanout gateway: {self.cap} connections are busy with requests, the"
                    " most it holds (a quarter of the open-files limit); further ones wait"
                    " to be accepted",
                )
                self._changed.clear()
                await self._changed.wait()
            try:
                conn, _ = await loop.sock_accept(listener)
            except OSError as exc:
                if exc.errno in _BROKEN:
                    raise
                if exc.errno not in _OUT_OF_FILES:
                    continue  # that connection went before it was accepted
                self._complaints.say(
                    "accept",
                    f"fanout gateway: cannot accept a connection ({exc.strerror}); the run"
                    " holds too many files, trying again each second",
                )
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            self._held += 1
            if self._held > self.cap and self._idle:
                self._complaints.say(
                    "connections",
                    f"fanout gateway: {self.cap} connections are open, the most it holds"
                    " (a quarter of the open-files limit): each new one closes the one"
                    " idle longest",
                )
                next(iter(self._idle)).evict()
            await self._set_up(conn, protocol)

    async def _set_up(self, conn: socket.socket, protocol: Callable[[], asyncio.Protocol]) -> None:
        made: list[Connection] = []

        def connection() -> Connection:
            made.append(Connection(protocol(), self))
            return made[-1]

        try:
            await asyncio.get_running_loop().connect_accepted_socket(connection, sock=conn)
        except BaseException as exc:
            # Gone before it was set up, or the gateway is closing meanwhile.
            if made and made[0].counted:
                made[0].close()
            else:
                conn.close()
                self._gone()
            if not isinstance(exc, OSError):
                raise

    def _opened(self, connection: Connection) -> None:
        assert connection._transport is not None
        self._open[connection._transport] = connection
        self._idle[connection] = None
        connection.counted = True

    def _busy(self, connection: Connection) -> None:
        self._idle.pop(connection, None)

    def _idle_again(self, connection: Connection) -> None:
        if connection._transport in self._open:
            self._idle[connection] = None
            self._changed.set()

    def _closed(self, connection: Connection, transport: asyncio.Transport) -> None:
        self._idle.pop(connection, None)
        if self._open.pop(transport, None) is not None:
            self._gone()

    def _gone(self) -> None:
        self._held -= 1
        self._changed.set()
