"""The mock upstream of the gateway's tests (tests/mockapi.py) behaves like the real APIs
where the gateway and the agents depend on it: its limit, its streams, its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mockapi import Fault, MockApi, MockConfig, Usage, parse_schedule, rate_limit_words


def _post(
    api: MockApi | str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        (api if isinstance(api, str) else api.url) + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return (
                response.status,
                {k.lower(): v for k, v in response.headers.items()},
                response.read(),
            )
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """Parse a server-sent event stream strictly: every event is `event:` + `data:` lines
    ended by a blank line, and the data is JSON."""
    events = []
    text = raw.decode()
    assert text.endswith("\n\n")
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        assert len(lines) == 2, block
        assert lines[0].startswith("event: "), block
        assert lines[1].startswith("data: "), block
        data = json.loads(lines[1][len("data: ") :])
        assert data["type"] == lines[0][len("event: ") :]
        events.append((data["type"], data))
    return events


MESSAGE = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 100,
    "messages": [{"role": "user", "content": "hi"}],
}


def test_it_enforces_its_own_sliding_window_with_retry_after(mock_api: MockApi) -> None:
    mock_api.configure(limit=2, window=60)
    statuses = [_post(mock_api, "/v1/messages", MESSAGE) for _ in range(3)]
    assert [s for s, _, _ in statuses] == [200, 200, 429]
    ok_headers = statuses[1][1]
    assert ok_headers["anthropic-ratelimit-requests-limit"] == "2"
    assert ok_headers["anthropic-ratelimit-requests-remaining"] == "0"
    _, headers, body = statuses[2]
    assert headers["retry-after"] == "60"
    assert json.loads(body) == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": rate_limit_words(2, 60)},
        "request_id": "req_mockerror",
    }
    assert [s.status for s in mock_api.posts()] == [200, 200, 429]
    assert mock_api.max_in_window(60) == 3


def test_its_refusal_states_its_limit_in_the_real_apis_words() -> None:
    assert rate_limit_words(2, 10) == (
        "This request would exceed the rate limit for your organization (mock) of 2 requests"
        " per 10 seconds. For details, refer to: https://docs.claude.com/en/api/rate-limits."
        " You can see the response headers for current usage. Please reduce the prompt"
        " length or the maximum tokens requested, or try again later."
    )
    assert "of 50 requests per minute." in rate_limit_words(50, 60)


def test_max_in_window_counts_arrivals_in_any_half_open_window() -> None:
    times = iter([0.0, 0.0, 1.0, 1.0, 2.0, 2.5])  # the start, then each request's arrival
    api = MockApi(clock=lambda: next(times))
    with api.in_thread():
        for _ in range(5):
            _post(api, "/v1/messages", MESSAGE)
    assert api.max_in_window(1.0) == 2  # 0.0 and 1.0 are not in one window of 1 s
    assert api.max_in_window(1.01) == 3  # 0.0, 1.0, 1.0
    assert api.max_in_window(2.0) == 4  # 1.0, 1.0, 2.0, 2.5


def test_a_scheduled_limit_changes_and_a_lowered_one_gets_an_honest_retry_after() -> None:
    # 3 per 20 s from the start, 1 from 10 s, 2 from 30 s (the clock: the start at 100,
    # then each request's arrival).
    times = iter([100.0, 100.0, 101.0, 102.0, 110.5, 121.5, 122.5, 131.0, 131.5])
    config = MockConfig(window=20, schedule=((0, 3), (10, 1), (30, 2)))
    api = MockApi(config, clock=lambda: next(times))
    with api.in_thread():
        answers = [_post(api, "/v1/messages", MESSAGE) for _ in range(8)]
    assert [status for status, _, _ in answers] == [200, 200, 200, 429, 429, 200, 200, 429]
    # At 110.5 the window holds 100, 101 and 102 and the limit is 1: one more fits once
    # 102 has left, at 122 (12 s), not when 100 leaves (10 s, the first to leave).
    assert [headers.get("retry-after") for _, headers, _ in answers] == [
        None,
        None,
        None,
        "12",
        "1",  # 0.5 s, rounded up
        None,
        None,
        "11",
    ]
    assert [
        (
            headers["anthropic-ratelimit-requests-limit"],
            headers["anthropic-ratelimit-requests-remaining"],
        )
        for _, headers, _ in answers
    ] == [
        ("3", "2"),
        ("3", "1"),
        ("3", "0"),
        ("1", "0"),
        ("1", "0"),
        ("1", "0"),
        ("2", "0"),
        ("2", "0"),
    ]
    assert [(s.since, s.limit, s.retry_after) for s in api.posts()] == [
        (0.0, 3, None),
        (1.0, 3, None),
        (2.0, 3, None),
        (10.5, 1, 12),
        (21.5, 1, 1),
        (22.5, 1, None),
        (31.0, 2, None),
        (31.5, 2, 11),
    ]
    assert api.limit_at(9.9) == 3
    assert api.limit_at(10) == 1


def test_a_limit_lowered_by_configure_gets_the_honest_retry_after_too() -> None:
    times = iter([0.0, 0.0, 1.0, 2.0, 10.5])
    api = MockApi(MockConfig(limit=3, window=20), clock=lambda: next(times))
    with api.in_thread():
        assert [_post(api, "/v1/messages", MESSAGE)[0] for _ in range(3)] == [200] * 3
        api.configure(limit=1)
        status, headers, _ = _post(api, "/v1/messages", MESSAGE)
    # Not 10 s, when the first of the three leaves: the third leaves at 22.
    assert (status, headers["retry-after"]) == (429, "12")


def test_without_limit_headers_a_429_says_only_retry_after(mock_api: MockApi) -> None:
    mock_api.configure(limit=1, window=30, limit_headers=False)
    for path, body in (
        ("/v1/messages", MESSAGE),
        ("/v1/chat/completions", {"model": "gpt-x", "messages": []}),
    ):
        mock_api.clear()
        (ok, ok_headers, _), (refused, headers, _) = (_post(mock_api, path, body) for _ in range(2))
        assert (ok, refused, headers["retry-after"]) == (200, 429, "30")
        for sent in (ok_headers, headers):
            assert [h for h in sent if "ratelimit" in h] == [], path


def test_a_stream_is_the_real_apis_events_and_a_tool_loop(mock_api: MockApi) -> None:
    mock_api.configure(
        tool=True,
        command="echo done > out.txt",
        usage=Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4, cache_write_tokens=2),
    )
    status, headers, raw = _post(mock_api, "/v1/messages?beta=true", {**MESSAGE, "stream": True})
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    events = _events(raw)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0][1]["message"]["usage"] == {
        "input_tokens": 30,
        "cache_creation_input_tokens": 2,
        "cache_read_input_tokens": 4,
        "output_tokens": 1,
    }
    assert events[1][1]["content_block"]["type"] == "tool_use"
    assert events[1][1]["content_block"]["name"] == "Bash"
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta")
    assert json.loads(partial)["command"] == "echo done > out.txt"
    assert events[6][1]["delta"]["stop_reason"] == "tool_use"
    assert events[6][1]["usage"] == {"output_tokens": 7}

    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_mock1", "content": ""}],
    }
    turn2 = {**MESSAGE, "stream": True, "messages": [{"role": "user", "content": "hi"}, result]}
    events = _events(_post(mock_api, "/v1/messages", turn2)[2])
    assert events[1][1]["content_block"] == {"type": "text", "text": ""}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == "All done."
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    seen = mock_api.posts()
    assert [(s.path, s.query, s.stream, s.model) for s in seen] == [
        ("/v1/messages", "beta=true", True, "claude-sonnet-4-5"),
        ("/v1/messages", "", True, "claude-sonnet-4-5"),
    ]
    assert mock_api.tally() == Usage(
        input_tokens=60, output_tokens=14, cache_read_tokens=8, cache_write_tokens=4
    )


def test_a_message_without_stream_is_one_json_with_usage(mock_api: MockApi) -> None:
    status, _, raw = _post(mock_api, "/v1/messages", MESSAGE)
    body = json.loads(raw)
    assert status == 200
    assert body["content"] == [{"type": "text", "text": "All done."}]
    assert body["stop_reason"] == "end_turn"
    assert body["usage"] == {
        "input_tokens": 12,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 5,
    }


def test_it_records_the_key_from_either_header(mock_api: MockApi) -> None:
    _post(mock_api, "/v1/messages", MESSAGE, {"x-api-key": "sk-one"})
    _post(
        mock_api,
        "/v1/chat/completions",
        {"model": "gpt-x", "messages": []},
        {"authorization": "Bearer sk-two"},
    )
    _post(mock_api, "/v1/messages", MESSAGE)
    assert [s.key for s in mock_api.posts()] == ["sk-one", "sk-two", ""]
    assert mock_api.tally("sk-two") == Usage(input_tokens=12, output_tokens=5)


def test_a_wrong_key_gets_401_when_a_key_is_required(mock_api: MockApi) -> None:
    mock_api.configure(require_key="sk-real")
    assert _post(mock_api, "/v1/messages", MESSAGE, {"x-api-key": "sk-real"})[0] == 200
    status, _, body = _post(mock_api, "/v1/messages", MESSAGE, {"x-api-key": "tok"})
    assert (status, json.loads(body)["error"]["type"]) == (401, "authentication_error")


def test_scripted_faults_answer_the_next_requests(mock_api: MockApi) -> None:
    mock_api.script(Fault.SPEND_LIMIT)
    mock_api.script(Fault.OVERLOADED, 1, retry_after=2)
    mock_api.script(Fault.CREDIT)
    spend, overloaded, credit, ok = (_post(mock_api, "/v1/messages", MESSAGE) for _ in range(4))
    assert spend[0] == 429
    assert "retry-after" not in spend[1]
    error = json.loads(spend[2])["error"]
    assert (error["type"], error["details"]) == (
        "rate_limit_error",
        {"error_code": "enforced_spend_limit_reached"},
    )
    assert (overloaded[0], overloaded[1]["retry-after"]) == (529, "2")
    assert json.loads(overloaded[2])["error"] == {
        "type": "overloaded_error",
        "message": "Overloaded",
    }
    assert credit[0] == 400
    assert "credit balance is too low" in json.loads(credit[2])["error"]["message"]
    assert ok[0] == 200
    assert [s.usage for s in mock_api.posts()] == [None, None, None, Usage()]


def test_openai_streams_end_with_a_usage_chunk_when_asked(mock_api: MockApi) -> None:
    mock_api.configure(usage=Usage(input_tokens=10, output_tokens=3, cache_read_tokens=6))
    body = {
        "model": "gpt-x",
        "messages": [],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    status, headers, raw = _post(mock_api, "/v1/chat/completions", body)
    assert (status, headers["content-type"]) == (200, "text/event-stream")
    blocks = raw.decode().split("\n\n")
    assert blocks[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(b[len("data: ") :]) for b in blocks[:-2]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "All done."
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 16,
        "completion_tokens": 3,
        "total_tokens": 19,
        "prompt_tokens_details": {"cached_tokens": 6},
    }
    without = _post(mock_api, "/v1/chat/completions", {**body, "stream_options": None})[2]
    assert b'"usage"' not in without
    plain = json.loads(
        _post(mock_api, "/v1/chat/completions", {"model": "gpt-x", "messages": []})[2]
    )
    assert plain["usage"]["completion_tokens"] == 3


def test_head_answers_200_without_a_key(mock_api: MockApi) -> None:
    request = urllib.request.Request(mock_api.url + "/", method="HEAD")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
    assert [(s.method, s.path, s.key) for s in mock_api.seen] == [("HEAD", "/", "")]
    assert mock_api.posts() == []


@pytest.mark.slow
def test_the_openai_sdk_worker_reads_the_mocks_stream(mock_api: MockApi, tmp_path: Path) -> None:
    mock_api.configure(usage=Usage(input_tokens=9, output_tokens=4))
    worker = Path(__file__).parent / "workers" / "openai_worker.py"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "OPENAI_BASE_URL": f"{mock_api.url}/v1",
        "OPENAI_API_KEY": "sk-worker",
    }
    for flags in ([], ["--include-usage"]):
        done = subprocess.run(
            [sys.executable, str(worker), *flags],
            input="Say it.",
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, "All done.\n"), done.stderr
        assert (tmp_path / "answer.txt").read_text() == "All done.\n"
    assert done.stderr == "usage: 9 in, 4 out\n"
    seen = mock_api.posts()
    assert [(s.path, s.key, s.model, s.stream) for s in seen] == [
        ("/v1/chat/completions", "sk-worker", "gpt-4o-mini", True)
    ] * 2
    assert [s.json().get("stream_options") for s in seen] == [None, {"include_usage": True}]


def test_scripted_headers_and_a_stream_that_breaks(mock_api: MockApi) -> None:
    mock_api.script(Fault.RATE_LIMIT, headers={"retry-after": "Wed, 01 Dec 2027 00:00:00 GMT"})
    mock_api.script(Fault.RATE_LIMIT, headers={"retry-after-ms": "1500"})
    mock_api.script(Fault.STREAM_ERROR)
    dated, ms = (_post(mock_api, "/v1/messages", MESSAGE)[1] for _ in range(2))
    assert dated["retry-after"] == "Wed, 01 Dec 2027 00:00:00 GMT"
    assert (ms["retry-after-ms"], "retry-after" in ms) == ("1500", False)
    status, _, raw = _post(mock_api, "/v1/messages", {**MESSAGE, "stream": True})
    events = _events(raw)
    assert status == 200
    assert [name for name, _ in events] == ["message_start", "error"]
    assert events[1][1]["error"] == {"type": "overloaded_error", "message": "Overloaded"}
    assert mock_api.posts()[-1].usage == Usage(input_tokens=12, output_tokens=1)
    mock_api.clear()
    assert mock_api.seen == []
    assert mock_api.tally() == Usage(input_tokens=0, output_tokens=0)


def test_openai_limit_headers_and_429(mock_api: MockApi) -> None:
    mock_api.configure(limit=1, window=30)
    body = {"model": "gpt-x", "messages": []}
    (ok, ok_headers, _), (refused, headers, raw) = (
        _post(mock_api, "/v1/chat/completions", body) for _ in range(2)
    )
    assert (ok, ok_headers["x-ratelimit-remaining-requests"]) == (200, "0")
    assert ok_headers["x-ratelimit-limit-requests"] == "1"
    assert (refused, headers["retry-after"]) == (429, "30")
    assert json.loads(raw)["error"]["code"] == "rate_limit_exceeded"


def test_it_holds_requests_and_counts_them_in_flight(mock_api: MockApi) -> None:
    mock_api.hold()
    with ThreadPoolExecutor(3) as pool:
        answers = [pool.submit(_post, mock_api, "/v1/messages", MESSAGE) for _ in range(3)]
        mock_api.wait_in_flight(3)
        assert not any(a.done() for a in answers)
        mock_api.release()
        assert [a.result()[0] for a in answers] == [200, 200, 200]
    assert (mock_api.peak_in_flight, mock_api.in_flight) == (3, 0)


def test_a_prefix_moves_the_api_below_a_path(mock_api: MockApi) -> None:
    mock_api.configure(prefix="/org/proxy")
    assert _post(mock_api, "/org/proxy/v1/messages", MESSAGE)[0] == 200
    assert _post(mock_api, "/org/proxy/v1/chat/completions", {"messages": []})[0] == 200
    assert _post(mock_api, "/v1/messages", MESSAGE)[0] == 404
    assert [s.path for s in mock_api.posts()] == [
        "/org/proxy/v1/messages",
        "/org/proxy/v1/chat/completions",
        "/v1/messages",
    ]


def test_a_body_that_is_not_a_json_object_gets_400(mock_api: MockApi) -> None:
    request = urllib.request.Request(mock_api.url + "/v1/messages", data=b"[1", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["error"]["type"] == "invalid_request_error"


def test_it_runs_as_a_process_of_its_own_with_its_record_over_http() -> None:
    mock = Path(__file__).parent / "mockapi.py"
    server = subprocess.Popen(
        [sys.executable, str(mock), "--limit", "1", "--window", "60"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert [_post(url, "/v1/messages", MESSAGE)[0] for _ in range(2)] == [200, 429]
        with urllib.request.urlopen(url + "/_mock/seen", timeout=30) as response:
            seen = json.loads(response.read())
        assert [(s["method"], s["status"], s["usage"]) for s in seen] == [
            (
                "POST",
                200,
                {
                    "input_tokens": 12,
                    "output_tokens": 5,
                    "cache_read_tokens": 0,
                    "cache_write_tokens": 0,
                },
            ),
            ("POST", 429, None),
        ]
    finally:
        assert server.stdin is not None
        server.stdin.close()
        assert server.wait(timeout=30) == 0


def test_the_process_takes_a_schedule_and_reports_each_requests_time_and_status() -> None:
    mock = Path(__file__).parent / "mockapi.py"
    server = subprocess.Popen(
        [
            sys.executable,
            str(mock),
            *("--schedule", "0:1,3600:5", "--window", "60", "--no-limit-headers"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        before = time.monotonic()
        answers = [_post(url, "/v1/messages", MESSAGE) for _ in range(2)]
        after = time.monotonic()
        assert [status for status, _, _ in answers] == [200, 429]
        assert answers[1][1]["retry-after"] == "60"
        assert [h for _, headers, _ in answers for h in headers if "ratelimit" in h] == []
        with urllib.request.urlopen(url + "/_mock/seen", timeout=30) as response:
            seen = json.loads(response.read())
        assert [(s["status"], s["limit"], s["retry_after"], s["prompt"]) for s in seen] == [
            (200, 1, None, "hi"),
            (429, 1, 60, "hi"),
        ]
        # `at` is time.monotonic(), the same clock in this process.
        assert before <= seen[0]["at"] <= seen[1]["at"] <= after
        assert 0 <= seen[0]["since"] <= seen[1]["since"] < 60
        assert seen[1]["at"] - seen[0]["at"] == pytest.approx(seen[1]["since"] - seen[0]["since"])
    finally:
        assert server.stdin is not None
        server.stdin.close()
        assert server.wait(timeout=30) == 0


def test_a_schedule_must_ascend_with_limits_of_at_least_one() -> None:
    assert parse_schedule("0:6,40:2,80:6") == ((0.0, 6), (40.0, 2), (80.0, 6))
    for bad in ("40:2,0:6", "0:0"):
        with pytest.raises(ValueError, match="not ascending steps of limits >= 1"):
            parse_schedule(bad)


def test_the_responses_api_streams_a_shell_call_then_text_with_usage(mock_api: MockApi) -> None:
    mock_api.configure(
        tool=True,
        command="echo hi",
        text="All done.",
        usage=Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4),
    )
    request = {"model": "gpt-5-codex", "stream": True, "tools": [{"name": "exec_command"}]}
    status, headers, raw = _post(mock_api, "/v1/responses", {**request, "input": []})
    assert (status, headers["content-type"]) == (200, "text/event-stream")
    events = _events(raw)
    assert [name for name, _ in events] == [
        "response.created",
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    call = events[2][1]["item"]
    assert (call["type"], call["name"], call["call_id"], json.loads(call["arguments"])) == (
        "function_call",
        "exec_command",
        "call_mock1",
        {"cmd": "echo hi"},
    )
    assert events[3][1]["response"]["usage"] == {
        "input_tokens": 34,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 41,
    }
    answered = {"type": "function_call_output", "call_id": "call_mock1", "output": "hi"}
    _, _, raw = _post(mock_api, "/v1/responses", {**request, "input": [answered]})
    events = _events(raw)
    deltas = [d["delta"] for name, d in events if name == "response.output_text.delta"]
    assert deltas == ["All", " done."]
    assert events[-2][1]["item"]["content"][0]["text"] == "All done."
    assert [(s.path, s.status) for s in mock_api.posts()] == [("/v1/responses", 200)] * 2


def test_the_responses_api_refuses_as_openai_and_as_chatgpts_usage_window(
    mock_api: MockApi,
) -> None:
    mock_api.script(Fault.USAGE_WINDOW)
    mock_api.script(Fault.SPEND_LIMIT)
    mock_api.script(Fault.STREAM_ERROR)
    body = {"model": "gpt-5-codex", "stream": True, "input": []}
    status, _, raw = _post(mock_api, "/v1/responses", body)
    error = json.loads(raw)["error"]
    assert (status, error["type"], error["plan_type"], error["resets_in_seconds"]) == (
        429,
        "usage_limit_reached",
        "plus",
        5400,
    )
    status, _, raw = _post(mock_api, "/v1/responses", body)
    assert (status, json.loads(raw)["error"]["code"]) == (429, "insufficient_quota")
    status, _, raw = _post(mock_api, "/v1/responses", body)
    assert status == 200
    assert [(name, d["response"]["status"]) for name, d in _events(raw)] == [
        ("response.created", "in_progress"),
        ("response.failed", "failed"),
    ]
