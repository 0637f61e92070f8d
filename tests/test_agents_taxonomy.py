"""fanout.agents: the taxonomy's names (journal and report values, so they must not
change by accident) and `read`, which dispatches to `fanout.agents.<agent>` lazily."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from datetime import UTC, datetime
from pathlib import Path

import pytest

from fanout import agents
from fanout.agents import AGENTS, Kind, Reading
from fanout.agents.providers import stated_window

NOW = datetime(2026, 12, 1, 16, 0, tzinfo=UTC)
DATA = Path(__file__).parent / "data" / "agents"
# No CLI of these runs in the tests: their goldens are their documented output, each
# .json saying where it is documented (the real CLIs' goldens have tests of their own).
DOCUMENTED = ("aider", "llm")


def test_the_kinds_and_their_values() -> None:
    assert [(k.name, k.value) for k in Kind] == [
        ("SUCCESS", "success"),
        ("FALSE_SUCCESS", "false-success"),
        ("OVERLOADED", "overloaded"),
        ("RATE_LIMITED", "rate-limited"),
        ("USAGE_WINDOW", "usage-window"),
        ("DAILY_QUOTA", "daily-quota"),
        ("SPEND_CAP", "spend-cap"),
        ("TURN_LIMIT", "turn-limit"),
        ("ERROR", "error"),
    ]
    assert AGENTS == ("claude", "codex", "gemini", "aider", "llm")


def test_a_reading_is_frozen_and_says_nothing_it_was_not_told() -> None:
    reading = Reading(kind=Kind.ERROR, detail="boom")
    assert [(f.name, getattr(reading, f.name)) for f in dataclasses.fields(reading)] == [
        ("kind", Kind.ERROR),
        ("detail", "boom"),
        ("retry_after", None),
        ("reset_at", None),
        ("window", None),
        ("input_tokens", None),
        ("output_tokens", None),
        ("cache_read_tokens", None),
        ("cache_write_tokens", None),
        ("cost_usd", None),
        ("model", None),
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.detail = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "window"),
    [
        # Anthropic's 429 rate_limit_error, as users quote it (bhouston/mycoder#62).
        (
            "This request would exceed the rate limit for your organization (d3f2...) of"
            " 40,000 input tokens per minute. For details, refer to: https://docs.anthropic.com",
            60.0,
        ),
        ("... for your organization (mock) of 2 requests per 10 seconds. For details", 10.0),
        # OpenAI's, as users quote it (Aider-AI/aider#236 and the API's docs).
        (
            "Rate limit reached for gpt-4 in organization org-x on requests per min (RPM):"
            " Limit 3, Used 3, Requested 1. Please try again in 20s.",
            60.0,
        ),
        # Gemini's quota id.
        ('"quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"', 60.0),
        ("rate_limit_error: mock limit", None),
        ("You can make 100 requests per day", None),
    ],
)
def test_a_throttle_message_that_states_its_limit_says_its_window(
    text: str, window: float | None
) -> None:
    assert stated_window(text) == window


def test_read_hands_the_attempt_to_the_agents_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, str, datetime]] = []

    def fake_read(*, exit_code: int, output: str, now: datetime) -> Reading:
        calls.append((exit_code, output, now))
        return Reading(kind=Kind.RATE_LIMITED, detail="slow down", retry_after=7.0)

    module = types.ModuleType("fanout.agents.fakeagent")
    module.read = fake_read  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fanout.agents.fakeagent", module)
    monkeypatch.setattr(agents, "AGENTS", (*AGENTS, "fakeagent"))

    reading = agents.read("fakeagent", exit_code=1, output="429", now=NOW)
    assert reading == Reading(kind=Kind.RATE_LIMITED, detail="slow down", retry_after=7.0)
    assert calls == [(1, "429", NOW)]


def test_an_agent_without_a_module_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "AGENTS", (*AGENTS, "nosuchagent"))
    with pytest.raises(LookupError) as raised:
        agents.read("nosuchagent", exit_code=0, output="", now=NOW)
    assert str(raised.value) == (
        "no classifier for agent 'nosuchagent': no module fanout.agents.nosuchagent"
    )


def test_an_unknown_agent_name_is_a_clear_error() -> None:
    with pytest.raises(LookupError) as raised:
        agents.read("cursor", exit_code=0, output="", now=NOW)
    assert str(raised.value) == (
        "no classifier for agent 'cursor' (known: claude, codex, gemini, aider, llm)"
    )


def test_a_module_that_fails_its_own_import_is_not_reported_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A classifier whose own import breaks is a bug to see as it is, not "no module".
    import fanout.agents as package

    (tmp_path / "brokenagent.py").write_text("import no_such_library_for_fanout_tests\n")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(agents, "AGENTS", (*AGENTS, "brokenagent"))
    with pytest.raises(ModuleNotFoundError, match="no_such_library_for_fanout_tests"):
        agents.read("brokenagent", exit_code=0, output="", now=NOW)


@pytest.mark.parametrize(
    "case",
    [f"{agent}/{p.stem}" for agent in DOCUMENTED for p in sorted((DATA / agent).glob("*.json"))],
)
def test_a_documented_output_reads_as_its_expected_reading(case: str) -> None:
    agent = case.split("/")[0]
    spec = json.loads((DATA / f"{case}.json").read_text())
    assert (spec["captured"], bool(spec["source"])) == (None, True)
    reading = agents.read(
        agent,
        exit_code=spec["exit_code"],
        output=(DATA / f"{case}.out").read_bytes().decode(),
        now=datetime.fromisoformat(spec["now"]),
    )
    expected = dict(spec["reading"])
    assert reading == Reading(**{**expected, "kind": Kind(expected["kind"])})
