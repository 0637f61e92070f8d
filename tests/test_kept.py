"""What the limits learned is kept from one run to the next (``kept``): a run saves its
learned ceilings in the journal, the next run's gate starts from them, and it says so
as it starts.  On a fake transport and virtual time, against an upstream that allows 2
requests in any 10 s and answers the rest with exit 75 and an honest Retry-After."""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from fanout import spec
from fanout.attempt.model import Attempt
from fanout.events import Events
from fanout.journal import Journal
from fanout.outcome import AttemptResult, Status
from fanout.pacing.ceiling import Learned
from fanout.pacing.limits import gate_for
from fanout.run import kept
from fanout.run.job import Options

from fakes import FakeTransport
from helpers import cli, make_runner, write_job

if TYPE_CHECKING:
    from fanout.gateway import Gateway

pytestmark = pytest.mark.looptime

LIMIT, WINDOW = 2, 10.0


class Upstream:
    """A sliding window of LIMIT requests per WINDOW: each attempt is one request, made
    when its worker has run (the fake's delay); a refused one exits 75 with Retry-After
    the seconds until the oldest counted request leaves the window."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.counted: deque[float] = deque()
        self.starts: list[float] = []
        self.throttled: list[float] = []

    def __call__(self, attempt: Attempt) -> AttemptResult:
        now = self.loop.time()
        self.starts.append(now - DELAY)
        while self.counted and self.counted[0] <= now - WINDOW:
            self.counted.popleft()
        if len(self.counted) >= LIMIT:
            self.throttled.append(now - DELAY)
            retry_after = math.ceil(self.counted[0] + WINDOW - now)
            return AttemptResult(
                status=Status.THROTTLED,
                reason="throttled (Retry-After)",
                exit_code=75,
                retry_after=retry_after,
            )
        self.counted.append(now)
        return AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0)


DELAY = 0.5


def _job(tmp_path: Path, units: int = 12) -> spec.Spec:
    names = ", ".join(f'"u{n:02d}"' for n in range(units))
    return spec.load(
        write_job(
            tmp_path,
            f"""
version = 1
name = "enrich"
[inputs]
items = [{names}]
[task]
command = ["enrich"]
[runtime]
maxConcurrentTasks = 6
[retry.throttle]
initial = "1s"
max = "1m"
jitter = 0.1
maxAttempts = 50
""",
        )
    )


async def _run(
    job: spec.Spec, journal: Journal, upstream: Upstream, events: list[dict[str, Any]]
) -> None:
    """One run as ``launch.runner_for`` wires it: the gate starts from what was kept.
    Every unit runs (no reuse): the runs are here for their pace."""
    sink = Events(events.append)
    seeds, _ = kept.seeds(journal, job)
    runner = make_runner(
        job,
        FakeTransport(script=upstream, delay=DELAY),
        journal=journal,
        events=sink,
        gate=gate_for(job, sink, random.Random(3), learned=seeds),
        rng=random.Random(7),
    )
    summary = await runner.execute(Options(reuse=False))
    assert summary.counts == {"succeeded": 12}


async def test_a_run_keeps_what_it_learned_and_the_next_starts_at_that_pace(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    first, first_events = Upstream(), list[dict[str, Any]]()
    await _run(job, journal, first, first_events)
    # Nothing was declared: the first run starts one, then two once it is through
    # (slow start, of 6 slots), and one of those is throttled.
    begin = first.starts[0]
    assert first.starts[:3] == [begin, begin + DELAY, begin + DELAY]
    assert first.throttled[0] == begin + DELAY
    (row,) = journal.kept_ceiling_rows("enrich")
    assert row.name == "*"
    # Throttled at 1.0, one more fitting 10 s later (rounded up) when the start at 0.0
    # leaves: 11 s, the upstream's 10 widened by the worker's delay before its request
    # and the rounding; an estimate is never short of the upstream's window.
    assert row.learned.window == 11.0
    assert 1.0 <= row.learned.per_window <= LIMIT
    assert row.text.startswith(f"{row.learned.per_window:.1f} per 11s learned from ")
    assert row.text.endswith("(none declared)")
    # The run's recorded limit statistics say the same (report and status read them).
    run = journal.runs("enrich")[0]
    assert run.limits["*"]["learned"] == row.learned.as_dict()
    assert run.limits["*"]["learnedText"] == row.text

    second, second_events = Upstream(), list[dict[str, Any]]()
    await _run(job, journal, second, second_events)
    start = second.starts[0]
    # A cron fire's run: paced from its first start at what the last run learned, so
    # at most one throttle in its first window, and none at all here.
    gaps = [b - a for a, b in zip(second.starts, second.starts[1:4], strict=False)]
    assert all(gap >= WINDOW / LIMIT for gap in gaps), second.starts[:4]
    assert [t for t in second.throttled if t < start + WINDOW] == []
    said = [
        {key: value for key, value in e.items() if key != "time"}
        for e in second_events
        if e["event"] == "limit.learned" and e.get("kept")
    ]
    assert said == [
        {
            "event": "limit.learned",
            "limit": "all dispatch",
            "perWindow": round(row.learned.per_window, 3),
            "window": 11.0,
            "throttles": row.learned.throttles,
            "concurrency": row.learned.concurrency,
            "text": row.text,
            "kept": True,
        }
    ]
    # The first run said it started slowly; the second, starting from what it knew, not.
    ramps = [(e["limit"], e["ramping"]) for e in first_events if e["event"] == "limit.ramp"]
    assert ramps[0] == ("all dispatch", True)
    assert not [e for e in second_events if e["event"] == "limit.ramp"]


async def test_the_round_s_end_keeps_what_was_learned_before_the_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = _job(tmp_path)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    saved: list[set[str]] = []
    save = journal.save_ceilings

    def spy(job_name: str, mapping: Any, *, run_id: str | None = None) -> None:
        saved.append(set(mapping))
        save(job_name, mapping, run_id=run_id)

    monkeypatch.setattr(journal, "save_ceilings", spy)
    await _run(job, journal, Upstream(), [])
    assert saved == [{"*"}, {"*"}]  # round 1's end, then the run's


def test_only_the_kept_names_a_job_has_now_seed_its_run(tmp_path: Path) -> None:
    with_limit = spec.load(
        write_job(
            tmp_path,
            """
version = 1
name = "enrich"
[inputs]
items = ["a"]
[task]
command = ["enrich"]
[[limits]]
name = "crm"
requests = 10
per = "1m"
""",
        )
    )
    journal = Journal(with_limit.runtime.state_dir / "journal.sqlite")
    one = Learned(rate=0.1, window=60.0, throttles=2)
    journal.save_ceilings(
        "enrich",
        {
            "*": (one, "all dispatch"),  # from before the job declared a limit
            "crm": (one, "crm"),
            "gone": (one, "a limit the job no longer has"),
            "api:anthropic": (one, "an API the job no longer has"),
        },
    )
    assert kept.seeds(journal, with_limit) == ({"crm": one}, {})
    without = _job(tmp_path / "b")
    journal.save_ceilings(without.name, {"api:x": (one, "x")})
    assert kept.seeds(journal, without) == ({"*": one}, {})


class _Gateway:
    """What ``kept`` asks of the gateway: what each API's window learned."""

    def __init__(self, learned: dict[str, tuple[Learned, str]]) -> None:
        self._learned = learned

    def learned(self) -> dict[str, tuple[Learned, str]]:
        return self._learned


async def test_what_the_gateway_learned_is_kept_and_recorded_as_api_rows(tmp_path: Path) -> None:
    job = _job(tmp_path)
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    window = Learned(rate=0.2, window=10.0, throttles=3)
    text = "2.0 per 10s learned from 3 throttles (declared 8 per 10s)"
    gateway = cast("Gateway", _Gateway({"anthropic": (window, text)}))
    gate = gate_for(job, Events())
    assert kept.limit_stats(gate, gateway) == {
        "api:anthropic": {"learned": window.as_dict(), "learnedText": text}
    }
    kept.save(journal, job, gate, gateway, "r1")
    assert journal.kept_ceilings("enrich") == {"api:anthropic": window}
    events: list[dict[str, Any]] = []
    kept.tell(Events(events.append), job, gate, gateway)
    assert [(e["event"], e.get("api"), e["text"], e["kept"]) for e in events[:1]] == [
        ("api.learned", "anthropic", text, True)
    ]


@pytest.mark.slow
def test_a_real_run_keeps_its_ceiling_and_status_plan_and_the_next_run_show_it(
    chdir_tmp: Path,
) -> None:
    """``fanout run`` end to end (launch wires the journal's seeds into the gate): a
    worker that exits 75 with Retry-After once; then status, plan and the next run."""
    marker = chdir_tmp / "throttled-once"
    script = (
        f"if [ $FANOUT_UNIT_ID = a ] && [ ! -e {marker} ];"
        f" then touch {marker}; echo Retry-After: 1; exit 75; fi"
    )
    write_job(
        chdir_tmp,
        f"""
        version = 1
        name = "crm"
        [inputs]
        items = ["a", "b"]
        [task]
        command = ["sh", "-c", '{script}']
        [runtime]
        sandbox = "none"
        maxConcurrentTasks = 2
        [retry.throttle]
        initial = "1s"
        jitter = 0
        """,
    )
    ran = cli("run", "job.toml")
    assert ran.code == 0, ran.err
    journal = Journal(chdir_tmp / ".fanout" / "journal.sqlite", read_only=True)
    (row,) = journal.kept_ceiling_rows("crm")
    assert row.name == "*"
    assert " learned from 1 throttle, " in row.text
    assert row.text.endswith(" (none declared)")
    status = cli("status")
    assert status.code == 0
    assert f"learned limits (kept for each job's next run)\n  crm  all dispatch: {row.text}\n" in (
        status.out
    )
    one = cli("status", str(row.run))
    assert f"  learned limits\n    all dispatch: {row.text}\n" in one.out
    plan = cli("plan", "job.toml")
    assert "Pace      no rate limits declared: fanout learns them from throttles\n" in plan.out
    assert f"Learned   all dispatch: {row.text} (run {row.run})\n" in plan.out
    again = cli("run", "job.toml")
    assert again.code == 0, again.err
    assert f" limit all dispatch starts at {row.text}, as an earlier run left it\n" in again.err
