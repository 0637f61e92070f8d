"""The gateway's books: each attempt's usage in the journal as its requests run (a
request's reservation before the upstream has it, its usage after), how the writes are
batched (on virtual time), a request cut off counted at its reservation, and a journal
that cannot be written.  Real SQLite, the real gateway and the mock API in one loop."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from fanout.errors import FanoutError, StateError
from fanout.events import Events
from fanout.gateway import Gateway, books
from fanout.gateway.usage import Ledger
from fanout.journal import Journal
from fanout.outcome import ApiUsage
from fanout.report import accounting
from fanout.spec.apis import FACTS, Style
from fanout.spec.model import Api, Price

from mockapi import MockApi, MockConfig

KEY = "sk-ant-real-books-3f9a2c7e"
# Cache writes at the dearest input price: a reservation prices its prompt at that.
PRICE = Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)
MESSAGES = [{"role": "user", "content": "hi"}]
# The gateway's estimate: the prompt's JSON text / 4, rounded up (8 tokens), at $3.75 per
# million, and max_tokens (100) at $15.
RESERVED = (8 * 3.75 + 100 * 15.0) / 1_000_000
# What the mock's answer (12 + 5 tokens) costs.
COST = (12 * 3.0 + 5 * 15.0) / 1_000_000


def usd(value: float) -> float:
    """USD to the nano-dollar: sums of floats compared exactly."""
    return round(value, 9)


def rounded(usage: Sequence[ApiUsage]) -> list[ApiUsage]:
    """``usage`` with its USD to the nano-dollar and no time queued."""
    return [
        replace(u, cost_usd=usd(u.cost_usd), reserved_usd=usd(u.reserved_usd), queued_seconds=0)
        for u in usage
    ]


def message(stream: bool = False) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": stream, "messages": MESSAGES}


@dataclass
class Rig:
    gateway: Gateway
    mock: MockApi
    client: aiohttp.ClientSession
    journal: Journal
    run_id: str
    stops: list[FanoutError] = field(default_factory=list)

    async def post(self, token: str, body: dict[str, Any]) -> int:
        url = self.gateway.url + "/anthropic/v1/messages"
        async with self.client.post(url, json=body, headers={"x-api-key": token}) as answer:
            await answer.read()
            return answer.status

    def booked(self) -> list[ApiUsage]:
        return self.journal.usage_totals(self.run_id)


@asynccontextmanager
async def rig(tmp_path: Path, config: MockConfig, **api: Any) -> AsyncIterator[Rig]:
    journal = Journal(tmp_path / "journal.sqlite")
    run_id = journal.create_run(job="books", job_file="books.toml", apply=False)
    async with MockApi(config) as mock:
        facts = FACTS[Style.ANTHROPIC]
        stops: list[FanoutError] = []
        gateway = Gateway(
            [
                Api(
                    name="anthropic",
                    upstream=mock.url,
                    style=Style.ANTHROPIC,
                    base_url_env=facts.base_url_env or "",
                    token_env=facts.token_env or "",
                    key_secret="REAL_KEY",
                    prices=(("claude-sonnet-*", PRICE),),
                    **api,
                )
            ],
            {"anthropic": KEY},
            events=Events(),
            stop=stops.append,
        )
        gateway.keep_books(functools.partial(journal.record_usages, run_id))
        await gateway.start()
        try:
            async with aiohttp.ClientSession() as client:
                yield Rig(gateway, mock, client, journal, run_id, stops)
        finally:
            await gateway.close()
            journal.close()


async def test_a_request_is_in_the_journal_at_its_reservation_while_the_upstream_answers(
    tmp_path: Path,
) -> None:
    seen: list[list[ApiUsage]] = []

    async def look() -> None:
        seen.append(r.booked())

    async with rig(tmp_path, MockConfig(require_key=KEY, before_last_event=look)) as r:
        token = r.gateway.grant(unit="u1", attempt=2, deadline=1e9, round=3)
        assert await r.post(token, message(stream=True)) == 200
        (during,) = seen
        assert rounded(during) == [
            ApiUsage(
                api="anthropic", requests=1, cost_usd=usd(RESERVED), reserved_usd=usd(RESERVED)
            )
        ]
        (used,) = r.gateway.revoke(token)
        # The attempt's end: its answered usage, in the journal under its own key.
        assert (used.requests, used.input_tokens, used.output_tokens) == (1, 12, 5)
        assert (usd(used.cost_usd), used.reserved_usd) == (usd(COST), 0.0)
        assert r.booked() == [used]
        assert usd(r.journal.unit_spent(r.run_id, "u1", 3)) == usd(COST)
        assert r.journal.unit_spent(r.run_id, "u1", 2) == 0.0


async def test_an_attempts_usage_written_again_and_again_counts_each_request_once(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, MockConfig(require_key=KEY)) as r:
        token = r.gateway.grant(unit="u1", attempt=1, deadline=1e9)
        for n in range(1, 4):
            assert await r.post(token, message()) == 200
            await asyncio.sleep(books.SETTLE_DELAY * 2)  # its usage written, not waited for
            (booked,) = r.booked()
            assert (booked.requests, booked.output_tokens, booked.reserved_usd) == (n, 5 * n, 0.0)
        r.gateway.revoke(token)
        # A resumed run's write of the same attempt (the journal's row replaced whole).
        r.journal.record_usage(r.run_id, 1, "u1", 1, [booked])
        assert [(u.requests, usd(u.cost_usd)) for u in r.booked()] == [(3, usd(3 * COST))]


async def test_a_request_whose_worker_hangs_up_before_the_answer_counts_at_its_reservation(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, MockConfig(require_key=KEY)) as r:
        token = r.gateway.grant(unit="u1", attempt=1, deadline=1e9)
        r.mock.hold()
        gone = asyncio.create_task(r.post(token, message()))
        await _until(lambda: r.mock.in_flight == 1)
        gone.cancel()  # the worker is killed (its deadline): its connection closes
        ledger = r.gateway._proxy.accounts.ledger
        await _until(lambda: ledger.of("anthropic").requests == 1)
        r.mock.release()
        # The upstream may well bill it: one request at what it reserved, in the journal.
        cut = ApiUsage(
            api="anthropic", requests=1, cost_usd=usd(RESERVED), reserved_usd=usd(RESERVED)
        )
        assert rounded(r.gateway.revoke(token)) == [cut]
        assert rounded(r.booked()) == [cut]
        lines = accounting.markdown([u.as_dict() for u in r.booked()])
        assert lines[-2] == (
            "Of the cost, $0.0015 is the reservation of requests whose answers fanout never"
            " read (its coordinator was killed, or their worker went away, while they ran):"
            " each one's prompt estimate and output cap at the model's price, likely more"
            " than the upstream billed, counted so that a budget errs early."
        )


async def test_a_request_whose_worker_hangs_up_while_it_waits_its_turn_counts_nothing(
    tmp_path: Path,
) -> None:
    release = asyncio.Event()
    config = MockConfig(require_key=KEY, before_last_event=release.wait)
    async with rig(tmp_path, config, max_in_flight=1) as r:
        token = r.gateway.grant(unit="u1", attempt=1, deadline=1e9)
        first = asyncio.create_task(r.post(token, message(stream=True)))
        await _until(lambda: len(r.mock.posts()) == 1)
        gone = asyncio.create_task(r.post(token, message()))
        limiter = r.gateway._proxy.routes["anthropic"].limiter
        await _until(lambda: limiter.stats()["waiting"] == 1)
        gone.cancel()
        await _until(lambda: limiter.stats()["waiting"] == 0)
        # The first is out (reserved), the one that left never was.
        (booked,) = r.booked()
        assert (booked.requests, usd(booked.reserved_usd)) == (1, usd(RESERVED))
        release.set()
        assert await first == 200
        (used,) = r.gateway.revoke(token)
        assert (used.requests, usd(used.cost_usd), used.reserved_usd) == (1, usd(COST), 0.0)


async def test_a_journal_that_cannot_be_written_stops_the_run_and_the_requests_go_on(
    tmp_path: Path,
) -> None:
    async with rig(tmp_path, MockConfig(require_key=KEY)) as r:
        token = r.gateway.grant(unit="u1", attempt=1, deadline=1e9)
        r.journal.db.execute("PRAGMA query_only = ON")  # every write now fails
        assert await r.post(token, message()) == 200
        (stopped,) = r.stops
        assert isinstance(stopped, StateError)
        assert str(stopped).startswith(
            f"the journal is read-only (attempt to write a readonly database): {r.journal.path}"
        )
        with pytest.raises(StateError):  # the attempt's end raises it to its dispatcher
            r.gateway.revoke(token)
        r.journal.db.execute("PRAGMA query_only = OFF")
        # What was kept goes with the next write (here the close's).
    with sqlite3.connect(tmp_path / "journal.sqlite") as db:
        assert db.execute("SELECT requests FROM usage").fetchall() == [(1,)]


def _ledgers(count: int) -> list[Ledger]:
    return [Ledger(["a"], whose=(1, f"u{n}", 1)) for n in range(count)]


@pytest.mark.looptime
async def test_one_turns_reservations_share_a_write_and_usage_waits_for_the_next() -> None:
    writes: list[tuple[float, list[str]]] = []
    loop = asyncio.get_running_loop()

    def write(bookings: Sequence[tuple[int, str, int, tuple[ApiUsage, ...]]]) -> None:
        writes.append((loop.time(), [unit for _, unit, _, _ in bookings]))

    def failed(error: FanoutError) -> None:
        raise AssertionError(error)

    keeping = books.Books()
    keeping.keep(write, failed=failed)
    ledgers = _ledgers(50)
    start = loop.time()
    await asyncio.gather(*(keeping.written(ledger) for ledger in ledgers))
    assert writes == [(start, [f"u{n}" for n in range(50)])]
    # An answered request's usage: written SETTLE_DELAY later, unless a reservation
    # comes first and takes it along.
    keeping.changed(ledgers[0])
    await asyncio.sleep(books.SETTLE_DELAY * 2)
    assert writes[1:] == [(start + books.SETTLE_DELAY, ["u0"])]
    keeping.changed(ledgers[1])
    await asyncio.sleep(books.SETTLE_DELAY / 2)
    await keeping.written(ledgers[2])
    await asyncio.sleep(books.SETTLE_DELAY * 2)
    later = start + books.SETTLE_DELAY * 2.5
    assert writes[2:] == [(later, ["u1", "u2"])]


@pytest.mark.looptime
async def test_without_a_writer_nothing_waits() -> None:
    keeping = books.Books()
    (ledger,) = _ledgers(1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await keeping.written(ledger)
    keeping.changed(ledger)
    keeping.now(ledger)
    assert loop.time() == start


async def _until(condition: Any) -> None:
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition never held")
