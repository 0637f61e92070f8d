"""Two real gateways, as two jobs on one machine would run them, calling one mock
upstream with one key through the per-user pacing ledger (``gateway.shares``) in a
directory of the test's: together they stay under the upstream's limit, and split it."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_gateway import KEY, make_api, message

from fanout.events import Events
from fanout.gateway import Gateway
from fanout.pacing.ceiling import Learned

from mockapi import MockApi, MockConfig

pytestmark = pytest.mark.slow

LIMIT, WINDOW, SECONDS = 6, 5.0, 10.0


async def test_two_jobs_sharing_a_key_stay_under_its_limit_and_split_it(tmp_path: Path) -> None:
    # One job learned the key's whole rate when it ran alone (its journal keeps it); the
    # other is new and knows nothing.  Alone, the first would keep its pace and the
    # second slow-start into it.
    learned = {"anthropic": Learned(rate=LIMIT / WINDOW, window=WINDOW, throttles=3)}
    # An upstream that says only Retry-After, on its 429s: what remains of its limit
    # would hold both jobs back by itself (both read it), which leaves nothing to the
    # ledger.
    config = MockConfig(require_key=KEY, limit=LIMIT, window=WINDOW, limit_headers=False)
    async with MockApi(config) as mock:
        events: list[list[dict[str, Any]]] = [[], []]
        gateways = [
            Gateway(
                [make_api(mock.url)],
                {"anthropic": KEY},
                events=Events(events[job].append),
                stop=print,
                learned=learned if job == 0 else None,
                shares_dir=tmp_path / "shares",
            )
            for job in range(2)
        ]
        answered = [0, 0]
        try:
            for gateway in gateways:
                await gateway.start()
            end = time.monotonic() + SECONDS
            async with aiohttp.ClientSession() as client:

                async def worker(job: int) -> None:
                    gateway = gateways[job]
                    token = gateway.grant(unit=f"u{job}", attempt=1, deadline=1e9)
                    while time.monotonic() < end:
                        async with client.post(
                            gateway.url + "/anthropic/v1/messages",
                            json=message(),
                            headers={"x-api-key": token},
                        ) as answer:
                            await answer.read()
                            assert answer.status == 200  # no 429 reaches a worker
                            answered[job] += 1

                await asyncio.wait_for(
                    asyncio.gather(*(worker(job) for job in range(2) for _ in range(3))), 60
                )
        finally:
            for gateway in gateways:
                await gateway.close()
        posts = mock.posts()
        statuses = [seen.status for seen in posts]
        refused = statuses.count(429)
        # The fraction of the limit used: requests a second the upstream accepted, from
        # the first to the last, over what it allows.
        accepted = [seen.at for seen in posts if seen.status == 200]
        used = (len(accepted) - 1) / (accepted[-1] - accepted[0]) * WINDOW / LIMIT
        print(f"answered {answered}, 429s {refused}, {used:.2f} of the limit used")
        print("TIMES", [(round(s.since, 2), s.status) for s in posts])
        # Measured with the ledger: 0 429s, 9 and 9 answers, 1.01 of the limit used (the
        # first window's burst); without it: 2 429s, 5 and 12 or 13, 0.59 to 0.64.
        assert refused <= 1, statuses
        assert used >= 0.85
        assert min(answered) / sum(answered) * used >= 0.35, answered  # each its part
        # Both left the ledger, each file saying so with what the upstream still counts.
        files = [json.loads(p.read_bytes()) for p in (tmp_path / "shares").glob("*/*.json")]
        assert [(f["left"], f["demand"], len(f["counted"]) > 0) for f in files] == [
            (True, 0, True),
            (True, 0, True),
        ]


async def test_two_new_jobs_on_one_key_learn_its_window_and_split_it(tmp_path: Path) -> None:
    """bench/adaptive.py's case E, kept small: two jobs that know nothing of the key's
    limit (4 per sliding 3 s here), whose upstream states its limit in headers but says
    its window only in a 429's Retry-After.  Each gateway learns the window from the
    requests of both jobs (their files in the ledger), then each sends its half of a
    window together, and the two never more than the key's limit in a window.  Before,
    a late 429's 1 s was taken for the window.  Until the first 429 the headers pace
    them (what remains, spread), below the limit: that is measured by the bench."""
    # They run until 9 s after the first 429 (when the pair has learned the window), 60 s
    # at most: under a second suite's load the headers' pace took most of a fixed 13 s
    # once, which left one accepted request after the 429 to measure.
    limit, window, after, most = 4, 3.0, 9.0, 60.0
    config = MockConfig(require_key=KEY, limit=limit, window=window)
    async with MockApi(config) as mock:
        gateways = [
            Gateway(
                [make_api(mock.url)],
                {"anthropic": KEY},
                events=Events(lambda event: None),
                stop=print,
                shares_dir=tmp_path / "shares",
            )
            for _ in range(2)
        ]
        answered = [0, 0]
        try:
            for gateway in gateways:
                await gateway.start()
            cap = time.monotonic() + most

            def running() -> bool:
                refused = next((seen.at for seen in mock.posts() if seen.status == 429), None)
                end = cap if refused is None else min(cap, refused + after)
                return time.monotonic() < end

            async with aiohttp.ClientSession() as client:

                async def worker(job: int) -> None:
                    gateway = gateways[job]
                    token = gateway.grant(unit=f"u{job}", attempt=1, deadline=1e9)
                    while running():
                        async with client.post(
                            gateway.url + "/anthropic/v1/messages",
                            json=message(),
                            headers={"x-api-key": token},
                        ) as answer:
                            await answer.read()
                            assert answer.status == 200
                            answered[job] += 1

                await asyncio.wait_for(
                    asyncio.gather(*(worker(job) for job in range(2) for _ in range(3))), most + 30
                )
        finally:
            for gateway in gateways:
                await gateway.close()
        posts = mock.posts()
        refused = [seen.status for seen in posts].count(429)
        # From the first 429 on, both know the window: the fraction of the limit used,
        # requests a second the upstream accepted from then to the last, over its rate.
        learned = next(seen.at for seen in posts if seen.status == 429)
        accepted = [seen.at for seen in posts if seen.status == 200 and seen.at > learned]
        used = (len(accepted) - 1) / (accepted[-1] - accepted[0]) * window / limit
        print(f"answered {answered}, 429s {refused}, {used:.2f} of the limit used after")
        assert mock.max_in_window(window) <= limit + refused
        assert refused <= 2
        # How much of the limit the pair uses once it is learned is a speed figure:
        # bench/adaptive.py's case E measures it (0.89 on an idle machine).  Here it
        # is a floor only, against a window learned several times too long: on a
        # machine running two suites at once the loop's lag stretched the learned
        # window and it came to 0.67-0.71, and once to 0.48 (0.92-0.99 idle).
        assert used >= 0.4
        assert min(answered) / sum(answered) >= 0.4, answered
