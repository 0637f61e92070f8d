"""The gateway on loopback, with real aiohttp on both sides, against the mock upstream
(tests/mockapi.py) in the same loop: key swap, tokens, streaming, usage, throttles,
spend and budget."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from fanout.errors import FanoutError, SpendStopped
from fanout.events import Events
from fanout.gateway import Gateway
from fanout.gateway.limiter import Limiter
from fanout.outcome import ApiUsage
from fanout.pacing.ceiling import Learned, describe
from fanout.spec.apis import FACTS, Style
from fanout.spec.model import Api, Price, Window

from mockapi import Fault, MockApi, MockConfig, Usage

KEY = "sk-ant-real-0123456789abcdef"
SONNET = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)


def ignore(error: FanoutError) -> None:
    pass


class NoJitter(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


def make_api(upstream: str, style: Style = Style.ANTHROPIC, **changes: Any) -> Api:
    facts = FACTS[style]
    fields: dict[str, Any] = {
        "name": str(style),
        "upstream": upstream,
        "style": style,
        "base_url_env": facts.base_url_env or "BASE",
        "token_env": facts.token_env or "TOKEN",
        "key_secret": "REAL_KEY",
        "prices": (("claude-sonnet-*", SONNET), ("gpt-*", Price(input=1.0, output=2.0))),
    }
    fields.update(changes)
    return Api(**fields)


@dataclass
class Rig:
    gateway: Gateway
    mock: MockApi
    client: aiohttp.ClientSession
    events: list[dict[str, Any]] = field(default_factory=list)
    stops: list[FanoutError] = field(default_factory=list)

    def token(self, deadline: float = 1e9) -> str:
        return self.gateway.grant(unit="u1", attempt=1, deadline=deadline)

    async def post(
        self, token: str, body: dict[str, Any], path: str = "/anthropic/v1/messages", **kw: Any
    ) -> tuple[int, Any, Mapping[str, str]]:
        headers = {"x-api-key": token, **kw.pop("headers", {})}
        async with self.client.post(
            self.gateway.url + path, json=body, headers=headers, **kw
        ) as answer:
            text = await answer.text()
            data = json.loads(text) if answer.content_type == "application/json" else text
            return answer.status, data, answer.headers.copy()


@asynccontextmanager
async def rig(
    config: MockConfig | None = None,
    *,
    style: Style = Style.ANTHROPIC,
    learned: Mapping[str, Learned] | None = None,
    **api: Any,
) -> AsyncIterator[Rig]:
    async with MockApi(config or MockConfig(require_key=KEY)) as mock:
        events: list[dict[str, Any]] = []
        stops: list[FanoutError] = []
        gateway = Gateway(
            [make_api(mock.url, style, **api)],
            {str(style): KEY},
            events=Events(events.append),
            stop=stops.append,
            rng=NoJitter(),
            learned=learned,
        )
        await gateway.start()
        try:
            async with aiohttp.ClientSession() as client:
                yield Rig(gateway, mock, client, events, stops)
        finally:
            await gateway.close()


def message(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


async def test_the_key_is_swapped_in_and_never_reaches_the_worker() -> None:
    async with rig() as r:
        token = r.token()
        # Claude Code sends both headers when both variables are set.
        status, data, headers = await r.post(
            token, message(), headers={"authorization": f"Bearer {token}"}
        )
        assert status == 200
        assert data["content"] == [{"type": "text", "text": "All done."}]
        assert KEY not in json.dumps(data) + repr(list(headers.items()))
        (seen,) = r.mock.posts()
        assert seen.key == KEY
        assert [v for k, v in seen.headers if k in ("x-api-key", "authorization")] == [KEY]
        assert token not in repr(seen.headers) + seen.query
        assert seen.path == "/v1/messages"


async def test_a_token_in_the_query_is_taken_out_and_the_rest_kept() -> None:
    async with rig() as r:
        token = r.token()
        path = f"/anthropic/v1/messages?beta=true&key={token}"
        status, _, _ = await r.post("", message(), path=path)
        assert status == 200
        (seen,) = r.mock.posts()
        assert (seen.query, seen.key) == ("beta=true", KEY)


async def test_a_revoked_or_unknown_token_gets_401_in_the_style_of_the_api() -> None:
    async with rig() as r:
        token = r.token()
        assert r.gateway.revoke(token) == ()
        expected = {
            "type": "error",
            "error": {
                "type": "authentication_error",
                "message": "fanout gateway: api anthropic: this token is not valid"
                " (its attempt has ended, or it was never issued)",
            },
        }
        for attempt in (token, "made-up"):
            status, data, _ = await r.post(attempt, message())
            assert (status, data) == (401, expected)
        assert r.mock.posts() == []


async def test_head_is_answered_without_a_token() -> None:
    async with rig() as r, r.client.head(r.gateway.url + "/") as answer:
        assert answer.status == 200
    assert r.mock.seen == []


async def test_a_stream_reaches_the_worker_chunk_by_chunk() -> None:
    # The mock holds its last event back until the worker has read the first one: a
    # gateway that buffered the answer would never deliver that first event.
    first_seen = asyncio.Event()
    async with rig(MockConfig(require_key=KEY, before_last_event=first_seen.wait)) as r:
        token = r.token()
        url = r.gateway.url + "/anthropic/v1/messages"
        async with r.client.post(
            url, json=message(stream=True), headers={"x-api-key": token}
        ) as answer:
            assert answer.headers["content-type"] == "text/event-stream"
            first = await asyncio.wait_for(answer.content.readuntil(b"\n\n"), 30)
            assert first.startswith(b"event: message_start\n")
            first_seen.set()
            rest = await answer.content.read()
        assert rest.endswith(b'event: message_stop\ndata: {"type": "message_stop"}\n\n')
        (usage,) = r.gateway.revoke(token)
        assert (usage.input_tokens, usage.output_tokens) == (12, 5)


async def test_usage_and_cost_equal_the_upstreams_tally() -> None:
    usage = Usage(
        input_tokens=1000, output_tokens=200, cache_read_tokens=5000, cache_write_tokens=300
    )
    async with rig(MockConfig(require_key=KEY, usage=usage)) as r:
        one, two = r.token(), r.token()
        for token, stream in ((one, True), (one, False), (two, True)):
            status, _, _ = await r.post(token, message(stream=stream))
            assert status == 200
        tally = r.mock.tally()
        assert tally == Usage(
            input_tokens=3000, output_tokens=600, cache_read_tokens=15000, cache_write_tokens=900
        )
        # USD per million: 1000*3 + 200*15 + 5000*0.3 + 300*3.75 per request.
        each = (1000 * 3.0 + 200 * 15.0 + 5000 * 0.3 + 300 * 3.75) / 1e6
        (first,) = r.gateway.revoke(one)
        assert first == ApiUsage(
            api="anthropic",
            requests=2,
            input_tokens=2000,
            output_tokens=400,
            cache_read_tokens=10000,
            cache_write_tokens=600,
            cost_usd=first.cost_usd,
            queued_seconds=first.queued_seconds,
        )
        assert first.cost_usd == pytest.approx(2 * each)
        (total,) = r.gateway.totals()
        assert (total.requests, total.input_tokens, total.output_tokens) == (3, 3000, 600)
        assert (total.cache_read_tokens, total.cache_write_tokens) == (15000, 900)
        assert total.cost_usd == pytest.approx(3 * each)


@pytest.mark.slow
async def test_a_429_with_retry_after_is_absorbed() -> None:
    async with rig() as r:
        r.mock.script(Fault.RATE_LIMIT, retry_after=1.5)
        token = r.token()
        status, data, _ = await r.post(token, message(stream=True))
        assert status == 200
        assert "message_stop" in data
        refused, accepted = r.mock.posts()
        assert (refused.status, accepted.status) == (429, 200)
        assert accepted.at - refused.at >= 1.5  # the pause is max(retry-after, 1 s backoff)
        (usage,) = r.gateway.revoke(token)
        assert (usage.requests, usage.throttles, usage.output_tokens) == (2, 1, 5)
        assert usage.queued_seconds >= 1.4
        (event,) = [e for e in r.events if e["event"] == "api.throttled"]
        assert {
            k: event[k] for k in ("api", "unit", "attempt", "status", "retryAfter", "pause")
        } == {
            "api": "anthropic",
            "unit": "u1",
            "attempt": 1,
            "status": 429,
            "retryAfter": 1.5,
            "pause": 1.5,
        }


async def test_a_529_without_retry_after_waits_the_backoff() -> None:
    async with rig() as r:
        r.mock.script(Fault.OVERLOADED)
        token = r.token()
        status, _, _ = await r.post(token, message())
        assert status == 200
        refused, accepted = r.mock.posts()
        assert (refused.status, accepted.at - refused.at >= 1.0) == (529, True)
        assert [e["pause"] for e in r.events if e["event"] == "api.throttled"] == [1.0]


@pytest.mark.slow
async def test_four_requests_throttled_by_one_burst_share_one_pause_then_go_paced() -> None:
    async with rig() as r:
        r.mock.script(Fault.RATE_LIMIT, times=4, retry_after=0.5)
        r.mock.hold()  # all four reach the upstream before any answer comes back
        token = r.token()
        posts = [asyncio.create_task(r.post(token, message())) for _ in range(4)]
        await wait_until(lambda: r.mock.in_flight == 4)
        r.mock.release()
        assert [status for status, _, _ in await asyncio.gather(*posts)] == [200] * 4
        throttled = [e for e in r.events if e["event"] == "api.throttled"]
        # One episode: one pause (the backoff's first 1 s, above the Retry-After), the
        # other three in it: no backoff of their own, none doubled.
        assert [e["episode"] for e in throttled] == ["new", "same", "same", "same"]
        assert max(e["pause"] for e in throttled) <= 1.0
        # After the pause the four go at what got through: one per 0.5 s window
        # (widened 5%), not all at once.
        retried = sorted(s.at for s in r.mock.posts()[4:])
        assert min(b - a for a, b in itertools.pairwise(retried)) >= 0.5
        ((known, text),) = r.gateway.learned().values()
        assert (known.per_window, known.window, known.throttles) == (1.0, 0.5, 4)
        assert text == describe(known)
        assert text.endswith("(none declared)")
        learned = [e for e in r.events if e["event"] == "api.learned"]
        assert {k: learned[-1][k] for k in ("api", "perWindow", "window", "text")} == {
            "api": "anthropic",
            "perWindow": 1.0,
            "window": 0.5,
            "text": text,
        }


async def test_what_the_last_run_learned_paces_from_the_first_request() -> None:
    seed = Learned(rate=4.0, window=1.0, throttles=3)
    # Declared 20 a second: alone, the window would let all four go at once.
    async with rig(learned={"anthropic": seed}, requests=Window(limit=20, per=1.0)) as r:
        token = r.token()
        await asyncio.gather(*(r.post(token, message()) for _ in range(4)))
        times = sorted(s.at for s in r.mock.posts())
        # 1.05 / 4 s apart when admitted; a loaded machine delays one arrival more than
        # the next by a few hundredths (all at once, alone, would be 0 apart).
        assert min(b - a for a, b in itertools.pairwise(times)) >= 0.2
        assert r.gateway.learned() == {
            "anthropic": (seed, "4.0 per 1.0s learned from 3 throttles (declared 20 per 1.0s)")
        }


async def test_past_the_deadline_a_429_passes_through() -> None:
    async with rig() as r:
        r.mock.script(Fault.RATE_LIMIT, retry_after=1)
        token = r.token(deadline=asyncio.get_running_loop().time() + 0.5)
        status, data, headers = await r.post(token, message())
        assert (status, data["error"]["type"], headers["retry-after"]) == (
            429,
            "rate_limit_error",
            "1",
        )
        assert len(r.mock.posts()) == 1
        (usage,) = r.gateway.revoke(token)
        assert (usage.requests, usage.throttles) == (1, 0)
        assert [e for e in r.events if e["event"] == "api.throttled"] == []


async def test_a_spend_limit_passes_through_and_stops_the_run_once() -> None:
    async with rig() as r:
        r.mock.script(Fault.SPEND_LIMIT, times=2)
        token = r.token()
        for _ in range(2):
            status, data, _ = await r.post(token, message())
            assert (status, data["error"]["details"]) == (
                429,
                {"error_code": "enforced_spend_limit_reached"},
            )
        assert len(r.mock.posts()) == 2  # not retried
        expected = (
            "api anthropic: the upstream refused for spend, credit or quota (429,"
            " rate_limit_error, enforced_spend_limit_reached: You have reached your"
            " organization's monthly spend limit; it resets at 2027-01-01T00:00:00Z.);"
            " once it accepts again, `fanout run` continues"
        )
        assert [(type(e), str(e)) for e in r.stops] == [(SpendStopped, expected)]
        assert r.gateway.stopped is r.stops[0]


async def test_no_credit_passes_through_and_stops_the_run() -> None:
    async with rig() as r:
        r.mock.script(Fault.CREDIT)
        status, data, _ = await r.post(r.token(), message())
        assert (status, data["error"]["type"]) == (400, "invalid_request_error")
        (stopped,) = r.stops
        assert "credit balance is too low" in str(stopped)


async def test_a_spent_budget_stops_the_run_and_refuses_further_requests() -> None:
    usage = Usage(input_tokens=1_000_000, output_tokens=0)  # $3.00 a request
    async with rig(MockConfig(require_key=KEY, usage=usage), budget_usd=5.0) as r:
        token = r.token()
        assert (await r.post(token, message()))[0] == 200
        assert r.stops == []
        assert (await r.post(token, message()))[0] == 200
        expected = (
            "api anthropic: the run's budget of $5.00 is spent ($6.00 used); raise [[apis]]"
            " budget and `fanout run` continues"
        )
        assert [str(e) for e in r.stops] == [expected]
        status, data, _ = await r.post(token, message())
        assert (status, data) == (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": expected}},
        )
        assert len(r.mock.posts()) == 2
        assert [e["event"] for e in r.events] == ["api.spend"]


async def test_restored_spend_counts_toward_the_budget() -> None:
    async with rig(budget_usd=5.0) as r:
        r.gateway.restore({"anthropic": 4.0})
        assert r.stops == []
        r.gateway.restore({"anthropic": 5.0})
        assert len(r.stops) == 1
        status, _, _ = await r.post(r.token(), message())
        assert status == 400
        assert r.mock.posts() == []


async def test_openai_streams_get_include_usage_and_report_it() -> None:
    usage = Usage(input_tokens=70, output_tokens=9, cache_read_tokens=30)
    async with rig(MockConfig(require_key=KEY, usage=usage), style=Style.OPENAI) as r:
        token = r.token()
        body = {"model": "gpt-5", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        headers = {"authorization": f"Bearer {token}"}
        status, text, _ = await r.post(
            "", body, path="/openai/v1/chat/completions", headers=headers
        )
        assert status == 200
        assert text.endswith("data: [DONE]\n\n")
        (seen,) = r.mock.posts()
        assert seen.json()["stream_options"] == {"include_usage": True}
        assert dict(seen.headers)["authorization"] == f"Bearer {KEY}"
        (used,) = r.gateway.revoke(token)
        assert (used.input_tokens, used.cache_read_tokens, used.output_tokens) == (70, 30, 9)
        assert used.cost_usd == pytest.approx((70 * 1.0 + 30 * 1.0 + 9 * 2.0) / 1e6)


async def test_an_openai_request_that_asks_for_usage_is_sent_byte_for_byte() -> None:
    async with rig(MockConfig(require_key=KEY), style=Style.OPENAI) as r:
        raw = (
            b'{"model":"gpt-5","stream":true,"stream_options":{"include_usage":true},"messages":[]}'
        )
        url = r.gateway.url + "/openai/v1/chat/completions"
        headers = {"authorization": f"Bearer {r.token()}", "content-type": "application/json"}
        async with r.client.post(url, data=raw, headers=headers) as answer:
            assert answer.status == 200
        assert r.mock.posts()[0].body == raw


async def test_an_unknown_api_gets_404() -> None:
    async with rig() as r:
        status, data, _ = await r.post(r.token(), message(), path="/nope/v1/messages")
        assert (status, data["error"]["message"]) == (
            404,
            "fanout gateway: no API named 'nope' here (the job's APIs: anthropic)",
        )


async def wait_until(condition: Callable[[], bool]) -> None:
    """Lets the loop run until ``condition`` holds (the gateway and the mock share it)."""
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never held")


def waiting(r: Rig) -> int:
    stats: dict[str, int] = r.gateway._proxy.routes["anthropic"].limiter.stats()
    return stats["waiting"]


async def test_a_request_queued_while_the_budget_is_spent_is_refused_unsent() -> None:
    release = asyncio.Event()
    config = MockConfig(
        require_key=KEY, usage=Usage(input_tokens=1_000_000), before_last_event=release.wait
    )
    async with rig(config, budget_usd=2.0, max_in_flight=1) as r:
        token = r.token()
        first = asyncio.create_task(r.post(token, message(stream=True)))
        await wait_until(lambda: len(r.mock.posts()) == 1)
        second = asyncio.create_task(r.post(token, message()))
        await wait_until(lambda: waiting(r) == 1)
        release.set()
        assert (await first)[0] == 200
        status, data, _ = await second
        assert (status, data["error"]["message"]) == (400, str(r.stops[0]))
        assert len(r.mock.posts()) == 1


async def test_a_worker_that_hangs_up_while_queued_leaves_the_queue() -> None:
    release = asyncio.Event()
    async with rig(
        MockConfig(require_key=KEY, before_last_event=release.wait), max_in_flight=1
    ) as r:
        token = r.token()
        first = asyncio.create_task(r.post(token, message(stream=True)))
        await wait_until(lambda: len(r.mock.posts()) == 1)
        gone = asyncio.create_task(r.post(token, message()))
        await wait_until(lambda: waiting(r) == 1)
        gone.cancel()
        await wait_until(lambda: waiting(r) == 0)
        release.set()
        assert (await first)[0] == 200
        assert (await r.post(token, message()))[0] == 200
        assert len(r.mock.posts()) == 2


@pytest.mark.slow
async def test_the_upstreams_remaining_zero_holds_the_next_request_until_its_reset() -> None:
    # The mock allows 1 request a second and says so (remaining 0, reset in RFC 3339):
    # the gateway waits for the reset instead of meeting the mock's 429.
    async with rig(MockConfig(require_key=KEY, limit=1, window=1.0)) as r:
        token = r.token()
        for _ in range(2):
            assert (await r.post(token, message()))[0] == 200
        assert [s.status for s in r.mock.posts()] == [200, 200]
        (usage,) = r.gateway.revoke(token)
        assert (usage.requests, usage.throttles) == (2, 0)
        assert usage.queued_seconds >= 0.5


async def test_gemini_gets_its_key_in_x_goog_api_key_and_the_query_loses_the_token() -> None:
    async with rig(style=Style.GEMINI) as r:
        token = r.token()
        path = f"/gemini/v1beta/models/gemini-2.5-pro:generateContent?key={token}&alt=json"
        status, _, _ = await r.post("", {"contents": []}, path=path)
        assert status == 200  # the mock answers Gemini too; it records what it got
        (seen,) = r.mock.posts()
        assert (seen.path, seen.query, seen.key) == (
            "/v1beta/models/gemini-2.5-pro:generateContent",
            "alt=json",
            KEY,
        )
        assert [v for k, v in seen.headers if k == "x-goog-api-key"] == [KEY]


async def test_an_unreachable_upstream_is_a_502_in_the_style_of_the_api() -> None:
    async with MockApi() as mock:
        closed = mock.url
    # A port nobody listens on (the mock's, after it closed).
    stops: list[FanoutError] = []
    gateway = Gateway([make_api(closed)], {"anthropic": KEY}, events=Events(), stop=stops.append)
    await gateway.start()
    try:
        async with aiohttp.ClientSession() as client:
            token = gateway.grant(unit="u", attempt=1, deadline=1e9)
            async with client.post(
                gateway.url + "/anthropic/v1/messages", json=message(), headers={"x-api-key": token}
            ) as answer:
                data = await answer.json()
        assert answer.status == 502
        assert data["type"] == "error"
        assert data["error"]["type"] == "api_error"
        assert data["error"]["message"].startswith(
            "fanout gateway: api anthropic: the upstream did not answer (ClientConnectorError"
        )
        assert KEY not in json.dumps(data)
        assert (gateway.revoke(token), stops) == ((), [])  # nothing reached the upstream
    finally:
        await gateway.close()


async def test_an_unpriced_model_is_said_once() -> None:
    async with rig() as r:
        token = r.token()
        for _ in range(2):
            assert (await r.post(token, message(model="claude-opus-4-8")))[0] == 200
        assert [(e["event"], e["model"]) for e in r.events] == [("api.unpriced", "claude-opus-4-8")]
        (usage,) = r.gateway.revoke(token)
        assert (usage.input_tokens, usage.cost_usd) == (24, 0.0)


async def test_one_token_serves_every_api_of_the_job_and_revoke_lists_them_in_job_order() -> None:
    async with MockApi(MockConfig(require_key=KEY)) as mock:
        apis = [
            make_api(mock.url, Style.OPENAI),
            make_api(mock.url, Style.ANTHROPIC),
            make_api(mock.url, Style.GEMINI),
        ]
        gateway = Gateway(apis, {"openai": KEY, "anthropic": KEY}, events=Events(), stop=ignore)
        port = gateway.port
        assert gateway.url == f"http://127.0.0.1:{port}"
        await gateway.start()
        try:
            token = gateway.grant(unit="u", attempt=3, deadline=1e9)
            async with aiohttp.ClientSession() as client:
                for path, body in (
                    ("/anthropic/v1/messages", message()),
                    ("/openai/v1/chat/completions", {"model": "gpt-5", "messages": []}),
                ):
                    async with client.post(
                        gateway.url + path, json=body, headers={"authorization": f"Bearer {token}"}
                    ) as answer:
                        assert answer.status == 200
            used = gateway.revoke(token)
            assert [(u.api, u.requests) for u in used] == [("openai", 1), ("anthropic", 1)]
            assert [(u.api, u.requests) for u in gateway.totals()] == [
                ("openai", 1),
                ("anthropic", 1),
                ("gemini", 0),
            ]
        finally:
            await gateway.close()


async def test_a_gateway_closed_without_starting_frees_its_port() -> None:
    gateway = Gateway([], {}, events=Events(), stop=ignore)
    port = gateway.port
    assert port > 0
    await gateway.close()
    await gateway.close()
    assert gateway.port == port
    probe = socket.socket()
    try:
        probe.bind(("127.0.0.1", port))
    finally:
        probe.close()


async def test_an_upstream_that_echoes_the_key_shows_the_worker_a_placeholder() -> None:
    async with rig(MockConfig(require_key="another", echo_key=True)) as r:
        status, data, _ = await r.post(r.token(), message())
        assert (status, data["error"]["message"]) == (401, "invalid x-api-key [secret]")
        assert r.mock.posts()[0].key == KEY


async def test_a_stream_the_upstream_cuts_reaches_the_worker_cut() -> None:
    # Ending it cleanly would hand the agent half an answer as if it were whole.
    async with rig(MockConfig(require_key=KEY, cut_after=1)) as r:
        token = r.token()
        url = r.gateway.url + "/anthropic/v1/messages"
        async with r.client.post(
            url, json=message(stream=True), headers={"x-api-key": token}
        ) as answer:
            assert answer.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await answer.read()
        (usage,) = r.gateway.revoke(token)  # what message_start said is counted
        assert (usage.requests, usage.input_tokens, usage.output_tokens) == (1, 12, 1)


@pytest.mark.slow
async def test_concurrent_workers_never_put_more_than_the_limit_in_any_window() -> None:
    # The mock enforces the same limit: one request too many would meet its 429.
    config = MockConfig(require_key=KEY, limit=2, window=1.0)
    async with rig(config, requests=Window(limit=2, per=1.0)) as r:
        tokens = [r.token() for _ in range(3)]
        answers = await asyncio.gather(*(r.post(t, message()) for t in tokens for _ in range(2)))
        assert [a[0] for a in answers] == [200] * 6
        assert [s.status for s in r.mock.posts()] == [200] * 6
        assert r.mock.max_in_window(1.0) == 2
        used = [r.gateway.revoke(t) for t in tokens]
        assert [(u.requests, u.throttles) for (u,) in used] == [(2, 0)] * 3


async def test_once_the_budget_is_spent_a_request_is_refused_without_queueing() -> None:
    release = asyncio.Event()
    config = MockConfig(require_key=KEY, before_last_event=release.wait)
    async with rig(config, budget_usd=5.0, max_in_flight=1) as r:
        token = r.token()
        first = asyncio.create_task(r.post(token, message(stream=True)))
        await wait_until(lambda: len(r.mock.posts()) == 1)
        r.gateway.restore({"anthropic": 5.0})
        # The only slot is taken: a refusal that queued for it would wait for ever.
        status, _, _ = await asyncio.wait_for(r.post(token, message()), 30)
        assert (status, waiting(r)) == (400, 0)
        release.set()
        assert (await first)[0] == 200


async def test_each_request_sent_upstream_tells_its_limiter_when_it_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The windows count a request from when its headers left (Limiter.sent), a retry
    # after a 429 from its own sending.
    sent: list[float] = []
    monkeypatch.setattr(Limiter, "sent", lambda self, ticket: sent.append(time.monotonic()))
    async with rig() as r:
        r.mock.script(Fault.RATE_LIMIT, retry_after=0.2)
        status, _, _ = await r.post(r.token(), message())
        assert status == 200
        refused, accepted = r.mock.posts()
        assert len(sent) == 2
        assert sent[0] <= refused.at
        assert refused.at < sent[1] <= accepted.at


def in_flight(r: Rig) -> int:
    stats: dict[str, int] = r.gateway._proxy.routes["anthropic"].limiter.stats()
    return stats["inFlight"]


async def test_an_error_reading_an_answer_still_frees_its_ticket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Anything raised between admission and the answer's end (here while its rate-limit
    # headers are read) frees the limiter's ticket on the way out: the next request of
    # a one-at-a-time API goes, instead of waiting for an in-flight slot forever.
    from fanout.gateway import ratelimits

    def broken(headers: Mapping[str, str], now: Any) -> None:
        raise RuntimeError("a bug reading the headers")

    async with rig(max_in_flight=1) as r:
        token = r.token()
        with monkeypatch.context() as patch:
            patch.setattr(ratelimits, "remaining", broken)
            status, _, _ = await r.post(token, message())
        assert status == 500
        assert in_flight(r) == 0
        async with asyncio.timeout(5):
            assert (await r.post(token, message()))[0] == 200


async def test_each_admitted_request_frees_its_ticket_exactly_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    freed: list[Any] = []  # the tickets themselves: alive, no two share an id
    settle = Limiter.settle

    def counted(self: Limiter, ticket: Any, *, input_tokens: int, output_tokens: int) -> None:
        freed.append(ticket)
        settle(self, ticket, input_tokens=input_tokens, output_tokens=output_tokens)

    monkeypatch.setattr(Limiter, "settle", counted)
    async with rig() as r:
        r.mock.script(Fault.RATE_LIMIT, retry_after=0.01)
        assert (await r.post(r.token(), message()))[0] == 200  # a throttle absorbed, then ok
        assert (await r.post(r.token(), message(stream=True)))[0] == 200
    assert len(freed) == 3
    assert len({id(ticket) for ticket in freed}) == 3
