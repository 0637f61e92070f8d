"""The next run's estimate from history (``report.estimate`` over ``journal.past``):
the sample of settled units, nearest-rank percentiles per rung and per unit, sums by
how a unit ended, and the projection of a next run, on a small journal written through
the journal's API with exact numbers; and ``fanout plan``'s estimate from that journal
(tests/test_plan_estimate.py has real runs through the gateway)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from fanout.backlog.units import Unit
from fanout.journal import Journal, Settled
from fanout.journal.past import ApiSums, Spread, UnitSums
from fanout.outcome import ApiUsage, AttemptResult, Outcome, RunState, Status, UnitState
from fanout.report import estimate

from helpers import cli, write_job

RUN = "20261201T120000-0a0a"
LATER = "20261202T120000-0b0b"
# Each unit's attempts: (rung, seconds, cost), the last one ending it in its state.
ATTEMPTS = {
    "a": [("first", 2.0, 0.01)],
    "b": [("first", 4.0, 0.02)],
    "c": [("first", 6.0, 0.03), ("second", 10.0, 0.05)],
    "d": [("first", 8.0, 0.04), ("second", 12.0, 0.06)],
}
ENDS = {"a": UnitState.SUCCEEDED, "b": UnitState.SUCCEEDED, "c": UnitState.SUCCEEDED}


def _values(spread: Spread) -> tuple[float, float, float]:
    return (spread.mean, spread.p50, spread.p90)


def _unit(name: str, index: int) -> Unit:
    return Unit(id=name, index=index, items=(name,), origin=f"i:{index}")


def _journal(path: Path) -> Journal:
    """Units a to d settled after running (d failed); e interrupted after an attempt of
    100 s; f reused.  Neither e nor f is in the sample."""
    journal = Journal(path)
    journal.create_run(job="est", job_file="est.toml", apply=False, run_id=RUN)
    journal.add_units(RUN, 1, [_unit(name, n) for n, name in enumerate("abcde")])
    for name, attempts in ATTEMPTS.items():
        for n, (rung, seconds, cost) in enumerate(attempts, 1):
            last = n == len(attempts)
            state = ENDS.get(name, UnitState.FAILED)
            ok = last and state is UnitState.SUCCEEDED
            status = Status.SUCCEEDED if ok else Status.FAILED
            journal.attempt_dispatched(RUN, 1, name, n, rung)
            journal.record_usage(
                RUN, 1, name, n, [ApiUsage(api="anthropic", requests=2, cost_usd=cost)]
            )
            journal.attempt_settled(
                RUN,
                1,
                name,
                n,
                AttemptResult(status=status, reason=str(status), duration=seconds),
                rung=0,
                rung_attempts=n,
                failures=0,
                last={},
                outcome=Outcome(unit_id=name, round=1, state=state, attempts=n) if last else None,
            )
    journal.attempt_dispatched(RUN, 1, "e", 1, "first")
    journal.attempt_settled(
        RUN,
        1,
        "e",
        1,
        AttemptResult(status=Status.FAILED, reason="x", duration=100.0),
        rung=0,
        rung_attempts=1,
        failures=1,
        last={},
    )
    journal.unit_interrupted(RUN, 1, "e")
    journal.add_settled(
        RUN, 1, [Settled.of(unit=_unit("f", 5), state=UnitState.REUSED, reason="reused")]
    )
    journal.finish_run(RUN, state=RunState.FINISHED, wall=30.0)
    return journal


def test_each_rung_has_its_units_attempts_and_nearest_rank_percentiles(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal.sqlite")
    rungs = journal.rung_history(journal.sample([RUN]))
    assert [(r.rung, r.units, r.attempts) for r in rungs] == [("first", 4, 4), ("second", 2, 2)]
    first, second = rungs
    # Durations 2, 4, 6, 8: p50 is the 2nd (ceil(0.5 x 4)), p90 the 4th (ceil(3.6)).
    assert first.seconds == Spread(mean=5.0, p50=4.0, p90=8.0)
    assert _values(first.cost_usd) == pytest.approx((0.025, 0.02, 0.04))
    # 10 and 12: p50 the 1st, p90 the 2nd (ceil(1.8)).
    assert second.seconds == Spread(mean=11.0, p50=10.0, p90=12.0)
    assert _values(second.cost_usd) == pytest.approx((0.055, 0.05, 0.06))


def test_units_are_summed_by_how_they_ended_and_their_spend_spread(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal.sqlite")
    units = journal.unit_history(journal.sample([RUN]), budget_usd=0.08)
    succeeded, failed = units.by_state["succeeded"], units.by_state["failed"]
    # a, b and c: 4 attempts of 2 + 4 + 6 + 10 s, spending 0.01, 0.02 and 0.08.
    assert (succeeded.units, succeeded.attempts, succeeded.seconds) == (3, 4, 22.0)
    assert (succeeded.spend_usd, succeeded.spend_squares) == pytest.approx((0.11, 0.0069))
    assert (failed.units, failed.attempts, failed.seconds) == (1, 2, 20.0)
    assert (failed.spend_usd, failed.spend_squares) == pytest.approx((0.10, 0.01))
    # No memory was declared for any attempt: byte-seconds are not known.
    assert (succeeded.byte_seconds, failed.byte_seconds) == (None, None)
    # Spends 0.01, 0.02, 0.08, 0.10: p50 the 2nd, p90 the 4th.
    assert _values(units.spend) == pytest.approx((0.0525, 0.02, 0.10))
    assert units.over_budget == 2  # c reached 0.08, d passed it
    used = units.apis["anthropic"]["failed"]
    assert (used.requests, used.cost_usd, used.cost_squares) == pytest.approx((4, 0.10, 0.01))
    assert units.api_all("anthropic").requests == 12


def test_the_history_is_the_jobs_runs_that_made_attempts_newest_first(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal.sqlite")
    journal.clock = lambda: time.time() + 3600
    journal.create_run(job="est", job_file="est.toml", apply=False, run_id=LATER)
    journal.create_run(job="other", job_file="other.toml", apply=False)
    assert [(r.id, r.attempts, r.wall) for r in journal.past_runs("est", 5)] == [(RUN, 7, 30.0)]
    assert journal.rung_history(journal.sample([])) == []
    assert journal.unit_history(journal.sample([]), budget_usd=None).by_state == {}


def test_a_next_run_sums_its_groups_and_its_spend_p90_is_the_sums(tmp_path: Path) -> None:
    journal = _journal(tmp_path / "journal.sqlite")
    units = journal.unit_history(journal.sample([RUN]), budget_usd=None)
    everyone = estimate.per_unit(units.all, {"anthropic": units.api_all("anthropic")})
    failures = estimate.per_unit(units.by_state["failed"], {"anthropic": ApiSums()})
    assert everyone is not None
    assert failures is not None
    assert (everyone.units, everyone.attempts, everyone.seconds) == (4, 1.5, 10.5)
    # Variance of 0.01, 0.02, 0.08, 0.10 about their mean 0.0525.
    variance = 0.0169 / 4 - 0.0525**2
    assert (everyone.spend_usd, everyone.spend_variance) == pytest.approx((0.0525, variance))
    assert everyone.apis["anthropic"].usage["requests"] == 3.0
    # 8 units like any, 2 unchanged since they failed, like d.
    projection = estimate.project([(8, everyone), (2, failures)])
    assert (projection.units, projection.attempts, projection.seconds) == (10, 16.0, 124.0)
    assert projection.mean_seconds == 7.75
    p90 = 0.62 + estimate.Z90 * math.sqrt(8 * variance)
    assert _values(projection.spend) == pytest.approx((0.62, 0.62, p90))
    assert round(estimate.Z90, 4) == 1.2816
    # The API's usage counts only the group whose unit used it.
    assert projection.apis["anthropic"].usage["requests"] == 24.0
    assert projection.gib_seconds is None


def test_gib_seconds_are_known_only_when_every_group_knows_them() -> None:
    known = estimate.per_unit(UnitSums(units=2, attempts=2, seconds=4.0, byte_seconds=2 * 2**30))
    unknown = estimate.per_unit(UnitSums(units=1, attempts=1, seconds=1.0, byte_seconds=None))
    assert known is not None
    assert unknown is not None
    assert known.gib_seconds == 1.0
    assert estimate.project([(3, known)]).gib_seconds == 3.0
    assert estimate.project([(3, known), (0, unknown)]).gib_seconds == 3.0
    assert estimate.project([(3, known), (1, unknown)]).gib_seconds is None
    assert estimate.per_unit(UnitSums()) is None


def _plan_job(directory: Path) -> Path:
    return write_job(
        directory,
        """
        version = 1
        name = "est"
        [inputs]
        items = ["a", "b", "c", "d", "e"]
        [task]
        command = ["true"]
        budget = { usd = 0.08 }
        [retry]
        ladder = [{ name = "first" }, { name = "second" }]
        [runtime]
        sandbox = "none"
        unsandboxedSecrets = true
        network = true
        maxConcurrentTasks = 4
        [[apis]]
        name = "anthropic"
        upstream = "https://api.anthropic.com"
        style = "anthropic"
        prices = { "*" = { input = 3.0, output = 15.0 } }
        """,
    )


def test_plan_without_an_earlier_run_says_so_and_that_every_unit_would_run(
    chdir_tmp: Path,
) -> None:
    job = _plan_job(chdir_tmp)
    planned = cli("plan", str(job))
    assert planned.code == 0, planned.err
    assert (
        "Estimate  no earlier run: no estimate\n"
        "          5 selected unit(s) would run (no earlier run to reuse)\n" in planned.out
    )
    document = json.loads(cli("plan", "--format", "json", str(job)).out)
    assert document["next"]["estimate"] is None
    assert document["next"]["units"]["toRun"] == 5
    assert not (chdir_tmp / ".fanout").exists()  # a plan creates no state


def test_plan_estimates_the_next_run_from_the_jobs_history(chdir_tmp: Path) -> None:
    job = _plan_job(chdir_tmp)
    _journal(chdir_tmp / ".fanout" / "journal.sqlite").close()
    planned = cli("plan", str(job))
    assert planned.code == 0, planned.err
    lines = planned.out.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("Estimate")))
    # No unit here has the fingerprint of an earlier success: all five would run, each
    # priced at what a unit took (1.5 attempts, 10.5 s, $0.0525; the spend's p90 is
    # 5 x 0.0525 + 1.2816 x sqrt(5 x 0.00146875)).
    assert lines[start : start + 9] == [
        f"Estimate  from 1 earlier run(s): 4 unit(s) settled after running (latest {RUN}:"
        " 7 attempt(s), 30s wall)",
        "          5 of 5 selected unit(s) would run, 0 reused, 0 quarantined",
        "          rung first: reached by 4 of 4 unit(s) (100%), 1.00 attempt(s) each; an"
        " attempt takes 5.0s (p50 4.0s, p90 8.0s) and costs $0.0250 (p50 $0.0200, p90"
        " $0.0400)",
        "          rung second: reached by 2 of 4 unit(s) (50%), 1.00 attempt(s) each; an"
        " attempt takes 11s (p50 10s, p90 12s) and costs $0.0550 (p50 $0.0500, p90 $0.0600)",
        "          a unit takes 1.50 attempt(s), 10s active, and spends $0.0525 (p50 $0.0200,"
        " p90 $0.1000)",
        "          next run: 7.5 attempt(s), 52s active, spend p50 $0.2625, p90 $0.3723",
        "          wall time about 13s, set by 4 slot(s); then a unit's attempts in a row 10s",
        "          task.budget $0.0800 per unit: a unit's p90 $0.1000 is OVER it; 2 of 4 past"
        " unit(s) spent it all",
        "",
    ]
    document = json.loads(cli("plan", "--format", "json", str(job)).out)
    figures = document["next"]["estimate"]
    assert figures["next"]["attempts"] == 7.5
    assert figures["perUnit"] == {
        "units": 4,
        "attempts": 1.5,
        "activeSeconds": 10.5,
        "spendUsd": {"mean": 0.0525, "p50": 0.02, "p90": 0.1},
    }
    assert figures["wall"][0] == {"by": "4 slot(s)", "seconds": 13.125}


def test_plan_says_that_run_continues_an_unfinished_last_run(chdir_tmp: Path) -> None:
    job = _plan_job(chdir_tmp)
    journal = _journal(chdir_tmp / ".fanout" / "journal.sqlite")
    journal.clock = lambda: time.time() + 3600
    journal.create_run(job="est", job_file="est.toml", apply=False, run_id=LATER)
    journal.close()
    planned = cli("plan", str(job))
    assert (
        f"Estimate  the job's last run {LATER} did not finish: `fanout run` continues it;"
        " this estimates a new run (`fanout run --fresh`)\n"
        f"          from 1 earlier run(s): 4 unit(s) settled after running (latest {RUN}:"
    ) in planned.out


def test_a_large_history_is_read_by_a_sample_that_stands_for_every_unit(tmp_path: Path) -> None:
    # 36 units succeeded at once (2 s, $0.01); 4 failed both attempts (3 s, $0.02 each).
    journal = Journal(tmp_path / "journal.sqlite")
    journal.create_run(job="est", job_file="est.toml", apply=False, run_id=RUN)
    names = [f"u{n:02d}" for n in range(40)]
    journal.add_units(RUN, 1, [_unit(name, n) for n, name in enumerate(names)])
    for n, name in enumerate(names):
        broke = n % 10 == 9
        for attempt in (1, 2) if broke else (1,):
            last = attempt == 2 or not broke
            state = UnitState.FAILED if broke else UnitState.SUCCEEDED
            journal.attempt_dispatched(RUN, 1, name, attempt, "first")
            cost = 0.02 if broke else 0.01
            journal.record_usage(
                RUN, 1, name, attempt, [ApiUsage(api="anthropic", requests=1, cost_usd=cost)]
            )
            journal.attempt_settled(
                RUN,
                1,
                name,
                attempt,
                AttemptResult(
                    status=Status.FAILED if broke else Status.SUCCEEDED,
                    reason="",
                    duration=3.0 if broke else 2.0,
                ),
                rung=0,
                rung_attempts=attempt,
                failures=0,
                last={},
                outcome=Outcome(unit_id=name, round=1, state=state, attempts=attempt)
                if last
                else None,
            )
    sample = journal.sample([RUN], limit=10)
    # Every failed unit (up to half the limit), and some of the successes.
    assert (sample.strata["failed"].settled, sample.strata["failed"].sampled) == (4, 4)
    succeeded = sample.strata["succeeded"]
    assert succeeded.settled == 36
    assert 1 <= succeeded.sampled < 36
    assert sample.units == 4 + succeeded.sampled
    assert journal.sample([RUN], limit=10) == sample  # the same units every time
    units = journal.unit_history(sample, budget_usd=0.04)
    # Each sampled success stands for 36 / sampled: the sums are the whole run's.
    ok, failed = units.by_state["succeeded"], units.by_state["failed"]
    assert (ok.units, ok.attempts, ok.seconds, ok.spend_usd) == pytest.approx((36, 36, 72, 0.36))
    assert (failed.units, failed.attempts, failed.seconds, failed.spend_usd) == pytest.approx(
        (4, 8, 24, 0.16)
    )
    # 90% of the weight spent $0.01: the p90 is $0.01, not the failures' $0.04.
    assert _values(units.spend) == pytest.approx((0.013, 0.01, 0.01))
    assert units.over_budget == pytest.approx(4)
    (rung,) = journal.rung_history(sample)
    assert (rung.units, rung.attempts) == pytest.approx((40, 44))
    assert _values(rung.seconds) == pytest.approx(((72 + 24) / 44, 2.0, 3.0))
