"""Helpers shared by the tests: writing job files and calling the CLI in-process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from datetime import time as clock
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from typer.testing import CliRunner

from fanout.attempt import verdict
from fanout.attempt.collecting import Collect
from fanout.attempt.invocation import Invocation
from fanout.attempt.model import Attempt
from fanout.attempt.sandbox import StagedFile
from fanout.attempt.seam import Transport
from fanout.cli import application
from fanout.cli.app import set_dumpable
from fanout.events import Events
from fanout.isolation import tools as sandbox
from fanout.isolation.place import Kind, Place
from fanout.journal import Journal, UnitRow
from fanout.run.job import Runner
from fanout.spec import Spec

# The typer app with every command, as the console script runs it.
APP = application()

MINIMAL = """\
version = 1
name = "test-job"
[inputs]
items = ["a", "b"]
[task]
command = ["true"]
"""


# What each part of a place's name starts: "ssh-bwrap" is sshd and bwrap.
_PLACE_PARTS = {"ssh": ("sshd",), "ray": ("ray",), "bwrap": ("bwrap",)}


def places(*names: str) -> list[Any]:
    """Parameters naming where a case runs ("none", "bwrap", "local-none", "ssh",
    "ssh-bwrap", "ray-none", ...), each marked with what that place starts, for a test
    that asks for the place's fixture itself (``request.getfixturevalue``)."""
    return [
        pytest.param(
            name,
            marks=[
                getattr(pytest.mark, marker)
                for part in name.split("-")
                for marker in _PLACE_PARTS.get(part, ())
            ],
        )
        for name in names
    ]


def agents(*names: str) -> list[Any]:
    """Parameters naming agents whose real CLI a case runs, each marked ``agent``."""
    return [pytest.param(name, marks=pytest.mark.agent) for name in names]


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def cli(*args: str) -> Ran:
    """Run ``fanout ARGS`` in this process (the cwd is the test's).  Each real ``fanout``
    is a process of its own: what a run seals (``cli.app.sealed_environ`` unsets the
    job's keys and secrets and makes the process non-dumpable) is undone afterwards,
    so the next call, and the next test, starts as a fresh process would."""
    before = dict(os.environ)
    try:
        result = CliRunner().invoke(APP, list(args))
    finally:
        os.environ.update(before)
        set_dumpable(True)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)


def write_job(directory: Path, text: str, name: str = "job.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def make_runner(
    job: Spec,
    transport: Transport,
    *,
    environ: Mapping[str, str] | None = None,
    events: Events | Callable[[dict[str, Any]], None] | None = None,
    journal: Journal | None = None,
    **parts: Any,
) -> Runner:
    """A Runner of ``job`` over ``transport`` with a real journal in the job's state
    directory (or ``journal``, to share one), no environment but ``environ``, its
    events to ``events`` (a sink, or an ``Events``); ``parts``: the Runner's other
    parts (``rng``, ``gate``, ``gateway``, ``workers``, ``monotonic``)."""
    return Runner(
        spec=job,
        transport=transport,
        journal=journal or Journal(job.runtime.state_dir / "journal.sqlite"),
        environ=environ or {},
        events=events if isinstance(events, Events) else Events(*([events] if events else [])),
        **parts,
    )


def make_attempt(
    directory: Path,
    argv: list[str],
    *,
    unit_id: str = "u1",
    verify: list[str] | None = None,
    timeout: float = 30,
    prompt: str = "",
    staged: tuple[StagedFile, ...] = (),
    collect: tuple[str, ...] | list[str] = (),
    env: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
    network: bool = False,
    log_limit: int = 1 << 20,
    tail_limit: int = 8192,
    throttle_patterns: tuple[str, ...] = (),
) -> Attempt:
    """One attempt as a transport receives it, writing its files below ``directory``."""
    return Attempt(
        run_id="r1",
        unit_id=unit_id,
        round=1,
        number=1,
        invocation=Invocation(
            unit_id=unit_id,
            rung="default",
            attempt=1,
            argv=tuple(argv),
            verify=tuple(verify or ()),
            prompt=prompt,
            env=MappingProxyType(env or {}),
            secrets=tuple(secrets or {}),
            timeout=timeout,
            stage=(),
            collect=tuple(collect),
        ),
        staged=staged,
        collect=Collect.compile(tuple(collect)),
        collect_dir=directory / "collected",
        log_path=directory / "logs" / "a1.log",
        log_limit=log_limit,
        tail_limit=tail_limit,
        network=network,
        throttle_patterns=tuple(re.compile(pattern) for pattern in throttle_patterns),
        secrets=secrets or {},
    )


def wrapped(kind: Kind, argv: list[str], base: Path, *, tools: tuple[Path, ...] = ()) -> list[str]:
    """The argv a local sandbox of ``kind`` at ``base`` runs for ``argv`` (its ``work``
    directory made), guard included: what ``local`` spawns for a step."""
    (base / "work").mkdir(parents=True, exist_ok=True)
    place = Place(
        host="local",
        kind=kind,
        base=str(base),
        path=os.environ.get("PATH", os.defpath),
        tools=tuple(str(tool) for tool in tools),
        namespace=sandbox.pid_namespace() if kind == "none" else (),
        lifeline=os.getpid(),
        root=os.geteuid() == 0,
    )
    return sandbox.guarded(sandbox.command(place, argv, network=False), argv[0], place)


def run_agent(
    program: Path,
    args: list[str],
    base: Path,
    env: dict[str, str],
    *,
    stdin: str,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run an agent CLI (``program``, installed in the test tools prefix) in a bwrap
    sandbox at ``base`` as fanout's sandboxes run it: network on (its mock API is on the
    host's loopback), ``base/work`` its cwd, and nothing in its environment but ``env``
    and a PATH of the CLI's directory and the system's.  ``base`` is bound into bwrap's
    view (its /tmp and /var/tmp are private), so a HOME inside it is writable there
    wherever ``base`` lies."""
    if shutil.which("bwrap") is None:
        raise AssertionError("bubblewrap is required (scripts/system-deps installs it)")
    (base / "work").mkdir(parents=True, exist_ok=True)
    path = f"{program.parent}:/usr/local/bin:/usr/bin:/bin"
    place = Place(
        host="local",
        kind="bwrap",
        base=str(base),
        path=path,
        tools=tuple(str(d) for d in sandbox.tool_dirs(path)),
        root=os.geteuid() == 0,
    )
    return subprocess.run(
        sandbox.command(place, [str(program), *args], network=True),
        input=stdin,
        capture_output=True,
        text=True,
        env={"PATH": path, **env},
        timeout=timeout,
        check=False,
    )


def table_rows(out: str) -> list[list[str]]:
    """The rows of the rich table in ``out`` as cells, a cell rich wrapped onto more
    lines joined again (``fanout hosts check``'s table)."""
    rows: list[list[str]] = []
    for line in out.replace("┃", "│").splitlines():
        if "│" not in line:
            continue
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if rows and not cells[0] and len(rows) > 1:
            rows[-1] = [" ".join(filter(None, pair)) for pair in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    return rows


def finished_attempts(directory: Path) -> list[dict[str, Any]]:
    """The ``attempt.finished`` events of the one run of the job in ``directory``."""
    (events,) = (directory / ".fanout" / "runs").glob("*/events.jsonl")
    found = [json.loads(line) for line in events.read_text().splitlines()]
    return [e for e in found if e["event"] == "attempt.finished"]


def run_report(directory: Path) -> dict[str, Any]:
    """report.json of the one run of the job in ``directory``."""
    (path,) = (directory / ".fanout" / "runs").glob("*/report.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def own_key(
    program: Path,
    mock: Any,
    monkeypatch: Any,
    variable: str,
    key: str,
    **configure: Any,
) -> None:
    """Ready a real agent CLI (``program``) to call the mock API ``mock`` with its own
    key, as a job without a gateway does: bwrap present (it runs in bwrap), the CLI on
    PATH, ``key`` in ``variable``, the mock configured (``configure``) to require it."""
    if shutil.which("bwrap") is None:
        raise AssertionError("bubblewrap is required (scripts/system-deps installs it)")
    monkeypatch.setenv("PATH", f"{program.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv(variable, key)
    mock.configure(require_key=key, **configure)


def claude_own_key_job(
    directory: Path, base_url: str, name: str, *, task: str = "", rest: str = ""
) -> Path:
    """A one-unit job of the real claude CLI calling the API at ``base_url`` with its own
    key (``ANTHROPIC_API_KEY``; no gateway), its own retries off so that each refusal
    ends one attempt, in bwrap with network; ``task`` adds lines to ``[task]``, ``rest``
    tables after ``[runtime]``."""
    return write_job(
        directory,
        f"""\
version = 1
name = "{name}"
[inputs]
items = ["one"]
[task]
agent = "claude"
prompt = "Write done into out.txt."
timeout = "60s"
secrets = ["ANTHROPIC_API_KEY"]
env = {{ ANTHROPIC_BASE_URL = "{base_url}", CLAUDE_CODE_MAX_RETRIES = "0" }}
{textwrap.dedent(task).strip()}
[runtime]
network = true
sandbox = "bwrap"
{textwrap.dedent(rest).strip()}
""",
    )


def agent_job(
    directory: Path,
    agent: str,
    *,
    env: Mapping[str, str],
    secrets: Sequence[str] = (),
    args: Sequence[str] = (),
    command: Sequence[str] = (),
    stage: Sequence[str] = (),
    attempts: int | None = None,
) -> Path:
    """A one-unit job of ``task.agent = agent`` without a gateway (the agent calls its
    API with its own key from ``secrets``, as a job without ``[[apis]]`` does), in
    bwrap, collecting out.txt; ``attempts``: a ladder of one rung of that many attempts
    (default: the default ladder).  Throttles and backoffs are short, throttle.max ten
    minutes: a usage window hours away parks the run."""
    ladder = f'[[retry.ladder]]\nname = "only"\nattempts = {attempts}\n' if attempts else ""
    return write_job(
        directory,
        f"""\
version = 1
name = "{agent}-outcomes"
[inputs]
items = ["one"]
[units]
collect = ["out.txt"]
{f"stage = {json.dumps(list(stage))}" if stage else ""}
[task]
agent = "{agent}"
{f"command = {json.dumps(list(command))}" if command else ""}
{f"args = {json.dumps(list(args))}" if args else ""}
prompt = "Write done into out.txt."
timeout = "120s"
{f"secrets = {json.dumps(list(secrets))}" if secrets else ""}
{"env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }" if env else ""}
[runtime]
network = true
sandbox = "bwrap"
[retry]
backoff = {{ initial = "250ms", max = "1s", jitter = "none" }}
throttle = {{ initial = "250ms", max = "10m" }}
{ladder}""",
    )


def replay_job(directory: Path, agent: str, golden: Path, exit_code: int) -> Path:
    """A one-unit job of ``task.agent = agent`` whose worker prints the captured output
    ``golden`` (staged into its sandbox) and exits with ``exit_code``: what the real CLI
    did, replayed through the dispatcher where the mock cannot make the CLI do it."""
    shutil.copy(golden, directory / "golden.out")
    return agent_job(
        directory,
        agent,
        env={},
        command=["sh", "-c", f'cat golden.out; exit "{exit_code}"'],
        stage=["golden.out"],
        attempts=1,
    )


def assert_throttled_then_succeeded(directory: Path, kind: str, reason: str) -> None:
    """The run of the one-unit job in ``directory``: one attempt of class ``kind``
    (its reason ``reason``) throttled, then the unit succeeded on the same rung."""
    attempts = finished_attempts(directory)
    assert [(a["status"], a["kind"]) for a in attempts] == [
        ("throttled", kind),
        ("succeeded", "success"),
    ]
    assert attempts[0]["reason"] == reason
    assert [a["rung"] for a in attempts] == ["default", "default"]  # no rung used
    report = run_report(directory)
    assert report["agentOutcomes"] == {kind: 1, "success": 1}
    (unit,) = report["units"]
    assert unit["rung"] == "default"


def far_from_resets() -> datetime:
    """Tomorrow at 06:00 UTC, on this machine's clock: hours from every reset the mock's
    agents name (a Gemini quota's midnight Pacific is 07:00 or 08:00 UTC, Claude's
    "resets 3:45pm (Europe/Dublin)" 14:45 or 15:45 UTC), so a test that wants a reset
    past ``retry.throttle.max`` gets one at any time of day (at the real time, one of
    them is minutes away for a while every day)."""
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    return datetime.combine(tomorrow, clock(6, 0), tzinfo=UTC).astimezone()


def pin_wall_clock(monkeypatch: pytest.MonkeyPatch, at: datetime) -> None:
    """The wall clock that attempts' verdicts read agents' resets against, set to ``at``
    for the runs this process makes (``verdict.wall_clock``)."""
    monkeypatch.setattr(verdict, "wall_clock", lambda: at)


def assert_parked_then_continued(job: Path, ran: Ran, kind: str, said: str) -> None:
    """``ran``, the first run of the one-unit ``job``, parked for a reset hours away:
    exit 8, ``said`` (the agent's words, after its class) and when it can go on in its
    message, the attempt interrupted and no unit charged; then a second ``fanout run``
    (the API answers again) continues that run and the unit succeeds on its first rung."""
    assert ran.code == 8, ran.out + ran.err
    assert f"{kind}: {said}" in ran.err
    assert "`fanout run` continues the run after " in ran.err
    (attempt,) = finished_attempts(job.parent)
    assert (attempt["status"], attempt["kind"]) == ("interrupted", kind)
    report = run_report(job.parent)
    assert report["state"] == "stopped"
    assert report["totals"] == {"interrupted": 1}  # no unit charged, none failed
    again = cli("run", str(job))
    assert again.code == 0, again.out + again.err
    report = run_report(job.parent)
    assert report["totals"] == {"succeeded": 1}
    (unit,) = report["units"]
    assert unit["rung"] == "default"


def only_run(directory: Path) -> Any:
    """The one run the journal under ``directory/.fanout`` holds."""
    journal = Journal(directory / ".fanout" / "journal.sqlite", read_only=True)
    try:
        (run,) = journal.runs()
        return run
    finally:
        journal.close()


def events_of(directory: Path, run_id: str, kind: str) -> list[dict[str, Any]]:
    """The run's events of ``kind`` from its events.jsonl, without their times."""
    log = directory / ".fanout" / "runs" / run_id / "events.jsonl"
    found = [json.loads(line) for line in log.read_text().splitlines()]
    return [{k: v for k, v in e.items() if k != "time"} for e in found if e["event"] == kind]


# A nightly job of three units; "b" fails every run, and two runs in a row quarantine
# it (the recurring-job tests: attention, history).
NIGHTLY = """\
version = 1
name = "nightly"
[inputs]
items = [{id = "a", status = "good"}, {id = "b", status = "bad"}, {id = "c", status = "good"}]
[units]
quarantineAfter = 2
[task]
command = ["test", "{{ unit.record.status }}", "!=", "bad"]
[runtime]
sandbox = "none"
"""

# 2026-11-30 03:00 UTC, and a day.
NIGHT = 1796007600.0
DAY = 86400.0


def unit_record(row: UnitRow) -> dict[str, Any]:
    """A unit's record in report.json as its journal row says it, made here in Python:
    what the report's lines (``json_object`` in SQLite) are checked against, up to its
    ``activeSeconds``."""
    return {
        "unit": row.unit.id,
        "round": row.round,
        "state": str(row.state),
        "rung": row.last.get("rung", ""),
        "attempts": row.attempts,
        "workerSeconds": round(row.worker_seconds, 3),
        "reason": row.reason,
        "origin": row.unit.origin,
        "collected": [c.path for c in row.collected],
        **({"reusedFrom": row.reused_from} if row.reused_from else {}),
    }
