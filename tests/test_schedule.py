"""The scheduler on virtual time: fires, overlap, catch-up, restarts, and the job lock."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.errors import JobLocked, Parked
from fanout.run.lock import JobLock
from fanout.schedule.scheduler import Fire, FireLog, Scheduler, trigger_key

from helpers import write_job

ORIGIN = datetime(2027, 3, 1, 9, 55, tzinfo=UTC)


class LoopClock:
    """Wall time that follows the (virtual) loop clock from ``origin``."""

    def __init__(self, origin: datetime) -> None:
        self.origin = origin
        self.start = asyncio.get_running_loop().time()

    def now(self) -> datetime:
        return self.origin + timedelta(seconds=asyncio.get_running_loop().time() - self.start)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _job(tmp_path: Path, trigger: str, name: str = "nightly") -> spec.Spec:
    return spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "{name}"
            [inputs]
            items = ["a"]
            [task]
            command = ["true"]
            [[triggers]]
            type = "cron"
            {trigger}
            """,
        )
    )


class Recorder:
    """A stand-in for a run: holds the job lock for ``minutes`` of virtual time."""

    def __init__(self, clock: LoopClock, minutes: float) -> None:
        self.clock = clock
        self.minutes = minutes
        self.started: list[tuple[str, str]] = []  # (scheduled fire, actual start), HH:MM
        self.interrupted: list[str] = []

    async def __call__(self, fire: Fire) -> str:
        lock = JobLock(fire.job.runtime.state_dir, fire.job.name)
        await lock.acquire(fire.trigger.overlap, by="test")
        try:
            self.started.append((f"{fire.at.astimezone(UTC):%H:%M}", f"{self.clock.now():%H:%M}"))
            try:
                await asyncio.sleep(self.minutes * 60)
            except asyncio.CancelledError:
                self.interrupted.append(f"{fire.at.astimezone(UTC):%H:%M}")
                raise
            return "ok"
        finally:
            lock.release()


pytestmark = pytest.mark.looptime


async def _run(
    tmp_path: Path, trigger: str, minutes: float, until: str
) -> tuple[Recorder, list[str]]:
    clock = LoopClock(ORIGIN)
    recorder = Recorder(clock, minutes)
    logs: list[str] = []
    job = _job(tmp_path, trigger)
    scheduler = Scheduler([job], start_run=recorder, clock=clock, log=logs.append)
    await scheduler.run(until=datetime.fromisoformat(until))
    return recorder, logs


async def test_fires_on_time_in_the_triggers_zone(tmp_path: Path) -> None:
    recorder, _ = await _run(
        tmp_path, 'schedule = "*/20 * * * *"\ntimezone = "Asia/Kolkata"', 1, "2027-03-01T11:05Z"
    )
    # Every 20 minutes on Kolkata's clock (UTC+05:30): :10, :30 and :50 past in UTC.
    assert recorder.started == [("10:10", "10:10"), ("10:30", "10:30"), ("10:50", "10:50")]


async def test_overlap_skip(tmp_path: Path) -> None:
    recorder, logs = await _run(
        tmp_path, 'schedule = "*/10 * * * *"\noverlap = "skip"', 25, "2027-03-01T11:00Z"
    )
    assert recorder.started == [("10:00", "10:00"), ("10:30", "10:30"), ("11:00", "11:00")]
    assert sum("skipped: the previous run is still going" in line for line in logs) == 4


async def test_overlap_queue_keeps_one_run_waiting(tmp_path: Path) -> None:
    recorder, logs = await _run(
        tmp_path, 'schedule = "*/10 * * * *"\noverlap = "queue"', 25, "2027-03-01T10:45Z"
    )
    # 10:10 waits for the 10:00 run; 10:20 finds 10:10 already queued; 10:30 queues
    # behind 10:10, which is running by then.
    assert recorder.started == [("10:00", "10:00"), ("10:10", "10:25"), ("10:30", "10:50")]
    assert any("10:20" in line and "already queued" in line for line in logs)


async def test_overlap_replace_interrupts_the_running_run(tmp_path: Path) -> None:
    recorder, _ = await _run(
        tmp_path, 'schedule = "*/10 * * * *"\noverlap = "replace"', 25, "2027-03-01T10:25Z"
    )
    assert recorder.started == [("10:00", "10:00"), ("10:10", "10:10"), ("10:20", "10:20")]
    assert recorder.interrupted[:2] == ["10:00", "10:10"]


async def test_a_stopped_scheduler_leaves_no_task_behind(tmp_path: Path) -> None:
    clock = LoopClock(ORIGIN)
    recorder = Recorder(clock, 1)
    job = _job(tmp_path, 'schedule = "*/10 * * * *"')
    scheduler = Scheduler([job], start_run=recorder, clock=clock, log=lambda message: None)
    # 10:07:30: the 10:00 run is over and the scheduler sleeps until 10:10.
    asyncio.get_running_loop().call_later(12.5 * 60, scheduler.stop)
    await scheduler.run()
    assert recorder.started == [("10:00", "10:00")]
    # Its sleep was cancelled and awaited, not left pending.
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def _after_downtime(job: spec.Spec) -> tuple[Recorder, list[str]]:
    """Run the scheduler from ORIGIN (09:55) to 10:30 after a downtime: the job's
    trigger last fired at 04:00.  What it started, and what it logged."""
    FireLog(job).set(trigger_key(0, job.triggers[0]), datetime(2027, 3, 1, 4, 0, tzinfo=UTC))
    clock = LoopClock(ORIGIN)
    recorder = Recorder(clock, 1)
    logs: list[str] = []
    await Scheduler([job], start_run=recorder, clock=clock, log=logs.append).run(
        until=datetime(2027, 3, 1, 10, 30, tzinfo=UTC)
    )
    return recorder, logs


async def test_catch_up_latest_runs_the_latest_missed_fire_once(tmp_path: Path) -> None:
    job = _job(tmp_path, 'schedule = "0 * * * *"\ncatchUp = "latest"\nstartingDeadline = "2h"')
    recorder, logs = await _after_downtime(job)
    assert recorder.started == [("09:00", "09:55"), ("10:00", "10:00")]
    assert (
        "missed 5 fire(s) while down; catching up the latest (2027-03-01T09:00:00+00:00)" in logs[0]
    )


async def test_catch_up_none_and_a_passed_deadline_skip_missed_fires(tmp_path: Path) -> None:
    for trigger, reason in [
        ('schedule = "0 * * * *"\ncatchUp = "none"', "catchUp = none"),
        (
            'schedule = "0 * * * *"\ncatchUp = "latest"\nstartingDeadline = "30m"',
            "past its startingDeadline",
        ),
    ]:
        directory = tmp_path / reason.replace(" ", "-")
        recorder, logs = await _after_downtime(_job(directory, trigger))
        assert recorder.started == [("10:00", "10:00")]
        assert logs[0].endswith(f"(latest 2027-03-01T09:00:00+00:00); skipped: {reason}")


async def test_a_restart_neither_fires_twice_nor_forgets(tmp_path: Path) -> None:
    job = _job(tmp_path, 'schedule = "*/10 * * * *"\ncatchUp = "latest"')
    clock = LoopClock(ORIGIN)
    first = Recorder(clock, 1)
    await Scheduler([job], start_run=first, clock=clock).run(
        until=datetime(2027, 3, 1, 10, 5, tzinfo=UTC)
    )
    assert first.started == [("10:00", "10:00")]
    saved = json.loads((job.runtime.state_dir / "schedule" / "nightly.json").read_text())
    assert list(saved.values()) == ["2027-03-01T10:00:00+00:00"]
    # The scheduler restarts at 10:05: 10:00 already fired, nothing to catch up.
    second = Recorder(clock, 1)
    await Scheduler([job], start_run=second, clock=clock).run(
        until=datetime(2027, 3, 1, 10, 15, tzinfo=UTC)
    )
    assert second.started == [("10:10", "10:10")]
    # Down from 10:15 to 10:38: the 10:20 and 10:30 fires were missed; catch up 10:30.
    await asyncio.sleep((datetime(2027, 3, 1, 10, 38, tzinfo=UTC) - clock.now()).total_seconds())
    third = Recorder(clock, 1)
    await Scheduler([job], start_run=third, clock=clock).run(
        until=datetime(2027, 3, 1, 10, 45, tzinfo=UTC)
    )
    assert third.started == [("10:30", "10:38"), ("10:40", "10:40")]


class Parking:
    """A stand-in for runs of a job whose agent's usage window closes: the first run
    parks (its window reopens at ``reset``, or at no time said), the others succeed."""

    def __init__(self, clock: LoopClock, reset: datetime | None) -> None:
        self.clock = clock
        self.reset = reset
        self.fires: list[tuple[str, str, bool]] = []  # (fire, actual start, a continuation)

    async def __call__(self, fire: Fire) -> str:
        self.fires.append((f"{fire.at:%H:%M:%S}", f"{self.clock.now():%H:%M:%S}", fire.resume))
        if len(self.fires) == 1:
            resume_at = None if self.reset is None else self.reset.timestamp()
            raise Parked("claude: usage-window: resets later", resume_at=resume_at)
        return "ok"


class Highest:
    """Randomness that always draws the top of the range (the longest jitter)."""

    def uniform(self, low: float, high: float) -> float:
        return high


async def test_a_parked_run_continues_after_the_reset_and_skips_the_fires_before(
    tmp_path: Path,
) -> None:
    job = _job(tmp_path, 'schedule = "*/10 * * * *"')
    clock = LoopClock(ORIGIN)
    # The 10:00 run parks; the window reopens at 10:31:40, 31:40 after the park.
    parking = Parking(clock, datetime(2027, 3, 1, 10, 31, 40, tzinfo=UTC))
    logs: list[str] = []
    scheduler = Scheduler(
        [job],
        start_run=parking,
        clock=clock,
        log=logs.append,
        rng=Highest(),  # type: ignore[arg-type]
    )
    await scheduler.run(until=datetime(2027, 3, 1, 10, 45, tzinfo=UTC))
    # The reset, 5 s of margin and a tenth of the 1,900 s wait (at most 60 s): 10:32:45.
    # The 10:10, 10:20 and 10:30 fires are skipped; 10:40 fires as usual.
    assert parking.fires == [
        ("10:00:00", "10:00:00", False),
        ("10:32:45", "10:32:45", True),
        ("10:40:00", "10:40:00", False),
    ]
    assert (
        "nightly: run parked until 2027-03-01T10:31:40+00:00; continuing it at "
        "2027-03-01T10:32:45+00:00, skipping the fires before" in logs
    )
    skipped = [line for line in logs if "skipped: the run is parked until" in line]
    assert [line.split(" fired for ")[1][:16] for line in skipped] == [
        "2027-03-01T10:10",
        "2027-03-01T10:20",
        "2027-03-01T10:30",
    ]
    # Continued, it is forgotten: a restart would not continue it again.
    saved = json.loads((job.runtime.state_dir / "schedule" / "nightly.json").read_text())
    assert "parked" not in saved


async def test_a_parked_run_continues_long_before_the_next_fire(tmp_path: Path) -> None:
    job = _job(tmp_path, 'schedule = "0 * * * *"')
    clock = LoopClock(ORIGIN)
    parking = Parking(clock, datetime(2027, 3, 1, 10, 20, tzinfo=UTC))
    await Scheduler([job], start_run=parking, clock=clock, rng=Highest()).run(  # type: ignore[arg-type]
        until=datetime(2027, 3, 1, 11, 30, tzinfo=UTC)
    )
    # 10:20, 5 s of margin, 60 s of jitter (a tenth of 20 minutes, at most a minute);
    # the scheduler was asleep until 11:00 when the run parked.
    assert parking.fires == [
        ("10:00:00", "10:00:00", False),
        ("10:21:05", "10:21:05", True),
        ("11:00:00", "11:00:00", False),
    ]


async def test_a_restarted_scheduler_continues_a_parked_run_at_its_time(tmp_path: Path) -> None:
    job = _job(tmp_path, 'schedule = "0 * * * *"')
    clock = LoopClock(ORIGIN)
    parking = Parking(clock, datetime(2027, 3, 1, 10, 20, tzinfo=UTC))
    logs: list[str] = []
    first = Scheduler([job], start_run=parking, clock=clock, log=logs.append, rng=Highest())  # type: ignore[arg-type]
    await first.run(until=datetime(2027, 3, 1, 10, 5, tzinfo=UTC))
    assert parking.fires == [("10:00:00", "10:00:00", False)]
    saved = json.loads((job.runtime.state_dir / "schedule" / "nightly.json").read_text())
    assert saved["parked"] == {"at": "2027-03-01T10:21:05+00:00", "trigger": 0}
    # Down from 10:05 to 10:30, past the continuation's time: continued at start.
    await asyncio.sleep((datetime(2027, 3, 1, 10, 30, tzinfo=UTC) - clock.now()).total_seconds())
    second = Scheduler([job], start_run=parking, clock=clock, log=logs.append)
    await second.run(until=datetime(2027, 3, 1, 10, 40, tzinfo=UTC))
    assert parking.fires[1:] == [("10:21:05", "10:30:00", True)]
    assert "nightly: a parked run continues at 2027-03-01T10:30:00+00:00" in logs


async def test_a_park_with_no_reset_time_waits_for_the_next_fire(tmp_path: Path) -> None:
    job = _job(tmp_path, 'schedule = "*/10 * * * *"')
    clock = LoopClock(ORIGIN)
    parking = Parking(clock, None)
    logs: list[str] = []
    await Scheduler([job], start_run=parking, clock=clock, log=logs.append).run(
        until=datetime(2027, 3, 1, 10, 15, tzinfo=UTC)
    )
    assert parking.fires == [("10:00:00", "10:00:00", False), ("10:10:00", "10:10:00", False)]
    assert "nightly: run parked, with no reset time said; the next fire continues it" in logs


async def test_trigger_vars_reach_the_run(tmp_path: Path) -> None:
    job = _job(tmp_path, 'name = "light"\nschedule = "@hourly"\nvars = { mode = "light" }')
    fires: list[Fire] = []

    async def start_run(fire: Fire) -> None:
        fires.append(fire)

    await Scheduler([job], start_run=start_run, clock=LoopClock(ORIGIN)).run(
        until=datetime(2027, 3, 1, 10, 1, tzinfo=UTC)
    )
    assert fires[0].context == {
        "name": "light",
        "schedule": "@hourly",
        "vars": {"mode": "light"},
        "time": "2027-03-01T10:00:00+00:00",
    }


LOCKER = """
import sys, time
sys.path.insert(0, {runner!r})
from pathlib import Path
from fanout.run.lock import JobLock
lock = JobLock(Path({state!r}), "race")
got = lock.try_acquire(by="racer")
print("got" if got else "lost", flush=True)
time.sleep(1.5)
"""


@pytest.mark.slow
@pytest.mark.looptime(False)
def test_two_processes_racing_for_a_job_lock(tmp_path: Path, repo: Path) -> None:
    code = LOCKER.format(runner=str(repo / "runner"), state=str(tmp_path))
    racers = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    results = sorted(p.communicate(timeout=20)[0].strip() for p in racers)
    assert results == ["got", "lost", "lost", "lost"]
    # The kernel released the lock with its holder: the next one gets it.
    assert JobLock(tmp_path, "race").try_acquire()


@pytest.mark.looptime(False)
async def test_skip_names_the_holder_and_queue_waits(tmp_path: Path) -> None:
    holder = JobLock(tmp_path, "job")
    assert holder.try_acquire(by="fanout schedule (nightly)")
    with pytest.raises(
        JobLocked,
        match=rf"job 'job' is already running \(pid {os.getpid()}, started by fanout schedule \(nightly\)",
    ):
        await JobLock(tmp_path, "job").acquire("skip")
    waiter = asyncio.create_task(JobLock(tmp_path, "job").acquire("queue"))
    await asyncio.sleep(0.5)
    assert not waiter.done()
    holder.release()
    await asyncio.wait_for(waiter, 5)


@pytest.mark.slow
@pytest.mark.looptime(False)
def test_schedule_command_logs_and_stops_on_sigterm(tmp_path: Path) -> None:
    job = _job(tmp_path, 'schedule = "0 3 * * *"')
    process = subprocess.Popen(
        [sys.executable, "-m", "fanout", "schedule", str(job.file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    first = process.stdout.readline()
    assert "scheduling nightly (1 trigger(s))" in first
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert out.strip().endswith("stopped")
    saved: dict[str, Any] = json.loads(
        (job.runtime.state_dir / "schedule" / "nightly.json").read_text()
    )
    assert list(saved) == ["0:0 3 * * *@UTC"]


_IGNORED = "# Created by fanout: its state directory (journal, logs, copies of files).\n*\n"


def test_a_state_directory_is_created_private_to_its_user(tmp_path: Path) -> None:
    lock = JobLock(tmp_path / "state", "job")
    assert lock.try_acquire()
    lock.release()
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    # Ignored by git and the tools that walk a tree, as a virtualenv is.
    assert (tmp_path / "state" / ".gitignore").read_text() == _IGNORED
    assert (tmp_path / "state" / ".ignore").read_text() == _IGNORED


def test_a_scheduler_makes_the_state_directory_the_same_way_before_any_run(
    tmp_path: Path,
) -> None:
    """The fire log is written when a scheduler first sees a trigger, before its first
    run takes the lock: the state directory it makes is just as private and ignored."""
    job = _job(tmp_path, 'schedule = "0 3 * * *"')
    FireLog(job).set(trigger_key(0, job.triggers[0]), ORIGIN)
    state = job.runtime.state_dir
    assert state.stat().st_mode & 0o777 == 0o700
    assert sorted(p.name for p in state.iterdir()) == [".gitignore", ".ignore", "schedule"]
    assert (state / ".gitignore").read_text() == _IGNORED


def test_an_existing_state_directory_is_left_as_its_user_made_it(tmp_path: Path) -> None:
    """Only a state directory fanout makes gets the ignore files (pytest does the same
    for its cache): one made before, or whose .gitignore was removed to commit the
    journal, stays as it is."""
    (tmp_path / "state").mkdir(mode=0o750)
    lock = JobLock(tmp_path / "state", "job")
    assert lock.try_acquire()
    lock.release()
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["locks"]


class SlowToWakeClock(LoopClock):
    """A clock whose sleep, once cancelled, takes a moment to let go (as a real one may)."""

    def __init__(self, origin: datetime) -> None:
        super().__init__(origin)
        self.sleeping = asyncio.Event()
        self.let_go: list[bool] = []

    async def sleep(self, seconds: float) -> None:
        self.sleeping.set()
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            await asyncio.shield(asyncio.sleep(1.0))
            self.let_go.append(True)
            raise


async def test_a_scheduler_cancelled_twice_leaves_no_sleep_behind(tmp_path: Path) -> None:
    # Its wait for the next fire races the clock's sleep against a stop and a parked
    # run: cancelled while it waits, and again while the sleep lets go, it returns
    # only once the sleep has ended (the race's tasks are owned by a group).
    clock = SlowToWakeClock(ORIGIN)
    scheduler = Scheduler(
        [_job(tmp_path, 'schedule = "0 10 * * *"')],
        start_run=Recorder(clock, 1),
        clock=clock,
        log=lambda line: None,
    )
    task = asyncio.create_task(scheduler.run())
    await clock.sleeping.wait()
    task.cancel()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.let_go == [True]


class FailingClock(LoopClock):
    async def sleep(self, seconds: float) -> None:
        raise OSError("the clock is gone")


async def test_a_clock_that_fails_stops_the_scheduler_with_its_own_error(tmp_path: Path) -> None:
    clock = FailingClock(ORIGIN)
    scheduler = Scheduler(
        [_job(tmp_path, 'schedule = "0 10 * * *"')],
        start_run=Recorder(clock, 1),
        clock=clock,
        log=lambda line: None,
    )
    with pytest.raises(OSError, match="the clock is gone"):
        await scheduler.run()
