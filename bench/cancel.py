"""How long ``fanout run`` takes to exit after a Ctrl-C (SIGINT) while its input command
or its aggregate command runs (each sleeps 60 s), and whether the command's process
group is gone by then.

Usage: .venv/bin/python bench/cancel.py [REPEATS]
Prints a markdown table (median and worst of REPEATS runs each).  The figure includes
the coordinator's own exit (the interpreter shutting down).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from procs import group_members

FANOUT = [sys.executable, "-m", "fanout"]

JOBS = {
    "input command (60 s)": """
        [inputs]
        command = ["sh", "-c", "echo $$ > {pid}; sleep 60"]
        format = "lines"
        [task]
        command = ["true"]
        """,
    "aggregate command (60 s)": """
        [inputs]
        items = ["a"]
        [task]
        command = ["true"]
        [aggregate]
        command = ["sh", "-c", "echo $$ > {pid}; sleep 60"]
        """,
}


def _once(body: str) -> tuple[float, bool]:
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        pid = root / "command.pid"
        job = root / "job.toml"
        text = 'version = 1\nname = "cancel"\n' + textwrap.dedent(body).format(pid=pid)
        job.write_text(text + '[runtime]\nsandbox = "none"\n')
        coordinator = subprocess.Popen(
            [*FANOUT, "run", str(job)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        while not (pid.exists() and pid.read_text().strip()):
            time.sleep(0.01)
        pgid = int(pid.read_text())
        time.sleep(0.5)
        signalled = time.monotonic()
        coordinator.send_signal(signal.SIGINT)
        coordinator.wait()
        latency = time.monotonic() - signalled
        time.sleep(0.2)  # an orphaned member is reaped by init a moment later
        alive = bool(group_members(pgid))
        if alive:
            os.killpg(pgid, signal.SIGKILL)
        return latency, alive


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print("| Ctrl-C during | median exit after SIGINT | worst | group left alive |")
    print("| --- | --- | --- | --- |")
    for name, body in JOBS.items():
        runs = [_once(body) for _ in range(repeats)]
        latencies = [latency for latency, _ in runs]
        alive = sum(1 for _, left in runs if left)
        print(
            f"| {name} | {statistics.median(latencies):.2f} s | {max(latencies):.2f} s"
            f" | {alive} of {repeats} |"
        )


if __name__ == "__main__":
    main()
