"""``fanout plan`` on a job with ``[[apis]]``: each API's upstream, style, variables,
key, windows as rates, bottleneck, and budget, in the plan's own layout."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from fanout import plan, spec
from fanout.journal import Journal
from fanout.pacing.ceiling import Learned

from helpers import MINIMAL, cli, write_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)

FULL = """\
[[apis]]
name = "anthropic"
upstream = "https://api.anthropic.com"
style = "anthropic"
keySecret = "ANTHROPIC_API_KEY"
requests = { limit = 50, per = "1m" }
inputTokens = { limit = 30000, per = "1m" }
outputTokens = { limit = 8000, per = "1m" }
maxInFlight = 10
budget = { usd = 20 }
[apis.prices]
"claude-sonnet-*" = { input = 3.0, output = 15.0, cacheRead = 0.3, cacheWrite = 3.75 }
"claude-haiku-*" = { input = 0.8, output = 4 }
"""


def api_lines(tmp_path: Path, apis: str, environ: dict[str, str] | None = None) -> list[str]:
    job = spec.load(write_job(tmp_path, MINIMAL + "[runtime]\nnetwork = true\n" + apis))
    text = plan.render_text(plan.make(job, environ=environ or {}, now=NOW))
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("APIs"))
    end = next(n for n, line in enumerate(lines) if line.startswith("Ladder"))
    return lines[start:end]


def test_plan_shows_an_api_its_windows_bottleneck_and_budget(tmp_path: Path) -> None:
    assert api_lines(tmp_path, FULL, {"ANTHROPIC_API_KEY": "sk-ant-never-shown"}) == [
        "APIs      anthropic: https://api.anthropic.com (style anthropic; workers get "
        "ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY; key $ANTHROPIC_API_KEY)",
        "            requests     50 per 1m (50/min)",
        "            inputTokens  30,000 per 1m (30,000/min): the bottleneck above 600 input "
        "tokens per request",
        "            outputTokens 8,000 per 1m (8,000/min): the bottleneck above 160 output "
        "tokens per request",
        "            maxInFlight  10 request(s) at once",
        "            bottleneck   requests, 50 request(s)/min, while requests average at most "
        "600 input tokens and 160 output tokens",
        "            budget       $20.00 per run; prices per million tokens: claude-sonnet-* "
        "$3 in, $15 out, $0.3 cache read, $3.75 cache write; claude-haiku-* $0.8 in, $4 out",
    ]


def test_plan_says_when_an_api_key_is_not_set(tmp_path: Path) -> None:
    first = api_lines(tmp_path, FULL)[0]
    assert first.endswith("; key $ANTHROPIC_API_KEY NOT SET (`fanout run` refuses))")


def test_plan_never_prints_the_key(chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "the-real-key-value")
    write_job(chdir_tmp, MINIMAL + "[runtime]\nnetwork = true\n" + FULL)
    result = cli("plan", "job.toml")
    assert result.code == 0, result.err
    assert "key $ANTHROPIC_API_KEY)" in result.out
    assert "the-real-key-value" not in result.out + result.err


def test_rates_of_windows_of_other_lengths(tmp_path: Path) -> None:
    apis = """\
[[apis]]
name = "openai"
upstream = "https://api.openai.com/v1"
style = "openai"
requests = { limit = 5, per = "10s" }
outputTokens = { limit = 1000, per = "1h" }
"""
    assert api_lines(tmp_path, apis) == [
        "APIs      openai: https://api.openai.com/v1 (style openai; workers get "
        "OPENAI_BASE_URL, OPENAI_API_KEY; no key sent)",
        "            requests     5 per 10s (30/min)",
        "            outputTokens 1,000 per 1h (16.7/min): the bottleneck above 0.556 output "
        "tokens per request",
        "            bottleneck   requests, 30 request(s)/min, while requests average at most "
        "0.556 output tokens",
        "            budget       none; no prices: cost is not counted",
    ]


def test_without_a_requests_window_tokens_decide(tmp_path: Path) -> None:
    apis = """\
[[apis]]
name = "gemini"
upstream = "https://generativelanguage.googleapis.com"
style = "gemini"
inputTokens = { limit = 1000000, per = "1m" }
outputTokens = { limit = 60000, per = "1m" }
"""
    assert api_lines(tmp_path, apis)[1:] == [
        "            inputTokens  1,000,000 per 1m (1,000,000/min)",
        "            outputTokens 60,000 per 1m (60,000/min)",
        "            bottleneck   tokens: requests/min = 1,000,000 / input tokens per request "
        "or 60,000 / output tokens per request, whichever is less (no requests window)",
        "            budget       none; no prices: cost is not counted",
    ]
    only_output = apis.replace('inputTokens = { limit = 1000000, per = "1m" }\n', "")
    assert api_lines(tmp_path, only_output)[2] == (
        "            bottleneck   tokens: requests/min = 60,000 / output tokens per request "
        "(no requests window)"
    )


def test_an_api_without_windows(tmp_path: Path) -> None:
    plain = """\
[[apis]]
name = "search"
upstream = "http://127.0.0.1:9"
style = "plain"
baseUrlEnv = "SEARCH_URL"
tokenEnv = "SEARCH_TOKEN"
"""
    assert api_lines(tmp_path, plain + "maxInFlight = 3\n")[1:] == [
        "            maxInFlight  3 request(s) at once",
        "            bottleneck   maxInFlight only: no windows, at most 3 request(s) at once",
        "            budget       none; no prices: cost is not counted",
    ]
    assert api_lines(tmp_path, plain) == [
        "APIs      search: http://127.0.0.1:9 (style plain; workers get SEARCH_URL, "
        "SEARCH_TOKEN; no key sent)",
        "            bottleneck   none: no windows and no maxInFlight, requests are only counted",
        "            budget       none; no prices: cost is not counted",
    ]


def test_each_api_gets_its_block_and_the_pace_says_requests_wait(tmp_path: Path) -> None:
    second = """\
[[apis]]
name = "search"
upstream = "http://127.0.0.1:9"
style = "plain"
baseUrlEnv = "SEARCH_URL"
tokenEnv = "SEARCH_TOKEN"
"""
    lines = api_lines(tmp_path, FULL + second, {"ANTHROPIC_API_KEY": "k"})
    assert [line.split(":")[0] for line in lines if line[10] != " "] == [
        "APIs      anthropic",
        "          search",
    ]
    job = spec.load(write_job(tmp_path, MINIMAL + "[runtime]\nnetwork = true\n" + second))
    text = plan.render_text(plan.make(job, environ={}, now=NOW))
    assert (
        "Pace      no [[limits]] declared: fanout learns the pace of starts from throttles,"
        " requests wait in [[apis]]\n" in text
    )


def test_the_resolved_job_shows_the_api_as_written(tmp_path: Path) -> None:
    job = spec.load(write_job(tmp_path, MINIMAL + "[runtime]\nnetwork = true\n" + FULL))
    text = plan.render_text(plan.make(job, environ={}, now=NOW))
    resolved = text.split("Resolved job (defaults filled in):\n", 1)[1]
    block = resolved[resolved.index("  [[apis]]") : resolved.index("  [retry]")]
    assert block == (
        "  [[apis]]\n"
        '  name = "anthropic"\n'
        '  upstream = "https://api.anthropic.com"\n'
        '  style = "anthropic"\n'
        '  baseUrlEnv = "ANTHROPIC_BASE_URL"\n'
        '  tokenEnv = "ANTHROPIC_API_KEY"\n'
        '  keySecret = "ANTHROPIC_API_KEY"\n'
        "  maxInFlight = 10\n"
        "\n"
        "  [apis.requests]\n"
        "  limit = 50\n"
        '  per = "1m"\n'
        "\n"
        "  [apis.inputTokens]\n"
        "  limit = 30000\n"
        '  per = "1m"\n'
        "\n"
        "  [apis.outputTokens]\n"
        "  limit = 8000\n"
        '  per = "1m"\n'
        "\n"
        '  [apis.prices."claude-sonnet-*"]\n'
        "  input = 3.0\n"
        "  output = 15.0\n"
        "  cacheRead = 0.3\n"
        "  cacheWrite = 3.75\n"
        "\n"
        '  [apis.prices."claude-haiku-*"]\n'
        "  input = 0.8\n"
        "  output = 4.0\n"
        "\n"
        "  [apis.budget]\n"
        "  usd = 20.0\n"
        "\n"
    )


def test_plan_says_no_limit_is_declared_and_what_the_last_runs_learned(tmp_path: Path) -> None:
    job = spec.load(write_job(tmp_path, MINIMAL))
    state = job.runtime.state_dir
    text = plan.render_text(plan.make(job, environ={}, now=NOW))
    assert "Pace      no rate limits declared: fanout learns them from throttles\n" in text
    assert "Learned" not in text
    assert not state.exists()  # read-only: no journal, no state made
    journal = Journal(state / "journal.sqlite")
    one = Learned(rate=0.2, window=10.0, throttles=3)
    journal.save_ceilings(
        job.name,
        {
            "*": (one, "2.0 per 10s learned from 3 throttles (none declared)"),
            "gone": (one, "a limit the job no longer has"),
        },
        run_id="20261130T030000-7f3a",
    )
    journal.save_ceilings("another-job", {"*": (one, "not this job's")})
    journal.close()
    before = sorted(p.name for p in state.iterdir())
    text = plan.render_text(plan.make(job, environ={}, now=NOW))
    assert (
        "Pace      no rate limits declared: fanout learns them from throttles\n"
        "Learned   all dispatch: 2.0 per 10s learned from 3 throttles (none declared)"
        " (run 20261130T030000-7f3a)\n"
        "          the next run starts at these paces, then probes upward\n"
    ) in text
    # Nothing made but what any SQLite reader of a WAL journal leaves (``store``).
    after = [p.name for p in state.iterdir() if not p.name.endswith(("-wal", "-shm"))]
    assert sorted(after) == before
