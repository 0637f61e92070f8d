"""The mock's Gemini routes (tests/mockapi.py) answer as the real Gemini API does where
gemini-cli and the gateway depend on it: the two content routes, usageMetadata, a tool
call, and the wording of its refusals."""

from __future__ import annotations

import json
from typing import Any

from test_mockapi import _post

from mockapi import Fault, MockApi, Usage

PATH = "/v1beta/models/gemini-2.5-flash"
BODY: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}


def _sse(raw: bytes) -> list[dict[str, Any]]:
    text = raw.decode()
    assert text.endswith("\r\n\r\n")
    blocks = text[:-4].split("\r\n\r\n")
    assert all(b.startswith("data: ") for b in blocks), blocks
    return [json.loads(b[len("data: ") :]) for b in blocks]


def test_generate_content_is_one_json_with_usage_metadata(mock_api: MockApi) -> None:
    mock_api.configure(usage=Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4))
    status, _, raw = _post(mock_api, PATH + ":generateContent", BODY, {"x-goog-api-key": "k1"})
    assert status == 200
    answer = json.loads(raw)
    assert answer["candidates"] == [
        {
            "content": {"parts": [{"text": "All done."}], "role": "model"},
            "index": 0,
            "finishReason": "STOP",
        }
    ]
    assert answer["usageMetadata"] == {
        "promptTokenCount": 34,
        "candidatesTokenCount": 7,
        "totalTokenCount": 41,
        "cachedContentTokenCount": 4,
    }
    [seen] = mock_api.posts()
    assert (seen.model, seen.stream, seen.key, seen.status) == (
        "gemini-2.5-flash",
        False,
        "k1",
        200,
    )


def test_a_stream_is_sse_chunks_with_usage_on_the_last(mock_api: MockApi) -> None:
    status, headers, raw = _post(mock_api, PATH + ":streamGenerateContent?alt=sse", BODY)
    assert (status, headers["content-type"]) == (200, "text/event-stream")
    chunks = _sse(raw)
    assert [c["candidates"][0]["content"]["parts"] for c in chunks] == [
        [{"text": "All"}],
        [{"text": " done."}],
    ]
    assert ["usageMetadata" in c for c in chunks] == [False, True]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert mock_api.posts()[0].stream is True


def test_tool_mode_calls_run_shell_command_until_a_function_response(mock_api: MockApi) -> None:
    mock_api.configure(tool=True, command="echo hi > x")
    _, _, raw = _post(mock_api, PATH + ":streamGenerateContent?alt=sse", BODY)
    assert _sse(raw)[0]["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"name": "run_shell_command", "args": {"command": "echo hi > x"}}}
    ]
    answered = {
        "contents": [
            *BODY["contents"],
            {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command"}}]},
        ]
    }
    _, _, raw = _post(mock_api, PATH + ":generateContent", answered)
    assert json.loads(raw)["candidates"][0]["content"]["parts"] == [{"text": "All done."}]


def test_faults_in_the_gemini_apis_words(mock_api: MockApi) -> None:
    mock_api.script(Fault.RATE_LIMIT, retry_after=7)
    mock_api.script(Fault.DAILY_QUOTA, retry_after=43)
    mock_api.script(Fault.OVERLOADED)
    mock_api.script(Fault.UNAUTHORIZED)
    answers = [_post(mock_api, PATH + ":generateContent", BODY) for _ in range(4)]
    assert [status for status, _, _ in answers] == [429, 429, 503, 400]
    # The real API says when to retry in the body, not in a retry-after header.
    assert "retry-after" not in answers[0][1]
    errors = [json.loads(raw)["error"] for _, _, raw in answers]
    assert [e["status"] for e in errors] == [
        "RESOURCE_EXHAUSTED",
        "RESOURCE_EXHAUSTED",
        "UNAVAILABLE",
        "INVALID_ARGUMENT",
    ]
    assert errors[0]["message"].endswith("model: gemini-2.5-flash\nPlease retry in 7s.")
    assert [d.get("retryDelay") for d in errors[0]["details"]] == [None, None, "7s"]
    quota_ids = [e["details"][0]["violations"][0]["quotaId"] for e in errors[:2]]
    assert quota_ids == [
        "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
        "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
    ]
    assert errors[2]["message"] == "The model is overloaded. Please try again later."
    assert errors[3]["details"][0]["reason"] == "API_KEY_INVALID"


def test_its_window_limit_answers_a_gemini_429(mock_api: MockApi) -> None:
    mock_api.configure(limit=1, window=60)
    assert _post(mock_api, PATH + ":generateContent", BODY)[0] == 200
    status, _, raw = _post(mock_api, PATH + ":generateContent", BODY)
    error = json.loads(raw)["error"]
    assert (status, error["status"], error["details"][-1]["retryDelay"]) == (
        429,
        "RESOURCE_EXHAUSTED",
        "60s",
    )
