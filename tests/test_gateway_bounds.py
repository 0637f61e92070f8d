"""What a unit controls in the gateway, bounded: its paths, its bodies, its connections
and requests in flight, its malformed requests, and what an upstream echoes of the key.
Real aiohttp on both sides, in one loop, raw sockets where a client would not misbehave."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_gateway import KEY, Rig, make_api, message, rig, wait_until
from yarl import URL

from fanout.events import Events
from fanout.gateway import Gateway, admission
from fanout.gateway.admission import Attempts
from fanout.gateway.complaints import Complaints
from fanout.gateway.connections import connection_cap
from fanout.gateway.tokens import Grant, Grants
from fanout.spec.apis import Style

from mockapi import MockApi, MockConfig


async def raw(port: int, request: bytes) -> bytes:
    """``request`` on a fresh connection; what the gateway answered until it closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


def post(path: str, token: str, body: bytes = b"{}", *, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: gw\r\nconnection: close\r\nx-api-key: {token}\r\n".encode()
        + extra
        + b"content-length: %d\r\n\r\n" % len(body)
        + body
    )


def answer_of(data: bytes) -> tuple[int, Any]:
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def notices(r: Rig) -> list[str]:
    return [e["message"] for e in r.events if e["event"] == "notice"]


# -- paths ---------------------------------------------------------------------------


async def test_dot_segments_are_resolved_before_the_request_goes_upstream() -> None:
    async with rig() as r:
        token = r.token()
        for path in ("/anthropic/v1/x/../messages", "/anthropic/v1/./%2e/messages"):
            url = URL(r.gateway.url + path, encoded=True)  # as sent, not resolved by the client
            async with r.client.post(url, json=message(), headers={"x-api-key": token}) as answer:
                assert answer.status == 200
        assert [seen.path for seen in r.mock.posts()] == ["/v1/messages", "/v1/messages"]


async def test_a_path_that_climbs_out_of_the_api_is_refused_unsent() -> None:
    # On main "/anthropic/../openai/..." went to the upstream as it was, with the key.
    async with rig() as r:
        token = r.token()
        expected: tuple[int, Any] = (
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "fanout gateway: api anthropic: the path climbs out of"
                    " /anthropic/ (a '..' segment), which the gateway does not send upstream",
                },
            },
        )
        for path in (
            "/anthropic/../v1/messages",
            "/anthropic/v1/%2e%2e/%2E%2E/x",
            "/anthropic/..%2fx",
        ):
            assert answer_of(await raw(r.gateway.port, post(path, token))) == expected
        assert r.mock.seen == []
        assert notices(r) == [expected[1]["error"]["message"]]


# -- bodies --------------------------------------------------------------------------


async def test_a_declared_body_over_the_styles_cap_gets_413_unread_and_one_line() -> None:
    async with rig(style=Style.OPENAI) as r:
        token = r.token()
        head = (
            b"POST /openai/v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
            b"authorization: Bearer " + token.encode() + b"\r\n"
            b"content-length: %d\r\n\r\n" % (50 * 1024 * 1024 + 1)
        )
        message_ = (
            "fanout gateway: api openai: the request body is over 50 MiB, the most the"
            " gateway passes to this API"
        )
        for _ in range(3):  # nothing of the body sent: the answer comes all the same
            reader, writer = await asyncio.open_connection("127.0.0.1", r.gateway.port)
            writer.write(head)
            data = await asyncio.wait_for(reader.readuntil(b"}}"), 30)
            writer.close()
            assert answer_of(data) == (
                413,
                {
                    "error": {
                        "message": message_,
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                },
            )
        assert r.mock.seen == []
        assert notices(r) == [message_]


async def test_a_chunked_body_is_refused_as_it_passes_the_cap() -> None:
    async with rig() as r:
        piece = b"x" * (1024 * 1024)

        async def body() -> AsyncIterator[bytes]:
            for _ in range(40):
                yield piece

        url = r.gateway.url + "/anthropic/v1/messages"
        async with r.client.post(url, data=body(), headers={"x-api-key": r.token()}) as answer:
            assert answer.status == 413
            assert (await answer.json())["error"]["type"] == "request_too_large"
        assert r.mock.seen == []


async def test_a_body_that_stalls_gets_408() -> None:
    async with MockApi(MockConfig(require_key=KEY)) as mock:
        events: list[dict[str, Any]] = []
        gateway = Gateway(
            [make_api(mock.url)],
            {"anthropic": KEY},
            events=Events(events.append),
            stop=print,
            idle_timeout=0.5,
        )
        await gateway.start()
        try:
            token = gateway.grant(unit="u1", attempt=1, deadline=1e9)
            request = post("/anthropic/v1/messages", token, b'{"model"')
            request = request.replace(b"content-length: 8", b"content-length: 80")
            status, data = answer_of(await raw(gateway.port, request))
            assert (status, data["error"]["message"]) == (
                408,
                "fanout gateway: api anthropic: the request body stalled (0.5 s without a byte)",
            )
        finally:
            await gateway.close()
        assert mock.seen == []


# -- an attempt's connections and requests --------------------------------------------


async def test_an_attempts_requests_beyond_its_in_flight_cap_wait_their_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "ATTEMPT_IN_FLIGHT", 2)
    release = asyncio.Event()
    async with rig(MockConfig(require_key=KEY, before_last_event=release.wait)) as r:
        token, other = r.token(), r.token()
        first = [asyncio.create_task(r.post(token, message(stream=True))) for _ in range(3)]
        await wait_until(lambda: len(r.mock.posts()) == 2)
        # Another attempt's request does not wait behind them.
        elsewhere = asyncio.create_task(r.post(other, message(stream=True)))
        await wait_until(lambda: len(r.mock.posts()) == 3)
        await asyncio.sleep(0.2)
        assert len(r.mock.posts()) == 3
        release.set()
        assert [(await task)[0] for task in (*first, elsewhere)] == [200] * 4
        assert len(r.mock.posts()) == 4
        for held in (token, other):  # nothing in flight, no body held
            grant = r.gateway._proxy.grants.holder(held)
            assert grant is not None
            assert r.gateway._proxy.attempts.counts(grant)[1:] == (0, 0)


async def test_a_connection_over_the_attempts_cap_gets_429_and_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admission, "ATTEMPT_CONNECTIONS", 2)
    async with rig() as r:
        token = r.token()
        keep = b"connection: keep-alive\r\n"
        held = []
        for _ in range(2):  # two kept-alive connections that each carried the token
            reader, writer = await asyncio.open_connection("127.0.0.1", r.gateway.port)
            writer.write(
                post("/anthropic/v1/messages", token, json.dumps(message()).encode()).replace(
                    b"connection: close\r\n", keep
                )
            )
            await asyncio.wait_for(reader.readuntil(b'"output_tokens": 5}}'), 30)
            held.append(writer)
        status, data = answer_of(await raw(r.gateway.port, post("/anthropic/v1/messages", token)))
        assert (status, data["error"]) == (
            429,
            {
                "type": "rate_limit_error",
                "message": "fanout gateway: u1 (attempt 1) has 2 connections open, the most"
                " one attempt may: close some, or wait",
            },
        )
        # Another attempt is not held by this one's connections.
        assert (await r.post(r.token(), message()))[0] == 200
        grant = r.gateway._proxy.grants.holder(token)
        assert grant is not None
        assert r.gateway._proxy.attempts.counts(grant) == (2, 0, 0)
        held.pop().close()
        await wait_until(lambda: r.gateway._proxy.attempts.counts(grant) == (1, 0, 0))
        assert (await r.post(token, message()))[0] == 200
        for writer in held:
            writer.close()


# -- malformed requests --------------------------------------------------------------


async def test_malformed_requests_make_one_line_per_kind_and_no_traceback(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # On main each printed aiohttp's traceback (2,000 requests: 1.1 MB of stderr).
    caplog.set_level(logging.DEBUG)
    async with rig() as r:
        port = r.gateway.port
        for _ in range(20):
            for request in (
                b"GET / HTTP/1.1\r\nhost: gw\r\nno colon here\r\n\r\n",
                b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",
            ):
                status_line = (await raw(port, request)).split(b"\r\n")[0]
                assert status_line.endswith(b" 400 Bad Request")
        # The gateway serves on.
        assert (await r.post(r.token(), message()))[0] == 200
    assert notices(r) == [
        "fanout gateway: a worker sent a malformed HTTP request (BadHttpMessage), answered 400",
        "fanout gateway: a worker sent a malformed HTTP request (LineTooLong), answered 400",
        "fanout gateway: a worker sent a malformed HTTP request (BadHttpMessage), answered 400"
        " (19 more like it since)",
        "fanout gateway: a worker sent a malformed HTTP request (LineTooLong), answered 400"
        " (19 more like it since)",
    ]
    assert capsys.readouterr().err == ""
    assert [record for record in caplog.records if record.name.startswith("aiohttp")] == []


# -- what the upstream echoes of the key ---------------------------------------------

# The key base64-encoded after one byte of something else: its first two characters
# and its last two depend on that byte and on the padding, the rest on the key alone.
SHIFTED = base64.b64encode(b"x" + KEY.encode()).decode()


@asynccontextmanager
async def echoing_upstream() -> AsyncIterator[str]:
    """An upstream that echoes the key it got every way it can: raw in a 200 body and
    a header, base64 and hex in a 401, split across the chunks of a stream."""

    async def messages(request: web.Request) -> web.StreamResponse:
        key = request.headers["x-api-key"]
        kind = request.query.get("echo")
        if kind == "plain":
            return web.json_response({"you_sent": key}, headers={"x-echo": f"key={key}"})
        if kind == "encoded":
            shifted = base64.b64encode(b"x" + key.encode()).decode()
            text = f"bad key {shifted} / {key.encode().hex()}"
            return web.json_response({"error": {"message": text}}, status=401)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for piece in (f'data: {{"text": "{key[:9]}', f'{key[9:]}"}}\n\n'):
            await response.write(piece.encode())
            await asyncio.sleep(0.05)  # two chunks on the wire
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_every_form_of_an_echoed_key_is_scrubbed_from_every_answer() -> None:
    # On main only a raw key in an error body was replaced.
    async with echoing_upstream() as upstream:
        gateway = Gateway([make_api(upstream)], {"anthropic": KEY}, events=Events(), stop=print)
        await gateway.start()
        try:
            token = gateway.grant(unit="u1", attempt=1, deadline=1e9)
            url = gateway.url + "/anthropic/v1/messages"
            got: dict[str, tuple[int, str, str]] = {}
            async with aiohttp.ClientSession() as client:
                for kind in ("plain", "encoded", "stream"):
                    async with client.post(
                        url, params={"echo": kind}, json=message(), headers={"x-api-key": token}
                    ) as answer:
                        text = await answer.text()
                        got[kind] = (answer.status, text, answer.headers.get("x-echo", ""))
        finally:
            await gateway.close()
    assert got["plain"] == (200, '{"you_sent": "[secret]"}', "key=[secret]")
    shifted = SHIFTED[:2] + "[secret]" + SHIFTED[-2:]
    assert got["encoded"] == (
        401,
        '{"error": {"message": "bad key ' + shifted + ' / [secret]"}}',
        "",
    )
    assert got["stream"] == (200, 'data: {"text": "[secret]"}\n\n', "")


# -- the rules, without sockets ------------------------------------------------------


def test_the_connection_cap_is_a_quarter_of_the_open_files_limit() -> None:
    assert [connection_cap(n) for n in (1024, 4096, 20000, 40, 10**6)] == [
        256,
        1024,
        1024,
        16,
        1024,
    ]


def test_a_complaint_is_said_once_a_window_and_the_rest_counted() -> None:
    events: list[dict[str, Any]] = []
    now = [0.0]
    complaints = Complaints(Events(events.append), clock=lambda: now[0])
    for at in (0.0, 1.0, 59.0):
        now[0] = at
        complaints.say("a", "fanout gateway: a")
    complaints.say("b", "fanout gateway: b")
    now[0] = 60.0
    complaints.say("a", "fanout gateway: a")  # a window later: said, with the count
    complaints.say("a", "fanout gateway: a")
    complaints.flush()
    complaints.flush()
    assert [e["message"] for e in events] == [
        "fanout gateway: a",
        "fanout gateway: b",
        "fanout gateway: a (2 more like it since the last line)",
        "fanout gateway: a (1 more like it since)",
    ]


async def step() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_an_attempts_bodies_wait_first_come_first_served_within_its_budget() -> None:
    grants = Grants(["api"])
    grant, other = (grants.holder(grants.grant(unit=u, attempt=1, deadline=1.0)) for u in "ab")
    assert grant is not None
    assert other is not None
    attempts = Attempts()
    mib = 1024 * 1024
    order: list[str] = []
    release = {name: asyncio.Event() for name in ("big", "second", "small", "other")}

    async def request(name: str, who: Grant, size: int) -> None:
        async with attempts.turn(who, size) as turn:
            order.append(name)
            await release[name].wait()
            turn.drop_body()
            order.append(f"{name} dropped")

    big = asyncio.create_task(request("big", grant, 40 * mib))
    await step()
    second = asyncio.create_task(request("second", grant, 40 * mib))
    await step()
    small = asyncio.create_task(request("small", grant, 1))  # fits, but comes after
    elsewhere = asyncio.create_task(request("other", other, 100 * mib))  # alone: passes
    await step()
    assert order == ["big", "other"]
    assert attempts.counts(grant) == (0, 1, 40 * mib)
    release["big"].set()
    await step()
    assert order == ["big", "other", "big dropped", "second", "small"]
    assert attempts.counts(grant) == (0, 2, 40 * mib + 1)
    for event in release.values():
        event.set()
    await asyncio.gather(big, second, small, elsewhere)
    assert len(attempts) == 0


async def test_a_request_that_gives_up_waiting_leaves_its_place() -> None:
    grants = Grants(["api"])
    grant = grants.holder(grants.grant(unit="u", attempt=1, deadline=1.0))
    assert grant is not None
    attempts = Attempts()
    held = asyncio.Event()

    async def hold() -> None:
        async with attempts.turn(grant, admission.ATTEMPT_BODIES):
            await held.wait()

    async def wait() -> None:
        async with attempts.turn(grant, 1):
            pass

    first = asyncio.create_task(hold())
    await step()
    gone = asyncio.create_task(wait())
    await step()
    gone.cancel()
    await step()
    assert attempts.counts(grant) == (0, 1, admission.ATTEMPT_BODIES)
    held.set()
    await first
    assert len(attempts) == 0
    async with attempts.turn(grant, 1):
        assert attempts.counts(grant) == (0, 1, 1)
