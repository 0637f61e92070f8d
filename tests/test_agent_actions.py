"""Every captured and documented output of every agent (the goldens of
``tests/data/agents/<agent>/``), through the whole dispatcher: what a ``fanout run``
with ``task.agent`` does with an attempt whose agent said that.  A worker prints the
golden and exits with the golden's exit code on a unit's first attempt, and prints the
agent's own success on the next, so each class shows its action:

- success: the unit succeeds at its first attempt;
- false success, turn limit, any other error: the attempt fails and the unit climbs the
  ladder (it succeeds on the second rung);
- overloaded, rate limited, a usage window or quota that resets within
  ``retry.throttle.max``: the attempt is throttled, no rung used (it succeeds on the first
  rung's second attempt);
- a usage window or quota resetting later: the run stops with exit 8 (parked), no unit
  charged, and ``fanout run`` continues it;
- a spend cap: the run stops with exit 7, and ``fanout run`` continues it.

Which class a golden is, is the classifiers' tests' business (``test_agents_*.py``);
here the class is read again at the test's own time (a usage window's reset is relative
to now) and each unit's fate is checked against the action this table gives it.  The
real CLIs are driven into these classes by ``test_agent_outcomes*.py``.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fanout import agents
from fanout.agents import AGENTS, Kind

from helpers import cli, write_job

pytestmark = pytest.mark.slow

DATA = Path(__file__).parent / "data" / "agents"
THROTTLE_MAX = 1.0  # seconds: a reset later than this parks the run

WORKER = """\
import json, pathlib, sys
unit, data, marks = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
agent, case = unit.split("-", 1)
mark = marks / unit
if mark.exists():  # the attempt after: the agent's own success
    sys.stdout.write((data / agent / "success.out").read_text())
    sys.exit(0)
mark.touch()
sys.stdout.write((data / agent / (case + ".out")).read_text())
sys.exit(json.loads((data / agent / (case + ".json")).read_text())["exit_code"])
"""


def _goldens(agent: str) -> list[str]:
    return sorted(path.stem for path in (DATA / agent).glob("*.out"))


def _action(agent: str, case: str) -> str:
    """What the dispatcher must do with this golden, read at this moment."""
    meta = json.loads((DATA / agent / f"{case}.json").read_text())
    output = (DATA / agent / f"{case}.out").read_text()
    reading = agents.read(
        agent, exit_code=meta["exit_code"], output=output, now=datetime.now().astimezone()
    )
    kind = reading.kind
    if kind is Kind.SUCCESS:
        return "succeeds"
    if kind in (Kind.FALSE_SUCCESS, Kind.TURN_LIMIT, Kind.ERROR):
        return "climbs"
    if kind in (Kind.OVERLOADED, Kind.RATE_LIMITED):
        return "throttled"
    if kind in (Kind.USAGE_WINDOW, Kind.DAILY_QUOTA):
        soon = reading.reset_at is not None and reading.reset_at - time.time() <= THROTTLE_MAX
        return "throttled" if soon else "parks"
    assert kind is Kind.SPEND_CAP
    return "stops"


def _job(directory: Path, agent: str, units: list[str]) -> Path:
    (directory / "marks").mkdir(parents=True)
    (directory / "worker.py").write_text(WORKER)
    items = json.dumps([f"{agent}-{case}" for case in units])
    return write_job(
        directory,
        f"""
        version = 1
        name = "agent-actions-{agent}"
        [inputs]
        items = {items}
        [task]
        agent = "{agent}"
        command = ["{sys.executable}", "{directory / "worker.py"}", "{{{{ unit.id }}}}", "{DATA}", "{directory / "marks"}"]
        prompt = "Fix it."
        timeout = "30s"
        [runtime]
        sandbox = "none"
        network = true
        [retry]
        backoff = {{ initial = "10ms", max = "10ms", jitter = "none" }}
        # The goldens' throttles are one worker's output, not an upstream's window: the
        # ceiling would learn 1 start per 20 s from llm's 20.5 s Retry-After.
        throttle = {{ initial = "10ms", max = "{THROTTLE_MAX:g}s", learn = false }}
        [[retry.ladder]]
        name = "first"
        [[retry.ladder]]
        name = "second"
        """,
    )


def _units(directory: Path) -> dict[str, dict[str, Any]]:
    (path,) = (directory / ".fanout" / "runs").glob("*/report.json")
    return {unit["unit"]: unit for unit in json.loads(path.read_text())["units"]}


def _first_attempts(directory: Path) -> dict[str, dict[str, Any]]:
    (path,) = (directory / ".fanout" / "runs").glob("*/events.jsonl")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return {e["unit"]: e for e in events if e["event"] == "attempt.finished" and e["attempt"] == 1}


# What each action leaves: the unit's state, the rung it succeeded on, its attempts, and
# its first attempt's status.
SETTLED = {
    "succeeds": ("succeeded", "first", 1, "succeeded"),
    "climbs": ("succeeded", "second", 2, "failed"),
    "throttled": ("succeeded", "first", 2, "throttled"),
}


@pytest.mark.parametrize("agent", AGENTS)
def test_each_class_an_agent_reports_gets_its_action(
    agent: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    actions = {case: _action(agent, case) for case in _goldens(agent)}
    # The goldens cover every class the dispatcher settles within a run, for each agent.
    assert {"succeeds", "climbs", "throttled"} <= set(actions.values()), actions
    settled = [case for case, action in actions.items() if action in SETTLED]
    directory = tmp_path / "settled"
    job = _job(directory, agent, settled)
    monkeypatch.chdir(directory)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    units, first = _units(directory), _first_attempts(directory)
    for case in settled:
        unit = f"{agent}-{case}"
        meta = json.loads((DATA / agent / f"{case}.json").read_text())
        fate = (units[unit]["state"], units[unit]["rung"], units[unit]["attempts"])
        assert (*fate, first[unit]["status"]) == SETTLED[actions[case]], unit
        # The class of the attempt is on its event (and so in the journal and report).
        assert first[unit]["kind"] == meta["reading"]["kind"], unit


@pytest.mark.parametrize(
    ("agent", "case"),
    [
        (agent, case)
        for agent in AGENTS
        for case in _goldens(agent)
        if _action(agent, case) in ("parks", "stops")
    ],
)
def test_a_class_that_stops_the_run_leaves_it_resumable(
    agent: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job(tmp_path, agent, [case])
    monkeypatch.chdir(tmp_path)
    ran = cli("run", str(job))
    assert ran.code == (8 if _action(agent, case) == "parks" else 7), ran.out + ran.err
    (unit,) = _units(tmp_path).values()
    assert (unit["state"], unit["attempts"]) == ("interrupted", 1)  # no unit charged
    # Its account has room again: the same run continues, the unit on its first rung.
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    (unit,) = _units(tmp_path).values()
    assert (unit["state"], unit["rung"]) == ("succeeded", "first")
