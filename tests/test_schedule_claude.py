"""``fanout schedule`` continues a parked run at the reset time its agent named, end to
end: a real scheduler process fires a job whose real Claude Code CLI meets a usage
window (the mock Messages API answers `Claude AI usage limit reached|<epoch>` 20 s
ahead), the run parks with no unit charged, and the scheduler continues the same
run once the window has reset, long before the trigger's next fire (tomorrow 03:00)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fanout import spec
from fanout.journal import Journal
from fanout.schedule.scheduler import FireLog, trigger_key

from helpers import claude_own_key_job
from mockapi import Fault, MockApi

pytestmark = pytest.mark.slow

KEY = "sk-ant-own-key-schedule-3f9a1c7e2b"
# How far ahead the window resets: past throttle.max (1 s), so the run parks rather
# than waiting it out in a throttle, and far enough that the scheduler and the CLI have
# started and met the window before it has passed, however loaded the machine (with 3 s,
# a loaded CI machine once reached the mock after the reset, and the unit was throttled).
WINDOW = 20


@pytest.mark.timeout(300)  # two runs of a real agent, under load
def test_a_parked_run_is_continued_by_the_scheduler_at_the_reset(
    claude_cli: Path, mock_api: MockApi, tmp_path: Path
) -> None:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required (scripts/system-deps installs it)")
    mock_api.configure(require_key=KEY)
    job_file = claude_own_key_job(
        tmp_path,
        mock_api.url,
        "parked-nightly",
        rest="""
        [retry]
        throttle = { initial = "250ms", max = "1s" }
        [[triggers]]
        type = "cron"
        schedule = "0 3 * * *"
        catchUp = "latest"
        startingDeadline = "48h"
        """,
    )
    job = spec.load(job_file)
    # The trigger last fired two days ago: the scheduler catches up yesterday's fire at once.
    last = datetime.now(UTC) - timedelta(days=2)
    FireLog(job).set(trigger_key(0, job.triggers[0]), last)
    reset = int(time.time()) + WINDOW
    mock_api.script(Fault.USAGE_WINDOW, message=f"Claude AI usage limit reached|{reset}")
    env = {
        **os.environ,
        "PATH": f"{claude_cli.parent}{os.pathsep}{os.environ['PATH']}",
        "ANTHROPIC_API_KEY": KEY,
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "fanout", "schedule", str(job_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    lines: list[str] = []
    done = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if "done: run" in line:
                done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # Generous: two claude runs under load; the window itself is seconds.
        assert done.wait(150), "\n".join(lines)
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        reader.join(10)
    assert process.returncode == 0, err
    said = [line.split(" ", 1)[1] for line in lines]  # without the timestamps
    until = datetime.fromtimestamp(reset, UTC).isoformat(timespec="seconds")
    parked = next(line for line in said if "run parked until" in line)
    assert parked.startswith(f"parked-nightly: run parked until {until}; continuing it at ")
    at = datetime.fromisoformat(parked.split("continuing it at ")[1].split(",")[0])
    # 5 s of margin and at most a tenth of the wait's jitter after the reset.
    assert timedelta(seconds=5) <= at - datetime.fromtimestamp(reset, UTC)
    assert at - datetime.fromtimestamp(reset, UTC) <= timedelta(seconds=5 + WINDOW / 10)
    assert "parked-nightly: continuing the parked run" in said
    finished = next(line for line in said if "done: run" in line)
    assert finished.endswith(" finished: 1 succeeded"), said
    # One run, continued: its unit's attempts are the refusal and then the success, and
    # the refusal used no rung (the unit succeeded at its first rung's first attempt).
    journal = Journal(job.runtime.state_dir / "journal.sqlite")
    try:
        (row,) = journal.runs(job.name)
        assert row.state == "finished"
        assert journal.attempt_tally(row.id).by_kind() == {"success": 1, "usage-window": 1}
    finally:
        journal.close()
    report = json.loads((job.runtime.state_dir / "runs" / row.id / "report.json").read_text())
    (unit,) = report["units"]
    assert (unit["state"], unit["attempts"], unit["rung"]) == ("succeeded", 2, "default")
    statuses = [seen.status for seen in mock_api.posts()]
    assert statuses[0] == 429, statuses
    assert set(statuses[1:]) == {200}, statuses
    # The continuation is forgotten once it ran: a restart does not continue it again.
    assert FireLog(job).parked() is None
