"""The API gateway in the coordinator: every request a worker makes to a job's
``[[apis]]`` passes here, on 127.0.0.1 only (SSH hosts reach it through a remote
forward).  It paces requests fleet-wide per API (``limiter``), swaps each attempt's
token for the real key (``tokens``; the key never leaves this process), absorbs
429/529 answers, streams answers through while reading their usage (``styles``), and
keeps the accounts and the budget (``usage``).  The HTTP side is ``proxy``.  Each API's
limiter learns its ceiling from the upstream's throttles (``learned`` keeps it for the
next run), and shares the limit with the other jobs that call the API with the same key
(``shares``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from aiohttp import web

from ..errors import FanoutError, SpendStopped
from ..events import Events
from ..outcome import ApiUsage
from ..pacing.ceiling import Learned, describe
from ..spec.model import Api
from .books import Write
from .complaints import Complaints
from .connections import IDLE_TIMEOUT, Connections
from .proxy import Proxy
from .shares import Membership, Shares

# aiohttp's default is 256 KiB (3.14; 64 KiB before): a quarter as much per connection.
BODY_BUFFER = 64 * 1024


class Gateway:
    """One gateway for all of a job's APIs, at ``url``/<api name>/."""

    def __init__(
        self,
        apis: Sequence[Api],
        keys: Mapping[str, str],
        *,
        events: Events,
        stop: Callable[[FanoutError], None],
        rng: random.Random | None = None,
        socket_dir: Path | None = None,
        host: str = "127.0.0.1",
        idle_timeout: float = IDLE_TIMEOUT,
        learned: Mapping[str, Learned] | None = None,
        shares_dir: Path | None = None,
    ) -> None:
        # Bound now, so the port is known before any transport (an SSH forward, a
        # worker's environment) is built; nothing is served until ``start``.  ``host``:
        # loopback, but for Ray nodes on other machines (runtime.ray.gatewayHost), where
        # the per-attempt tokens are what protects it.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._host = host
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._socket.bind((host, 0))
            self._socket.listen(128)
            self._socket.setblocking(False)
            self._port: int = self._socket.getsockname()[1]
        except OSError:
            self._socket.close()
            raise
        # ``socket_dir``: also serve on a unix socket there, for sandboxes with a network
        # of their own (runtime.network = "apis"), which have it bound in.  It lies in a
        # fresh directory of mode 0700, so only this user can connect, whatever the
        # umask; ``socket_path`` is known from now on, like the port.
        self._unix: socket.socket | None = None
        self._unix_dir: Path | None = None
        if socket_dir is not None:
            try:
                self._unix_dir = Path(tempfile.mkdtemp(prefix="fanout-gateway-", dir=socket_dir))
                self._unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self._unix.bind(str(self._unix_dir / "gateway.sock"))
                self._unix.listen(128)
                self._unix.setblocking(False)
            except OSError:
                self._close_sockets()
                raise
        self._stop = stop
        self._stopped: SpendStopped | None = None
        self._keys = tuple(dict.fromkeys(key for key in keys.values() if key))
        self._complaints = Complaints(events)
        self._connections = Connections(complaints=self._complaints, idle_timeout=idle_timeout)
        self._proxy = Proxy(
            apis,
            keys,
            events=events,
            stop=self._spent,
            rng=rng or random.Random(),
            connections=self._connections,
            complaints=self._complaints,
            learned=learned,
        )
        self._runner: web.AppRunner | None = None
        self._accepting: list[asyncio.Task[None]] = []
        # ``shares_dir``: the per-user pacing ledger (``shares``), None to pace alone.
        self._shares: Shares | None = None
        self._sharing: asyncio.Task[None] | None = None
        if shares_dir is not None:

            def warn(message: str) -> None:
                self._complaints.say("shares", message)

            self._shares = Shares(
                Membership(
                    shares_dir,
                    upstream=route.api.upstream,
                    key=route.key,
                    limiter=route.limiter,
                    warn=warn,
                )
                for route in self._proxy.routes.values()
                if route.key
            )

    @property
    def port(self) -> int:
        return self._port

    @property
    def keys(self) -> tuple[str, ...]:
        """The real keys it sends upstream: what every output redacts (``Round.keys``)."""
        return self._keys

    @property
    def socket_path(self) -> Path | None:
        """The unix socket the gateway also serves on, None without ``socket_dir``."""
        return None if self._unix_dir is None else self._unix_dir / "gateway.sock"

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}"

    @property
    def stopped(self) -> SpendStopped | None:
        """Why the gateway stopped the run's spending (the first reason), if it did."""
        return self._stopped

    def _spent(self, error: SpendStopped) -> None:
        if self._stopped is None:
            self._stopped = error
            self._stop(error)

    async def start(self) -> None:
        self._proxy.open_session()
        # No access log: a query string may carry a token (?key=).  A worker that
        # disconnects cancels its request, also while it waits in the queue.  What
        # aiohttp's server would log (a traceback per malformed request) becomes one
        # line per kind (``complaints``).  No site: ``connections`` accepts, so that
        # it can stop accepting at its cap.
        runner = web.AppRunner(
            self._proxy.app(),
            access_log=None,
            handle_signals=False,
            handler_cancellation=True,
            shutdown_timeout=1.0,
            logger=self._complaints.server_logger(),
            # What aiohttp buffers of a body not read yet (twice this, at most): the
            # bodies waiting for their attempt's turn (``admission``).
            read_bufsize=BODY_BUFFER,
        )
        await runner.setup()
        server = runner.server
        assert server is not None
        self._runner = runner
        for listener in (self._socket, self._unix):
            if listener is not None:
                serving = self._connections.serve(listener, server)
                self._accepting.append(asyncio.create_task(serving))
        if self._shares is not None and self._shares.memberships:
            self._shares.beat()  # a member before its first request
            self._sharing = asyncio.create_task(self._shares.run())

    async def close(self) -> None:
        """Stops serving (requests still running are cancelled, and counted) and closes
        the upstream connections; what is left of the books is written.  Safe to call
        twice, or without ``start``."""
        try:
            sharing, self._sharing = self._sharing, None
            if sharing is not None:
                sharing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sharing
            if self._shares is not None:
                self._shares.leave()
            accepting, self._accepting = self._accepting, []
            for task in accepting:
                task.cancel()
            for task in accepting:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._runner is not None:
                runner, self._runner = self._runner, None
                await runner.cleanup()
        finally:
            try:
                await self._proxy.close_session()
                self._close_sockets()
            finally:
                self._proxy.accounts.books.close()
                self._complaints.flush()

    def _close_sockets(self) -> None:
        self._socket.close()
        if self._unix is not None:
            self._unix.close()
        if self._unix_dir is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._unix_dir / "gateway.sock")
            with contextlib.suppress(OSError):
                self._unix_dir.rmdir()

    def restore(self, spent: Mapping[str, float]) -> None:
        """USD already spent this run per API (a resumed run): counted toward each
        budget, which may stop the run at once."""
        self._proxy.accounts.restore(spent)

    def grant(
        self,
        *,
        unit: str,
        attempt: int,
        deadline: float,
        budget_usd: float | None = None,
        spent_usd: float = 0.0,
        round: int = 1,
    ) -> str:
        """A fresh token for attempt ``attempt`` of ``unit`` in round ``round``, valid
        for every API until ``revoke``; ``deadline`` (loop time) is when the gateway
        stops retrying 429s for it.  With ``budget_usd`` (the unit's ``task.budget``,
        ``spent_usd`` of it already gone) its requests get a 400 once the unit's
        spending reaches the budget."""
        return self._proxy.grants.grant(
            unit=unit,
            attempt=attempt,
            deadline=deadline,
            budget_usd=budget_usd,
            spent_usd=spent_usd,
            round=round,
        )

    def revoke(self, token: str) -> tuple[ApiUsage, ...]:
        """From now the token gets 401; what it used, one entry per API it called (its
        requests still in flight at their reservation), in the journal's books when
        this returns (see ``keep_books``; a failed write raises its StateError)."""
        grant = self._proxy.grants.holder(token)
        usage = self._proxy.grants.revoke(token)
        if grant is not None:
            self._proxy.accounts.books.now(grant.ledger)
        return usage

    def keep_books(self, write: Write) -> None:
        """Write each attempt's usage to ``write`` (the journal, for the run) as its
        requests start and end, not only when it ends (``books``): a coordinator killed
        mid-attempt loses none of what its requests spent.  A write that fails stops
        the run."""
        self._proxy.accounts.books.keep(write, failed=self._stop)

    def learned(self) -> dict[str, tuple[Learned, str]]:
        """What each API's limiter learned of its ceiling (from this run's throttles, or
        kept from an earlier run's), to keep for the next run, and how to say it
        (``2.0 per 10s learned from 3 throttles (declared 8 per 10s)``)."""
        found = {}
        for name, route in self._proxy.routes.items():
            known = route.limiter.ceiling.known()
            if known is not None:
                found[name] = (known, describe(known, declared=route.limiter.declared))
        return found

    def totals(self) -> tuple[ApiUsage, ...]:
        """The run's usage so far (since this process started), every API in job order."""
        return self._proxy.accounts.ledger.all()
