"""What the dispatcher does with each class of the failure taxonomy the real Codex CLI
(``task.agent = "codex"``) can be driven into against the mock Responses API, through
whole ``fanout run``s, without a gateway: codex calls the mock with its own key, through
a provider of the job's own (``-c model_providers.mock=...`` in ``task.args``, without
retries of its own, so each refusal is one attempt's end; the preset's config.toml
points codex at a provider only for a gateway).

| class         | driven by                                  | the dispatcher            |
| success       | a two-turn tool loop                       | succeeded                 |
| rate-limited  | 429 rate_limit_exceeded                    | throttled, then succeeds, no rung used |
| overloaded    | 503 "engine is currently overloaded"       | throttled, then succeeds, no rung used |
| usage-window  | 429 usage_limit_reached, 90 minutes        | parked: exit 8, resumable, then succeeds |
| spend-cap     | 429 insufficient_quota                     | the run stops: exit 7     |
| error         | 401 invalid_api_key, a broken stream       | failed                    |
| false-success | codex 0.171 cannot: it exits 1 beside turn.failed; the issue's exit 0 beside it is replayed from the captured stream-error golden | failed |

Not reachable with codex at all, so not here: daily-quota (the OpenAI API and the
ChatGPT backend have no per-day refusal apart from the usage window) and turn-limit
(`codex exec` has no turn limit; its context-window refusal would be one, and the mock
has no such answer), nor a captured output of either.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import (
    agent_job,
    assert_parked_then_continued,
    assert_throttled_then_succeeded,
    cli,
    finished_attempts,
    own_key,
    replay_job,
    run_report,
)
from mockapi import Fault, MockApi

pytestmark = pytest.mark.slow

KEY = "sk-proj-codex-outcomes-2f8a6c1e9b4d"
GOLDEN = Path(__file__).parent / "data" / "agents" / "codex"


def _job(directory: Path, mock: MockApi, attempts: int | None = None) -> Path:
    provider = (
        f'{{name = "mock", base_url = "{mock.url}/v1", env_key = "OPENAI_API_KEY", '
        'wire_api = "responses", request_max_retries = 0, stream_max_retries = 0}'
    )
    return agent_job(
        directory,
        "codex",
        env={},
        secrets=["OPENAI_API_KEY"],
        # A model codex knows offers its shell tool.
        args=[
            "--model",
            "gpt-5-codex",
            "-c",
            'model_provider="mock"',
            "-c",
            f"model_providers.mock={provider}",
        ],
        attempts=attempts,
    )


@pytest.fixture
def codex_mock(codex_cli: Path, mock_api: MockApi, monkeypatch: pytest.MonkeyPatch) -> MockApi:
    own_key(codex_cli, mock_api, monkeypatch, "OPENAI_API_KEY", KEY, tool=True)
    return mock_api


def test_a_tool_loop_succeeds_with_the_agents_own_usage(
    codex_mock: MockApi, tmp_path: Path
) -> None:
    ran = cli("run", str(_job(tmp_path, codex_mock)))
    assert ran.code == 0, ran.out + ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("succeeded", "success")
    (unit,) = run_report(tmp_path)["units"]
    assert unit["collected"] == ["out.txt"]
    # No gateway: codex's own count (turn.completed.usage, two requests of 12 + 5).
    (used,) = unit["usage"]
    assert (used["api"], used["inputTokens"], used["outputTokens"]) == ("codex", 24, 10)
    assert [p.status for p in codex_mock.posts()] == [200, 200]


@pytest.mark.parametrize(
    ("fault", "kind", "said"),
    [
        (
            Fault.RATE_LIMIT,
            "rate-limited",
            "exceeded retry limit, last status: 429 Too Many Requests",
        ),
        (
            Fault.OVERLOADED,
            "overloaded",
            "unexpected status 503 Service Unavailable: The engine is currently overloaded, "
            "url: {url}/v1/responses",
        ),
    ],
)
def test_a_throttle_uses_no_rung_and_the_unit_then_succeeds(
    codex_mock: MockApi, tmp_path: Path, fault: Fault, kind: str, said: str
) -> None:
    codex_mock.script(fault, retry_after=0.2 if fault is Fault.RATE_LIMIT else None)
    ran = cli("run", str(_job(tmp_path, codex_mock)))
    assert ran.code == 0, ran.out + ran.err
    assert_throttled_then_succeeded(
        tmp_path, kind, f"codex: {kind}: " + said.format(url=codex_mock.url)
    )


def test_a_usage_window_parks_the_run_with_exit_8_and_a_second_run_continues_it(
    codex_mock: MockApi, tmp_path: Path
) -> None:
    # ChatGPT's usage_limit_reached, resets in 90 minutes: past throttle.max (10m).
    codex_mock.script(Fault.USAGE_WINDOW)
    job = _job(tmp_path, codex_mock)
    ran = cli("run", str(job))
    assert_parked_then_continued(
        job, ran, "usage-window", "You\u2019ve hit your usage limit. Upgrade to Pro"
    )
    assert [p.status for p in codex_mock.posts()] == [429, 200, 200]


def test_a_spend_cap_stops_the_run_with_exit_7(codex_mock: MockApi, tmp_path: Path) -> None:
    codex_mock.script(Fault.SPEND_LIMIT)
    ran = cli("run", str(_job(tmp_path, codex_mock)))
    assert ran.code == 7, ran.out + ran.err
    assert "codex: spend-cap: Quota exceeded. Check your plan and billing details." in ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("interrupted", "spend-cap")
    assert run_report(tmp_path)["totals"] == {"interrupted": 1}
    assert [p.status for p in codex_mock.posts()] == [429]  # nothing new started


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (
            Fault.UNAUTHORIZED,
            "unexpected status 401 Unauthorized: Incorrect API key, url: {url}/v1/responses",
        ),
        (Fault.STREAM_ERROR, "stream disconnected before completion: The server had an error"),
    ],
)
def test_an_error_fails_the_attempt(
    codex_mock: MockApi, tmp_path: Path, fault: Fault, said: str
) -> None:
    codex_mock.script(fault)
    ran = cli("run", str(_job(tmp_path, codex_mock, attempts=1)))
    assert ran.code == 1, ran.out + ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("failed", "error")
    assert attempt["reason"] == "codex: error: " + said.format(url=codex_mock.url)
    assert run_report(tmp_path)["totals"] == {"failed": 1}


def test_an_exit_0_beside_turn_failed_is_a_false_success_and_fails_the_attempt(
    tmp_path: Path,
) -> None:
    # The real stream-error capture (turn.failed), as a codex release that exits 0 there.
    ran = cli("run", str(replay_job(tmp_path, "codex", GOLDEN / "stream-error.out", 0)))
    assert ran.code == 1, ran.out + ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("failed", "false-success")
    assert attempt["reason"] == (
        "codex: false-success: stream disconnected before completion: The server had an error"
    )
    assert run_report(tmp_path)["totals"] == {"failed": 1}
