"""``fanout plan``'s estimate of the next run, from the job's earlier runs.

The issue's "done when": with the mock API's usage and prices, the plan's estimate for a
run is within 20% of that run's measured spend and attempts.  Real ``fanout run``s
through the gateway (workers real python programs making priced requests to the mock
API of tests/mockapi.py), a changed backlog, ``fanout plan`` on it, then the run it
estimated.  And what the plan says with no history, with a run it would continue, and
of the budgets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from helpers import cli, write_job
from mockapi import MockApi, Usage

KEY = "sk-ant-real-estimate-5e1d7c"
# Every answer reports (12 + 5) tokens, at $1,000 per million each: $0.017 a request.
PRICES = 'prices = { "*" = { input = 1000.0, output = 1000.0 } }'
REQUEST_USD = 0.017
# A unit's file says how many requests its attempt makes and how it goes: "easy" passes
# on the first rung, "hard" fails there (after its requests) and passes on the second,
# "broken" fails on both.
WORKER = r"""
import json, os, sys, urllib.request
unit, rung = sys.argv[1], sys.argv[2]
count, kind = open(unit).read().split()[:2]
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
for _ in range(int(count)):
    body = json.dumps({"model": "claude-test-1", "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(base + "/v1/messages", data=body, headers={
        "x-api-key": token, "content-type": "application/json",
        "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request) as answer:
        json.load(answer)
sys.exit(0 if kind == "easy" or (kind == "hard" and rung == "second") else 1)
"""


def _job(directory: Path, upstream: str) -> Path:
    command = json.dumps(["python3", "-c", WORKER, "{{ unit.id }}", "{{ rung.name }}"])
    return write_job(
        directory,
        f"""
        version = 1
        name = "estimated"
        [inputs]
        files = ["data/*.txt"]
        [units]
        stage = ["{{{{ unit.id }}}}"]
        [task]
        command = {command}
        timeout = "60s"
        budget = {{ usd = 0.1 }}
        [retry]
        backoff = {{ initial = "10ms", max = "10ms", jitter = "none" }}
        ladder = [{{ name = "first" }}, {{ name = "second" }}]
        [runtime]
        network = true
        sandbox = "none"
        unsandboxedSecrets = true
        maxConcurrentTasks = 4
        [[apis]]
        name = "anthropic"
        upstream = "{upstream}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        requests = {{ limit = 6000, per = "1m" }}
        budget = {{ usd = 1.0 }}
        {PRICES}
        """,
    )


def _files(directory: Path, units: dict[int, tuple[int, str]], note: str = "") -> None:
    data = directory / "data"
    data.mkdir(exist_ok=True)
    for number, (requests, kind) in units.items():
        (data / f"f{number:02d}.txt").write_text(f"{requests} {kind}\n{note}")


# 20 units: 1 to 3 requests an attempt, every fourth hard, the last broken.
FIRST = {
    n: (1 + n % 3, "broken" if n == 20 else "hard" if n % 4 == 1 else "easy") for n in range(1, 21)
}
# The changed backlog: 6 files edited (2 hard, 4 easy), 4 new ones (1 hard), the broken
# unit unchanged (it runs again: its streak has not quarantined it).
CHANGED = [1, 2, 3, 4, 5, 6]
NEW = {21: (2, "hard"), 22: (1, "easy"), 23: (3, "easy"), 24: (2, "easy")}


def _latest_report(directory: Path) -> dict[str, Any]:
    reports = [
        json.loads(p.read_text()) for p in (directory / ".fanout").glob("runs/*/report.json")
    ]
    return max(reports, key=lambda report: report["started"])


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch, mock_api: MockApi) -> None:
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)
    mock_api.configure(require_key=KEY, usage=Usage(input_tokens=12, output_tokens=5))


@pytest.mark.slow
def test_the_plans_estimate_is_within_a_fifth_of_the_run_it_estimated(
    mock_api: MockApi, tmp_path: Path, keyed: None
) -> None:
    job = _job(tmp_path, mock_api.url)
    _files(tmp_path, FIRST)
    first = cli("run", str(job))
    assert first.code == 1, first.out + first.err  # the broken unit failed
    # 14 easy units 1 attempt, 5 hard and the broken one 2.
    assert sum(_latest_report(tmp_path)["attempts"].values()) == 26
    _files(tmp_path, {n: FIRST[n] for n in CHANGED}, note="edited\n")
    _files(tmp_path, NEW)

    planned = cli("plan", "--format", "json", str(job))
    assert planned.code == 0, planned.out + planned.err
    nextrun = json.loads(planned.out)["next"]
    assert nextrun["units"] == {
        "selected": 24,
        "toRun": 11,
        "again": 1,
        "reused": 13,
        "quarantined": 0,
        "sorted": True,
        "firstToRun": [
            "data/f01.txt",
            "data/f02.txt",
            "data/f03.txt",
            "data/f04.txt",
            "data/f05.txt",
            "data/f06.txt",
            "data/f20.txt",
            "data/f21.txt",
            "data/f22.txt",
            "data/f23.txt",
        ],
    }
    estimate = nextrun["estimate"]
    assert [(r["rung"], r["units"], r["attempts"]) for r in estimate["rungs"]] == [
        ("first", 20, 20),
        ("second", 6, 6),
    ]
    # A hard unit of 3 requests spends 6 x $0.017 = $0.102: its last request reached
    # task.budget, so it still succeeded; a unit's p90 says so.
    assert estimate["budgets"][0] == {
        "budget": "task.budget",
        "usd": 0.1,
        "p90Usd": 0.102,
        "under": False,
        "spentAll": 3,
    }
    assert [(b["budget"], b["under"]) for b in estimate["budgets"][1:]] == [
        ("api anthropic budget", True)
    ]
    planned_attempts = estimate["next"]["attempts"]
    planned_usd = estimate["next"]["spendUsd"]["p50"]
    text = cli("plan", str(job)).out
    assert (
        "          11 of 24 selected unit(s) would run (1 of them unchanged since they"
        " failed), 13 reused, 0 quarantined\n" in text
    )
    assert (
        "          task.budget $0.1000 per unit: a unit's p90 $0.1020 is OVER it; 3 of 20 past"
        " unit(s) spent it all\n" in text
    )

    mock_api.clear()
    second = cli("run", str(job))
    assert second.code == 1, second.out + second.err
    report = _latest_report(tmp_path)
    assert report["totals"] == {"failed": 1, "reused": 13, "succeeded": 10}
    measured_attempts = sum(report["attempts"].values())
    (api,) = report["apis"]
    measured_usd = api["costUsd"]
    assert measured_usd == pytest.approx(len(mock_api.posts()) * REQUEST_USD)
    print(
        f"\nattempts: planned {planned_attempts}, measured {measured_attempts};"
        f" spend: planned ${planned_usd:.4f} (p90 ${estimate['next']['spendUsd']['p90']:.4f}),"
        f" measured ${measured_usd:.4f}; wall: planned {estimate['wall'][0]['seconds']}s"
        f" ({estimate['wall'][0]['by']}), measured {report['wallSeconds']}s"
    )
    assert abs(planned_attempts - measured_attempts) <= 0.2 * measured_attempts
    assert abs(planned_usd - measured_usd) <= 0.2 * measured_usd
