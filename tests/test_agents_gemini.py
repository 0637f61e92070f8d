"""The Gemini CLI's classifier (fanout.agents.gemini) against golden outputs of the real
CLI in both its output formats, and a live re-capture: the real gemini in bwrap against
tests/mockapi.py in each situation of the goldens, read to the same Reading.

Each golden `tests/data/agents/gemini/<case>.out` (`--output-format json`) and
`tests/data/agents/gemini/stream-json/<case>.out` (the preset's `stream-json`) is the
real CLI's stdout then stderr, byte for byte; `<case>.json` says how it was captured
(argv, env, settings, the mock's fault, the requests the mock saw), the exit code and
the expected Reading."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fanout.agents import Kind, Reading, gemini, read
from fanout.attempt.verdict import Verdict
from fanout.outcome import Status

from helpers import make_attempt, pin_wall_clock, run_agent
from mockapi import Fault, MockApi, Usage

GOLDEN = Path(__file__).parent / "data" / "agents" / "gemini"
# Each output format's goldens: the same situations, captured the same way.
FORMATS = {"stream-json": GOLDEN / "stream-json", "json": GOLDEN}
CASES = sorted(p.stem for p in GOLDEN.glob("*.out"))
TOKEN = "tok-gemini-7f3a"
NOW = datetime(2026, 12, 1, 16, 30, tzinfo=UTC)


def _golden(case: str, output_format: str = "stream-json") -> tuple[dict[str, Any], str]:
    folder = FORMATS[output_format]
    doc = json.loads((folder / f"{case}.json").read_text())
    return doc, (folder / f"{case}.out").read_bytes().decode()


def _expected(doc: dict[str, Any]) -> Reading:
    fields = dict(doc["reading"])
    return Reading(**{**fields, "kind": Kind(fields["kind"])})


@pytest.mark.parametrize("output_format", sorted(FORMATS))
def test_the_goldens_cover_every_situation_the_mock_can_drive(output_format: str) -> None:
    assert sorted(p.stem for p in FORMATS[output_format].glob("*.out")) == CASES
    assert CASES == [
        "daily_quota",
        "false_success",
        "no_auth_type",
        "overloaded",
        "rate_limit",
        "success",
        "turn_limit",
        "unauthorized",
        "untrusted",
    ]
    kinds = {case: _golden(case, output_format)[0]["reading"]["kind"] for case in CASES}
    assert kinds == {
        "daily_quota": "daily-quota",
        "false_success": "false-success",
        "no_auth_type": "error",
        "overloaded": "overloaded",
        "rate_limit": "rate-limited",
        "success": "success",
        "turn_limit": "turn-limit",
        "unauthorized": "error",
        "untrusted": "error",
    }


@pytest.mark.parametrize("output_format", sorted(FORMATS))
@pytest.mark.parametrize("case", CASES)
def test_each_golden_reads_to_its_reading(case: str, output_format: str) -> None:
    doc, output = _golden(case, output_format)
    assert doc["argv"][doc["argv"].index("--output-format") + 1] == output_format
    now = datetime.fromisoformat(doc["now"])
    reading = gemini.read(exit_code=doc["exit_code"], output=output, now=now)
    assert reading == _expected(doc)
    # The taxonomy's dispatcher finds the same module.
    assert read("gemini", exit_code=doc["exit_code"], output=output, now=now) == reading


@pytest.mark.parametrize("output_format", sorted(FORMATS))
def test_the_exit_codes_are_the_http_status_modulo_256(output_format: str) -> None:
    # What the real CLI did (the docs say 1 for an API failure): the goldens pin it.
    codes = {case: _golden(case, output_format)[0]["exit_code"] for case in CASES}
    assert codes == {
        "daily_quota": 429 % 256,
        "false_success": 0,
        "no_auth_type": 41,
        "overloaded": 503 % 256,
        "rate_limit": 429 % 256,
        "success": 0,
        "turn_limit": 53,
        "unauthorized": 400 % 256,
        "untrusted": 55,
    }


@pytest.mark.parametrize("output_format", sorted(FORMATS))
def test_success_reports_the_tokens_of_both_turns(output_format: str) -> None:
    _, output = _golden("success", output_format)
    assert gemini.read(exit_code=0, output=output, now=NOW) == Reading(
        kind=Kind.SUCCESS,
        detail="All done.",
        input_tokens=60,
        output_tokens=14,
        cache_read_tokens=8,
        model="gemini-2.5-flash",
    )


@pytest.mark.parametrize("output_format", sorted(FORMATS))
def test_the_daily_quota_resets_at_midnight_pacific(output_format: str) -> None:
    _, output = _golden("daily_quota", output_format)
    reading = gemini.read(exit_code=173, output=output, now=NOW)
    assert datetime.fromtimestamp(reading.reset_at or 0, UTC) == datetime(
        2026, 12, 2, 8, 0, tzinfo=UTC
    )
    # In summer Pacific time is UTC-7.
    summer = gemini.read(exit_code=173, output=output, now=datetime(2026, 7, 1, 12, tzinfo=UTC))
    assert summer.reset_at == datetime(2026, 7, 2, 7, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("before", "status"),
    [(timedelta(minutes=5), Status.THROTTLED), (timedelta(hours=3), Status.INTERRUPTED)],
)
async def test_a_daily_quota_minutes_from_its_reset_pauses_the_unit_and_hours_from_it_parks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: timedelta, status: Status
) -> None:
    # The reset (midnight Pacific) and its distance are read on one wall clock: within
    # retry.throttle.max (here 10 minutes) the unit waits it out, no rung used; past it
    # the run stops, resumable at the reset.
    midnight = datetime(2026, 12, 2, 8, 0, tzinfo=UTC)  # 00:00 in Los Angeles
    pin_wall_clock(monkeypatch, (midnight - before).astimezone())
    doc, output = _golden("daily_quota")
    attempt = make_attempt(tmp_path, ["gemini"])
    verdict = Verdict(dataclasses.replace(attempt, agent="gemini", longest_pause=600.0))
    verdict.capture.feed(output.encode())

    async def nothing() -> tuple[()]:
        return ()

    result = await verdict.decide(
        code=doc["exit_code"], stage="worker", control=None, collect=nothing
    )
    assert (result.status, result.kind) == (status, "daily-quota")
    if status is Status.THROTTLED:
        assert result.retry_after == pytest.approx(before.total_seconds())
    else:
        assert result.resume_at == midnight.timestamp()


def test_a_log_cut_before_the_json_reads_by_the_exit_code() -> None:
    assert gemini.read(exit_code=173, output="Attempt 1 failed: ...", now=NOW) == Reading(
        kind=Kind.RATE_LIMITED, detail="Attempt 1 failed: ..."
    )
    assert gemini.read(exit_code=247, output="", now=NOW) == Reading(
        kind=Kind.OVERLOADED, detail="no output"
    )
    assert gemini.read(exit_code=53, output="", now=NOW) == Reading(
        kind=Kind.TURN_LIMIT, detail="no output"
    )
    assert gemini.read(exit_code=41, output="boom\n", now=NOW) == Reading(
        kind=Kind.ERROR, detail="boom"
    )


def test_a_long_retry_and_a_capacity_error() -> None:
    def error(message: str, code: int = 429) -> str:
        return json.dumps(
            {"session_id": "s", "error": {"type": "Error", "message": message, "code": code}}
        )

    long = gemini.read(exit_code=173, output=error("Quota.\nSuggested retry after 400s."), now=NOW)
    assert (long.kind, long.retry_after, long.detail) == (
        Kind.RATE_LIMITED,
        400.0,
        "Quota. Suggested retry after 400s.",
    )
    capacity = gemini.read(
        exit_code=173, output=error("You have exhausted your capacity on this model."), now=NOW
    )
    assert capacity.kind is Kind.OVERLOADED


# -- the live re-capture --------------------------------------------------------------

# How each golden's situation is made: the mock's config and fault, extra settings.
LIVE: dict[str, dict[str, Any]] = {
    # Below a path, as the gateway's URL is ({gateway}/{api name}).
    "success": {"tool": True, "prefix": "/gemini"},
    "rate_limit": {"tool": True, "fault": (Fault.RATE_LIMIT, 7)},
    "daily_quota": {"tool": True, "fault": (Fault.DAILY_QUOTA, 43)},
    "overloaded": {"tool": True, "fault": (Fault.OVERLOADED, None)},
    "turn_limit": {"tool": True, "settings": {"model": {"maxSessionTurns": 1}}},
    "false_success": {"text": ""},
    "unauthorized": {"fault": (Fault.UNAUTHORIZED, None)},
    # What a preset that forgot a setting gets.
    "no_auth_type": {"no_settings": True},
    "untrusted": {"env_drop": "GEMINI_CLI_TRUST_WORKSPACE"},
}

# What a preset needs for gemini headless against a gateway (the README says why).
SETTINGS: dict[str, Any] = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {
        "enableAutoUpdate": False,
        "enableAutoUpdateNotification": False,
        "maxAttempts": 1,
    },
}


def _gemini(
    gemini_cli: Path, api: MockApi, tmp_path: Path, live: dict[str, Any], output_format: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run `gemini -p` once in a bwrap sandbox (network on: the mock is on the host's
    loopback), the prompt on stdin, nothing in its environment but what is named here."""
    base = tmp_path / "sandbox"
    (base / "home" / ".gemini").mkdir(parents=True)
    merged = {k: dict(v) for k, v in SETTINGS.items()}
    for key, values in live.get("settings", {}).items():
        merged.setdefault(key, {}).update(values)
    if not live.get("no_settings"):
        (base / "home" / ".gemini" / "settings.json").write_text(json.dumps(merged))
    environment = {
        "HOME": str(base / "home"),
        "GOOGLE_GEMINI_BASE_URL": api.url + live.get("prefix", ""),
        "GEMINI_API_KEY": TOKEN,
        "GEMINI_CLI_TRUST_WORKSPACE": "true",
    }
    environment.pop(live.get("env_drop", ""), None)
    args = ["-p", "", "--output-format", output_format, "-m", "gemini-2.5-flash", "--yolo"]
    done = run_agent(gemini_cli, args, base, environment, stdin="Write done to out.txt.")
    return done, base / "work"


@pytest.mark.slow
@pytest.mark.parametrize("output_format", sorted(FORMATS))
@pytest.mark.parametrize("case", CASES)
def test_the_real_cli_still_gives_each_golden_reading(
    gemini_cli: Path, mock_api: MockApi, tmp_path: Path, case: str, output_format: str
) -> None:
    live = LIVE[case]
    mock_api.configure(
        tool=live.get("tool", False),
        text=live.get("text", "All done."),
        usage=Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4),
        prefix=live.get("prefix", ""),
    )
    if "fault" in live:
        fault, retry_after = live["fault"]
        mock_api.script(fault, 20, retry_after=retry_after)
    done, work = _gemini(gemini_cli, mock_api, tmp_path, live, output_format)

    doc, _ = _golden(case, output_format)
    assert done.returncode == doc["exit_code"], (done.stdout, done.stderr)
    reading = gemini.read(exit_code=done.returncode, output=done.stdout + done.stderr, now=NOW)
    assert dataclasses.asdict(reading) == dataclasses.asdict(_expected(doc))
    posts = mock_api.posts()
    prefix = live.get("prefix", "")
    assert [[s.path.removeprefix(prefix), s.status] for s in posts] == doc["requests"]
    assert all(s.path.startswith(prefix) for s in posts)
    if posts:
        assert {(s.key, s.query) for s in posts} == {(TOKEN, "alt=sse")}
        # The prompt came from stdin.
        first = posts[0].json()["contents"][-1]["parts"]
        assert any("Write done to out.txt." in p.get("text", "") for p in first)
    if case == "success":
        assert (work / "out.txt").read_text() == "done\n"
    # The CLI keeps its session in HOME, but never the key it was given.
    written = [p for p in work.parent.rglob("*") if p.is_file()]
    assert [p for p in written if TOKEN.encode() in p.read_bytes()] == []


def test_tokens_are_summed_over_the_router_and_the_main_model_with_thoughts() -> None:
    # The shape of a run with the default "auto" model (captured: the router's classifier
    # calls on flash-lite, then the main model), thinking tokens added.
    def model(role: str, inputs: int, candidates: int, cached: int, thoughts: int) -> Any:
        tokens = {
            "input": inputs,
            "prompt": inputs + cached,
            "candidates": candidates,
            "cached": cached,
            "thoughts": thoughts,
        }
        return {"api": {"totalRequests": 1}, "tokens": tokens, "roles": {role: {"tokens": tokens}}}

    result = {
        "session_id": "s",
        "response": "ok",
        "stats": {
            "models": {
                "gemini-3.5-flash-lite": model("utility_router", 150, 35, 20, 0),
                "gemini-3.1-pro-preview": model("main", 30, 7, 4, 11),
            }
        },
    }
    output = "Warning: ...\n" + json.dumps(result, indent=2) + "\n"
    assert gemini.read(exit_code=0, output=output, now=NOW) == Reading(
        kind=Kind.SUCCESS,
        detail="ok",
        input_tokens=180,
        output_tokens=53,
        cache_read_tokens=24,
        model="gemini-3.1-pro-preview",
    )


def test_the_gateway_stopping_the_api_for_money_is_a_spend_cap() -> None:
    # The unauthorized golden's shape: a 400 the CLI does not recognise is printed as the
    # raw body; here the body fanout's gateway answers once the API's budget is spent.
    said = "api gemini: the run's budget of $5.00 is spent ($5.01 used); raise [[apis]] budget"
    body = json.dumps({"error": {"code": 400, "message": said, "status": "INVALID_ARGUMENT"}})
    error = {"type": "Error", "message": body, "code": 400}
    output = json.dumps({"session_id": "s", "error": error}, indent=2) + "\n"
    assert gemini.read(exit_code=144, output=output, now=NOW) == Reading(
        kind=Kind.SPEND_CAP, detail=said
    )


def _stream(*events: dict[str, Any]) -> str:
    return "".join(json.dumps({"timestamp": "t", **event}) + "\n" for event in events)


def test_stream_json_counts_thoughts_from_the_total_and_takes_the_model_it_started() -> None:
    # stream-json's stats name no role and leave thinking out of output_tokens; the
    # total holds them (prompt + candidates + thoughts).
    def model(inputs: int, candidates: int, cached: int, thoughts: int) -> dict[str, int]:
        prompt = inputs + cached
        return {
            "total_tokens": prompt + candidates + thoughts,
            "input_tokens": prompt,
            "output_tokens": candidates,
            "cached": cached,
            "input": inputs,
        }

    models = {
        "gemini-3.5-flash-lite": model(150, 35, 20, 0),
        "gemini-3.1-pro-preview": model(30, 7, 4, 11),
    }
    output = _stream(
        {"type": "init", "session_id": "s", "model": "gemini-3.1-pro-preview"},
        {"type": "message", "role": "assistant", "content": "o", "delta": True},
        {"type": "message", "role": "assistant", "content": "k", "delta": True},
        {"type": "result", "status": "success", "stats": {"models": models}},
    )
    expected = Reading(
        kind=Kind.SUCCESS,
        detail="ok",
        input_tokens=180,
        output_tokens=53,
        cache_read_tokens=24,
        model="gemini-3.1-pro-preview",
    )
    assert gemini.read(exit_code=0, output=output, now=NOW) == expected
    # Started as "auto" (no model of that name answered): the last one that did.
    auto = output.replace('"model": "gemini-3.1-pro-preview"', '"model": "auto"')
    assert gemini.read(exit_code=0, output=auto, now=NOW) == expected


def test_stream_json_without_its_result_reads_by_the_exit_code() -> None:
    started = _stream(
        {"type": "init", "session_id": "s", "model": "gemini-2.5-flash"},
        {"type": "message", "role": "assistant", "content": "All", "delta": True},
    )
    assert gemini.read(exit_code=0, output=started, now=NOW) == Reading(
        kind=Kind.SUCCESS, detail="exit 0, no JSON result"
    )
    assert gemini.read(exit_code=173, output=started + "[fanout: cut]\n", now=NOW) == Reading(
        kind=Kind.RATE_LIMITED, detail="[fanout: cut]"
    )


def test_stream_json_unwraps_the_gateways_spent_budget_from_its_api_error() -> None:
    said = "api gemini: the run's budget of $5.00 is spent ($5.01 used); raise [[apis]] budget"
    body = json.dumps({"error": {"code": 400, "message": said, "status": "INVALID_ARGUMENT"}})
    error = {"type": "unknown", "message": f"[API Error: {body}]"}
    output = _stream({"type": "result", "status": "error", "error": error, "stats": {}})
    assert gemini.read(exit_code=144, output=output, now=NOW) == Reading(
        kind=Kind.SPEND_CAP, detail=said
    )
