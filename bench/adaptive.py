"""Pacing to a limit nobody declared: real ``fanout run``s against a mock
upstream whose limit fanout is not told.

The upstream is tests/mockapi.py in a process of its own: N requests in any sliding
window of W = 10 s, a 429 beyond it with an honest ``retry-after`` (whole seconds until
one more fits, also just after the limit was lowered), and a limit that may change on
a schedule.  Each case writes a job into a temporary directory and runs
``python -m fanout run JOB`` as a user would (a process group of its own, killed at the
case's timeout); the mock's record (``GET /_mock/seen``) says what the upstream got.

Cases, each with its targets:

- A. Exit-75 workers, nothing declared: 12 units (``--units``), 4 slots, upstream 2 per
  10 s without rate-limit headers.  Each unit is a small Python worker making ONE
  request; on a 429 it prints ``Retry-After: N`` and exits 75, as a script calling an
  enrichment or CRM API would.  Sandbox none.  Targets: wall <= 1.3x the least, 429s <=
  25% of answers.
- B. The real claude CLI with the claude preset, its own key, no gateway
  (``CLAUDE_CODE_MAX_RETRIES=0``), the mock in tool mode (a Bash call, then the end of
  the turn: 2 requests a unit), upstream 2 per 10 s, 4 units, bwrap.  Targets as A.
- C. The gateway (``[[apis]]`` anthropic, upstream the mock, no window declared), claude
  units, upstream 2 per 10 s, 6 units.  Targets: >= 0.9 of the limit used (busy span),
  429s <= 10% of requests.
- D. The gateway, no window declared, the upstream's limit 6 -> 2 -> 6 per 10 s
  (0:6, 60:2, 120:6; ``--quick`` 0:6, 30:2, 60:6), 42 units of a tiny Python worker
  making 2 requests through the gateway (sandbox none): about 180 s of work at the
  limit.  Prints requests per 10 s window against the limit in force.  Target: each
  change followed within two windows.
- E. Two jobs at once (two ``fanout run`` processes, two job dirs, one state home as
  one user has) sharing one key and the upstream's limit (4 per 10 s) through their
  gateways, no window declared, 6 claude units each.  Targets: together >= 0.85 of the
  limit (busy span), each >= 0.35 of it while both are busy (from the later first
  request to the earlier last one; the mock tells whose request it was by the prompt),
  429s <= 10% of requests.
- F. A second run of case A's job in the same job dir and state home, as the next cron
  fire starts it (what the first run learned is in its journal), once the upstream's
  window has emptied.  Target: at most one 429 in its first window (W seconds from its
  first request).  Case A runs first, also when only F was asked for.

Every case also wants every unit to succeed (``fanout run`` exit 0).

How to read a case's row:

- least s: the least time the upstream's limit allows from the first request to the
  last, serving them as early as its window lets (for a fixed limit
  (ceil(R/N) - 1)·W for R requests: 50 s for A's 12, 30 s for B's 8, where the issue's
  table said ~40 s, R/N windows).  Start-up and the last unit's tail are not in it, so
  a perfect run shows a ratio a little above 1.
- wall s: the whole ``fanout run`` (start-up included); ratio = wall / least.
- answers: the 200s the upstream sent; 429s, and 429s per answer and per request
  (requests = answers + 429s: an agent's unit refused mid-conversation asks again).
- used (wall) = answers / (N · wall / W), the brief's figure: above 1 is possible on a
  short run (the first window is free at the start).  used (busy) = answers / (N ·
  (span / W + 1)), span = first to last request: the most any client could get in that
  span is N·(floor(span/W) + 1), so this is at most 1, and 1 for a run at the limit.
  With a schedule both integrate the limit over the time.  The targets use busy.
- Targets beside the figures, PASS or FAIL; a run killed at the timeout is a FAIL.

Usage: .venv/bin/python bench/adaptive.py [--cases A,B,C,D,E,F] [--units N] [--quick]
       [--slots N] [--timeout S] [--no-limit-headers] [--keep DIR]
A full run takes about 10 minutes (A 55-58 s, B 62 s, C 57-58 s, D 188 s, E 72 s,
F 59 s, and F's wait for the window), and at most about 50 with every run killed at
its timeout.  ``--quick`` takes about a third.
The claude cases need the CLI where scripts/system-deps installs it
($FANOUT_TEST_TOOLS, default /opt/fanout-test-tools) and bwrap; they are skipped without.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MOCK = ROOT / "tests" / "mockapi.py"
FANOUT = [sys.executable, "-m", "fanout"]
TOOLS = Path(os.environ.get("FANOUT_TEST_TOOLS", "/opt/fanout-test-tools"))
CLAUDE = TOOLS / "node_modules" / ".bin" / "claude"
KEY = "sk-ant-bench-adaptive-5d1c8e2a7b"  # the mock's "real" key; nobody's secret
WINDOW = 10.0
JOBS = ("E1", "E2")  # case E's two jobs; each one's prompt names it ("Case e1, ...")
# A step of the upstream's limit: (seconds since the mock started, requests per window).
Schedule = tuple[tuple[float, int], ...]

# One request per unit (A, F: ``python worker.py TAG 1``; a 429 is an exit 75 with the
# server's Retry-After) or a few in a row through the gateway (D).
WORKER = """\
import json, os, sys, urllib.error, urllib.request
url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages"
headers = {"x-api-key": os.environ.get("ANTHROPIC_API_KEY", "none"),
           "anthropic-version": "2023-06-01", "content-type": "application/json"}
tag, count = sys.argv[1], int(sys.argv[2])
body = json.dumps({"model": "claude-bench", "max_tokens": 16,
                   "messages": [{"role": "user", "content": tag}]}).encode()
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback only
for _ in range(count):
    try:
        with opener.open(urllib.request.Request(url, body, headers), timeout=600) as answer:
            answer.read()
    except urllib.error.HTTPError as error:
        if error.code in (429, 529):
            wait = error.headers.get("retry-after")
            if wait:
                print(f"Retry-After: {wait}", flush=True)
            sys.exit(75)
        raise
"""

WORKER_JOB = """\
version = 1
name = "adaptive-{case}"
[inputs]
command = ["seq", "{units}"]
format = "lines"
[task]
command = ["{python}", "{worker}", "case {case} unit {{{{ unit.id }}}}", "{requests}"]
timeout = "10m"
{task_env}
[runtime]
maxConcurrentTasks = {slots}
sandbox = "none"
{runtime}
{apis}
"""

CLAUDE_JOB = """\
version = 1
name = "adaptive-{case}"
[inputs]
command = ["seq", "{units}"]
format = "lines"
[task]
agent = "claude"
args = ["--allowedTools", "Bash"]
prompt = "Case {case}, unit {{{{ unit.id }}}}: write done into out.txt."
timeout = "10m"
{task_env}
[runtime]
maxConcurrentTasks = {slots}
network = true
sandbox = "bwrap"
{apis}
"""

# No window declared: the gateway is told the upstream and the key, nothing of its limit.
API = """\
[[apis]]
name = "anthropic"
upstream = "{url}"
style = "anthropic"
keySecret = "ANTHROPIC_API_KEY"
"""


@dataclass(frozen=True)
class Request:
    """One API request as the mock recorded it."""

    at: float  # time.monotonic() at arrival, the same clock as this process's
    since: float  # seconds since the mock started
    status: int
    limit: int | None
    prompt: str


class Mock:
    """The mock upstream, a process of its own (``python tests/mockapi.py``)."""

    def __init__(self, url: str, schedule: Schedule) -> None:
        self.url = url
        self.schedule = schedule
        self.started: float | None = None  # time.monotonic() of its start, once seen

    def _fetch(self) -> list[Request]:
        with urllib.request.urlopen(self.url + "/_mock/seen", timeout=30) as answer:
            record: list[dict[str, Any]] = json.loads(answer.read())
        return [
            Request(
                at=r["at"],
                since=r["since"],
                status=r["status"],
                limit=r["limit"],
                prompt=r["prompt"],
            )
            for r in record
            if r["method"] == "POST"
        ]

    async def requests(self, since_at: float = 0.0) -> list[Request]:
        """The API requests that arrived at or after ``since_at`` (time.monotonic()), in
        the order they arrived (the record is in the order they were answered)."""
        requests = await asyncio.to_thread(self._fetch)
        if requests and self.started is None:
            self.started = requests[0].at - requests[0].since
        return sorted((r for r in requests if r.at >= since_at), key=lambda r: r.at)

    def since(self, at: float) -> float:
        """Mock time (seconds since its start) of a time.monotonic() reading."""
        return at - (self.started if self.started is not None else at)


@contextlib.asynccontextmanager
async def mock_process(schedule: Schedule, *flags: str) -> AsyncIterator[Mock]:
    steps = ",".join(f"{start:g}:{limit}" for start, limit in schedule)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(MOCK),
        "--window",
        f"{WINDOW:g}",
        "--schedule",
        steps,
        *flags,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    try:
        url = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip()
        if not url.startswith("http://"):
            raise SystemExit(f"the mock did not start: {url!r}")
        yield Mock(url, schedule)
    finally:
        process.stdin.close()  # it serves until its stdin closes
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


@dataclass
class Run:
    """One ``fanout run``: its exit code (None: killed at the timeout), when it
    started (time.monotonic()) and how long it took."""

    code: int | None
    started: float
    wall: float
    log: Path


async def fanout_run(job: Path, env: dict[str, str], seconds: float, log: Path) -> Run:
    """``fanout run JOB`` in a process group of its own, its output in ``log``; SIGTERM
    to the group after ``seconds`` (fanout drains: running units are stopped), SIGKILL if
    it is still there 30 s later."""
    started = time.monotonic()
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            *FANOUT,
            "run",
            str(job),
            # Every unit runs: the cases measure pacing (F, a second run of A's job,
            # would reuse all 12 of its successes).
            "--no-reuse",
            cwd=job.parent,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        code: int | None = None
        try:
            code = await asyncio.wait_for(process.wait(), seconds)
        except TimeoutError:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 30)
            except TimeoutError:
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        finally:
            if process.returncode is None:  # cancelled (Ctrl-C of the bench)
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
            _signal_group(process.pid, signal.SIGKILL)  # anything of its group left over
    return Run(code=code, started=started, wall=time.monotonic() - started, log=log)


def _signal_group(pid: int, number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, number)


# -- what the limit allows -------------------------------------------------------------


def limit_at(schedule: Schedule, since: float) -> int:
    limit = schedule[0][1]
    for start, step in schedule:
        if start > since:
            break
        limit = step
    return limit


def least_span(schedule: Schedule, count: int, start: float) -> float:
    """The least time from the first of ``count`` requests (at mock time ``start``) to
    the last that the upstream's sliding window allows: each is sent as soon as one more
    fits (the earliest schedule is the greedy one), the limit changing on its schedule."""
    accepted: list[float] = []
    t = start
    steps = [s for s, _ in schedule]
    for _ in range(count):
        while True:
            limit = limit_at(schedule, t)
            inside = [a for a in accepted if a + WINDOW > t + 1e-9]
            if len(inside) < limit:
                accepted.append(t)
                break
            leave = inside[len(inside) - limit] + WINDOW
            later = [s for s in steps if s > t + 1e-9]
            t = min(leave, later[0]) if later else leave
    return accepted[-1] - start if accepted else 0.0


def capacity(schedule: Schedule, start: float, end: float) -> float:
    """Requests the limit allows per unit of time over [start, end], integrated
    (N·(end - start)/W for a fixed N)."""
    edges = sorted({start, end, *(s for s, _ in schedule if start < s < end)})
    return sum(limit_at(schedule, a) * (b - a) / WINDOW for a, b in itertools.pairwise(edges))


# -- one case's figures ------------------------------------------------------------------


@dataclass
class Row:
    case: str
    title: str
    units: int
    least: float | None = None
    wall: float = 0.0
    answers: int = 0
    throttles: int = 0
    used_wall: float | None = None
    used_busy: float | None = None
    codes: list[int | None] = field(default_factory=list)
    checks: list[tuple[str, bool]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # tables of its own, after the row
    skipped: str = ""

    @property
    def requests(self) -> int:
        return self.answers + self.throttles

    @property
    def passed(self) -> bool:
        return not self.skipped and all(ok for _, ok in self.checks)

    def check(self, text: str, ok: bool) -> None:
        self.checks.append((text, ok))


def keep_requests(directory: Path, requests: Sequence[Request]) -> None:
    """The upstream's record of a case, beside its jobs (``requests.tsv``: seconds since
    the mock started, status, the prompt's tail), to read where the time went."""
    lines = [f"{r.since:.3f}\t{r.status}\t{r.prompt[-40:]}" for r in requests]
    (directory / "requests.tsv").write_text("\n".join(lines) + "\n")


def measure(
    row: Row, mock: Mock, requests: Sequence[Request], runs: Sequence[Run], needed: int
) -> tuple[float, float] | None:
    """Fill ``row``'s figures from the requests the mock got during ``runs`` (the work
    needs ``needed`` answers); the busy span in mock time, or None without requests."""
    row.codes = [run.code for run in runs]
    row.wall = max(run.started + run.wall for run in runs) - min(run.started for run in runs)
    row.answers = sum(r.status == 200 for r in requests)
    row.throttles = sum(r.status == 429 for r in requests)
    row.check("every unit succeeded (exit 0)", all(code == 0 for code in row.codes))
    for run in runs:
        if run.code not in (0, 1, None):  # not a run's verdict: the job or the bench is wrong
            tail = run.log.read_text(errors="replace").splitlines()[-15:]
            row.lines += [f"fanout run exited {run.code}; the end of {run.log}:", *tail, ""]
    if not requests:
        return None
    first, last = requests[0].since, requests[-1].since
    row.least = least_span(mock.schedule, needed, first)
    begin = mock.since(min(run.started for run in runs))
    end = begin + row.wall
    row.used_wall = row.answers / capacity(mock.schedule, begin, end)
    free = limit_at(mock.schedule, first)  # the window that is full at once at the start
    row.used_busy = row.answers / (free + capacity(mock.schedule, first, last))
    return first, last


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def per(part: int, whole: int) -> float:
    """``part / whole`` for a target: a 429 without any answer is infinitely many."""
    return part / whole if whole else math.inf if part else 0.0


def text(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def print_row(row: Row) -> None:
    print(f"\n### {row.case}. {row.title}\n")
    if row.skipped:
        print(f"SKIPPED: {row.skipped}\n")
        return
    print(
        "| units | least s | wall s | wall/least | answers | 429s | 429s/answers "
        "| 429s/requests | used (wall) | used (busy) | exit |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    codes = ", ".join("timeout" if code is None else str(code) for code in row.codes)
    print(
        f"| {row.units} | {text(row.least, 1)} | {row.wall:.1f} "
        f"| {text(ratio(row.wall, row.least))} | {row.answers} | {row.throttles} "
        f"| {text(ratio(row.throttles, row.answers))} "
        f"| {text(ratio(row.throttles, row.requests))} | {text(row.used_wall, 3)} "
        f"| {text(row.used_busy, 3)} | {codes} |"
    )
    print()
    for line in row.lines:
        print(line)
    for target, ok in row.checks:
        print(f"- {'PASS' if ok else 'FAIL'}: {target}")
    print(flush=True)


# -- the cases ------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    scratch: Path
    # Case A's job and mock, kept for F (its second run), and what closes the mock.
    exit75: tuple[Path, Mock, dict[str, str], float] | None = None
    stack: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    def units(self, full: int, quick: int) -> int:
        units: int | None = self.args.units
        return units if units is not None else quick if self.args.quick else full

    def timeout(self, least: float) -> float:
        given: float | None = self.args.timeout
        return given if given is not None else min(900.0, 6 * least + 120)

    def headers(self, default: bool) -> tuple[str, ...]:
        """The mock's flag for its rate-limit headers: off for a non-LLM API, or
        everywhere with --no-limit-headers."""
        return () if default and not self.args.no_limit_headers else ("--no-limit-headers",)

    def directory(self, name: str) -> Path:
        path = self.scratch / name
        path.mkdir(parents=True)
        return path

    def env(self, state: Path) -> dict[str, str]:
        return {
            **os.environ,
            "XDG_STATE_HOME": str(state),
            "PATH": f"{CLAUDE.parent}{os.pathsep}{os.environ['PATH']}",
            # The upstream key as a user exports it: the agent's own secret (B), or
            # the gateway's keySecret (C, D, E).
            "ANTHROPIC_API_KEY": KEY,
        }

    def logs(self, row: Row, *runs: Run) -> None:
        """Where each run's output is, if it is kept (--keep)."""
        if self.args.keep is not None:
            row.lines.append(f"log: {', '.join(str(run.log) for run in runs)}\n")

    def claude_missing(self) -> str:
        if not os.access(CLAUDE, os.X_OK):
            return f"the claude CLI is not at {CLAUDE} (scripts/system-deps installs it)"
        if shutil.which("bwrap") is None:
            return "bwrap is not installed (scripts/system-deps installs it)"
        return ""


def worker_job(
    directory: Path, case: str, units: int, slots: int, requests: int, *, url: str, gateway: bool
) -> Path:
    worker = directory / "worker.py"
    worker.write_text(WORKER)
    job = directory / "job.toml"
    job.write_text(
        WORKER_JOB.format(
            case=case.lower(),
            units=units,
            python=sys.executable,
            worker=worker,
            requests=requests,
            slots=slots,
            task_env="" if gateway else f'env = {{ ANTHROPIC_BASE_URL = "{url}" }}',
            # A gateway's tokens in plain directories: the bench measures pacing.
            runtime="network = true\nunsandboxedSecrets = true" if gateway else "",
            apis=API.format(url=url) if gateway else "",
        )
    )
    return job


def claude_job(
    directory: Path, case: str, units: int, slots: int, *, url: str, gateway: bool
) -> Path:
    job = directory / "job.toml"
    own_key = (
        f'secrets = ["ANTHROPIC_API_KEY"]\nenv = {{ ANTHROPIC_BASE_URL = "{url}", '
        'CLAUDE_CODE_MAX_RETRIES = "0", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = "1" }'
    )
    job.write_text(
        CLAUDE_JOB.format(
            case=case.lower(),
            units=units,
            slots=slots,
            task_env="" if gateway else own_key,
            apis=API.format(url=url) if gateway else "",
        )
    )
    return job


async def case_a(bench: Bench) -> Row:
    units = bench.units(12, 6)
    row = Row("A", "exit-75 workers, nothing declared, 2 per 10 s", units)
    directory = bench.directory("a")
    schedule: Schedule = ((0, 2),)
    # Closed at the bench's end: case F's run is the same job against the same mock.
    mock = await bench.stack.enter_async_context(mock_process(schedule, *bench.headers(False)))
    job = worker_job(directory, "A", units, bench.args.slots, 1, url=mock.url, gateway=False)
    env = bench.env(directory / "state")
    least = least_span(schedule, units, 0)
    run = await fanout_run(job, env, bench.timeout(least), directory / "run.log")
    requests = await mock.requests(run.started)
    measure(row, mock, requests, [run], units)
    row.check("wall <= 1.3x the least", (ratio(row.wall, row.least) or math.inf) <= 1.3)
    row.check("429s <= 25% of answers", per(row.throttles, row.answers) <= 0.25)
    bench.logs(row, run)
    last = requests[-1].at if requests else time.monotonic()
    bench.exit75 = (job, mock, env, last)
    return row


async def case_f(bench: Bench) -> Row:
    assert bench.exit75 is not None, "case A runs before F"
    job, mock, env, last = bench.exit75
    units = bench.units(12, 6)
    row = Row("F", "case A's job again, the next cron fire (same job dir and state)", units)
    # The next fire comes once the upstream's window has emptied.
    await asyncio.sleep(max(0.0, last + WINDOW + 1 - time.monotonic()))
    least = least_span(mock.schedule, units, 0)
    run = await fanout_run(job, env, bench.timeout(least), job.parent / "run-f.log")
    requests = await mock.requests(run.started)
    measure(row, mock, requests, [run], units)
    first = requests[0].at if requests else 0.0
    early = [r for r in requests if r.at < first + WINDOW]
    refused = sum(r.status == 429 for r in early)
    row.lines.append(
        f"first window ({WINDOW:g} s from its first request): {len(early)} requests, "
        f"{refused} 429s\n"
    )
    bench.logs(row, run)
    row.check("at most one 429 in its first window", refused <= 1)
    return row


async def case_b(bench: Bench) -> Row:
    units = bench.units(4, 2)
    row = Row("B", "claude preset, its own key, no gateway, 2 per 10 s", units)
    row.skipped = bench.claude_missing()
    if row.skipped:
        return row
    directory = bench.directory("b")
    schedule: Schedule = ((0, 2),)
    async with mock_process(schedule, "--tool", *bench.headers(True)) as mock:
        job = claude_job(directory, "B", units, bench.args.slots, url=mock.url, gateway=False)
        least = least_span(schedule, 2 * units, 0)
        run = await fanout_run(
            job, bench.env(directory / "state"), bench.timeout(least), directory / "run.log"
        )
        requests = await mock.requests(run.started)
    measure(row, mock, requests, [run], 2 * units)
    row.check("wall <= 1.3x the least", (ratio(row.wall, row.least) or math.inf) <= 1.3)
    row.check("429s <= 25% of answers", per(row.throttles, row.answers) <= 0.25)
    bench.logs(row, run)
    return row


async def case_c(bench: Bench) -> Row:
    units = bench.units(6, 3)
    row = Row("C", "gateway, no window declared, claude units, 2 per 10 s", units)
    row.skipped = bench.claude_missing()
    if row.skipped:
        return row
    directory = bench.directory("c")
    schedule: Schedule = ((0, 2),)
    async with mock_process(schedule, "--tool", *bench.headers(True)) as mock:
        job = claude_job(directory, "C", units, bench.args.slots, url=mock.url, gateway=True)
        least = least_span(schedule, 2 * units, 0)
        run = await fanout_run(
            job, bench.env(directory / "state"), bench.timeout(least), directory / "run.log"
        )
        requests = await mock.requests(run.started)
    measure(row, mock, requests, [run], 2 * units)
    row.check(">= 0.9 of the limit used (busy)", (row.used_busy or 0) >= 0.9)
    row.check("429s <= 10% of requests", per(row.throttles, row.requests) <= 0.10)
    bench.logs(row, run)
    return row


def windows_table(
    schedule: Schedule, requests: Sequence[Request], end: float
) -> tuple[list[str], list[tuple[str, int | None]]]:
    """D's table: requests per window of W seconds from each change of the limit (until
    the next change, or the run's end), and how many windows fanout took to follow each
    change: the first window with >= 80% of the limit answered and at most one 429."""
    lines = [
        "| window s | limit | requests | answers | 429s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    follows: list[tuple[str, int | None]] = []
    for index, (start, limit) in enumerate(schedule):
        stop = schedule[index + 1][0] if index + 1 < len(schedule) else max(end, start)
        before = schedule[index - 1][1] if index else 0
        followed: int | None = None
        number = 0
        t = start
        while t < stop - 1e-9:
            inside = [r for r in requests if t <= r.since < t + WINDOW]
            answers = sum(r.status == 200 for r in inside)
            refused = sum(r.status == 429 for r in inside)
            lines.append(
                f"| {t:.0f}-{t + WINDOW:.0f} | {limit} | {len(inside)} | {answers} | {refused} |"
            )
            number += 1
            if followed is None and answers >= math.ceil(0.8 * limit) and refused <= 1:
                followed = number
            t += WINDOW
        name = "start" if not index else f"{before} -> {limit} at {start:g} s"
        follows.append((name, followed))
    return lines, follows


async def case_d(bench: Bench) -> Row:
    quick = bench.args.quick
    schedule: Schedule = ((0, 6), (30, 2), (60, 6)) if quick else ((0, 6), (60, 2), (120, 6))
    units = bench.units(42, 21)
    row = Row("D", "gateway, no window declared, the limit 6 -> 2 -> 6 per 10 s", units)
    directory = bench.directory("d")
    async with mock_process(schedule, *bench.headers(True)) as mock:
        job = worker_job(directory, "D", units, bench.args.slots, 2, url=mock.url, gateway=True)
        least = least_span(schedule, 2 * units, 0)
        run = await fanout_run(
            job, bench.env(directory / "state"), bench.timeout(least), directory / "run.log"
        )
        requests = await mock.requests(run.started)
    measure(row, mock, requests, [run], 2 * units)
    lines, follows = windows_table(schedule, requests, mock.since(run.started + run.wall))
    row.lines += [*lines, ""]
    for name, followed in follows:
        shown = "not within the run" if followed is None else f"{followed} windows"
        row.lines.append(f"followed {name}: {shown}")
        if name != "start":
            row.check(f"followed {name} within 2 windows", followed is not None and followed <= 2)
    row.lines.append("")
    bench.logs(row, run)
    return row


async def case_e(bench: Bench) -> Row:
    units = bench.units(6, 3)
    row = Row("E", "two jobs at once sharing one key, gateways, 4 per 10 s", 2 * units)
    row.skipped = bench.claude_missing()
    if row.skipped:
        return row
    schedule: Schedule = ((0, 4),)
    directory = bench.directory("e")
    env = bench.env(directory / "state")  # one user: one state home for both jobs
    async with mock_process(schedule, "--tool", *bench.headers(True)) as mock:
        jobs = [
            claude_job(
                bench.directory(f"e/{name}"),
                name,
                units,
                bench.args.slots,
                url=mock.url,
                gateway=True,
            )
            for name in JOBS
        ]
        least = least_span(schedule, 4 * units, 0)
        runs = await asyncio.gather(
            *(fanout_run(job, env, bench.timeout(least), job.parent / "run.log") for job in jobs)
        )
        requests = await mock.requests(min(run.started for run in runs))
    keep_requests(directory, requests)
    measure(row, mock, requests, runs, 4 * units)
    row.check(">= 0.85 of the limit used together (busy)", (row.used_busy or 0) >= 0.85)
    row.check("429s <= 10% of requests", per(row.throttles, row.requests) <= 0.10)
    # Each job's share while both were busy: from the later first request to the earlier
    # last one (a job that is done early does not lose its share for the time after).
    own = {name: [r for r in requests if f"Case {name.lower()}," in r.prompt] for name in JOBS}
    both = (
        (max(mine[0].since for mine in own.values()), min(mine[-1].since for mine in own.values()))
        if all(own.values())
        else None
    )
    row.lines += [
        f"both busy: {'-' if both is None else f'{both[0]:.1f}-{both[1]:.1f} s'}",
        "",
        "| job | answers | 429s | wall s | answers while both busy | share of the limit then |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (name, mine), run in zip(own.items(), runs, strict=True):
        share: float | None = None
        during = 0
        if both is not None:
            start, end = both
            during = sum(r.status == 200 and start <= r.since <= end for r in mine)
            share = during / (limit_at(schedule, start) + capacity(schedule, start, end))
        row.lines.append(
            f"| {name} | {sum(r.status == 200 for r in mine)} "
            f"| {sum(r.status == 429 for r in mine)} | {run.wall:.1f} | {during} "
            f"| {text(share, 3)} |"
        )
        row.check(f"{name} >= 0.35 of the limit while both busy", (share or 0) >= 0.35)
    row.lines.append("")
    bench.logs(row, *runs)
    return row


CASES: dict[str, Callable[[Bench], Any]] = {
    "A": case_a,
    "F": case_f,
    "B": case_b,
    "C": case_c,
    "D": case_d,
    "E": case_e,
}


def summary(rows: Sequence[Row], seconds: float) -> None:
    print("\n## Summary\n")
    print("| case | least s | wall s | wall/least | answers | 429s | used (busy) | verdict |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        verdict = "SKIPPED" if row.skipped else "PASS" if row.passed else "FAIL"
        print(
            f"| {row.case} | {text(row.least, 1)} | {row.wall:.1f} "
            f"| {text(ratio(row.wall, row.least))} | {row.answers} | {row.throttles} "
            f"| {text(row.used_busy, 3)} | {verdict} |"
        )
    print(f"\nThe bench took {seconds:.0f} s.")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--cases",
        type=lambda value: [c.strip().upper() for c in value.split(",") if c.strip()],
        default=list(CASES),
        help="comma-separated, of A,B,C,D,E,F (default all)",
    )
    parser.add_argument(
        "--units", type=int, default=None, help="units per job (per case's default)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes (about a third)")
    parser.add_argument("--slots", type=int, default=4, help="maxConcurrentTasks (default 4)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per run (default 6x the least + 120, at most 900)",
    )
    parser.add_argument(
        "--no-limit-headers",
        action="store_true",
        help="the mock sends no rate-limit headers in any case (by default only A and F's)",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the jobs, logs and state here"
    )
    args = parser.parse_args()
    unknown = [c for c in args.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)} (of {', '.join(CASES)})")
    if "F" in args.cases and "A" not in args.cases:
        args.cases.append("A")  # F is the second run of A's job
    return args


async def main_async(args: argparse.Namespace, scratch: Path) -> None:
    start = time.monotonic()
    bench = Bench(args, scratch)
    rows: list[Row] = []
    print(f"# fanout against a limit nobody declared (bench/adaptive.py, in {scratch})")
    async with bench.stack:
        for name, case in CASES.items():
            if name in args.cases:
                row: Row = await case(bench)
                print_row(row)
                rows.append(row)
    summary(rows, time.monotonic() - start)


def main() -> None:
    args = arguments()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        asyncio.run(main_async(args, args.keep.resolve()))
        return
    with tempfile.TemporaryDirectory(prefix="fanout-adaptive-") as scratch:
        asyncio.run(main_async(args, Path(scratch)))


if __name__ == "__main__":
    main()
