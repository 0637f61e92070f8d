"""``task.budget`` held to the cost the real Claude Code CLI reports (``total_cost_usd``)
when no gateway counts its requests: the CLI in bwrap against the mock Messages API
with its own key, as tests/test_agent_outcomes.py drives it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fanout.values.quantities import usd_text

from helpers import claude_own_key_job, cli, finished_attempts, own_key
from mockapi import MockApi

pytestmark = pytest.mark.slow

KEY = "sk-ant-own-key-budget-3e8a1c6b9d"


def _job(directory: Path, mock_api: MockApi, budget: float) -> Path:
    return claude_own_key_job(
        directory,
        mock_api.url,
        "claude-unit-budget",
        task=f"budget = {{ usd = {budget} }}",
        rest="""
        [[retry.ladder]]
        name = "first"
        attempts = 2
        [[retry.ladder]]
        name = "second"
        attempts = 2
        [retry]
        backoff = { initial = "10ms", max = "10ms", jitter = "none" }
        """,
    )


def test_the_real_claude_clis_reported_cost_stops_a_unit_at_its_budget(
    claude_cli: Path, mock_api: MockApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The mock asks for a Bash call the job allows no tool for: claude reports success
    # anyway, a false success, so every attempt fails and costs what claude says.
    own_key(claude_cli, mock_api, monkeypatch, "ANTHROPIC_API_KEY", KEY, tool=True)
    # More than one attempt costs at the CLI's own prices for the mock's usage (claude
    # 2.1.197 says $0.00037), less than two.
    budget = 0.0005
    ran = cli("run", str(_job(tmp_path, mock_api, budget)))
    assert ran.code == 1, ran.out + ran.err
    attempts = finished_attempts(tmp_path)
    costs = [a["usage"][0]["costUsd"] for a in attempts]
    assert [a["usage"][0]["api"] for a in attempts] == ["claude"] * len(attempts)
    # Stopped by the second attempt, whose reported cost brought the total to the
    # budget, with the ladder's other two attempts unused.
    assert len(costs) == 2
    assert costs[0] < budget <= costs[0] + costs[1]
    assert [(a["status"], a["kind"]) for a in attempts] == [("failed", "false-success")] * 2
    reason = f"unit budget {usd_text(budget)} spent ({usd_text(sum(costs))} used)"
    assert attempts[-1]["reason"] == reason
    (path,) = (tmp_path / ".fanout" / "runs").glob("*/report.json")
    (unit,) = json.loads(path.read_text())["units"]
    assert (unit["state"], unit["attempts"], unit["reason"]) == ("failed", 2, reason)
