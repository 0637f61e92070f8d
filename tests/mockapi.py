"""A mock upstream API on loopback for the gateway's tests, on aiohttp.

It speaks the Anthropic Messages API (`POST /v1/messages`, streamed as server-sent events
exactly as the real API sends them, or as one JSON message) and OpenAI's chat completions
(`POST /v1/chat/completions`, streamed with a final usage chunk when the request asks
for `stream_options.include_usage`, or as one JSON object) and Gemini's
(`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`, each
answer with its `usageMetadata`).  In tool mode an Anthropic
request whose last user message carries no `tool_result` is answered with a Bash
`tool_use` (the command from the config), anything else ends the turn, so a real agent
CLI runs a scripted two-turn loop against it; a Gemini request whose last turn carries no
`functionResponse` is answered with a `run_shell_command` call (gemini-cli's shell tool).
With `edits` (`Edit`) an Anthropic conversation whose prompt names a scripted file is
answered with a Read of it, then an Edit, then the end of the turn: a real Claude Code
limited to `--allowedTools Read,Edit` (the examples') edits a real file.

Like the real upstreams it enforces a limit of its own (N requests per sliding window of
W seconds, answering 429 `rate_limit_error` with `retry-after` beyond it and sending
`anthropic-ratelimit-requests-*` / `x-ratelimit-*-requests` headers), can be scripted to
fail the next k requests (see `Fault`), and records every request it receives
(`MockApi.seen`) so a test can compare the upstream's tally with what fanout reports.
`HEAD` of any path answers 200 (Claude Code's connectivity pre-check).

The limit can change over time, as a tier or a shared key's other users change it
(`MockConfig.schedule`, `--schedule 0:6,40:2,80:6`: from 0 s after the mock started 6
per window, from 40 s 2, from 80 s 6 again; the window stays `window`).  The
`retry-after` of a 429 is honest: the whole seconds, rounded up, until enough of the
requests it accepted have left the window for one more to fit, also when the limit was
just lowered below what the window holds.  `limit_headers=False` (`--no-limit-headers`)
sends no `anthropic-ratelimit-*` / `x-ratelimit-*` headers, only a 429's `retry-after`,
as an API that is no LLM's (an enrichment service, a CRM) says no more than that.

Start it in the test's loop (`async with MockApi(...) as mock`) or on a thread of its
own (`with MockApi(...).in_thread() as mock`, what the `mock_api` fixture does), so a
test that runs fanout synchronously can use it too.  A benchmark runs it as a process
of its own (`python tests/mockapi.py --limit 50 --window 60`: it prints its URL, serves
until stdin closes, and `GET /_mock/seen` gives its record as JSON: each request's
arrival `at` (time.monotonic(), which another process on the machine reads alike) and
`since` the mock started, its `status`, the `limit` in force then, a 429's
`retry_after` and the tail of its first message's text, the `prompt`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import math
import re
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from aiohttp import web

ANTHROPIC = "/v1/messages"
OPENAI = "/v1/chat/completions"
# OpenAI's Responses API, what the Codex CLI speaks (wire_api = "responses").
RESPONSES = "/v1/responses"
DEFAULT_COMMAND = "echo done > out.txt"
# Gemini's two content routes; the model is in the path.
GEMINI = re.compile(
    r"/v1beta/models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent)"
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Usage:
    """Tokens of one answer.  `input_tokens` is the uncached input, as Anthropic counts
    it (OpenAI's `prompt_tokens` is input + cache_read, `cached_tokens` is cache_read)."""

    input_tokens: int = 12
    output_tokens: int = 5
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def plus(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class MockConfig:
    """What the mock answers.  `limit` requests per sliding `window` seconds (None: no
    limit); `usage` on every successful answer; `latency` seconds before answering and
    `gap` seconds between streamed events (to see that a proxy does not buffer);
    `require_key`: answer 401 to any other key; `prefix`: the API's paths start with
    it (an upstream URL with a path, e.g. "/proxy" serves "/proxy/v1/messages")."""

    tool: bool = False
    command: str = DEFAULT_COMMAND
    text: str = "All done."
    usage: Usage = field(default_factory=Usage)
    limit: int | None = None
    window: float = 60.0
    latency: float = 0.0
    gap: float = 0.0
    require_key: str | None = None
    prefix: str = ""
    # The limit over time: (seconds since the mock started, requests per window) steps in
    # ascending order, each in force until the next; before the first, `limit`.
    schedule: tuple[tuple[float, int], ...] = ()
    # Send the anthropic-ratelimit-* / x-ratelimit-* headers (False: retry-after only).
    limit_headers: bool = True
    # Awaited before the last event of a stream (in the mock's loop): a test holds the
    # end of an answer back until it has seen the beginning arrive through a proxy.
    before_last_event: Callable[[], Awaitable[object]] | None = None
    # A 401 names the key it refused, as some upstreams do (OpenAI, partly masked).
    echo_key: bool = False
    # A stream's connection is dropped after this many events (an upstream that died).
    cut_after: int | None = None
    # Scripted file edits (Anthropic, in tool mode or not): a conversation whose prompt
    # names an Edit's path is answered with a Read of that file, then the Edit, then the
    # end of the turn (`_edit_call`), so a real Claude Code edits a real file with
    # nothing but its Read and Edit tools (the examples' `--allowedTools Read,Edit`).
    edits: tuple[Edit, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Edit:
    """One file edit the mock scripts: `path` as the prompt names it (relative to the
    agent's working directory), the text `old` the Edit replaces with `new` (Claude's
    Edit tool wants `old` to occur once in the file)."""

    path: str
    old: str
    new: str


class Fault(enum.Enum):
    """A scripted failure, rendered in the style of the endpoint it answers:

    | fault       | Anthropic                                             | OpenAI                                      |
    | RATE_LIMIT  | 429 rate_limit_error, retry-after                     | 429 rate_limit_exceeded, retry-after        |
    | OVERLOADED  | 529 overloaded_error                                  | 503 server_error (engine overloaded)        |
    | SPEND_LIMIT | 429 rate_limit_error, details.error_code              | 429 insufficient_quota                      |
    |             | enforced_spend_limit_reached, no retry-after          |                                             |
    | CREDIT      | 400 invalid_request_error "credit balance is too low" | 429 insufficient_quota credit_balance_exhausted |
    | USAGE_LIMIT | 400 "You have reached your specified API usage limits"| 429 insufficient_quota organization_usage_limit_exceeded |
    | USAGE_WINDOW| 429 rate_limit_error "You've hit your session limit ·   | 429 usage_limit_reached, resets_in_seconds  |
    |             | resets 3:45pm (Europe/Dublin)" (or `message=`)        | (ChatGPT's Codex backend; USAGE_WINDOW_SECONDS), |
    |             |                                                       | or `message=` as its message                |
    | UNAUTHORIZED| 401 authentication_error                              | 401 invalid_api_key                         |
    | STREAM_ERROR| 200 stream: message_start, then an `error` event      | 500 server_error (Responses API: a 200      |
    |             | (overloaded_error), as the real API fails mid-stream  | stream, response.created, response.failed)  |
    | DAILY_QUOTA | as RATE_LIMIT                                         | as RATE_LIMIT                               |

    Gemini (`_gemini_fault`): RATE_LIMIT 429 RESOURCE_EXHAUSTED with a per-minute
    QuotaFailure and RetryInfo `retryDelay` (the retry_after; the real API sends no
    retry-after header); DAILY_QUOTA the same with a per-day quotaId; OVERLOADED 503
    UNAVAILABLE "The model is overloaded"; UNAUTHORIZED 400 API_KEY_INVALID; STREAM_ERROR
    500 INTERNAL; SPEND_LIMIT, CREDIT, USAGE_LIMIT the bare 429 "Resource has been
    exhausted (e.g. check quota)." (Gemini has no such distinct answers).
    """

    RATE_LIMIT = "rate_limit"
    OVERLOADED = "overloaded"
    SPEND_LIMIT = "spend_limit"
    CREDIT = "credit"
    USAGE_LIMIT = "usage_limit"
    USAGE_WINDOW = "usage_window"
    UNAUTHORIZED = "unauthorized"
    STREAM_ERROR = "stream_error"
    DAILY_QUOTA = "daily_quota"


CREDIT_MESSAGE = (
    "Your credit balance is too low to access the Anthropic API. "
    "Please go to Plans & Billing to upgrade or purchase credits."
)
USAGE_LIMIT_MESSAGE = (
    "You have reached your specified API usage limits. "
    "You will regain access on 2027-01-01 at 00:00 UTC."
)
# A subscription's usage window, in the words Claude Code documents (the real CLI builds
# it from headers only for a subscriber's login, so the mock says it in the body).
USAGE_WINDOW_MESSAGE = "You've hit your session limit · resets 3:45pm (Europe/Dublin)"
SPEND_LIMIT_MESSAGE = (
    "You have reached your organization's monthly spend limit; it resets at 2027-01-01T00:00:00Z."
)

# The ChatGPT backend's usage window (Codex on a subscription): it reopens this long after
# the refusal (its `resets_in_seconds`; `resets_at` is now plus this).
USAGE_WINDOW_SECONDS = 5400


@dataclass(frozen=True, kw_only=True, slots=True)
class Seen:
    """One request as the mock received it.  `at` is time.monotonic() at arrival; `key`
    comes from x-api-key, else `Authorization: Bearer`, else x-goog-api-key ("" if none);
    `usage` is what a successful answer carried (None for an error or a HEAD); `since`
    is `at` less the time the mock started; `limit` the window's limit in force at
    arrival (None: no limit); `retry_after` the whole seconds of a refusal's
    `retry-after` (None without one)."""

    at: float
    method: str
    path: str
    query: str
    key: str
    # Out of the repr: a failed assertion on a list of Seen stays readable (Claude's
    # bodies are some 76 kB).
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    body: bytes = field(repr=False)
    model: str | None
    stream: bool
    status: int
    usage: Usage | None
    since: float = 0.0
    limit: int | None = None
    retry_after: int | None = None

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True, kw_only=True, slots=True)
class _Script:
    fault: Fault
    headers: Mapping[str, str]
    message: str | None = None


class MockApi:
    """The mock upstream; see the module docstring.  Safe to configure and read from
    another thread than the one serving."""

    def __init__(
        self,
        config: MockConfig | None = None,
        *,
        host: str = "127.0.0.1",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config or MockConfig()
        self._host = host
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self._accepted: deque[float] = deque()
        self._script: deque[_Script] = deque()
        self._in_flight = 0
        self._peak_in_flight = 0
        self._answered = 0
        self._held = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._runner: web.AppRunner | None = None
        self._port = 0
        self._clock = clock
        self._started: float | None = None

    # -- configuration -------------------------------------------------------------

    @property
    def config(self) -> MockConfig:
        return self._config

    def configure(self, **changes: Any) -> None:
        """Replace fields of the config (e.g. `configure(tool=True, limit=5, window=10)`)."""
        with self._lock:
            self._config = replace(self._config, **changes)

    def script(
        self,
        fault: Fault,
        times: int = 1,
        *,
        retry_after: float | None = None,
        headers: Mapping[str, str] | None = None,
        message: str | None = None,
    ) -> None:
        """Answer the next `times` API requests (HEADs do not count) with `fault`, before
        the window limit is looked at.  `retry_after` (seconds) is sent as `retry-after`;
        RATE_LIMIT defaults to 1, the others send none (as the real spend limit does).
        `headers` are added as given (e.g. `{"retry-after-ms": "1500"}`, or an HTTP-date
        `retry-after` with `retry_after` left None).  `message` replaces a USAGE_WINDOW's
        text (e.g. the older `Claude AI usage limit reached|<epoch>`) or a RATE_LIMIT's
        ("mock limit"; e.g. `rate_limit_words(50, 60)`, the words the real API says)."""
        if retry_after is None and fault is Fault.RATE_LIMIT and not headers:
            retry_after = 1
        sent = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
        sent.update(headers or {})
        with self._lock:
            self._script.extend(
                _Script(fault=fault, headers=sent, message=message) for _ in range(times)
            )

    def hold(self) -> None:
        """Keep every API request that arrives from now waiting (in flight, recorded at
        arrival) until `release()`: a test sees how many a client keeps in flight."""
        with self._lock:
            self._held = True

    def release(self) -> None:
        with self._lock:
            self._held = False
            waiters, self._waiters = self._waiters, []
        for loop, waiter in waiters:
            loop.call_soon_threadsafe(_wake, waiter)

    def wait_in_flight(self, count: int, timeout: float = 30.0) -> None:
        """Block (a test's thread, not the mock's loop) until `count` API requests are
        in flight; AssertionError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.in_flight < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.in_flight} requests in flight, not {count}")
            time.sleep(0.01)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def clear(self) -> None:
        """Forget the record, the window and the script (the config stays)."""
        with self._lock:
            self._seen.clear()
            self._accepted.clear()
            self._script.clear()
            self._peak_in_flight = self._in_flight

    # -- what it saw ----------------------------------------------------------------

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("the mock API is not started")
        return f"http://{self._host}:{self._port}"

    @property
    def seen(self) -> list[Seen]:
        """Every request so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._seen)

    def posts(self) -> list[Seen]:
        """The API requests (POSTs) so far."""
        return [s for s in self.seen if s.method == "POST"]

    def tally(self, key: str | None = None) -> Usage:
        """The usage the mock answered, summed (over requests with `key` if given)."""
        total = Usage(input_tokens=0, output_tokens=0)
        for s in self.posts():
            if s.usage is not None and (key is None or s.key == key):
                total = total.plus(s.usage)
        return total

    def limit_at(self, since: float) -> int | None:
        """The window's limit `since` seconds after the mock started (the schedule's
        step begun by then, else `config.limit`)."""
        with self._lock:
            config = self._config
        return _limit_at(config, since)

    def max_in_window(self, seconds: float) -> int:
        """The most API requests that arrived within any window of `seconds` (a request
        at t and one at t + seconds are not in one window, as in the mock's own limit)."""
        times = sorted(s.at for s in self.posts())
        most = 0
        start = 0
        for end, at in enumerate(times):
            while times[start] <= at - seconds:
                start += 1
            most = max(most, end - start + 1)
        return most

    @property
    def peak_in_flight(self) -> int:
        """The most API requests the mock was answering at one time."""
        return self._peak_in_flight

    # -- serving ----------------------------------------------------------------------

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("HEAD", "/{tail:.*}", self._head)
        app.router.add_route("POST", "/{tail:.*}", self._post)
        app.router.add_route("GET", "/_mock/seen", self._report)
        app.router.add_route("GET", "/{tail:.*}", self._other)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self._host, 0)
        await site.start()
        self._started = self._clock()
        self._runner = runner
        self._port = runner.addresses[0][1]

    async def close(self) -> None:
        self.release()  # a held request would keep the server from shutting down
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> MockApi:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[MockApi]:
        """Serve on a loop of the mock's own, on a daemon thread, until the block ends."""
        ready = threading.Event()
        failed: list[BaseException] = []
        stop: list[Callable[[], object]] = []

        async def main() -> None:
            done = asyncio.Event()
            try:
                await self.start()
            except BaseException as error:
                failed.append(error)
                ready.set()
                raise
            loop = asyncio.get_running_loop()
            stop.append(lambda: loop.call_soon_threadsafe(done.set))
            ready.set()
            try:
                await done.wait()
            finally:
                await self.close()

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        try:
            yield self
        finally:
            stop[0]()
            thread.join(timeout=10)

    # -- handlers ---------------------------------------------------------------------

    def _record(self, request: web.Request, body: bytes, at: float) -> Seen:
        headers = request.headers
        key = headers.get("x-api-key", "")
        if not key and headers.get("authorization", "").lower().startswith("bearer "):
            key = headers["authorization"][len("bearer ") :]
        key = key or headers.get("x-goog-api-key", "")
        parsed: Any = None
        with contextlib.suppress(ValueError):
            parsed = json.loads(body) if body else None
        parsed = parsed if isinstance(parsed, dict) else {}
        model = parsed.get("model")
        gemini = GEMINI.search(request.path)
        if gemini is not None:
            model = gemini["model"]
        return Seen(
            at=at,
            since=at - (at if self._started is None else self._started),
            method=request.method,
            path=request.path,
            query=request.query_string,
            key=key,
            headers=tuple((k.lower(), v) for k, v in headers.items()),
            body=body,
            model=model if isinstance(model, str) else None,
            stream=parsed.get("stream") is True
            or (gemini is not None and gemini["method"] == "streamGenerateContent"),
            status=0,
            usage=None,
        )

    def _store(
        self, seen: Seen, status: int, usage: Usage | None = None, *, retry_after: int | None = None
    ) -> None:
        with self._lock:
            limit = _limit_at(self._config, seen.since)
            self._seen.append(
                replace(seen, status=status, usage=usage, limit=limit, retry_after=retry_after)
            )

    async def _head(self, request: web.Request) -> web.StreamResponse:
        self._store(self._record(request, b"", self._clock()), 200)
        return web.Response(status=200)

    async def _report(self, request: web.Request) -> web.StreamResponse:
        """The record as JSON, for a client in another process (a benchmark); not
        recorded itself, and without keys or bodies."""
        return web.json_response(
            [
                {
                    "at": s.at,
                    "since": s.since,
                    "method": s.method,
                    "path": s.path,
                    "model": s.model,
                    "status": s.status,
                    "limit": s.limit,
                    "retry_after": s.retry_after,
                    "prompt": _prompt_tail(s.body),
                    "usage": None if s.usage is None else asdict(s.usage),
                }
                for s in self.seen
            ]
        )

    async def _other(self, request: web.Request) -> web.StreamResponse:
        self._store(self._record(request, b"", self._clock()), 404)
        return _anthropic_error(404, "not_found_error", f"no route {request.path}")

    async def _post(self, request: web.Request) -> web.StreamResponse:
        at = self._clock()
        body = await request.read()
        seen = self._record(request, body, at)
        with self._lock:
            config = self._config
        style = request.path.removeprefix(config.prefix)
        gemini = GEMINI.fullmatch(style)
        known = style in (ANTHROPIC, OPENAI, RESPONSES) or gemini is not None
        if not known or not request.path.startswith(config.prefix):
            self._store(seen, 404)
            return _anthropic_error(404, "not_found_error", f"no route {request.path}")
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            self._store(seen, 400)
            return _anthropic_error(400, "invalid_request_error", "the body is not a JSON object")
        with self._lock:
            self._in_flight += 1
            self._peak_in_flight = max(self._peak_in_flight, self._in_flight)
        try:
            refusal, headers = self._admit(seen, config, at)
            if config.latency:
                await asyncio.sleep(config.latency)
            await self._unless_held()
            if refusal is STREAM_ERROR:
                usage = config.usage
                started = Usage(
                    input_tokens=usage.input_tokens,
                    output_tokens=min(1, usage.output_tokens),
                    cache_read_tokens=usage.cache_read_tokens,
                    cache_write_tokens=usage.cache_write_tokens,
                )
                self._store(seen, 200, started)
                if style == RESPONSES:
                    return await self._responses_failed(request, parsed, config)
                return await self._broken_stream(request, parsed, config)
            if refusal is not None:
                self._store(seen, refusal.status, retry_after=_retry_after(refusal))
                return refusal
            # Recorded before the answer is written: a client that has read the whole
            # stream then finds the request in the record.
            self._store(seen, 200, config.usage)
            if gemini is not None:
                return await self._gemini(request, gemini["model"], seen.stream, parsed, config)
            if style == ANTHROPIC:
                return await self._anthropic(request, parsed, config, headers)
            if style == RESPONSES:
                return await self._responses(request, parsed, config, headers)
            return await self._openai(request, parsed, config, headers)
        finally:
            with self._lock:
                self._in_flight -= 1

    async def _unless_held(self) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if not self._held:
                return
            self._waiters.append((loop, waiter))
        await waiter

    def _admit(
        self, seen: Seen, config: MockConfig, at: float
    ) -> tuple[web.Response | None, dict[str, str]]:
        """The error this request gets, if any (a scripted fault, a wrong key, the
        window; STREAM_ERROR for a stream to break), and the rate-limit headers of its
        answer."""
        # The Responses API refuses in OpenAI's error shape, as chat completions does.
        openai = seen.path.endswith((OPENAI, RESPONSES))
        gemini = GEMINI.search(seen.path) is not None
        with self._lock:
            scripted = self._script.popleft() if self._script else None
            if scripted is None and config.require_key not in (None, seen.key):
                scripted = _Script(fault=Fault.UNAUTHORIZED, headers={})
            if scripted is not None and gemini:
                return _gemini_fault(scripted, seen.model or "gemini-mock"), {}
            if scripted is not None:
                broken = not openai or seen.path.endswith(RESPONSES)
                if scripted.fault is Fault.STREAM_ERROR and broken:
                    return STREAM_ERROR, {}
                refusal = _fault(scripted, openai=openai)
                if config.echo_key and scripted.fault is Fault.UNAUTHORIZED:
                    refusal.text = (refusal.text or "").replace("key", f"key {seen.key}", 1)
                return refusal, {}
            headers: dict[str, str] = {}
            limit = _limit_at(config, seen.since)
            if limit is not None:
                while self._accepted and self._accepted[0] <= at - config.window:
                    self._accepted.popleft()
                if len(self._accepted) >= limit:
                    # Honest: until enough have left the window for one more to fit, the
                    # first of them if the limit stayed, a later one if it was lowered.
                    wait = self._accepted[len(self._accepted) - limit] + config.window - at
                    headers = self._limit_headers(config, limit, 0, wait, openai=openai)
                    # Whole seconds, rounded up, as the real APIs send it.
                    headers["retry-after"] = str(max(1, math.ceil(wait)))
                    if gemini:
                        refusal = _gemini_fault(
                            _Script(fault=Fault.RATE_LIMIT, headers=headers),
                            seen.model or "gemini-mock",
                        )
                    elif openai:
                        refusal = _openai_error(
                            429, "requests", "rate_limit_exceeded", "Rate limit reached", headers
                        )
                    else:
                        refusal = _anthropic_error(
                            429, "rate_limit_error", rate_limit_words(limit, config.window), headers
                        )
                    return refusal, {}
                self._accepted.append(at)
                reset = self._accepted[0] + config.window - at
                headers = self._limit_headers(
                    config, limit, max(0, limit - len(self._accepted)), reset, openai=openai
                )
        return None, headers

    def _limit_headers(
        self, config: MockConfig, limit: int, remaining: int, reset_in: float, *, openai: bool
    ) -> dict[str, str]:
        if not config.limit_headers:
            return {}
        if openai:
            return {
                "x-ratelimit-limit-requests": str(limit),
                "x-ratelimit-remaining-requests": str(remaining),
                "x-ratelimit-reset-requests": f"{max(1, math.ceil(reset_in * 1000))}ms",
            }
        # RFC 3339 in whole seconds, rounded up so that waiting until then is enough.
        reset = datetime.fromtimestamp(math.ceil(time.time() + reset_in), UTC)
        return {
            "anthropic-ratelimit-requests-limit": str(limit),
            "anthropic-ratelimit-requests-remaining": str(remaining),
            "anthropic-ratelimit-requests-reset": reset.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }

    def _number(self) -> int:
        """A number for the ids of one answer (msg_mock1, toolu_mock1, ...)."""
        with self._lock:
            self._answered += 1
            return self._answered

    async def _broken_stream(
        self, request: web.Request, body: Any, config: MockConfig
    ) -> web.StreamResponse:
        """A 200 stream that starts a message, then fails as the real API does under
        load: an `error` event, no message_delta, no message_stop."""
        n = self._number()
        usage = config.usage
        start = {
            "type": "message_start",
            "message": {
                "id": f"msg_mock{n}",
                "type": "message",
                "role": "assistant",
                "model": body.get("model") or "claude-mock",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": usage.input_tokens,
                    "cache_creation_input_tokens": usage.cache_write_tokens,
                    "cache_read_input_tokens": usage.cache_read_tokens,
                    "output_tokens": min(1, usage.output_tokens),
                },
            },
        }
        error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        chunks = [
            f"event: message_start\ndata: {json.dumps(start)}\n\n".encode(),
            f"event: error\ndata: {json.dumps(error)}\n\n".encode(),
        ]
        return await _stream(request, chunks, config.gap, {"request-id": f"req_mock{n}"})

    async def _anthropic(
        self, request: web.Request, body: Any, config: MockConfig, headers: dict[str, str]
    ) -> web.StreamResponse:
        n = self._number()
        model = body.get("model") or "claude-mock"
        use_tool = config.tool and not _has_tool_result(body)
        usage = config.usage
        start_usage = {
            "input_tokens": usage.input_tokens,
            "cache_creation_input_tokens": usage.cache_write_tokens,
            "cache_read_input_tokens": usage.cache_read_tokens,
            # The real API counts a token or so at message_start; the final count is
            # message_delta's (cumulative, not to be added to this one).
            "output_tokens": min(1, usage.output_tokens),
        }
        tool_name = "Bash"
        tool_input: dict[str, Any] = {
            "command": config.command,
            "description": "Run the scripted command",
        }
        edit_call = _edit_call(body, config.edits)
        if edit_call is not None:
            use_tool, tool_name, tool_input = True, *edit_call
        elif config.edits and _named_edit(body, config.edits) is not None:
            use_tool = False  # the scripted edit is done: the turn ends
        stop = "tool_use" if use_tool else "end_turn"
        headers["request-id"] = f"req_mock{n}"
        if not body.get("stream"):
            block: dict[str, Any] = (
                {"type": "tool_use", "id": f"toolu_mock{n}", "name": tool_name, "input": tool_input}
                if use_tool
                else {"type": "text", "text": config.text}
            )
            message = {
                "id": f"msg_mock{n}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [block],
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {**start_usage, "output_tokens": usage.output_tokens},
            }
            return web.json_response(message, headers=headers)
        if use_tool:
            first: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_mock{n}",
                "name": tool_name,
                "input": {},
            }
            text = json.dumps(tool_input)
            half = len(text) // 2
            deltas = [
                {"type": "input_json_delta", "partial_json": text[:half]},
                {"type": "input_json_delta", "partial_json": text[half:]},
            ]
        else:
            first = {"type": "text", "text": ""}
            words = config.text.split(" ")
            deltas = [
                {"type": "text_delta", "text": w if i == 0 else " " + w}
                for i, w in enumerate(words)
            ]
        events: list[tuple[str, dict[str, Any]]] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": f"msg_mock{n}",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": start_usage,
                    },
                },
            ),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": first},
            ),
            ("ping", {"type": "ping"}),
            *(
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
                for d in deltas
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": usage.output_tokens},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        chunks = [f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events]
        return await _stream(
            request, chunks, config.gap, headers, config.before_last_event, config.cut_after
        )

    async def _openai(
        self, request: web.Request, body: Any, config: MockConfig, headers: dict[str, str]
    ) -> web.StreamResponse:
        n = self._number()
        model = body.get("model") or "gpt-mock"
        usage = config.usage
        usage_body = {
            "prompt_tokens": usage.input_tokens + usage.cache_read_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.cache_read_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens},
        }
        created = int(time.time())
        headers["x-request-id"] = f"req_mock{n}"
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": f"chatcmpl-mock{n}",
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": config.text},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage_body,
                },
                headers=headers,
            )
        options = body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True

        def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            data: dict[str, Any] = {
                "id": f"chatcmpl-mock{n}",
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if include_usage:
                data["usage"] = None
            return data

        words = config.text.split(" ")
        datas = [chunk({"role": "assistant", "content": ""}, None)]
        datas += [chunk({"content": w if i == 0 else " " + w}, None) for i, w in enumerate(words)]
        datas.append(chunk({}, "stop"))
        if include_usage:
            datas.append(
                {
                    "id": f"chatcmpl-mock{n}",
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage_body,
                }
            )
        chunks = [f"data: {json.dumps(d)}\n\n".encode() for d in datas]
        chunks.append(b"data: [DONE]\n\n")
        return await _stream(
            request, chunks, config.gap, headers, config.before_last_event, config.cut_after
        )

    async def _responses(
        self, request: web.Request, body: Any, config: MockConfig, headers: dict[str, str]
    ) -> web.StreamResponse:
        """OpenAI's Responses API, streamed (Codex always streams): response.created,
        the output item (text deltas, or in tool mode a shell call while the input has
        no function_call_output yet), response.completed with the usage."""
        n = self._number()
        model = body.get("model") or "gpt-mock"
        usage = config.usage
        headers["x-request-id"] = f"req_mock{n}"
        response: dict[str, Any] = {
            "id": f"resp_mock{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "in_progress",
            "model": model,
            "output": [],
        }
        events: list[dict[str, Any]] = [{"type": "response.created", "response": response}]
        tool = _shell_tool(body) if config.tool and not _has_call_output(body) else None
        item: dict[str, Any]
        if tool is not None:
            name, arguments = tool
            item = {
                "type": "function_call",
                "id": f"fc_mock{n}",
                "call_id": f"call_mock{n}",
                "name": name,
                "arguments": json.dumps(arguments(config.command)),
                "status": "completed",
            }
            events.append({"type": "response.output_item.added", "output_index": 0, "item": item})
        else:
            item_id = f"msg_mock{n}"
            started = {
                "id": item_id,
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            events.append(
                {"type": "response.output_item.added", "output_index": 0, "item": started}
            )
            words = config.text.split(" ")
            events += [
                {
                    "type": "response.output_text.delta",
                    "item_id": item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": w if i == 0 else " " + w,
                }
                for i, w in enumerate(words)
            ]
            item = {
                **started,
                "status": "completed",
                "content": [{"type": "output_text", "text": config.text, "annotations": []}],
            }
        events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
        prompt = usage.input_tokens + usage.cache_read_tokens
        completed = {
            **response,
            "status": "completed",
            "output": [item],
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": usage.cache_read_tokens},
                "output_tokens": usage.output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + usage.output_tokens,
            },
        }
        events.append({"type": "response.completed", "response": completed})
        chunks = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
        return await _stream(
            request, chunks, config.gap, headers, config.before_last_event, config.cut_after
        )

    async def _responses_failed(
        self, request: web.Request, body: Any, config: MockConfig
    ) -> web.StreamResponse:
        """A 200 Responses stream that fails mid-way as the real API does: created, then
        response.failed with a server_error."""
        n = self._number()
        response: dict[str, Any] = {
            "id": f"resp_mock{n}",
            "object": "response",
            "status": "in_progress",
            "model": body.get("model") or "gpt-mock",
            "output": [],
        }
        failed = {
            **response,
            "status": "failed",
            "error": {"code": "server_error", "message": "The server had an error"},
        }
        events = [
            {"type": "response.created", "response": response},
            {"type": "response.failed", "response": failed},
        ]
        chunks = [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events]
        return await _stream(request, chunks, config.gap, {"x-request-id": f"req_mock{n}"})

    async def _gemini(
        self, request: web.Request, model: str, stream: bool, body: Any, config: MockConfig
    ) -> web.StreamResponse:
        """generateContent / streamGenerateContent: the text (one chunk per word when
        streamed) or, in tool mode, a `run_shell_command` call; `usageMetadata` on the
        last chunk, as the real API counts it (the prompt includes the cached tokens)."""
        n = self._number()
        usage = config.usage
        prompt = usage.input_tokens + usage.cache_read_tokens
        metadata: dict[str, Any] = {
            "promptTokenCount": prompt,
            "candidatesTokenCount": usage.output_tokens,
            "totalTokenCount": prompt + usage.output_tokens,
        }
        if usage.cache_read_tokens:
            metadata["cachedContentTokenCount"] = usage.cache_read_tokens
        if config.tool and not _has_function_response(body):
            call = {"name": "run_shell_command", "args": {"command": config.command}}
            parts_list: list[list[dict[str, Any]]] = [[{"functionCall": call}]]
        else:
            words = config.text.split(" ")
            parts_list = [[{"text": w if i == 0 else " " + w}] for i, w in enumerate(words)]

        def chunk(parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
            candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
            data: dict[str, Any] = {"candidates": [candidate]}
            if last:
                candidate["finishReason"] = "STOP"
                data["usageMetadata"] = metadata
            data["modelVersion"] = model
            data["responseId"] = f"mock{n}"
            return data

        if not stream:
            merged = [p for parts in parts_list for p in parts]
            if all("text" in p for p in merged):
                merged = [{"text": "".join(p["text"] for p in merged)}]
            return web.json_response(chunk(merged, True))
        datas = [chunk(parts, i == len(parts_list) - 1) for i, parts in enumerate(parts_list)]
        chunks = [f"data: {json.dumps(d)}\r\n\r\n".encode() for d in datas]
        return await _stream(
            request, chunks, config.gap, {}, config.before_last_event, config.cut_after
        )


# The marker `_admit` returns for a scripted STREAM_ERROR (a 200 that breaks mid-stream).
STREAM_ERROR = web.Response(status=200)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _limit_at(config: MockConfig, since: float) -> int | None:
    """The window's limit `since` seconds after the start: the last step of the
    schedule begun by then, else the config's `limit`."""
    limit = config.limit
    for start, step in config.schedule:
        if start > since:
            break
        limit = step
    return limit


def _prompt_tail(body: bytes) -> str:
    """The last 200 characters of a chat request's first message (Anthropic's or
    OpenAI's `messages`; "" for anything else), where an agent puts the prompt: a
    benchmark tells whose request it was."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return ""
    messages = parsed.get("messages") if isinstance(parsed, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return ""
    return _text_of(messages[0].get("content"))[-200:]


def _retry_after(refusal: web.Response) -> int | None:
    """The whole seconds of a refusal's `retry-after`, if it sends them as a number."""
    value = refusal.headers.get("retry-after", "")
    return int(value) if value.isdigit() else None


def parse_schedule(text: str) -> tuple[tuple[float, int], ...]:
    """`0:6,40:2,80:6` as schedule steps: (seconds since the start, limit), ascending,
    each limit at least 1."""
    steps = []
    for part in text.split(","):
        start, _, limit = part.partition(":")
        steps.append((float(start), int(limit)))
    if [s for s, _ in steps] != sorted(s for s, _ in steps) or min(n for _, n in steps) < 1:
        raise ValueError(f"not ascending steps of limits >= 1: {text!r}")
    return tuple(steps)


def _has_tool_result(body: Any) -> bool:
    messages = body.get("messages") or []
    last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
    return isinstance(last, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in last
    )


def _tool_results(body: Any) -> int:
    """How many user turns of an Anthropic request carry a `tool_result`."""
    count = 0
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") == "user" and isinstance(content, list):
            count += any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    return count


def _text_of(value: Any) -> str:
    """All the text of a system prompt or a message's content (a string or blocks)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(_text_of(b.get("text") if isinstance(b, dict) else b) for b in value)
    return ""


def _named_edit(body: Any, edits: tuple[Edit, ...]) -> Edit | None:
    """The scripted edit whose path the conversation's first user message names."""
    messages = body.get("messages") or []
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    prompt = _text_of(first.get("content"))
    return next((e for e in edits if re.search(rf"\b{re.escape(e.path)}\b", prompt)), None)


def _edit_call(body: Any, edits: tuple[Edit, ...]) -> tuple[str, dict[str, Any]] | None:
    """The tool call of a scripted edit's turn: Read the file (Claude Code refuses to
    Edit a file it has not read), then Edit it; None once both have answered, or if the
    prompt names no scripted edit.  The path is made absolute against the "Primary
    working directory" Claude Code's system prompt states, as its tools want it."""
    edit = _named_edit(body, edits)
    if edit is None:
        return None
    found = re.search(r"[Ww]orking directory: (\S+)", _text_of(body.get("system")))
    path = f"{found[1]}/{edit.path}" if found else edit.path
    turn = _tool_results(body)
    if turn == 0:
        return "Read", {"file_path": path}
    if turn == 1:
        return "Edit", {"file_path": path, "old_string": edit.old, "new_string": edit.new}
    return None


def _has_call_output(body: Any) -> bool:
    """Whether a Responses request's input carries a tool's result (the second turn)."""
    items = body.get("input") or []
    return any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)


def _shell_tool(body: Any) -> tuple[str, Callable[[str], dict[str, Any]]] | None:
    """The shell tool a Responses request offers, and how it takes a command line:
    Codex offers `exec_command` ({"cmd": ...}) or the older `shell` ({"command": argv})."""
    names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    if "exec_command" in names:
        return "exec_command", lambda line: {"cmd": line}
    if "shell" in names:
        return "shell", lambda line: {"command": ["bash", "-lc", line]}
    return None


async def _stream(
    request: web.Request,
    chunks: list[bytes],
    gap: float,
    headers: Mapping[str, str],
    before_last_event: Callable[[], Awaitable[object]] | None = None,
    cut_after: int | None = None,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200,
        headers={"content-type": "text/event-stream", "cache-control": "no-cache", **headers},
    )
    await response.prepare(request)
    for i, chunk in enumerate(chunks):
        if gap and i:
            await asyncio.sleep(gap)
        if before_last_event is not None and i == len(chunks) - 1:
            await before_last_event()
        if i == cut_after and request.transport is not None:
            request.transport.abort()
            return response
        await response.write(chunk)
    await response.write_eof()
    return response


def rate_limit_words(limit: int, window: float) -> str:
    """The message of Anthropic's 429 `rate_limit_error` (as users quote it, e.g.
    bhouston/mycoder#62: "... of 40,000 input tokens per minute. For details, ..."),
    stating the mock's own limit and window; the real API's windows are a minute."""
    per = {1.0: "second", 60.0: "minute", 3600.0: "hour"}.get(window, f"{window:g} seconds")
    return (
        f"This request would exceed the rate limit for your organization (mock) of {limit}"
        f" requests per {per}. For details, refer to: https://docs.claude.com/en/api/rate-limits."
        " You can see the response headers for current usage. Please reduce the prompt length"
        " or the maximum tokens requested, or try again later."
    )


def _anthropic_error(
    status: int,
    kind: str,
    message: str,
    headers: Mapping[str, str] | None = None,
    details: Mapping[str, str] | None = None,
) -> web.Response:
    error: dict[str, Any] = {"type": kind, "message": message}
    if details:
        error["details"] = dict(details)
    return web.json_response(
        {"type": "error", "error": error, "request_id": "req_mockerror"},
        status=status,
        headers=headers,
    )


def _openai_error(
    status: int, kind: str, code: str, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        status=status,
        headers=headers,
    )


def _has_function_response(body: Any) -> bool:
    contents = body.get("contents") or []
    last = contents[-1].get("parts") if contents and isinstance(contents[-1], dict) else None
    return isinstance(last, list) and any(
        isinstance(p, dict) and "functionResponse" in p for p in last
    )


def _gemini_error(
    status: int,
    state: str,
    message: str,
    details: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    error: dict[str, Any] = {"code": status, "message": message, "status": state}
    if details:
        error["details"] = details
    return web.json_response({"error": error}, status=status, headers=headers)


def _gemini_fault(scripted: _Script, model: str) -> web.Response:
    """A scripted fault as the Gemini API words it (the bodies of real answers, see the
    Fault table); a retry-after becomes the RetryInfo's `retryDelay`."""
    headers = {k: v for k, v in scripted.headers.items() if k.lower() != "retry-after"}
    fault = scripted.fault
    if fault in (Fault.RATE_LIMIT, Fault.DAILY_QUOTA):
        delay = scripted.headers.get("retry-after", "1")
        per = "Day" if fault is Fault.DAILY_QUOTA else "Minute"
        limit = 250 if fault is Fault.DAILY_QUOTA else 10
        metric = "generativelanguage.googleapis.com/generate_content_free_tier_requests"
        message = (
            "You exceeded your current quota, please check your plan and billing details. "
            "For more information on this error, head to: "
            "https://ai.google.dev/gemini-api/docs/rate-limits.\n"
            f"* Quota exceeded for metric: {metric}, limit: {limit}, model: {model}\n"
            f"Please retry in {delay}s."
        )
        violation = {
            "quotaMetric": metric,
            "quotaId": f"GenerateRequestsPer{per}PerProjectPerModel-FreeTier",
            "quotaDimensions": {"location": "global", "model": model},
            "quotaValue": str(limit),
        }
        details: list[dict[str, Any]] = [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]},
            {
                "@type": "type.googleapis.com/google.rpc.Help",
                "links": [
                    {
                        "description": "Learn more about Gemini API quotas",
                        "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
                    }
                ],
            },
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": f"{delay}s"},
        ]
        return _gemini_error(429, "RESOURCE_EXHAUSTED", message, details, headers)
    if fault is Fault.OVERLOADED:
        return _gemini_error(
            503, "UNAVAILABLE", "The model is overloaded. Please try again later.", None, headers
        )
    if fault is Fault.UNAUTHORIZED:
        info = {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "API_KEY_INVALID",
            "domain": "googleapis.com",
            "metadata": {"service": "generativelanguage.googleapis.com"},
        }
        return _gemini_error(
            400,
            "INVALID_ARGUMENT",
            "API key not valid. Please pass a valid API key.",
            [info],
            headers,
        )
    if fault is Fault.STREAM_ERROR:
        return _gemini_error(500, "INTERNAL", "An internal error has occurred.", None, headers)
    return _gemini_error(
        429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).", None, headers
    )


def _fault(scripted: _Script, *, openai: bool) -> web.Response:
    headers = scripted.headers
    fault = Fault.RATE_LIMIT if scripted.fault is Fault.DAILY_QUOTA else scripted.fault
    if openai:
        if fault is Fault.RATE_LIMIT:
            return _openai_error(
                429, "requests", "rate_limit_exceeded", "Rate limit reached", headers
            )
        if fault is Fault.OVERLOADED:
            return _openai_error(
                503, "server_error", "server_error", "The engine is currently overloaded", headers
            )
        if fault is Fault.UNAUTHORIZED:
            return _openai_error(
                401, "invalid_request_error", "invalid_api_key", "Incorrect API key"
            )
        if fault is Fault.USAGE_WINDOW and scripted.message:
            return _openai_error(
                429, "usage_limit_reached", "usage_limit_reached", scripted.message, headers
            )
        if fault is Fault.STREAM_ERROR:
            return _openai_error(500, "server_error", "server_error", "The server had an error")
        if fault is Fault.USAGE_WINDOW:
            return _usage_window(headers)
        code = {
            Fault.SPEND_LIMIT: "insufficient_quota",
            Fault.CREDIT: "credit_balance_exhausted",
            Fault.USAGE_LIMIT: "organization_usage_limit_exceeded",
        }[fault]
        return _openai_error(
            429, "insufficient_quota", code, "You exceeded your current quota", headers
        )
    if fault is Fault.RATE_LIMIT:
        return _anthropic_error(429, "rate_limit_error", scripted.message or "mock limit", headers)
    if fault is Fault.OVERLOADED:
        return _anthropic_error(529, "overloaded_error", "Overloaded", headers)
    if fault is Fault.SPEND_LIMIT:
        return _anthropic_error(
            429,
            "rate_limit_error",
            SPEND_LIMIT_MESSAGE,
            headers,
            {"error_code": "enforced_spend_limit_reached"},
        )
    if fault is Fault.CREDIT:
        return _anthropic_error(400, "invalid_request_error", CREDIT_MESSAGE, headers)
    if fault is Fault.USAGE_LIMIT:
        return _anthropic_error(400, "invalid_request_error", USAGE_LIMIT_MESSAGE, headers)
    if fault is Fault.USAGE_WINDOW:
        message = scripted.message or USAGE_WINDOW_MESSAGE
        return _anthropic_error(429, "rate_limit_error", message, headers)
    return _anthropic_error(401, "authentication_error", "invalid x-api-key", headers)


def _usage_window(headers: Mapping[str, str]) -> web.Response:
    """The refusal of ChatGPT's Codex backend at a plan's usage limit, the shape the
    Codex CLI parses (`error.type` usage_limit_reached with the plan and the reset)."""
    error = {
        "type": "usage_limit_reached",
        "message": "The usage limit has been reached",
        "plan_type": "plus",
        "resets_at": int(time.time()) + USAGE_WINDOW_SECONDS,
        "resets_in_seconds": USAGE_WINDOW_SECONDS,
    }
    return web.json_response({"error": error}, status=429, headers=headers)


def main(argv: list[str] | None = None) -> None:
    """Serve in this process: print the URL, serve until stdin closes."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="the mock upstream API of fanout's tests")
    parser.add_argument("--limit", type=int, default=None, help="requests per window")
    parser.add_argument("--window", type=float, default=60.0, help="seconds")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before answering")
    parser.add_argument("--tool", action="store_true", help="answer with a Bash tool call first")
    parser.add_argument(
        "--schedule",
        type=parse_schedule,
        default=(),
        help="the limit over time, SECONDS:LIMIT steps (0:6,40:2,80:6); replaces --limit",
    )
    parser.add_argument(
        "--no-limit-headers",
        dest="limit_headers",
        action="store_false",
        help="send no anthropic-ratelimit-* / x-ratelimit-* headers, only retry-after",
    )
    options = parser.parse_args(argv)
    config = MockConfig(
        limit=options.limit,
        window=options.window,
        latency=options.latency,
        tool=options.tool,
        schedule=options.schedule,
        limit_headers=options.limit_headers,
    )
    with MockApi(config).in_thread() as api:
        print(api.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
