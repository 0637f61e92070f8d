"""The spend figure under SIGKILL: the real ``fanout run`` of 40 units x 3 priced
requests through the gateway to the mock API (tests/mockapi.py, which bills each
request it answers, also one whose client died), SIGKILLed three times with requests
in flight, then run to its end.

The figures: the money the report counts is at least 99% of what the upstream billed
(every answered request at its usage, every request a kill cut off at its reservation),
and no more than that plus the reservations (nothing counted twice across the resumes);
with a run budget, the upstream bills at most the budget plus the requests that were in
flight when it was reached."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mockapi import MockApi, Usage

pytestmark = pytest.mark.slow

KEY = "sk-ant-real-kill-spend-5e1b7d"
UNITS = 40
REQUESTS = 3  # per unit, one after another
CONCURRENCY = 4
KILLS = 3
# $3 / $15 per million tokens; every answer reports 100 + 20 tokens: $0.0006 a request.
INPUT, OUTPUT = 100, 20
PER_REQUEST = (INPUT * 3.0 + OUTPUT * 15.0) / 1_000_000
# The mock answers each request after this long, so every kill finds some in flight.
LATENCY = 0.3
# A prompt of about INPUT tokens by the gateway's estimate (its JSON text / 4), with an
# output cap of 64: a request reserves a little more than it costs.
WORKER = r"""
import json, os, sys, urllib.request
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64,
                   "messages": [{"role": "user", "content": "summarise " * 40}]}).encode()
for _ in range(int(sys.argv[1])):
    request = urllib.request.Request(base + "/v1/messages", data=body, headers={
        "x-api-key": token, "content-type": "application/json",
        "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        json.load(answer)
"""


def _job(directory: Path, upstream: str, budget: str) -> None:
    items = json.dumps([f"u{n:02d}" for n in range(UNITS)])
    command = json.dumps(["python3", "-c", WORKER, str(REQUESTS)])
    (directory / "job.toml").write_text(
        f"""
version = 1
name = "kill-spend"
[inputs]
items = {items}
[task]
command = {command}
timeout = "60s"
[runtime]
maxConcurrentTasks = {CONCURRENCY}
# Plain directories (the kills are the point here, not the sandbox), which needs the
# opt-in for a job with [[apis]].
sandbox = "none"
unsandboxedSecrets = true
network = true
[[apis]]
name = "anthropic"
upstream = "{upstream}"
style = "anthropic"
keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
prices = {{ "claude-sonnet-*" = {{ input = 3.0, output = 15.0 }} }}
{budget}
"""
    )


@dataclass
class Spend:
    # What the upstream billed: requests answered (their usage recorded) and USD.
    billed_requests: int
    billed_usd: float
    # What report.json counts over the run's stretches, and of that the reservations
    # of requests a kill cut off.
    counted_requests: int
    counted_usd: float
    reserved_usd: float
    # The requests the mock was answering at each kill.
    in_flight: list[int]
    final_code: int
    # What report.md says of the reservations.
    note: list[str]


def _run(directory: Path, mock: MockApi, kill_at: list[int], budget: str = "") -> Spend:
    mock.configure(
        require_key=KEY, latency=LATENCY, usage=Usage(input_tokens=INPUT, output_tokens=OUTPUT)
    )
    _job(directory, mock.url, budget)
    env = {**os.environ, "FANOUT_TEST_ANTHROPIC_KEY": KEY}
    in_flight = []
    for posts in kill_at:
        coordinator = subprocess.Popen(
            [sys.executable, "-m", "fanout", "run", "job.toml"],
            cwd=directory,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        # Killed once the upstream has this many requests and is answering at least two.
        while len(mock.posts()) < posts or mock.in_flight < 2:
            assert coordinator.poll() is None, coordinator.communicate()[1]
            assert time.monotonic() < deadline, f"no kill point at {posts} requests"
            time.sleep(0.005)
        in_flight.append(mock.in_flight)
        coordinator.send_signal(signal.SIGKILL)
        _, err = coordinator.communicate()
        assert coordinator.returncode == -signal.SIGKILL, err
    final = subprocess.run(
        [sys.executable, "-m", "fanout", "run", "job.toml"],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    # The requests the kills cut off are billed as the mock finishes them.
    deadline = time.monotonic() + 10
    while mock.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    billed = [s for s in mock.posts() if s.usage is not None]
    tally = mock.tally()
    (report,) = (directory / ".fanout" / "runs").glob("*/report.json")
    (api,) = json.loads(report.read_text())["apis"]
    markdown = report.with_name("report.md").read_text().splitlines()
    return Spend(
        billed_requests=len(billed),
        billed_usd=(tally.input_tokens * 3.0 + tally.output_tokens * 15.0) / 1_000_000,
        counted_requests=api["requests"],
        counted_usd=api["costUsd"],
        reserved_usd=api.get("reservedUsd", 0.0),  # (absent before reservations)
        in_flight=in_flight,
        final_code=final.returncode,
        note=[line for line in markdown if line.startswith("Of the cost, ")],
    )


def test_three_sigkills_lose_none_of_the_spend(mock_api: MockApi, tmp_path: Path) -> None:
    spend = _run(tmp_path, mock_api, kill_at=[20, 50, 80])
    print(spend)
    assert spend.final_code == 0
    assert len(spend.in_flight) == KILLS
    assert min(spend.in_flight) >= 2
    # Every unit made its requests once in its settling attempt, and more in the
    # attempts the kills cut off.
    assert spend.billed_requests >= UNITS * REQUESTS
    assert spend.counted_usd >= 0.99 * spend.billed_usd
    # Answered requests are counted once, resumes and attempt ends included: what is
    # not a reservation is at most what the upstream billed.
    assert spend.counted_usd - spend.reserved_usd <= spend.billed_usd + 1e-9
    # The reservations are whole requests (each its prompt estimate and output cap,
    # about 2.1 times its cost here), at most one per worker at each kill: none left
    # from an attempt that ended.
    reserved = round(spend.reserved_usd / _reservation(), 6)
    assert reserved == int(reserved)
    assert KILLS <= reserved <= KILLS * CONCURRENCY
    assert [line.split(" is the reservation ")[0] for line in spend.note] == [
        f"Of the cost, ${spend.reserved_usd:.4f}"
    ]
    assert spend.counted_requests >= spend.billed_requests


def test_a_run_budget_sigkilled_three_times_is_overrun_by_the_requests_in_flight_at_most(
    mock_api: MockApi, tmp_path: Path
) -> None:
    budget = 0.03  # 50 requests' worth
    spend = _run(tmp_path, mock_api, kill_at=[10, 22, 34], budget=f"budget = {{ usd = {budget} }}")
    print(spend)
    assert spend.final_code == 7  # the budget stopped the run
    assert len(spend.in_flight) == KILLS
    # Counted with the kills' reservations, which err high: it stops at the budget,
    # the upstream's bill a little under it or over it by what was in flight.
    assert spend.counted_usd >= budget
    # Past the budget, only requests already in flight when it was reached (a worker
    # has one at a time, so at most CONCURRENCY).
    assert spend.billed_usd - budget <= CONCURRENCY * PER_REQUEST + 1e-9
    assert spend.counted_usd >= 0.99 * spend.billed_usd


def _reservation() -> float:
    """What one of the worker's requests reserves: its prompt's JSON text / 4 tokens at
    $3 per million, 64 output tokens at $15."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "summarise " * 40}]
    chars = len(json.dumps(messages, separators=(",", ":")))
    return (-(-chars // 4) * 3.0 + 64 * 15.0) / 1_000_000
