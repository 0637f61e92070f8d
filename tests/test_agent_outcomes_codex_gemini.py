"""What the dispatcher does with each class of the failure taxonomy the real Codex and
Gemini CLIs can be driven into against the mock APIs, through whole ``fanout run``s,
without a gateway; what both do alike is one test over both agents.

Codex (``task.agent = "codex"``) against the mock Responses API: codex calls the mock with
its own key, through a provider of the job's own (``-c model_providers.mock=...`` in
``task.args``, without retries of its own, so each refusal is one attempt's end; the
preset's config.toml points codex at a provider only for a gateway).

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

Gemini (``task.agent = "gemini"``) against the mock Gemini API: gemini calls the mock with
its own key (``GOOGLE_GEMINI_BASE_URL`` in ``task.env``), and the workspace's own
``.gemini/settings.json``, staged into the unit, turns its retries off
(``general.maxAttempts = 1``, as the preset does for a gateway), so each refusal is one
attempt's end: with its retries on, a 429 is retried with backoff past any timeout.

| class         | driven by                                          | the dispatcher |
| success       | a two-turn tool loop (`--yolo`)                    | succeeded      |
| rate-limited  | 429 RESOURCE_EXHAUSTED per minute, retryDelay      | throttled, then succeeds, no rung used |
| overloaded    | 503 UNAVAILABLE "The model is overloaded"          | throttled, then succeeds, no rung used |
| daily-quota   | 429 RESOURCE_EXHAUSTED per day                     | parked until midnight Pacific: exit 8, resumable, then succeeds |
| turn-limit    | `model.maxSessionTurns = 1` and a tool call: exit 53 | failed, climbs the ladder |
| false-success | an empty 200 stream: exit 0                        | failed         |
| spend-cap     | through a gateway whose `[[apis]]` budget is spent: its 400 | the run stops new starts: exit 7 |
| error         | 400 API_KEY_INVALID                                | failed         |

Not reachable with gemini, so not here: usage-window (the Gemini API has no
subscription window; its per-day quota is the nearest, above), and no captured output
of one exists to replay.  The Gemini API itself has no spend-cap or credit answer
either (a bare 429 "Resource has been exhausted" is a rate limit), so the spend cap
gemini meets is the gateway's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import (
    agent_job,
    agents,
    assert_parked_then_continued,
    assert_throttled_then_succeeded,
    cli,
    far_from_resets,
    finished_attempts,
    own_key,
    pin_wall_clock,
    replay_job,
    run_report,
    write_job,
)
from mockapi import Fault, MockApi

pytestmark = pytest.mark.slow

CODEX_KEY = "sk-proj-codex-outcomes-2f8a6c1e9b4d"
GEMINI_KEY = "gemini-own-key-outcomes-6d1b9e3f7a"
GOLDEN = Path(__file__).parent / "data" / "agents" / "codex"
MODEL = "gemini-2.5-flash"


def _codex_job(directory: Path, mock: MockApi, attempts: int | None = None) -> Path:
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


def _gemini_job(
    directory: Path, mock: MockApi, attempts: int | None = None, **settings: object
) -> Path:
    folder = directory / ".gemini"
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(
        json.dumps({"general": {"maxAttempts": 1}, **settings}, indent=2)
    )
    return agent_job(
        directory,
        "gemini",
        env={"GOOGLE_GEMINI_BASE_URL": mock.url},
        secrets=["GEMINI_API_KEY"],
        args=["-m", MODEL, "--yolo"],
        stage=[".gemini/settings.json"],
        attempts=attempts,
    )


JOBS = {"codex": _codex_job, "gemini": _gemini_job}


@pytest.fixture
def codex_mock(codex_cli: Path, mock_api: MockApi, monkeypatch: pytest.MonkeyPatch) -> MockApi:
    own_key(codex_cli, mock_api, monkeypatch, "OPENAI_API_KEY", CODEX_KEY, tool=True)
    return mock_api


@pytest.fixture
def gemini_mock(gemini_cli: Path, mock_api: MockApi, monkeypatch: pytest.MonkeyPatch) -> MockApi:
    own_key(gemini_cli, mock_api, monkeypatch, "GEMINI_API_KEY", GEMINI_KEY, tool=True)
    return mock_api


@pytest.mark.parametrize("agent", agents("codex", "gemini"))
def test_a_tool_loop_succeeds_with_the_agents_own_usage(
    agent: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    mock: MockApi = request.getfixturevalue(f"{agent}_mock")
    ran = cli("run", str(JOBS[agent](tmp_path, mock)))
    assert ran.code == 0, ran.out + ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("succeeded", "success")
    (unit,) = run_report(tmp_path)["units"]
    assert unit["collected"] == ["out.txt"]
    # No gateway: the agent's own count (two requests of 12 + 5).
    (used,) = unit["usage"]
    assert (used["api"], used["inputTokens"], used["outputTokens"]) == (agent, 24, 10)
    assert [p.status for p in mock.posts()] == [200, 200]


GEMINI_RATE_LIMITED = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits. "
    "* Quota exceeded for metric: generativelanguage.googleapis.com/"
    f"generate_content_free_tier_requests, limit: 10, model: {MODEL} Please retry in 0.2s. "
    "Suggested retry after 0.2s."
)


@pytest.mark.parametrize(
    ("agent", "fault", "kind", "said"),
    [
        *(
            pytest.param("codex", *case, marks=pytest.mark.agent)
            for case in [
                (
                    Fault.RATE_LIMIT,
                    "rate-limited",
                    "exceeded retry limit, last status: 429 Too Many Requests",
                ),
                (
                    Fault.OVERLOADED,
                    "overloaded",
                    "unexpected status 503 Service Unavailable: The engine is currently "
                    "overloaded, url: {url}/v1/responses",
                ),
            ]
        ),
        *(
            pytest.param("gemini", *case, marks=pytest.mark.agent)
            for case in [
                (Fault.RATE_LIMIT, "rate-limited", GEMINI_RATE_LIMITED),
                (
                    Fault.OVERLOADED,
                    "overloaded",
                    "The model is overloaded. Please try again later.",
                ),
            ]
        ),
    ],
)
def test_a_throttle_uses_no_rung_and_the_unit_then_succeeds(
    agent: str, fault: Fault, kind: str, said: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    mock: MockApi = request.getfixturevalue(f"{agent}_mock")
    mock.script(fault, retry_after=0.2 if fault is Fault.RATE_LIMIT else None)
    ran = cli("run", str(JOBS[agent](tmp_path, mock)))
    assert ran.code == 0, ran.out + ran.err
    reason = f"{agent}: {kind}: " + said.replace("{url}", mock.url)
    assert_throttled_then_succeeded(tmp_path, kind, reason)


def test_codex_a_usage_window_parks_the_run_with_exit_8_and_a_second_run_continues_it(
    codex_mock: MockApi, tmp_path: Path
) -> None:
    # ChatGPT's usage_limit_reached, resets in 90 minutes: past throttle.max (10m).
    codex_mock.script(Fault.USAGE_WINDOW)
    job = _codex_job(tmp_path, codex_mock)
    ran = cli("run", str(job))
    assert_parked_then_continued(
        job, ran, "usage-window", "You\u2019ve hit your usage limit. Upgrade to Pro"
    )
    assert [p.status for p in codex_mock.posts()] == [429, 200, 200]


def test_codex_a_spend_cap_stops_the_run_with_exit_7(codex_mock: MockApi, tmp_path: Path) -> None:
    codex_mock.script(Fault.SPEND_LIMIT)
    ran = cli("run", str(_codex_job(tmp_path, codex_mock)))
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
def test_codex_an_error_fails_the_attempt(
    codex_mock: MockApi, tmp_path: Path, fault: Fault, said: str
) -> None:
    codex_mock.script(fault)
    ran = cli("run", str(_codex_job(tmp_path, codex_mock, attempts=1)))
    assert ran.code == 1, ran.out + ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("failed", "error")
    assert attempt["reason"] == "codex: error: " + said.format(url=codex_mock.url)
    assert run_report(tmp_path)["totals"] == {"failed": 1}


def test_codex_an_exit_0_beside_turn_failed_is_a_false_success_and_fails_the_attempt(
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


def test_gemini_a_daily_quota_parks_the_run_with_exit_8_and_a_second_run_continues_it(
    gemini_mock: MockApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A per-day quota resets at the next midnight Pacific, read at a time of day hours
    # before it: past throttle.max (10m).  (At the real time it is minutes away for a
    # while every day: the run then paused the unit, as it should, and this test hung.)
    pin_wall_clock(monkeypatch, far_from_resets())
    gemini_mock.script(Fault.DAILY_QUOTA, retry_after=43)
    job = _gemini_job(tmp_path, gemini_mock)
    ran = cli("run", str(job))
    assert_parked_then_continued(
        job, ran, "daily-quota", "You have exhausted your daily quota on this model."
    )
    assert [p.status for p in gemini_mock.posts()] == [429, 200, 200]


def test_gemini_a_turn_limit_fails_the_attempt_and_climbs_the_ladder(
    gemini_mock: MockApi, tmp_path: Path
) -> None:
    # One turn allowed; the tool call's answer would be the second.
    job = _gemini_job(tmp_path, gemini_mock, model={"maxSessionTurns": 1})
    job.write_text(
        job.read_text() + '[[retry.ladder]]\nname = "first"\n[[retry.ladder]]\nname = "second"\n'
    )
    ran = cli("run", str(job))
    assert ran.code == 1, ran.out + ran.err
    attempts = finished_attempts(tmp_path)
    assert [(a["rung"], a["status"], a["kind"]) for a in attempts] == [
        ("first", "failed", "turn-limit"),
        ("second", "failed", "turn-limit"),
    ]
    assert attempts[0]["reason"] == (
        "gemini: turn-limit: Reached max session turns for this session. Increase the "
        "number of turns by specifying maxSessionTurns in settings.json."
    )
    assert run_report(tmp_path)["totals"] == {"failed": 1}


def test_gemini_an_empty_answer_is_a_false_success_and_fails_the_attempt(
    gemini_mock: MockApi, tmp_path: Path
) -> None:
    gemini_mock.configure(tool=False, text="")  # gemini exits 0 all the same
    ran = cli("run", str(_gemini_job(tmp_path, gemini_mock, attempts=1)))
    assert ran.code == 1, ran.out + ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("failed", "false-success")
    assert attempt["reason"] == (
        "gemini: false-success: The model returned an empty response with no text or "
        "thoughts. This may be a transient API issue; please try again."
    )
    assert run_report(tmp_path)["totals"] == {"failed": 1}


def test_gemini_an_error_fails_the_attempt(gemini_mock: MockApi, tmp_path: Path) -> None:
    gemini_mock.script(Fault.UNAUTHORIZED)
    ran = cli("run", str(_gemini_job(tmp_path, gemini_mock, attempts=1)))
    assert ran.code == 1, ran.out + ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("failed", "error")
    assert attempt["reason"] == "gemini: error: API key not valid. Please pass a valid API key."
    assert run_report(tmp_path)["totals"] == {"failed": 1}


def test_gemini_a_spent_budget_is_a_spend_cap_and_stops_new_starts_with_exit_7(
    gemini_mock: MockApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Through the gateway: the first answer (12 + 5 tokens at $1000 a million) spends
    # the budget, so the tool loop's second request gets the gateway's 400.
    monkeypatch.setenv("FANOUT_TEST_GEMINI_KEY", GEMINI_KEY)
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "gemini-budget"
        [inputs]
        items = ["one", "two"]
        [task]
        agent = "gemini"
        args = ["-m", "{MODEL}", "--yolo"]
        prompt = "Write done into out.txt."
        timeout = "120s"
        [runtime]
        network = true
        sandbox = "bwrap"
        maxConcurrentTasks = 1
        [[apis]]
        name = "gemini"
        upstream = "{gemini_mock.url}"
        style = "gemini"
        keySecret = "FANOUT_TEST_GEMINI_KEY"
        prices = {{ "gemini-*" = {{ input = 1000.0, output = 1000.0 }} }}
        budget = {{ usd = 0.01 }}
        """,
    )
    ran = cli("run", str(job))
    assert ran.code == 7, ran.out + ran.err
    assert "api gemini: the run's budget of $0.0100 is spent ($0.0170 used)" in ran.err
    (attempt,) = finished_attempts(tmp_path)
    assert (attempt["status"], attempt["kind"]) == ("interrupted", "spend-cap")
    assert run_report(tmp_path)["totals"] == {"interrupted": 1, "pending": 1}
    assert [p.status for p in gemini_mock.posts()] == [200]  # nothing new started
