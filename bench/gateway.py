"""The API gateway against a mock upstream on loopback, in one run.

1. Pacing.  Units making k sequential requests each (k = 1, 2, 3, 4, 8) under a limit
   of N requests per W seconds (default 50 per 5 s), through a real ``fanout run`` of a
   job this script writes: once through the gateway (``[[apis]]`` with ``requests =
   {limit = N, per = W}``; the worker calls ``$ANTHROPIC_BASE_URL`` with the token in
   ``$ANTHROPIC_API_KEY``), once with today's task pacing (``[[limits]]`` requests = N,
   per = W, requestsPerTask = k, the right guess, its best case; the worker calls the
   mock directly).  The worker is a small Python script making k requests with urllib;
   sandbox none, so process start-up costs the least.  The mock (tests/mockapi.py)
   never rejects (its own limit is off): what it records is what each mode sends.

   *Steady fraction* = (b - a) / (t[b] - t[a]) * W / N, where t[i] is the time the
   upstream received its i-th request (from 0), a = P, b = the largest multiple of P
   not past the last request, and P is the period of the mode's schedule in requests:
   N through the gateway (a request waits for the one N before it to leave the
   window), floor(N/k)·k with task pacing (one window's worth of task starts).  So it
   is requests per second over whole periods past the first (the first holds the
   gateway's start-up burst of N at once), as a fraction of N/W; the pattern's phase
   cannot bias it.  Task pacing cannot exceed floor(N/k)·k/N, the gateway W/(W + SKEW)
   (0.980 at 5 s: its limiter admits a request ``per + SKEW`` after the one N before
   it).  Also shown: the most requests the upstream received in any W-second window
   (the limit says <= N), and the span from the first request to the last against
   the least the limit allows, (ceil(R/N) - 1)·W for R requests.

   Then the issue's own example, both ways: 12 units of two requests each under 5
   requests per 10 s (the issue measured 66 s with task pacing, where request pacing
   allows about 40 s).

2. Latency the gateway adds: sequential requests from one aiohttp client, alternating
   direct to the mock and through an in-process ``fanout.gateway.Gateway`` (a request
   limit far above the load, so the limiter runs but never waits), JSON and streamed
   (SSE); p50 and p99 of each, and each percentile's difference (gateway minus
   direct).  Also through a gateway keeping its books in a journal, as in a run.  Client, gateway and mock share one event loop, so everything the gateway
   does per request is counted, none of it overlapped with the client's or the mock's.

3. Requests per second the gateway sustains alone: the mock (``python
   tests/mockapi.py``) and a load generator of many concurrent aiohttp clients run in
   processes of their own, the gateway (no limits) in this one.  The load generator's
   rate direct to the mock says whether the gateway or the load side was the
   bottleneck; the gateway process's CPU time per request gives what one core would
   sustain.  Once more with the gateway's books kept in a real journal (SQLite, WAL,
   as ``fanout run`` keeps them: each request's reservation written before it is
   sent, its usage after, batched (``books``)): the transactions it took, per
   second and per request, and what they cost in throughput and CPU.

Usage: .venv/bin/python bench/gateway.py [--limit N] [--per SECONDS] [--windows M]
       [--requests 1,2,3,4,8] [--concurrency C] [--latency-requests R]
       [--load-clients C] [--load-seconds S] [--load-rounds R]
       [--only pacing|example|latency|throughput]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fanout.events import Events
from fanout.gateway import Gateway, books
from fanout.gateway.admission import ATTEMPT_IN_FLIGHT
from fanout.journal import Journal
from fanout.spec import Api, Window
from fanout.spec.apis import FACTS, Style

from mockapi import MockApi

FANOUT = [sys.executable, "-m", "fanout"]
TESTS = Path(__file__).resolve().parents[1] / "tests"
KEY = "bench-upstream-key"  # the mock's "real" key; not a secret of anyone's
BODY = {"model": "claude-bench", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}

WORKER = """\
import json, os, sys, urllib.request
url = os.environ["ANTHROPIC_BASE_URL"].rstrip("/") + "/v1/messages"
headers = {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01",
           "content-type": "application/json"}
body = json.dumps(%(body)r).encode()
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, no proxy
for _ in range(int(sys.argv[1])):
    with opener.open(urllib.request.Request(url, body, headers), timeout=600) as answer:
        answer.read()
"""

JOB = """\
version = 1
name = "bench-gateway-{mode}-{k}"
[inputs]
command = ["seq", "{units}"]
format = "lines"
[task]
command = ["{python}", "{worker}", "{k}"]
{task_env}
[runtime]
maxConcurrentTasks = {concurrency}
# Plain directories, whose workers could read each other's tokens: the bench measures
# the gateway's pacing and cost, not a sandbox.
sandbox = "none"
unsandboxedSecrets = true
network = true
{pacing}
"""

THROUGH_GATEWAY = """\
[[apis]]
name = "anthropic"
upstream = "{upstream}"
style = "anthropic"
keySecret = "ANTHROPIC_API_KEY"
requests = {{ limit = {limit}, per = "{per_ms}ms" }}
"""

TASK_PACING = """\
[[limits]]
name = "anthropic"
requests = {limit}
per = "{per_ms}ms"
requestsPerTask = {k}
"""


@dataclass(frozen=True)
class Case:
    mode: str  # "gateway" or "task"
    k: int  # requests per unit
    units: int
    limit: int
    per: float
    concurrency: int


@dataclass(frozen=True)
class Pacing:
    case: Case
    requests: int
    steady: float | None  # None: too few requests for two whole periods
    most_in_window: int
    span: float
    least_span: float
    wall: float  # the whole ``fanout run``, start-up included


def steady_fraction(arrivals: Sequence[float], period: int, limit: int, per: float) -> float | None:
    """The steady fraction of the docstring: rate over whole periods past the first."""
    times = sorted(arrivals)
    a = period
    b = period * ((len(times) - 1) // period)
    if b <= a:
        return None
    return (b - a) / (times[b] - times[a]) * per / limit


async def fanout_run(job: Path, env: dict[str, str]) -> float:
    """Seconds the run took; it must succeed."""
    start = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *FANOUT,
        "run",
        str(job),
        "--no-reuse",  # every unit runs: the cases measure pacing
        cwd=job.parent,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    if process.returncode != 0:
        raise SystemExit(
            f"fanout run {job.name} failed ({process.returncode}):\n"
            f"{out.decode()[-1500:]}\n{err.decode()[-1500:]}"
        )
    return time.perf_counter() - start


def cases(args: argparse.Namespace) -> list[Case]:
    """Table 1's cases: ceil((M·N + 1)/k) units of k requests, so M whole periods."""
    return [
        Case(
            mode=mode,
            k=k,
            units=math.ceil((args.windows * args.limit + 1) / k),
            limit=args.limit,
            per=args.per,
            concurrency=args.concurrency,
        )
        for k in args.requests
        for mode in ("gateway", "task")
    ]


def example_cases(args: argparse.Namespace) -> list[Case]:
    """The issue's example: 12 units of two requests under 5 requests per 10 s."""
    return [
        Case(mode=mode, k=2, units=12, limit=5, per=10.0, concurrency=args.concurrency)
        for mode in ("gateway", "task")
    ]


async def pacing_case(case: Case, scratch: Path) -> Pacing:
    """One real ``fanout run`` of ``case``, and what the upstream received."""
    mode, k, units, limit, per = case.mode, case.k, case.units, case.limit, case.per
    workdir = scratch / f"{mode}-{k}-{units}-{limit}"
    workdir.mkdir()
    worker = workdir / "worker.py"
    worker.write_text(WORKER % {"body": BODY})
    async with MockApi() as mock:
        if mode == "gateway":
            pacing = THROUGH_GATEWAY.format(
                upstream=mock.url, limit=limit, per_ms=round(per * 1000)
            )
            task_env = ""
        else:
            pacing = TASK_PACING.format(limit=limit, per_ms=round(per * 1000), k=k)
            task_env = (
                f'env = {{ ANTHROPIC_BASE_URL = "{mock.url}" }}\nsecrets = ["ANTHROPIC_API_KEY"]'
            )
        job = workdir / "job.toml"
        job.write_text(
            JOB.format(
                mode=mode,
                k=k,
                units=units,
                python=sys.executable,
                worker=worker,
                task_env=task_env,
                concurrency=case.concurrency,
                pacing=pacing,
            )
        )
        env = {
            **os.environ,
            "XDG_STATE_HOME": str(workdir / "state"),
            # The upstream key, as a user exports it: the gateway's keySecret, or with
            # task pacing a task secret (then the worker holds it).
            "ANTHROPIC_API_KEY": KEY,
        }
        wall = await fanout_run(job, env)
        arrivals = [seen.at for seen in mock.posts()]
        most = mock.max_in_window(per)
    if len(arrivals) != units * k:
        raise SystemExit(f"{mode} k={k}: the mock got {len(arrivals)}, not {units * k}")
    period = limit if mode == "gateway" else (limit // k) * k
    return Pacing(
        case=case,
        requests=len(arrivals),
        steady=steady_fraction(arrivals, period, limit, per),
        most_in_window=most,
        span=max(arrivals) - min(arrivals),
        least_span=(math.ceil(len(arrivals) / limit) - 1) * per,
        wall=wall,
    )


def pacing_table(rows: Sequence[Pacing], args: argparse.Namespace) -> None:
    print(
        f"Pacing: units of k requests each under {args.limit} requests per {args.per:g} s, "
        f"a real `fanout run` (sandbox none, concurrency {args.concurrency})\n"
    )
    print(
        "| k | requests | steady fraction: gateway | task pacing | task pacing's ceiling "
        f"| most in any {args.per:g} s: gateway | task pacing "
        "| first→last s: gateway | task pacing | least s |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    by = {(row.case.mode, row.case.k): row for row in rows}
    for k in args.requests:
        gate, task = by[("gateway", k)], by[("task", k)]
        ceiling = (args.limit // k) * k / args.limit
        print(
            f"| {k} | {gate.requests} | {_fraction(gate.steady)} | {_fraction(task.steady)} "
            f"| {ceiling:.3f} "
            f"| {gate.most_in_window} | {task.most_in_window} | {gate.span:.1f} "
            f"| {task.span:.1f} | {gate.least_span:.1f} |"
        )
    print(
        "\nSteady fraction: requests per second the upstream received over whole periods "
        "of each mode's schedule past the first (N requests through the gateway, "
        "floor(N/k)·k with task pacing), divided by N/W; goal through the gateway >= 0.95. "
        "Task pacing's ceiling: floor(N/k)·k/N.  Most in any window: the limit allows N.  "
        "Least s: (ceil(R/N) - 1)·W, the least the limit allows from the first request "
        "to the last.\n"
    )


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def example_table(rows: Sequence[Pacing]) -> None:
    print(
        "The issue's example: 12 units of 2 requests each under 5 requests per 10 s, "
        "a real `fanout run`\n"
    )
    print("| pacing | wall s | first→last request s | least s | most in any 10 s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        name = "gateway" if row.case.mode == "gateway" else "task pacing (requestsPerTask = 2)"
        print(
            f"| {name} | {row.wall:.1f} | {row.span:.1f} | {row.least_span:.1f} "
            f"| {row.most_in_window} |"
        )
    print(
        "\nWall: the whole `fanout run`, start-up included.  Task pacing fits "
        "floor(5/2) = 2 units in a window and starts them evenly; the gateway sends 5 "
        "requests at once, then one as each leaves the window.\n"
    )


def percentile(samples: Sequence[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, math.floor(fraction * len(ordered)))]


def api_for(upstream: str, limit: int | None) -> Api:
    return Api(
        name="anthropic",
        upstream=upstream,
        style=Style.ANTHROPIC,
        base_url_env=FACTS[Style.ANTHROPIC].base_url_env or "",
        token_env=FACTS[Style.ANTHROPIC].token_env or "",
        key_secret="ANTHROPIC_API_KEY",
        requests=None if limit is None else Window(limit=limit, per=60.0),
    )


def gateway_for(upstream: str, limit: int | None) -> Gateway:
    def stop(error: Exception) -> None:
        raise SystemExit(f"the gateway stopped the run: {error}")

    return Gateway([api_for(upstream, limit)], {"anthropic": KEY}, events=Events(), stop=stop)


async def latency(
    args: argparse.Namespace, scratch: Path
) -> list[tuple[str, list[float], list[float], list[float]]]:
    """(kind, direct ms, through the gateway ms, through a gateway keeping its books in
    a journal ms) per kind of request, sequentially."""
    rows = []
    async with MockApi() as mock:
        gateway = gateway_for(mock.url, 10**9)
        kept = gateway_for(mock.url, 10**9)
        journal = Journal(scratch / "latency.sqlite")
        booked = Booked(journal, journal.create_run(job="bench", job_file="", apply=False))
        kept.keep_books(booked.write)
        await gateway.start()
        await kept.start()
        try:
            loop = asyncio.get_running_loop()
            token = gateway.grant(unit="bench", attempt=1, deadline=loop.time() + 3600)
            kept_token = kept.grant(unit="bench", attempt=1, deadline=loop.time() + 3600)
            async with aiohttp.ClientSession() as session:
                for kind, stream in (("JSON", False), ("SSE stream", True)):
                    body = {**BODY, "stream": stream}
                    direct: list[float] = []
                    through: list[float] = []
                    with_books: list[float] = []
                    for n in range(args.latency_requests + 50):
                        a = await _timed_post(session, f"{mock.url}/v1/messages", KEY, body)
                        b = await _timed_post(
                            session, f"{gateway.url}/anthropic/v1/messages", token, body
                        )
                        c = await _timed_post(
                            session, f"{kept.url}/anthropic/v1/messages", kept_token, body
                        )
                        if n >= 50:  # the first connections and code paths warm up
                            direct.append(a)
                            through.append(b)
                            with_books.append(c)
                    rows.append((kind, direct, through, with_books))
            gateway.revoke(token)
            kept.revoke(kept_token)
        finally:
            await gateway.close()
            await kept.close()
            journal.close()
    return rows


async def _timed_post(
    session: aiohttp.ClientSession, url: str, key: str, body: dict[str, Any]
) -> float:
    """Milliseconds from sending the request to the last byte of the answer."""
    start = time.perf_counter()
    async with session.post(url, json=body, headers={"x-api-key": key}) as answer:
        await answer.read()
        if answer.status != 200:
            raise SystemExit(f"{url}: {answer.status} {await answer.text()}")
    return (time.perf_counter() - start) * 1000


def latency_table(rows: Sequence[tuple[str, list[float], list[float], list[float]]]) -> None:
    count = len(rows[0][1])
    print(f"Latency the gateway adds: {count} sequential requests each way, one client\n")
    print(
        "| request | direct p50 ms | p99 | through the gateway p50 ms | p99 | added p50 ms | p99"
        " | with books in a journal: added p50 ms | p99 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for kind, direct, through, with_books in rows:
        d50, d99 = percentile(direct, 0.5), percentile(direct, 0.99)
        t50, t99 = percentile(through, 0.5), percentile(through, 0.99)
        b50, b99 = percentile(with_books, 0.5), percentile(with_books, 0.99)
        print(
            f"| {kind} | {d50:.2f} | {d99:.2f} | {t50:.2f} | {t99:.2f} "
            f"| {t50 - d50:.2f} | {t99 - d99:.2f} | {b50 - d50:.2f} | {b99 - d99:.2f} |"
        )
    print(
        "\nAdded: the gateway's percentile minus the direct one (goal p50 < 2 ms); a "
        "request limit far above the load, so the limiter runs but never waits.  With "
        "books: as ``fanout run`` keeps them, each request's reservation in the journal "
        "before it is sent (one transaction each, one request at a time).\n"
    )


def _load_child(conn: Connection) -> None:
    """The load generator of table 3, a process of its own: loads each URL it is sent."""

    async def main() -> None:
        while True:
            order = await asyncio.to_thread(conn.recv)
            if order is None:
                return
            url, keys, clients, seconds = order
            conn.send(await _load(url, keys, clients, seconds))

    asyncio.run(main())


async def _load(url: str, keys: tuple[str, ...], clients: int, seconds: float) -> int:
    """Requests answered in ``seconds`` by ``clients`` concurrent loops, client i with
    ``keys[i % len(keys)]``."""
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        done = 0

        async def client(key: str) -> None:
            nonlocal done
            while loop.time() < end:
                async with session.post(url, json=BODY, headers={"x-api-key": key}) as answer:
                    await answer.read()
                    if answer.status != 200:
                        raise SystemExit(f"{url}: {answer.status}")
                done += 1

        await asyncio.gather(*(client(keys[i % len(keys)]) for i in range(clients)))
        return done


@dataclass
class Booked:
    """A gateway's books in a journal of its own, its transactions counted."""

    journal: Journal
    run_id: str
    transactions: int = 0

    def write(self, bookings: Sequence[tuple[int, str, int, tuple[Any, ...]]]) -> None:
        self.transactions += 1
        self.journal.record_usages(self.run_id, bookings)


async def throughput(
    args: argparse.Namespace, scratch: Path
) -> list[tuple[str, float, float | None, float | None]]:
    """(path, requests per second, gateway CPU ms per request or None, journal
    transactions per request or None)."""
    # The mock in a process of its own, as tests/mockapi.py runs for benchmarks.
    mock = await asyncio.create_subprocess_exec(
        sys.executable,
        str(TESTS / "mockapi.py"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert mock.stdin is not None
    assert mock.stdout is not None
    upstream = (await mock.stdout.readline()).decode().strip()
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_load_child, args=(child,), daemon=True)
    process.start()
    try:

        async def load(url: str, keys: tuple[str, ...]) -> int:
            parent.send((url, keys, args.load_clients, args.load_seconds))
            answered: int = await asyncio.to_thread(parent.recv)
            return answered

        gateway = gateway_for(upstream, None)
        kept = gateway_for(upstream, None)
        journal = Journal(scratch / "journal.sqlite")
        booked = Booked(journal, journal.create_run(job="bench", job_file="", apply=False))
        kept.keep_books(booked.write)
        await gateway.start()
        await kept.start()
        direct: list[float] = []
        through: list[float] = []
        cpu_ms: list[float] = []
        through_kept: list[float] = []
        cpu_ms_kept: list[float] = []
        per_request: list[float] = []
        try:
            loop = asyncio.get_running_loop()
            # An attempt may have 16 requests in flight (the gateway's bound on one unit):
            # a token for each 16 clients, as that many units would hold.
            tokens = range(math.ceil(args.load_clients / ATTEMPT_IN_FLIGHT))
            token = tuple(
                gateway.grant(unit=f"bench{n}", attempt=1, deadline=loop.time() + 3600)
                for n in tokens
            )
            kept_token = tuple(
                kept.grant(unit=f"bench{n}", attempt=1, deadline=loop.time() + 3600) for n in tokens
            )
            via = f"{gateway.url}/anthropic/v1/messages"
            via_kept = f"{kept.url}/anthropic/v1/messages"
            await load(via, token)  # warm up: connections, code paths
            await load(via_kept, kept_token)
            # Alternated, so a neighbour's burst on this shared machine hits all alike,
            # the gateway's two ways in turn first (the one right after the direct
            # load measured slower, whichever it was).
            for number in range(args.load_rounds):
                direct.append(await load(f"{upstream}/v1/messages", (KEY,)) / args.load_seconds)
                for books_kept in (False, True) if number % 2 else (True, False):
                    cpu, transactions = time.process_time(), booked.transactions
                    if books_kept:
                        answered = await load(via_kept, kept_token)
                        cpu_ms_kept.append((time.process_time() - cpu) * 1000 / answered)
                        through_kept.append(answered / args.load_seconds)
                        per_request.append((booked.transactions - transactions) / answered)
                    else:
                        answered = await load(via, token)
                        cpu_ms.append((time.process_time() - cpu) * 1000 / answered)
                        through.append(answered / args.load_seconds)
            for one in token:
                gateway.revoke(one)
            for one in kept_token:
                kept.revoke(one)
        finally:
            await gateway.close()
            await kept.close()
            journal.close()
        parent.send(None)
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()
        mock.stdin.close()  # the mock serves until its stdin closes
        await mock.wait()
    return [
        ("direct to the mock", statistics.median(direct), None, None),
        ("through the gateway", statistics.median(through), statistics.median(cpu_ms), None),
        (
            f"through the gateway, books in a journal (reservations per turn, usage within {books.SETTLE_DELAY * 1000:g} ms)",
            statistics.median(through_kept),
            statistics.median(cpu_ms_kept),
            statistics.median(per_request),
        ),
    ]


def throughput_table(
    rows: Sequence[tuple[str, float, float | None, float | None]], args: argparse.Namespace
) -> None:
    print(
        f"Gateway alone: {args.load_clients} concurrent aiohttp clients, no limits, JSON "
        f"answers; median of {args.load_rounds} rounds of {args.load_seconds:g} s each way, "
        "alternating\n"
    )
    print(
        "| path | requests/s | gateway CPU ms/request | requests/s per gateway CPU core"
        " | journal transactions/request | transactions/s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for path, rate, cpu, per_request in rows:
        cost = "" if cpu is None else f"{cpu:.3f}"
        ceiling = "" if cpu is None else f"{1000 / cpu:.0f}"
        tx = "" if per_request is None else f"{per_request:.3f}"
        tx_s = "" if per_request is None else f"{per_request * rate:.0f}"
        print(f"| {path} | {rate:.0f} | {cost} | {ceiling} | {tx} | {tx_s} |")
    print(
        "\nThe mock and the load generator run in processes of their own, sharing this "
        "machine's cores with the gateway: the direct rate bounds what the load side can "
        "offer; the last column is what one core spent only on the gateway would serve.\n"
    )


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=50, help="N requests per window")
    parser.add_argument("--per", type=float, default=5.0, help="W, the window in seconds")
    parser.add_argument("--windows", type=int, default=5, help="M: about M·N requests a case")
    parser.add_argument(
        "--requests",
        type=lambda text: [int(k) for k in text.split(",")],
        default=[1, 2, 3, 4, 8],
        help="requests per unit, comma-separated",
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency-requests", type=int, default=1000)
    parser.add_argument("--load-clients", type=int, default=64)
    parser.add_argument("--load-seconds", type=float, default=5.0)
    parser.add_argument("--load-rounds", type=int, default=4)
    parser.add_argument("--only", choices=["pacing", "example", "latency", "throughput"])
    return parser.parse_args()


async def bench(args: argparse.Namespace) -> None:
    printers: list[Callable[[], None]] = []
    if args.only in (None, "pacing", "example"):
        with tempfile.TemporaryDirectory(prefix="fanout-bench-") as scratch:
            if args.only in (None, "pacing"):
                rows = [await pacing_case(case, Path(scratch)) for case in cases(args)]
                printers.append(lambda: pacing_table(rows, args))
            if args.only in (None, "example"):
                example = [await pacing_case(case, Path(scratch)) for case in example_cases(args)]
                printers.append(lambda: example_table(example))
    if args.only in (None, "latency"):
        with tempfile.TemporaryDirectory(prefix="fanout-bench-") as scratch:
            latencies = await latency(args, Path(scratch))
        printers.append(lambda: latency_table(latencies))
    if args.only in (None, "throughput"):
        with tempfile.TemporaryDirectory(prefix="fanout-bench-") as scratch:
            rates = await throughput(args, Path(scratch))
        printers.append(lambda: throughput_table(rates, args))
    for printer in printers:
        printer()


def main() -> None:
    asyncio.run(bench(arguments()))


if __name__ == "__main__":
    main()
