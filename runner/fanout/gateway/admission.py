"""What one attempt may hold in the gateway at once, and how a request's body is read.

Once a request's token names its attempt (``tokens``), these bounds are the attempt's
own, so one unit cannot take what the others need:

- ``ATTEMPT_CONNECTIONS`` open connections that carried its token (a connection counts
  for the attempt of its first request); the request that would open one more gets a
  429 and its connection is closed.  Agents open a few (Claude Code's parallel
  subagents, a handful each), and retry a 429.
- ``ATTEMPT_IN_FLIGHT`` requests handled at once, and ``ATTEMPT_BODIES`` bytes of their
  bodies held (a body alone may be as large as its style allows, ``styles.MAX_BODY``).
  The others wait their turn, first come first served, their bodies not yet read: an
  unread body stays in the kernel's buffers and aiohttp's (128 KiB at most), not in
  the coordinator's memory.  A body counts at its declared length (at the style's cap
  when its length is not declared) from its turn until its answer begins; the answer
  may stream for minutes, and needs the body no longer.

A body is read in pieces under the style's cap: a declared length over it is refused at
once with 413, unread; an undeclared one as soon as it passes the cap.  A body whose
worker sends nothing for ``idle_timeout`` seconds is refused with 408.  A gateway that
read each body whole first, up to 64 MiB, would let eight bodies of 60 MB from one unit
take the coordinator from 54 MB to 1.07 GB (measured).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from .connections import Connection
from .styles import MIB
from .tokens import Grant

ATTEMPT_CONNECTIONS = 32
ATTEMPT_IN_FLIGHT = 16
ATTEMPT_BODIES = 64 * MIB


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the gateway answers itself: status, error kind (``styles.error_body``),
    message, and when to try again (seconds; None: not worth trying again)."""

    status: int
    kind: str
    message: str
    retry_after: int | None = None


@dataclass(slots=True)
class _Attempt:
    grant: Grant  # held, so that its id is not reused while the entry lives
    connections: int = 0
    in_flight: int = 0
    held: int = 0
    waiting: deque[tuple[int, asyncio.Future[None]]] = field(default_factory=deque)

    def idle(self) -> bool:
        return not (self.connections or self.in_flight or self.waiting)


class Turn:
    """One request's turn: its place among the attempt's requests in flight, and its
    ``body``, counted for ``size`` bytes until ``drop_body``."""

    def __init__(self, attempts: Attempts, state: _Attempt, size: int) -> None:
        self._attempts = attempts
        self._state = state
        self.size = size
        self.body = b""

    def drop_body(self) -> None:
        """The body is needed no longer (the answer has begun): its bytes are free."""
        self.body = b""
        if self.size:
            size, self.size = self.size, 0
            self._attempts._freed(self._state, size=size, request=False)


class Attempts:
    """The bounds above, for every attempt that has a request or connection here."""

    def __init__(self) -> None:
        # By the grant's identity: two grants are two attempts, whatever their fields.
        self._by_grant: dict[int, _Attempt] = {}

    @contextlib.asynccontextmanager
    async def admit(
        self,
        request: web.BaseRequest,
        grant: Grant,
        connection: Connection | None,
        *,
        cap: int,
        idle_timeout: float,
        what: str,
    ) -> AsyncIterator[Turn | Refusal]:
        """The request's turn, its body read (``Turn.body``), held until the block
        ends; or why it is refused: one connection over the attempt's cap (429), a body
        over ``cap`` (413) or one that stalls (408).  ``what`` names the API."""
        if not self.claim(grant, connection):
            yield Refusal(
                429,
                "busy",
                f"fanout gateway: {grant.unit} (attempt {grant.attempt}) has"
                f" {ATTEMPT_CONNECTIONS} connections open, the most one attempt may:"
                " close some, or wait",
                retry_after=1,
            )
            return
        size = body_size(request, cap)
        if size is None:
            yield too_large(cap, what)
            return
        async with self.turn(grant, size) as turn:
            body = await read_body(request, cap=cap, idle_timeout=idle_timeout, what=what)
            if isinstance(body, Refusal):
                yield body
                return
            turn.body = body
            yield turn

    def claim(self, grant: Grant, connection: Connection | None) -> bool:
        """Counts ``connection`` for the grant's attempt, if it is not counted yet (for
        this attempt or another); False when the attempt has ``ATTEMPT_CONNECTIONS``
        open already."""
        if connection is None or connection.attempt is not None:
            return True
        state = self._state(grant)
        if state.connections >= ATTEMPT_CONNECTIONS:
            self._forget_if_idle(state)
            return False
        state.connections += 1
        connection.attempt = grant

        def closed() -> None:
            state.connections -= 1
            self._forget_if_idle(state)

        connection.on_close.append(closed)
        return True

    @contextlib.asynccontextmanager
    async def turn(self, grant: Grant, size: int) -> AsyncIterator[Turn]:
        """Waits until the attempt has room for one more request holding ``size``
        bytes of body, then holds that room until the block ends."""
        state = self._state(grant)
        if state.waiting or not _fits(state, size):
            waiter = asyncio.get_running_loop().create_future()
            entry = (size, waiter)
            state.waiting.append(entry)
            try:
                await waiter
            except BaseException:
                if entry in state.waiting:
                    state.waiting.remove(entry)
                    self._wake(state)  # it may have been the one the others waited behind
                elif waiter.done() and not waiter.cancelled():
                    # Admitted as it was cancelled: the room goes to the next one.
                    self._freed(state, size=size, request=True)
                else:
                    self._wake(state)
                self._forget_if_idle(state)
                raise
        else:
            state.in_flight += 1
            state.held += size
        turn = Turn(self, state, size)
        try:
            yield turn
        finally:
            self._freed(state, size=turn.size, request=True)

    def _state(self, grant: Grant) -> _Attempt:
        state = self._by_grant.get(id(grant))
        if state is None:
            state = self._by_grant[id(grant)] = _Attempt(grant)
        return state

    def _freed(self, state: _Attempt, *, size: int, request: bool) -> None:
        state.held -= size
        if request:
            state.in_flight -= 1
        self._wake(state)
        self._forget_if_idle(state)

    def _wake(self, state: _Attempt) -> None:
        while state.waiting and _fits(state, state.waiting[0][0]):
            size, waiter = state.waiting.popleft()
            if waiter.done():  # cancelled meanwhile
                continue
            state.in_flight += 1
            state.held += size
            waiter.set_result(None)

    def _forget_if_idle(self, state: _Attempt) -> None:
        if state.idle() and self._by_grant.get(id(state.grant)) is state:
            del self._by_grant[id(state.grant)]

    def counts(self, grant: Grant) -> tuple[int, int, int]:
        """The attempt's connections, requests in flight and bytes of bodies held."""
        state = self._by_grant.get(id(grant))
        return (0, 0, 0) if state is None else (state.connections, state.in_flight, state.held)

    def __len__(self) -> int:
        return len(self._by_grant)


def _fits(state: _Attempt, size: int) -> bool:
    if state.in_flight >= ATTEMPT_IN_FLIGHT:
        return False
    return state.held == 0 or state.held + size <= ATTEMPT_BODIES


def body_size(request: web.BaseRequest, cap: int) -> int | None:
    """What a request's body counts for while held: its declared length, else the cap
    (nothing for a request without one); None when the declared length is over the cap
    (the request is refused unread)."""
    if not request.body_exists:
        return 0
    length = request.content_length
    if length is None:
        return cap
    return length if length <= cap else None


def too_large(cap: int, what: str) -> Refusal:
    return Refusal(
        413,
        "too_large",
        f"fanout gateway: {what}: the request body is over {cap // MIB} MiB, the most the"
        " gateway passes to this API",
    )


async def read_body(
    request: web.BaseRequest, *, cap: int, idle_timeout: float, what: str
) -> bytes | Refusal:
    """The request's body, at most ``cap`` bytes, or why it is refused (``what`` names
    the API in the message)."""
    if body_size(request, cap) is None:
        return too_large(cap, what)
    pieces: list[bytes] = []
    size = 0
    while True:
        try:
            async with asyncio.timeout(idle_timeout):
                piece = await request.content.readany()
        except TimeoutError:
            return Refusal(
                408,
                "timeout",
                f"fanout gateway: {what}: the request body stalled ({idle_timeout:g} s"
                " without a byte)",
            )
        except web.RequestPayloadError as exc:
            return Refusal(
                400, "invalid", f"fanout gateway: {what}: the request body is malformed ({exc})"
            )
        if not piece:
            return b"".join(pieces)
        size += len(piece)
        if size > cap:
            return too_large(cap, what)
        pieces.append(piece)
