"""The gateway's HTTP side (aiohttp, server and client): one request from a worker,
from its token to the upstream's last byte.

``/<api>/<rest>?<query>`` goes to ``<upstream>/<rest>?<query>``, dot segments resolved.
On the way: the token is checked and swapped for the real key, the request waits for
its attempt's turn and its body is read (``admission``), then it waits its turn in the
API's limiter, a 429/529 is absorbed (paused, sent again) while the attempt has time,
and the answer streams back chunk by chunk while its usage is read and the key scrubbed
(``scrub``).  Every answer tells the limiter's ceiling what got through
(``Limiter.answered``) or was throttled (``Limiter.throttled``): the pause is the
ceiling's, one per episode (the requests one burst got refused share it), Retry-After
its floor with jitter on top; a request whose pause would end past its attempt's
deadline gets the 429 itself.  ``api.throttled`` says each throttle absorbed (its
``episode``), ``api.learned`` each change of what the ceiling learned.
What the gateway answers itself is shaped as the style's own errors, so agents print
the message: 401 for a token that is not (or no longer) valid, 400 once the run's
budget for the API or the unit's own budget is spent (never a 429 or 529: agents retry
those) or for a path out of the API's, 404 for an API the job does not have, 502 when
the upstream cannot be reached, and ``admission``'s refusals (408, 413, 429).

Counting: ``requests`` counts every request sent upstream, a retried one each time
(as the upstream's own tally does); ``throttles`` the 429/529 answers absorbed.  An
answer that reports no usage counts no tokens and costs nothing, and its reservation
stays in the limiter's windows (the upstream may well have counted it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import types
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp
from aiohttp import web
from yarl import URL

from ..errors import SpendStopped
from ..events import Events
from ..pacing.ceiling import Learned, describe
from ..spec.apis import Style
from ..spec.model import Api
from . import admission, forwarding, ratelimits, styles
from .admission import Attempts
from .answers import TokenCounts, UsageReader
from .complaints import Complaints
from .connections import Connection, Connections
from .limiter import Limiter, Ticket
from .scrub import Scrub
from .styles import Estimate, Verdict
from .tokens import Grant, Grants
from .usage import Accounts, Hold

# A request without a cap on its output reserves this much of an output-tokens window
# (the common default cap of agent CLIs) until its usage replaces the reservation;
# reserving the whole window instead would run such requests one per window.
UNCAPPED_OUTPUT = 4096


@dataclass(kw_only=True, slots=True)
class Route:
    """One API's state in the gateway."""

    api: Api
    key: str
    limiter: Limiter
    scrub: Scrub


class Proxy:
    """Serves the workers' requests; ``Gateway`` owns its socket and lifetime."""

    def __init__(
        self,
        apis: Sequence[Api],
        keys: Mapping[str, str],
        *,
        events: Events,
        stop: Callable[[SpendStopped], None],
        rng: random.Random,
        connections: Connections,
        complaints: Complaints,
        learned: Mapping[str, Learned] | None = None,
    ) -> None:
        kept = learned or {}
        self.routes = {
            api.name: Route(
                api=api,
                key=keys.get(api.name, ""),
                limiter=Limiter(
                    requests=api.requests,
                    input_tokens=api.input_tokens,
                    output_tokens=api.output_tokens,
                    max_in_flight=api.max_in_flight,
                    rng=rng,
                    learned=kept.get(api.name),
                    told=functools.partial(self._learned, api.name),
                ),
                scrub=Scrub(keys.get(api.name, "")),
            )
            for api in apis
        }
        self.grants = Grants([api.name for api in apis])
        self.accounts = Accounts(apis, events=events, stop=stop)
        self.events = events
        self.rng = rng
        self.connections = connections
        self.complaints = complaints
        self.attempts = Attempts()
        self.session: aiohttp.ClientSession | None = None

    def _learned(self, name: str, known: Learned) -> None:
        declared = self.routes[name].limiter.declared
        self.events.emit(
            "api.learned",
            api=name,
            perWindow=round(known.per_window, 3),
            window=round(known.window, 3),
            throttles=known.throttles,
            concurrency=known.concurrency,
            text=describe(known, declared=declared),
        )

    def app(self) -> web.Application:
        # Bodies are read by ``admission`` (in pieces, under each style's cap), never
        # by aiohttp's ``request.read()``, which ``client_max_size`` would bound.
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def open_session(self) -> None:
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(_headers_sent)
        self.session = aiohttp.ClientSession(
            trace_configs=[trace],
            # No total: an agent's stream may run for many minutes.  A silent upstream
            # is cut after 10 minutes (Claude Code's own request timeout).
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=600),
            # The limiters decide concurrency; each request upstream has a worker's
            # connection behind it, so there are never more than the gateway holds.
            connector=aiohttp.TCPConnector(limit=self.connections.cap),
            # No proxy or netrc from the environment: nothing may add credentials.
            trust_env=False,
            # No cookies kept: one attempt's would go out with every other's requests.
            # A worker's own cookies pass through both ways, as its other headers do.
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
        )

    async def close_session(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    # -- one request ------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        connection = self.connections.of(request.transport)
        with connection.handling() if connection is not None else contextlib.nullcontext():
            return await self._handle(request, connection)

    async def _handle(
        self, request: web.Request, connection: Connection | None
    ) -> web.StreamResponse:
        if request.method == "HEAD":  # Claude Code's connectivity pre-check
            return web.Response(status=200)
        # raw_path: the path as sent (with its query), so the upstream gets it unchanged.
        name, _, sent = request.raw_path.partition("?")[0].lstrip("/").partition("/")
        route = self.routes.get(name)
        if route is None:
            known = ", ".join(self.routes) or "none"
            message = f"fanout gateway: no API named {name!r} here (the job's APIs: {known})"
            return _error(Style.PLAIN, 404, "not_found", message)
        style = route.api.style
        grant = self._holder(request)
        if grant is None:
            message = (
                f"fanout gateway: api {name}: this token is not valid"
                " (its attempt has ended, or it was never issued)"
            )
            return _error(style, 401, "auth", message)
        rest = forwarding.within(sent)
        if rest is None:
            message = (
                f"fanout gateway: api {name}: the path climbs out of /{name}/ (a '..'"
                " segment), which the gateway does not send upstream"
            )
            self.complaints.say(f"path:{name}", message)
            return _error(style, 400, "invalid", message)
        refused = self._refusal(name, grant)
        if refused is not None:  # never a 429 or 529: agents would retry those
            return _error(style, 400, "invalid", refused)
        async with self.attempts.admit(
            request,
            grant,
            connection,
            cap=styles.MAX_BODY[style],
            idle_timeout=self.connections.idle_timeout,
            what=f"api {name}",
        ) as turn:
            if isinstance(turn, admission.Refusal):
                return self._refused(route, turn)
            # Accounted once, however the request ends (see ``usage.Hold``).
            hold = self.accounts.hold(name, grant.ledger)
            try:
                return await self._forward(request, route, grant, hold, rest, turn)
            finally:
                hold.close()

    def _refused(self, route: Route, refusal: admission.Refusal) -> web.Response:
        """A request refused before it was read to its end: said once a minute, and its
        connection closed after the answer (what is left of the body is not read)."""
        self.complaints.say(f"{refusal.kind}:{route.api.name}", refusal.message)
        response = _error(route.api.style, refusal.status, refusal.kind, refusal.message)
        if refusal.retry_after is not None:
            response.headers["retry-after"] = str(refusal.retry_after)
        response.force_close()
        return response

    def _refusal(self, name: str, grant: Grant) -> str | None:
        """What a request is told instead of being sent: the run's budget for the API
        is spent, or its unit's (``task.budget``; the same 400, since the unit can do
        nothing about it but stop, and the dispatcher then fails it)."""
        refused = self.accounts.refused.get(name)
        if refused is not None:
            return refused
        unit = grant.refused()
        if unit is not None:
            return f"fanout gateway: {unit}: this unit's requests are refused (task.budget)"
        return None

    def _holder(self, request: web.Request) -> Grant | None:
        offered = forwarding.tokens_offered(request.headers, request.query_string)
        return next((g for token in offered if (g := self.grants.holder(token))), None)

    async def _forward(
        self,
        request: web.Request,
        route: Route,
        grant: Grant,
        hold: Hold,
        rest: str,
        turn: admission.Turn,
    ) -> web.StreamResponse:
        """Send the request upstream, each time its limiter admits it, until an answer
        is the worker's (a throttle absorbed sends it again)."""
        style = route.api.style
        guess = styles.estimate(style, turn.body, rest)
        # The turn holds the body (no name here does): dropped there, it is freed.
        turn.body = styles.prepared(style, rest, turn.body)
        url = URL(
            forwarding.upstream_url(route.api.upstream, rest, request.query_string),
            encoded=True,
        )
        headers = forwarding.upstream_headers(list(request.headers.items()), style, route.key)
        tally = _Tally()
        while True:
            async with _admitted(route.limiter, guess) as held:
                tally.queued += held.ticket.queued
                refused = self._refusal(route.api.name, grant)
                if refused is not None:  # a budget was spent while this one waited
                    held.settle(input_tokens=0, output_tokens=0)
                    self._account(hold, None, tally)
                    return _error(style, 400, "invalid", refused)
                try:
                    answer = await self._send(request, route, hold, held, url, headers, turn)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    held.release()
                    self._account(hold, None, tally)
                    message = (
                        f"fanout gateway: api {route.api.name}: the upstream did not answer"
                        f" ({_said(exc)})"
                    )
                    return _error(style, 502, "upstream", message)
                tally.sent += 1
                async with answer:
                    now = datetime.now(UTC)
                    told = ratelimits.remaining(answer.headers, now)
                    if told is not None:
                        route.limiter.observe(told, of=held.ticket)
                    if answer.status < 400:
                        route.limiter.answered(held.ticket)
                        turn.drop_body()  # no retry from here, and the answer may stream long
                        return await self._stream(request, answer, route, hold, held, guess, tally)
                    passed = await self._error_answer(answer, route, grant, hold, held, now, tally)
                    if passed is not None:
                        return passed

    async def _send(
        self,
        request: web.Request,
        route: Route,
        hold: Hold,
        held: _Held,
        url: URL,
        headers: Sequence[tuple[str, str]],
        turn: admission.Turn,
    ) -> aiohttp.ClientResponse:
        """The request on its way upstream, its reservation in the journal first."""
        assert self.session is not None, "the gateway is not started"
        await hold.reserve(held.guess, UNCAPPED_OUTPUT)  # in the journal before it leaves
        return await self.session.request(
            request.method,
            url,
            headers=headers,
            data=turn.body or None,
            allow_redirects=False,
            # The windows count the request from when it left (Limiter.sent).
            trace_request_ctx=functools.partial(route.limiter.sent, held.ticket),
        )

    async def _error_answer(
        self,
        answer: aiohttp.ClientResponse,
        route: Route,
        grant: Grant,
        hold: Hold,
        held: _Held,
        now: datetime,
        tally: _Tally,
    ) -> web.Response | None:
        """An answer of 400 or more: the worker's, or None for a throttle absorbed (the
        request goes again after the limiter's pause)."""
        style = route.api.style
        try:
            data = await answer.read()
        except (aiohttp.ClientError, TimeoutError):
            data = b""
        verdict = styles.classify(style, answer.status, data)
        if verdict is not Verdict.RETRY:
            route.limiter.answered(held.ticket)
            held.release()
        elif self._absorbed(answer, route, grant, held, now):
            tally.throttles += 1
            hold.answered()
            return None
        self._account(hold, None, tally)
        if verdict is Verdict.SPEND:
            self.accounts.upstream_refused(route.api.name, answer.status, data)
        return web.Response(
            status=answer.status,
            headers=route.scrub.headers(
                forwarding.downstream_headers(list(answer.headers.items()))
            ),
            body=route.scrub.body(data),
        )

    def _absorbed(
        self,
        answer: aiohttp.ClientResponse,
        route: Route,
        grant: Grant,
        held: _Held,
        now: datetime,
    ) -> bool:
        """Tell the limiter of a throttle; whether the attempt has time for its pause
        (then it is absorbed, and said)."""
        loop = asyncio.get_running_loop()
        wait = ratelimits.retry_after(answer.headers, now)
        # The ceiling learns of it whether or not it is absorbed.
        pause = route.limiter.throttled(held.ticket, wait)
        held.release()
        resume = max(loop.time(), route.limiter.paused_until)
        if resume >= grant.deadline:
            return False
        # The pause as the limiter decided it, from the instant it read its clock: a
        # clock read later, on a loaded machine, said 1.499 for a Retry-After of 1.5.
        begun = pause.until - pause.seconds if pause is not None else loop.time()
        self.events.emit(
            "api.throttled",
            api=route.api.name,
            unit=grant.unit,
            attempt=grant.attempt,
            status=answer.status,
            retryAfter=wait,
            pause=round(max(begun, route.limiter.paused_until) - begun, 3),
            episode="new" if pause is not None and pause.new_episode else "same",
        )
        return True

    async def _stream(
        self,
        request: web.Request,
        answer: aiohttp.ClientResponse,
        route: Route,
        hold: Hold,
        held: _Held,
        guess: Estimate,
        tally: _Tally,
    ) -> web.StreamResponse:
        """Writes the answer to the worker as its chunks arrive, reading its usage."""
        sse = answer.content_type == "text/event-stream"
        reader = UsageReader(route.api.style, sse=sse, model=guess.model)
        scrubbed = route.scrub.stream()
        response = web.StreamResponse(
            status=answer.status,
            headers=route.scrub.headers(
                forwarding.downstream_headers(list(answer.headers.items()))
            ),
        )
        counts: TokenCounts | None = None
        try:
            await response.prepare(request)
            try:
                async for chunk in answer.content.iter_any():
                    reader.feed(chunk)
                    passed = scrubbed.feed(chunk)
                    if passed:
                        await response.write(passed)
            except (aiohttp.ClientError, TimeoutError):
                # Cut mid-answer: the worker's connection is dropped after what arrived,
                # so its client sees a broken stream, not a whole answer that is half.
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write_eof(scrubbed.close())
        except ConnectionResetError:  # the worker went away
            pass
        finally:
            counts = reader.result()
            if counts is None:
                held.release()
            else:
                held.settle(
                    input_tokens=counts.paced_input_tokens,
                    output_tokens=counts.output_tokens,
                )
            self._account(hold, counts, tally)
        return response

    def _account(self, hold: Hold, counts: TokenCounts | None, tally: _Tally) -> None:
        hold.settle(
            counts,
            requests=tally.sent,
            queued_seconds=tally.queued,
            throttles=tally.throttles,
        )


@dataclass(slots=True)
class _Tally:
    """One request's count so far: sent upstream (a retried one each time), seconds
    queued in its limiter, throttles absorbed."""

    sent: int = 0
    queued: float = 0.0
    throttles: int = 0


class _Held:
    """A limiter's ticket, freed exactly once: settled with the usage an answer
    reported, or released (its reservation kept in the windows) however else the
    request ends, a cancellation or an error included (``_admitted``)."""

    def __init__(self, limiter: Limiter, ticket: Ticket, guess: Estimate) -> None:
        self.limiter = limiter
        self.ticket = ticket
        self.guess = guess
        self._freed = False

    def settle(self, *, input_tokens: int, output_tokens: int) -> None:
        if not self._freed:
            self._freed = True
            self.limiter.settle(self.ticket, input_tokens=input_tokens, output_tokens=output_tokens)

    def release(self) -> None:
        if not self._freed:
            self._freed = True
            self.limiter.release(self.ticket)


@contextlib.asynccontextmanager
async def _admitted(limiter: Limiter, guess: Estimate) -> AsyncIterator[_Held]:
    """Wait for the limiter to admit the request; its ticket is freed on leaving, if
    nothing inside freed it."""
    ticket = await limiter.admit(
        input_tokens=guess.input_tokens,
        output_tokens=UNCAPPED_OUTPUT if guess.output_tokens is None else guess.output_tokens,
    )
    held = _Held(limiter, ticket, guess)
    try:
        yield held
    finally:
        held.release()


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _error(style: Style, status: int, kind: str, message: str) -> web.Response:
    return web.Response(
        status=status,
        body=styles.error_body(style, status, kind, message),
        content_type="application/json",
    )


async def _headers_sent(
    session: aiohttp.ClientSession,
    context: types.SimpleNamespace,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    sent = context.trace_request_ctx
    if callable(sent):
        sent()
