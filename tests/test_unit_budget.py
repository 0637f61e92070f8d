"""``task.budget``: most one unit may spend in a run, over all its attempts.

Through the gateway (real ``fanout run``s, workers real python programs making priced
requests to the mock API of tests/mockapi.py): once a unit's spending reaches its budget
its further requests get the gateway's 400, the unit fails at once with the budget as
its reason (no further attempt or rung), the other units and the run go on, and a
resumed run does not run it again.  Without a gateway the cost the agent reports (claude's
``total_cost_usd``, read from a captured result the worker prints) counts the same way.
The job language: the check that a budget can be counted at all, and ``fanout plan``."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.attempt.model import Attempt
from fanout.errors import HostsUnavailable
from fanout.outcome import ApiUsage, AttemptResult
from fanout.run.job import Options, Runner

from fakes import FakeTransport
from helpers import cli, make_runner, write_job
from mockapi import MockApi, Usage

KEY = "sk-ant-real-budget-7c2e9d4a1f"
# Every answer reports (12 + 5) tokens, at $1,000 per million each: $0.017 a request.
PRICES = 'prices = { "*" = { input = 1000.0, output = 1000.0 } }'
# Requests (as an Anthropic SDK would) until the count in argv[1] (the unit id's number
# after the "-") or the first refusal, whose status and body it prints before failing.
WORKER = r"""
import json, os, sys, urllib.error, urllib.request
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
for _ in range(int(sys.argv[1].rsplit("-", 1)[1])):
    body = json.dumps({"model": "claude-test-1", "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(base + "/v1/messages", data=body, headers={
        "x-api-key": token, "content-type": "application/json",
        "anthropic-version": "2023-06-01"})
    try:
        with urllib.request.urlopen(request) as answer:
            json.load(answer)
    except urllib.error.HTTPError as refused:
        print(refused.code, refused.read().decode())
        sys.exit(1)
"""
# Two rungs of two attempts: a unit whose budget is spent must use none of them.
LADDER = """
[[retry.ladder]]
name = "first"
attempts = 2
[[retry.ladder]]
name = "second"
attempts = 2
[retry.backoff]
initial = "10ms"
max = "10ms"
jitter = "none"
"""


def _gateway_job(directory: Path, items: list[str], upstream: str, api_budget: str = "") -> Path:
    command = json.dumps(["python3", "-c", WORKER, "{{ unit.id }}"])
    return write_job(
        directory,
        f"""
        version = 1
        name = "unit-budget"
        [inputs]
        items = {json.dumps(items)}
        [task]
        command = {command}
        timeout = "60s"
        budget = {{ usd = 0.05 }}
        [runtime]
        network = true
        sandbox = "none"
        unsandboxedSecrets = true
        maxConcurrentTasks = 1
        [[apis]]
        name = "anthropic"
        upstream = "{upstream}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        requests = {{ limit = 1000, per = "1m" }}
        {PRICES}
        {api_budget}
        """
        + LADDER,
    )


def _report(directory: Path) -> dict[str, Any]:
    (path,) = (directory / ".fanout" / "runs").glob("*/report.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _units(directory: Path) -> dict[str, dict[str, Any]]:
    return {u["unit"]: u for u in _report(directory)["units"]}


def _events(directory: Path, name: str) -> list[dict[str, Any]]:
    (path,) = (directory / ".fanout" / "runs").glob("*/events.jsonl")
    found = [json.loads(line) for line in path.read_text().splitlines()]
    return [e for e in found if e["event"] == name]


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch, mock_api: MockApi) -> None:
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)
    mock_api.configure(require_key=KEY, usage=Usage(input_tokens=12, output_tokens=5))


@pytest.mark.slow
def test_a_unit_stops_at_its_budget_and_the_others_go_on(
    mock_api: MockApi, tmp_path: Path, keyed: None
) -> None:
    # big-10 would make 10 requests: the third brings it to $0.051 >= $0.05, so the
    # gateway refuses the fourth, unsent.  small-2 spends $0.034 and succeeds, after it;
    # edge-3 reaches the budget with its last request and, done, is still a success.
    job = _gateway_job(tmp_path, ["big-10", "small-2", "edge-3", "after-2"], mock_api.url)
    ran = cli("run", str(job))
    assert ran.code == 1, ran.out + ran.err
    assert len(mock_api.posts()) == 3 + 2 + 3 + 2
    units = _units(tmp_path)
    assert {u: (r["state"], r["attempts"], r["reason"]) for u, r in units.items()} == {
        "big-10": ("failed", 1, "unit budget $0.0500 spent ($0.0510 used)"),
        "small-2": ("succeeded", 1, "ok"),
        "edge-3": ("succeeded", 1, "ok"),
        "after-2": ("succeeded", 1, "ok"),
    }
    assert [r["budget"] for r in units.values()] == [{"usd": 0.05}] * 4
    (usage,) = units["big-10"]["usage"]
    assert (usage["requests"], usage["costUsd"]) == (3, 0.051)
    # What the worker was told: the run budget's 400, naming the unit's budget.
    status, body = units["big-10"]["outputTail"].strip().split(" ", 1)
    assert status == "400"
    assert json.loads(body)["error"] == {
        "type": "invalid_request_error",
        "message": "fanout gateway: unit budget $0.0500 spent ($0.0510 used):"
        " this unit's requests are refused (task.budget)",
    }
    finished = [
        (e["unit"], e["status"], e["reason"]) for e in _events(tmp_path, "attempt.finished")
    ]
    assert finished[0] == ("big-10", "failed", "unit budget $0.0500 spent ($0.0510 used)")
    assert _report(tmp_path)["state"] == "finished"


@pytest.mark.slow
def test_a_resumed_run_does_not_run_a_unit_whose_budget_is_spent(
    mock_api: MockApi, tmp_path: Path, keyed: None
) -> None:
    # The run's own budget ($0.06) stops the run in mid-3's first request ($0.068),
    # after big-10 failed on its unit budget; given more, the run resumes without it,
    # and mid-3's second attempt has what its first left: two requests' worth.
    job = _gateway_job(
        tmp_path, ["big-10", "mid-3", "after-2"], mock_api.url, "budget = { usd = 0.06 }"
    )
    ran = cli("run", str(job))
    assert ran.code == 7, ran.out + ran.err
    assert len(mock_api.posts()) == 3 + 1
    assert _report(tmp_path)["totals"] == {"failed": 1, "interrupted": 1, "pending": 1}
    job.write_text(job.read_text().replace("usd = 0.06", "usd = 1.0"))
    ran = cli("run", str(job))
    assert ran.code == 1, ran.out + ran.err
    assert len(mock_api.posts()) == 3 + 1 + 2 + 2
    units = _units(tmp_path)
    spent = "unit budget $0.0500 spent ($0.0510 used)"
    assert {u: (r["state"], r["attempts"], r["reason"]) for u, r in units.items()} == {
        "big-10": ("failed", 1, spent),
        "mid-3": ("failed", 2, spent),
        "after-2": ("succeeded", 1, "ok"),
    }
    # mid-3's interrupted attempt spent $0.017 before the stop, its second $0.034.
    (usage,) = units["mid-3"]["usage"]
    assert (usage["requests"], usage["costUsd"]) == (3, 0.051)
    # A stretch without the budget: the report says the units were held to none.
    job.write_text(job.read_text().replace("budget = { usd = 0.05 }", ""))
    assert cli("run", "--fresh", str(job)).code == 0
    runs = sorted((tmp_path / ".fanout" / "runs").glob("*/report.json"))
    assert len(runs) == 2
    latest = max(runs, key=lambda p: json.loads(p.read_text())["started"])
    assert all("budget" not in u for u in json.loads(latest.read_text())["units"])


# A worker that prints the result of a real claude run (captured from the CLI against the
# mock API: tests/data/agents/claude/), its cost replaced by argv[2]; the unit "ok-..."
# prints the successful one, any other the turn-limit failure.
AGENT = r"""
import json, sys
unit, cost = sys.argv[1], float(sys.argv[2])
name = "success" if unit.startswith("ok-") else "max_turns"
result = json.loads(open(f"{sys.argv[3]}/{name}.out").read().splitlines()[0])
result["total_cost_usd"] = cost
print(json.dumps(result))
sys.exit(0 if name == "success" else 1)
"""
TURNS = "claude: turn-limit: error_max_turns: Reached maximum number of turns (1)"


def _agent_job(directory: Path, repo: Path, items: list[str], cost: float) -> Path:
    goldens = repo / "tests" / "data" / "agents" / "claude"
    command = json.dumps(["python3", "-c", AGENT, "{{ unit.id }}", str(cost), str(goldens)])
    return write_job(
        directory,
        f"""
        version = 1
        name = "unit-budget-agent"
        [inputs]
        items = {json.dumps(items)}
        [task]
        agent = "claude"
        command = {command}
        timeout = "60s"
        budget = {{ usd = 0.05 }}
        [runtime]
        network = true
        sandbox = "none"
        maxConcurrentTasks = 1
        """
        + LADDER,
    )


@pytest.mark.slow
def test_the_cost_an_agent_reports_counts_toward_the_budget_without_a_gateway(
    tmp_path: Path, repo: Path
) -> None:
    # Each attempt reports $0.03: the unit whose attempts fail stops after its second
    # ($0.06), with two attempts of the ladder's four unused; one that succeeds in its
    # only attempt while crossing the budget ($0.06 in one go) is still a success.
    job = _agent_job(tmp_path, repo, ["turns-1", "ok-1"], 0.03)
    ran = cli("run", str(job))
    assert ran.code == 1, ran.out + ran.err
    units = _units(tmp_path)
    assert {u: (r["state"], r["attempts"], r["reason"]) for u, r in units.items()} == {
        "turns-1": ("failed", 2, "unit budget $0.0500 spent ($0.0600 used)"),
        "ok-1": ("succeeded", 1, "ok"),
    }
    assert [(u["api"], u["costUsd"]) for u in units["turns-1"]["usage"]] == [("claude", 0.06)]
    finished = [
        (e["unit"], e["status"], e.get("kind"), e["reason"])
        for e in _events(tmp_path, "attempt.finished")
    ]
    assert sorted(finished, key=lambda e: e[0] != "turns-1") == [
        ("turns-1", "failed", "turn-limit", TURNS),
        ("turns-1", "failed", "turn-limit", "unit budget $0.0500 spent ($0.0600 used)"),
        ("ok-1", "succeeded", "success", "ok"),
    ]


@pytest.mark.slow
def test_an_agent_success_that_crosses_the_budget_stays_a_success(
    tmp_path: Path, repo: Path
) -> None:
    job = _agent_job(tmp_path, repo, ["ok-1"], 0.08)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    (unit,) = _report(tmp_path)["units"]
    assert (unit["state"], unit["attempts"], unit["reason"]) == ("succeeded", 1, "ok")
    assert unit["usage"][0]["costUsd"] == 0.08


def _problems(directory: Path, text: str) -> list[str]:
    job = write_job(directory, text)
    ran = cli("validate", str(job))
    assert ran.code == 2, ran.out + ran.err
    prefix = f"{job}:"
    return [line.removeprefix(prefix) for line in ran.err.splitlines() if line.startswith(prefix)]


JOB = """\
version = 1
name = "b"
[inputs]
items = ["a"]
[task]
{task}
budget = {{ usd = 2 }}
[runtime]
network = true
"""
ANTHROPIC = """\
[[apis]]
name = "anthropic"
upstream = "https://api.anthropic.com"
style = "anthropic"
keySecret = "K"
"""
NEEDS_PRICES = (
    "7:1: task.budget: a budget needs prices: without them every request costs $0 and the"
    " budget never stops anything"
)


def test_a_unit_budget_nothing_counts_is_a_located_error(tmp_path: Path) -> None:
    assert _problems(tmp_path, JOB.format(task='command = ["true"]')) == [
        NEEDS_PRICES
        + " (no [[apis]] entry has prices, and a task without an agent reports no cost)"
    ]
    assert _problems(tmp_path, JOB.format(task='agent = "codex"')) == [
        NEEDS_PRICES + " (no [[apis]] entry has prices, and agent 'codex' reports no cost)"
    ]
    # claude reports its cost, but through an unpriced API the gateway's $0 replaces it.
    assert _problems(tmp_path, JOB.format(task='agent = "claude"') + ANTHROPIC) == [
        NEEDS_PRICES + " (no [[apis]] entry has prices, and agent 'claude' calls apis[0]"
        " through the gateway, whose count replaces the cost the agent reports)"
    ]


def test_a_unit_budget_something_counts_is_valid_and_plan_shows_it(tmp_path: Path) -> None:
    claude = write_job(tmp_path / "a", JOB.format(task='agent = "claude"'))
    assert cli("validate", str(claude)).code == 0
    priced = write_job(
        tmp_path / "b",
        JOB.format(task='command = ["true"]')
        + ANTHROPIC
        + 'prices = { "*" = { input = 3.0, output = 15.0 } }\n',
    )
    ran = cli("plan", str(priced))
    assert ran.code == 0, ran.out + ran.err
    assert (
        "Budget    $2.00 per unit (task.budget), over all its attempts in the run;"
        " once spent the unit fails"
    ) in ran.out.splitlines()
    # The resolved job writes it as the job file does (and so validates again).
    lines = ran.out.splitlines()
    assert lines[lines.index("  [task.budget]") + 1] == "  usd = 2.0"


def test_a_unit_budget_is_a_positive_number_of_dollars(tmp_path: Path) -> None:
    text = JOB.format(task='command = ["true"]').replace("usd = 2", "usd = 0")
    priced = text + ANTHROPIC + 'prices = { "*" = { input = 1, output = 1 } }\n'
    assert _problems(tmp_path, priced) == ["7:18: task.budget.usd: must be more than 0, not 0"]


def _logic_job(directory: Path) -> spec.Spec:
    return spec.load(
        write_job(
            directory,
            """
            version = 1
            name = "unit-budget-logic"
            [inputs]
            items = ["u0", "u1"]
            [task]
            agent = "claude"
            command = ["agent"]
            budget = { usd = 0.05 }
            [runtime]
            network = true
            """,
        )
    )


def _logic_runner(job: spec.Spec, transport: FakeTransport) -> Runner:
    return make_runner(job, transport, events=lambda e: None, rng=random.Random(7))


@pytest.mark.looptime
async def test_a_unit_resumed_with_its_budget_spent_is_failed_without_an_attempt(
    tmp_path: Path,
) -> None:
    def down(attempt: Attempt) -> AttemptResult:
        raise HostsUnavailable("every host is down")

    job = _logic_job(tmp_path)
    first = _logic_runner(job, FakeTransport(script=down))
    with pytest.raises(HostsUnavailable):
        await first.execute(Options())
    (run,) = first.journal.runs()
    # What u0's attempts spent before the stop (an interrupted attempt's usage is
    # journaled however it ends), over two APIs; another run's spending counts for none.
    first.journal.record_usage(run.id, 1, "u0", 1, [ApiUsage(api="anthropic", cost_usd=0.045)])
    first.journal.record_usage(run.id, 1, "u0", 2, [ApiUsage(api="claude", cost_usd=0.01)])
    first.journal.record_usage(run.id, 1, "u1", 1, [ApiUsage(api="anthropic", cost_usd=0.04)])
    first.journal.record_usage("other-run", 1, "u1", 1, [ApiUsage(api="claude", cost_usd=1.0)])
    assert first.journal.unit_spent(run.id, "u0", 1) == pytest.approx(0.055)
    assert first.journal.unit_spent(run.id, "u1", 1) == pytest.approx(0.04)
    assert first.journal.unit_spent(run.id, "u1", 2) == pytest.approx(0.04)
    again = FakeTransport()
    resumed = _logic_runner(job, again)
    summary = await resumed.execute(Options(resume=True))
    assert summary.counts == {"failed": 1, "succeeded": 1}
    assert [a.unit_id for a in again.attempts] == ["u1"]
    rows = {row.unit.id: row for row in resumed.journal.units(run.id)}
    assert rows["u0"].reason == "unit budget $0.0500 spent ($0.0550 used)"
