"""What the gateway reads per API style, as pure functions: estimates, usage from JSON
bodies and SSE streams, rate-limit headers, error classification and error bodies,
prices."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from fanout.gateway import forwarding, ratelimits, styles
from fanout.gateway.answers import TokenCounts, UsageReader
from fanout.gateway.limiter import Remaining
from fanout.gateway.styles import Estimate, Verdict
from fanout.gateway.tokens import Grants
from fanout.gateway.usage import Ledger, cost_usd, price_for
from fanout.outcome import ApiUsage
from fanout.spec.apis import Style
from fanout.spec.model import Price
from fanout.values.redact import TOKEN_LENGTH, TOKEN_PREFIX

NOW = datetime(2026, 12, 1, 14, 40, 0, tzinfo=UTC)


def body(data: Any) -> bytes:
    return json.dumps(data).encode()


# -- estimates ---------------------------------------------------------------------------


def test_an_anthropic_estimate_counts_the_prompts_json_text_over_four() -> None:
    data = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "stream": True,
        "system": "be brief",  # 10 chars as JSON
        "messages": [{"role": "user", "content": "hi"}],  # 32 chars
        "metadata": {"user_id": "not prompt text"},
    }
    assert styles.estimate(Style.ANTHROPIC, body(data), "v1/messages") == Estimate(
        model="claude-sonnet-4-5", input_tokens=11, output_tokens=4096, stream=True
    )


@pytest.mark.parametrize(
    ("style", "data", "path", "output"),
    [
        (Style.OPENAI, {"max_completion_tokens": 300, "max_tokens": 7}, "v1/chat/completions", 300),
        (Style.OPENAI, {"max_tokens": 7}, "v1/chat/completions", 7),
        (Style.OPENAI, {"max_output_tokens": 50}, "v1/responses", 50),
        (Style.OPENAI, {}, "v1/chat/completions", None),
        (Style.GEMINI, {"generationConfig": {"maxOutputTokens": 99}}, "v1beta/models/g:x", 99),
        (Style.ANTHROPIC, {"max_tokens": True}, "v1/messages", None),
        (Style.OPENAI, {"input": "text"}, "v1/embeddings", 0),
        (Style.GEMINI, {"contents": []}, "v1beta/models/e:embedContent", 0),
    ],
)
def test_the_output_reservation_comes_from_the_styles_cap(
    style: Style, data: dict[str, Any], path: str, output: int | None
) -> None:
    assert styles.estimate(style, body({"messages": [], **data}), path).output_tokens == output


def test_a_gemini_estimate_takes_the_model_from_the_path_and_streams_by_method() -> None:
    data = {"contents": [{"parts": [{"text": "hello"}]}]}  # 30 chars as JSON
    path = "v1beta/models/gemini-2.5-pro:streamGenerateContent"
    assert styles.estimate(Style.GEMINI, body(data), path) == Estimate(
        model="gemini-2.5-pro", input_tokens=8, output_tokens=None, stream=True
    )


def test_what_asks_for_no_generated_text_estimates_nothing() -> None:
    nothing = Estimate(model=None, input_tokens=0, output_tokens=0, stream=False)
    prompt = body({"model": "m", "messages": ["x" * 400]})
    assert styles.estimate(Style.ANTHROPIC, b"\xff not json", "v1/messages") == nothing
    assert styles.estimate(Style.ANTHROPIC, b"", "v1/models") == nothing
    assert styles.estimate(Style.OPENAI, body({"model": "m"}), "v1/x") == nothing
    assert styles.estimate(Style.ANTHROPIC, prompt, "v1/messages/count_tokens?beta=true") == nothing
    assert styles.estimate(Style.GEMINI, prompt, "v1beta/models/g:countTokens") == nothing
    assert styles.estimate(Style.PLAIN, prompt, "x") == nothing


# -- the one body change ------------------------------------------------------------------


def test_an_openai_stream_without_include_usage_gets_it_and_keeps_its_options() -> None:
    sent = body({"model": "gpt-5", "stream": True, "stream_options": {"other": 1}})
    changed = json.loads(styles.prepared(Style.OPENAI, "v1/chat/completions", sent))
    assert changed["stream_options"] == {"other": 1, "include_usage": True}


@pytest.mark.parametrize(
    ("style", "path", "data"),
    [
        (Style.OPENAI, "v1/chat/completions", {"stream": False}),
        (
            Style.OPENAI,
            "v1/chat/completions",
            {"stream": True, "stream_options": {"include_usage": True}},
        ),
        (
            Style.OPENAI,
            "v1/responses",
            {"stream": True},
        ),  # reports usage unasked; rejects the option
        (Style.ANTHROPIC, "v1/chat/completions", {"stream": True}),
    ],
)
def test_other_bodies_go_upstream_byte_for_byte(style: Style, path: str, data: Any) -> None:
    sent = body(data)
    assert styles.prepared(style, path, sent) is sent


# -- usage --------------------------------------------------------------------------------


def sse(*events: Any, split: int = 7) -> list[bytes]:
    """The events as an SSE stream, cut into chunks of ``split`` bytes (mid-line)."""
    text = b"".join(
        (b"event: x\r\ndata: " + (e if isinstance(e, bytes) else body(e)) + b"\r\n\r\n")
        for e in events
    )
    return [text[i : i + split] for i in range(0, len(text), split)]


def read(style: Style, chunks: list[bytes], *, sse_mode: bool = True) -> TokenCounts | None:
    reader = UsageReader(style, sse=sse_mode, model="asked-model")
    for chunk in chunks:
        reader.feed(chunk)
    return reader.result()


def test_anthropic_usage_is_message_start_then_message_deltas_cumulative_counts() -> None:
    start = {
        "type": "message_start",
        "message": {
            "model": "claude-sonnet-4-5-20250929",
            "usage": {
                "input_tokens": 12,
                "cache_creation_input_tokens": 100,
                "cache_read_input_tokens": 2000,
                "output_tokens": 1,
            },
        },
    }
    delta = {"type": "message_delta", "usage": {"output_tokens": 3}}
    last = {"type": "message_delta", "usage": {"output_tokens": 57}}
    assert read(Style.ANTHROPIC, sse(start, {"type": "ping"}, delta, last)) == TokenCounts(
        model="claude-sonnet-4-5-20250929",
        input_tokens=12,
        output_tokens=57,
        cache_read_tokens=2000,
        cache_write_tokens=100,
        paced_input_tokens=112,
    )


def test_openai_usage_is_the_final_chunk_with_cached_tokens_inside_the_prompt() -> None:
    chunk = {"model": "gpt-5", "choices": [{"delta": {"content": "x"}}], "usage": None}
    final = {
        "model": "gpt-5",
        "choices": [],
        "usage": {
            "prompt_tokens": 100,
            "completion_tokens": 9,
            "prompt_tokens_details": {"cached_tokens": 30},
        },
    }
    assert read(Style.OPENAI, sse(chunk, final, b"[DONE]")) == TokenCounts(
        model="gpt-5",
        input_tokens=70,
        output_tokens=9,
        cache_read_tokens=30,
        paced_input_tokens=100,
    )


def test_openai_responses_api_usage_is_read_from_response_completed() -> None:
    done = {
        "type": "response.completed",
        "response": {
            "model": "gpt-5-codex",
            "usage": {
                "input_tokens": 50,
                "output_tokens": 5,
                "input_tokens_details": {"cached_tokens": 10},
            },
        },
    }
    assert read(Style.OPENAI, sse({"type": "response.created"}, done)) == TokenCounts(
        model="gpt-5-codex",
        input_tokens=40,
        output_tokens=5,
        cache_read_tokens=10,
        paced_input_tokens=50,
    )


def test_gemini_usage_from_usage_metadata_in_sse_and_in_a_json_array() -> None:
    meta = {
        "promptTokenCount": 80,
        "candidatesTokenCount": 7,
        "thoughtsTokenCount": 3,
        "cachedContentTokenCount": 20,
    }
    last = {"modelVersion": "gemini-2.5-pro", "usageMetadata": meta}
    expected = TokenCounts(
        model="gemini-2.5-pro",
        input_tokens=60,
        output_tokens=10,
        cache_read_tokens=20,
        paced_input_tokens=80,
    )
    first = {"usageMetadata": {"promptTokenCount": 80}}
    assert read(Style.GEMINI, sse(first, last)) == expected
    assert read(Style.GEMINI, [body([first, last])], sse_mode=False) == expected


def test_a_json_answers_usage_is_read_whole_at_the_end() -> None:
    answer = {"type": "message", "model": "m", "usage": {"input_tokens": 5, "output_tokens": 6}}
    text = body(answer)
    chunks = [text[: len(text) // 2], text[len(text) // 2 :]]
    assert read(Style.ANTHROPIC, chunks, sse_mode=False) == TokenCounts(
        model="m", input_tokens=5, output_tokens=6, paced_input_tokens=5
    )


def test_no_usage_reads_as_none() -> None:
    assert read(Style.ANTHROPIC, sse({"type": "ping"})) is None
    assert read(Style.OPENAI, [b"not json"], sse_mode=False) is None
    assert read(Style.PLAIN, sse({"usage": {"input_tokens": 1}})) is None


def test_a_stream_cut_before_its_last_blank_line_still_counts() -> None:
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 4, "output_tokens": 1}}}
    chunks = sse(start)
    assert read(Style.ANTHROPIC, [b"".join(chunks)[:-2]]) == TokenCounts(
        model="asked-model", input_tokens=4, output_tokens=1, paced_input_tokens=4
    )


# -- rate-limit headers -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "seconds"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after": "Tue, 01 Dec 2026 14:40:30 GMT"}, 30.0),
        ({"retry-after": "Tue, 01 Dec 2026 14:39:00 GMT"}, 0.0),
        ({"retry-after": "3", "retry-after-ms": "2500"}, 2.5),
        ({"retry-after-ms": "bogus", "retry-after": "4"}, 4.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-1"}, None),
        ({}, None),
    ],
)
def test_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    assert ratelimits.retry_after(headers, NOW) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("6m0s", 360.0),
        ("12ms", 0.012),
        ("1h2m3.5s", 3723.5),
        ("1.5s", 1.5),
        ("250us", 0.00025),
        ("20", 20.0),
        ("0.5", 0.5),
        ("2026-12-01T14:40:59Z", 59.0),
        ("2026-12-01T15:40:59+01:00", 59.0),
        ("2026-12-01T14:39:00Z", 0.0),
        ("6 minutes", None),
        ("1x", None),
        ("", None),
    ],
)
def test_reset_values(text: str, seconds: float | None) -> None:
    assert ratelimits.reset_seconds(text, NOW) == pytest.approx(seconds)


def test_anthropic_headers_give_each_limits_remaining_and_reset() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-12-01T14:40:02Z",
        "anthropic-ratelimit-tokens-remaining": "96000",
        "anthropic-ratelimit-tokens-reset": "2026-12-01T14:41:00Z",
        "anthropic-ratelimit-input-tokens-remaining": "80000",
        "anthropic-ratelimit-input-tokens-reset": "2026-12-01T14:40:30Z",
        "anthropic-ratelimit-output-tokens-remaining": "16000",
    }
    assert ratelimits.remaining(headers, NOW) == Remaining(
        requests=0,
        requests_reset=2.0,
        tokens=96000,
        tokens_reset=60.0,
        input_tokens=80000,
        input_tokens_reset=30.0,
        output_tokens=16000,
        output_tokens_reset=None,
        requests_limit=50,
    )


def test_openai_headers_with_go_durations() -> None:
    headers = {
        "x-ratelimit-limit-requests": "500",
        "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    assert ratelimits.remaining(headers, NOW) == Remaining(
        requests=499,
        requests_reset=0.12,
        tokens=149984,
        tokens_reset=360.0,
        requests_limit=500,
    )


def test_a_requests_limit_alone_is_said() -> None:
    # The limit without what remains of it still bounds what the gateway learns.
    assert ratelimits.remaining({"anthropic-ratelimit-requests-limit": "8"}, NOW) == Remaining(
        requests_limit=8
    )
    assert ratelimits.remaining({"x-ratelimit-limit-requests": "60"}, NOW) == Remaining(
        requests_limit=60
    )


def test_no_rate_limit_headers_say_nothing() -> None:
    assert ratelimits.remaining({"x-ratelimit-remaining-requests": "many"}, NOW) is None
    assert ratelimits.remaining({}, NOW) is None


# -- classification -----------------------------------------------------------------------


def anthropic_error(kind: str, message: str, **extra: Any) -> bytes:
    return body(
        {"type": "error", "error": {"type": kind, "message": message, **extra}, "request_id": "r"}
    )


def openai_error(kind: str, code: str | None) -> bytes:
    return body({"error": {"message": "m", "type": kind, "param": None, "code": code}})


SPEND_CAP = anthropic_error(
    "rate_limit_error",
    "monthly spend limit",
    details={"error_code": "enforced_spend_limit_reached"},
)


@pytest.mark.parametrize(
    ("style", "status", "data", "verdict"),
    [
        (Style.ANTHROPIC, 429, anthropic_error("rate_limit_error", "slow down"), Verdict.RETRY),
        (Style.ANTHROPIC, 529, anthropic_error("overloaded_error", "Overloaded"), Verdict.RETRY),
        (Style.ANTHROPIC, 429, b"<html>too many</html>", Verdict.RETRY),
        (Style.ANTHROPIC, 429, SPEND_CAP, Verdict.SPEND),
        (
            Style.ANTHROPIC,
            400,
            anthropic_error(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API.",
            ),
            Verdict.SPEND,
        ),
        (
            Style.ANTHROPIC,
            400,
            anthropic_error(
                "invalid_request_error", "You have reached your specified API usage limits."
            ),
            Verdict.SPEND,
        ),
        (Style.ANTHROPIC, 402, anthropic_error("billing_error", "pay"), Verdict.SPEND),
        (
            Style.ANTHROPIC,
            400,
            anthropic_error("invalid_request_error", "max_tokens: too big"),
            Verdict.FORWARD,
        ),
        (
            Style.ANTHROPIC,
            401,
            anthropic_error("authentication_error", "invalid x-api-key"),
            Verdict.FORWARD,
        ),
        (Style.ANTHROPIC, 500, anthropic_error("api_error", "oops"), Verdict.FORWARD),
        (Style.OPENAI, 429, openai_error("requests", "rate_limit_exceeded"), Verdict.RETRY),
        (
            Style.OPENAI,
            429,
            openai_error("insufficient_quota", "insufficient_quota"),
            Verdict.SPEND,
        ),
        (
            Style.OPENAI,
            429,
            openai_error("insufficient_quota", "credit_balance_exhausted"),
            Verdict.SPEND,
        ),
        (
            Style.OPENAI,
            429,
            openai_error("requests", "organization_spend_limit_exceeded"),
            Verdict.SPEND,
        ),
        (
            Style.OPENAI,
            429,
            openai_error("requests", "project_spend_limit_exceeded"),
            Verdict.SPEND,
        ),
        (
            Style.OPENAI,
            429,
            openai_error("requests", "organization_usage_limit_exceeded"),
            Verdict.SPEND,
        ),
        (
            Style.OPENAI,
            401,
            openai_error("invalid_request_error", "invalid_api_key"),
            Verdict.FORWARD,
        ),
        # The spend-cap body means money only where Anthropic sends it.
        (Style.OPENAI, 429, SPEND_CAP, Verdict.RETRY),
        (
            Style.GEMINI,
            429,
            body({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}),
            Verdict.RETRY,
        ),
        (Style.PLAIN, 429, b"", Verdict.RETRY),
        (Style.PLAIN, 503, b"", Verdict.FORWARD),
    ],
)
def test_classify(style: Style, status: int, data: bytes, verdict: Verdict) -> None:
    assert styles.classify(style, status, data) is verdict


def test_error_bodies_in_each_styles_shape() -> None:
    def made(style: Style, status: int, kind: str) -> Any:
        return json.loads(styles.error_body(style, status, kind, "no"))

    assert made(Style.ANTHROPIC, 401, "auth") == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "no"},
    }
    assert made(Style.OPENAI, 401, "auth") == {
        "error": {
            "message": "no",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert made(Style.OPENAI, 502, "upstream")["error"]["type"] == "server_error"
    assert made(Style.GEMINI, 400, "invalid") == {
        "error": {"code": 400, "message": "no", "status": "INVALID_ARGUMENT"}
    }
    assert made(Style.PLAIN, 404, "not_found")["error"]["message"] == "no"
    assert made(Style.ANTHROPIC, 413, "too_large")["error"]["type"] == "request_too_large"
    assert made(Style.OPENAI, 429, "busy")["error"]["code"] == "rate_limit_exceeded"
    assert made(Style.GEMINI, 408, "timeout")["error"]["status"] == "DEADLINE_EXCEEDED"
    assert made(Style.GEMINI, 429, "busy")["error"]["status"] == "RESOURCE_EXHAUSTED"


# -- prices, ledgers, tokens --------------------------------------------------------------


def test_the_first_matching_glob_prices_a_model() -> None:
    opus, sonnet, rest = (
        Price(input=15, output=75),
        Price(input=3, output=15),
        Price(input=1, output=1),
    )
    prices = (("claude-opus-*", opus), ("claude-*", sonnet), ("*", rest))
    assert price_for(prices, "claude-opus-4-8") is opus
    assert price_for(prices, "claude-sonnet-4-5") is sonnet
    assert price_for(prices, "Claude-sonnet-4-5") is rest  # case counts
    assert price_for(prices, "openrouter/x") is rest
    assert price_for(prices[:2], "gpt-5") is None
    assert price_for(prices, None) is None


def test_cached_tokens_cost_their_own_prices_or_the_input_price() -> None:
    counts = TokenCounts(
        model="m",
        input_tokens=1_000_000,
        output_tokens=2_000_000,
        cache_read_tokens=3_000_000,
        cache_write_tokens=4_000_000,
    )
    assert cost_usd(
        Price(input=3, output=15, cache_read=0.3, cache_write=3.75), counts
    ) == pytest.approx(3 + 30 + 0.9 + 15)
    assert cost_usd(Price(input=3, output=15), counts) == pytest.approx(3 + 30 + 9 + 12)


def test_a_ledger_keeps_job_order_and_lists_only_the_apis_called() -> None:
    ledger = Ledger(["a", "b", "c"])
    ledger.add(ApiUsage(api="c", requests=1, output_tokens=5))
    ledger.add(ApiUsage(api="a", requests=2))
    ledger.add(ApiUsage(api="c", requests=1, output_tokens=1))
    assert ledger.used() == (
        ApiUsage(api="a", requests=2),
        ApiUsage(api="c", requests=2, output_tokens=6),
    )
    assert [u.api for u in ledger.all()] == ["a", "b", "c"]


def test_tokens_are_fresh_and_die_on_revoke() -> None:
    grants = Grants(["a"])
    one, two = (grants.grant(unit="u", attempt=n, deadline=9.0) for n in (1, 2))
    assert one != two
    assert one.startswith(TOKEN_PREFIX)
    assert len(one) == len(TOKEN_PREFIX) + TOKEN_LENGTH  # what redaction recognises
    holder = grants.holder(one)
    assert holder is not None
    assert (holder.unit, holder.attempt, holder.deadline) == ("u", 1, 9.0)
    holder.ledger.add(ApiUsage(api="a", requests=1))
    assert grants.revoke(one) == (ApiUsage(api="a", requests=1),)
    assert grants.holder(one) is None
    assert grants.revoke(one) == ()
    assert grants.holder(two) is not None


# -- forwarding ---------------------------------------------------------------------------


def test_what_goes_upstream_loses_tokens_and_hop_by_hop_headers_and_gains_the_key() -> None:
    worker = [
        ("Host", "127.0.0.1:4000"),
        ("x-api-key", "tok"),
        ("Authorization", "Bearer tok"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("X-Secret-Hop", "1"),
        ("Content-Length", "12"),
        ("Accept-Encoding", "gzip, br"),
        ("anthropic-beta", "a"),
        ("anthropic-beta", "b"),
        ("Transfer-Encoding", "chunked"),
    ]
    assert forwarding.upstream_headers(worker, Style.ANTHROPIC, "sk-real") == [
        ("anthropic-beta", "a"),
        ("anthropic-beta", "b"),
        ("accept-encoding", "identity"),
        ("x-api-key", "sk-real"),
    ]
    assert forwarding.upstream_headers(worker, Style.OPENAI, "sk-o")[-1] == (
        "authorization",
        "Bearer sk-o",
    )
    assert forwarding.upstream_headers(worker, Style.GEMINI, "g")[-1] == ("x-goog-api-key", "g")
    assert forwarding.upstream_headers(worker, Style.ANTHROPIC, "")[-1] == (
        "accept-encoding",
        "identity",
    )


def test_what_comes_back_loses_framing_the_gateway_redoes() -> None:
    answer = [
        ("Content-Type", "text/event-stream"),
        ("Content-Length", "9"),
        ("Content-Encoding", "gzip"),
        ("Transfer-Encoding", "chunked"),
        ("request-id", "req_1"),
        ("anthropic-ratelimit-requests-remaining", "4"),
    ]
    assert forwarding.downstream_headers(answer) == [
        ("Content-Type", "text/event-stream"),
        ("request-id", "req_1"),
        ("anthropic-ratelimit-requests-remaining", "4"),
    ]


def test_the_upstream_url_keeps_its_path_and_the_query_all_but_key() -> None:
    assert (
        forwarding.upstream_url("https://h/base/", "v1/messages", "beta=true")
        == "https://h/base/v1/messages?beta=true"
    )
    assert (
        forwarding.upstream_url("https://h", "v1/a%2Fb", "key=t&alt=sse&x=%20")
        == "https://h/v1/a%2Fb?alt=sse&x=%20"
    )
    assert forwarding.upstream_url("https://h", "v1/m", "key=t") == "https://h/v1/m"


def test_dot_segments_are_resolved_and_a_climb_out_of_the_api_is_none() -> None:
    assert forwarding.within("v1/messages") == "v1/messages"
    assert forwarding.within("v1/./x/../messages") == "v1/messages"
    assert forwarding.within("v1/%2e/x/%2E%2e/messages") == "v1/messages"
    assert forwarding.within("v1/x/..") == "v1/"  # as a resolver makes it
    assert forwarding.within("v1/a%2Fb") == "v1/a%2Fb"  # an encoded slash is kept
    assert forwarding.within("v1/...") == "v1/..."  # not a dot segment
    for climbs in (
        "..",
        "../openai/v1",
        "v1/../../x",
        "%2e%2e/x",
        "v1/%2E%2E/%2e%2e",
        "v1/..%2fx",  # decoded first by some servers
        "v1/a%5C..%5Cb",
        "v1/a\\..",
        "v1/.%2F",
    ):
        assert forwarding.within(climbs) is None, climbs


def test_a_token_is_looked_for_where_each_client_puts_it() -> None:
    assert forwarding.tokens_offered(
        {"x-api-key": "a", "authorization": "bearer b"}, "key=c%2Dd"
    ) == ["a", "b", "c-d"]
    assert forwarding.tokens_offered({"authorization": "Basic b", "x-goog-api-key": "g"}, "") == [
        "g"
    ]
    assert forwarding.tokens_offered({}, "monkey=x") == []
