"""The per-user pacing ledger (``gateway.shares``): two limiters of one key, each with
its membership in one injected directory, on an injected heartbeat clock and the
loop's virtual time for their pacing."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from fanout.gateway.limiter import Limiter, Ticket
from fanout.gateway.shares import GONE_S, STALE_S, Membership, Shares, group_name
from fanout.pacing.ceiling import Learned

pytestmark = pytest.mark.looptime

UPSTREAM = "https://api.anthropic.com"
KEY = "sk-ant-shared-7f3a9c1e5b2d8f4a6c0e"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _limiter(learned: Learned | None = None) -> Limiter:
    return Limiter(
        requests=None,
        input_tokens=None,
        output_tokens=None,
        max_in_flight=None,
        learned=learned,
    )


def _member(directory: Path, limiter: Limiter, clock: Clock, key: str = KEY) -> Membership:
    return Membership(directory, upstream=UPSTREAM, key=key, limiter=limiter, clock=clock)


def _now() -> float:
    return round(asyncio.get_running_loop().time(), 6)


async def _admitted_at(limiter: Limiter) -> float:
    ticket = await asyncio.wait_for(limiter.admit(input_tokens=0, output_tokens=0), 1000)
    limiter.answered(ticket)
    limiter.settle(ticket, input_tokens=0, output_tokens=0)
    return _now()


async def _held(limiter: Limiter) -> Ticket:
    """A request in flight: demand that stays."""
    return await asyncio.wait_for(limiter.admit(input_tokens=0, output_tokens=0), 1000)


async def test_two_jobs_of_one_key_split_the_learned_rate(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _limiter(Learned(rate=0.4, window=10, throttles=2)), _limiter()
    one = _member(tmp_path, first, clock)
    _member(tmp_path, second, clock)  # it beats on its own, as its request arrives
    await _held(first)  # a request arrives: first joins with its demand, alone so far
    assert first.ceiling.share == 1
    await _held(second)  # second joins, and sees first's demand at once
    assert (first.ceiling.share, second.ceiling.share) == (1, 0.5)
    one.beat()  # first sees second's at its next beat
    assert (first.ceiling.share, second.ceiling.share) == (0.5, 0.5)
    # 4 a 10 s window for the key, 2 of them this job's: one every 1.05 * 5 s from the
    # one held (at 0).
    assert [await _admitted_at(first) for _ in range(3)] == [5.25, 10.5, 15.75]


async def test_a_member_without_demand_gives_its_part_back(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _limiter(Learned(rate=0.4, window=10, throttles=2)), _limiter()
    one, two = _member(tmp_path, first, clock), _member(tmp_path, second, clock)
    await _held(first)
    ticket = await _held(second)
    one.beat()
    assert first.ceiling.share == 0.5
    second.answered(ticket)
    second.settle(ticket, input_tokens=0, output_tokens=0)
    # Alive and beating, with nothing to send: between two requests of one worker, or
    # a job whose units no longer call the API.  Its part is kept for STALE_S.
    shares = []
    for _ in range(int(STALE_S)):
        clock.now += 1
        two.beat()
        one.beat()
        shares.append(first.ceiling.share)
    assert STALE_S == 5
    assert shares == [0.5, 0.5, 0.5, 0.5, 1]
    await _held(second)  # it has demand again: it joins at once, and first at its beat
    assert second.ceiling.share == 0.5
    one.beat()
    assert first.ceiling.share == 0.5


async def test_a_throttle_of_one_job_teaches_the_other(tmp_path: Path) -> None:
    clock = Clock()
    first = _limiter(Learned(rate=0.8, window=10, throttles=0))
    second = _limiter(Learned(rate=0.8, window=10, throttles=0))
    one, two = _member(tmp_path, first, clock), _member(tmp_path, second, clock)
    held = [await _held(first) for _ in range(3)] + [await _held(second)]
    two.beat()
    one.beat()
    # first's newest meets a 429 at 2.625 (its three went 1.3125 s apart, alone then):
    # one more fits in 7.375 s, when its start at 0 leaves a 10 s window.  2 of its
    # own got through in that window (the one throttled not counted); second's, which
    # its file says, went at the same moment as the refused one, so it may have been
    # refused too, and is not counted: 2 a window for the key.
    assert _now() == 2.625
    assert first.throttled(held[2], 7.375) is not None
    assert first.ceiling.known() == Learned(
        rate=0.2, window=10, throttles=1, concurrency=first.ceiling.concurrency
    )
    clock.now += 1
    one.beat()  # says it was throttled
    two.beat()  # ... and second, which was not, slows down to what first learned
    known = second.ceiling.known()
    assert known is not None
    assert (known.rate, known.window) == (0.2, 10)
    two.beat()
    assert second.ceiling.known() == known  # adopted once, not again on every beat


async def test_a_throttle_counts_the_other_jobs_requests_in_its_window(tmp_path: Path) -> None:
    """Case E: two jobs on one key of 4 per sliding 10 s.  A 429 at 8 s says one more fits
    in 2 s, when the oldest counted request leaves: the other job's, at 0.  Counting its
    own alone (two, the oldest at 3), a job took 3 s for the window, or 2 (the
    Retry-After) before it had two; both jobs paced at "2 per 2 s" and drew a 429 a
    window.  The members' files carry what the upstream counts of each, written as each
    request is answered."""
    loop = asyncio.get_running_loop()
    clock = lambda: loop.time() + 1_000_000.0  # noqa: E731  (the heartbeat clock, moving)
    first, second = _limiter(), _limiter()
    for limiter in (first, second):
        limiter.ceiling.stated(4)  # the upstream's header: its limit, not its window
    members = [_member(tmp_path, job, clock) for job in (first, second)]  # type: ignore[arg-type]

    async def answered_at(limiter: Limiter, at: float) -> None:
        await asyncio.sleep(at - loop.time())
        assert _now() == at
        await _admitted_at(limiter)

    async with asyncio.TaskGroup() as group:
        beating = [group.create_task(Shares([member]).run()) for member in members]
        for limiter, at in ((first, 0), (second, 3), (first, 5), (second, 6)):
            await answered_at(limiter, at)
        await asyncio.sleep(2)
        ticket = await _held(second)
        assert _now() == 8
        second.throttled(ticket, 2.0)
        for task in beating:
            task.cancel()
    assert second.ceiling.window == 10
    assert second.ceiling.rate == 0.4  # the key's 4 over it


async def test_a_job_that_left_still_counts_until_its_requests_leave_the_window(
    tmp_path: Path,
) -> None:
    """Case E's end: one job finished and its gateway closed, taking its file; the other
    took the whole key at once and sent into a window that still held what the first
    had just sent: two 429s.  The file stays, saying it left, with what the upstream
    counts of it, until GONE_S has passed."""
    loop = asyncio.get_running_loop()
    clock = lambda: loop.time() + 1_000_000.0  # noqa: E731
    first, second = _limiter(), _limiter()
    for limiter in (first, second):  # a window the upstream said: 4 per 10 s for the key
        assert limiter.adopt(Learned(rate=0.4, window=10, throttles=1, said=True))
    one, two = (_member(tmp_path, job, clock) for job in (first, second))  # type: ignore[arg-type]
    for member in (one, two, one):
        member.beat()
    assert (first.ceiling.share, second.ceiling.share) == (0.5, 0.5)
    assert [await _admitted_at(first) for _ in range(2)] == [0, 0]  # its share's worth
    await _admitted_at(second)
    one.leave()
    two.beat()
    assert second.ceiling.share == 1  # all of the key is second's now, but its window
    # still holds first's two: one more fits at once, the rest when those leave.
    assert [await _admitted_at(second) for _ in range(3)] == [0, 10.1, 10.1]
    (left,) = [json.loads(p.read_bytes()) for p in _files(tmp_path) if p != two.path]
    assert (left["left"], left["demand"], left["counted"]) == (True, 0, [1e6, 1e6])
    await asyncio.sleep(GONE_S)
    two.beat()  # the upstream's window has passed: the file goes
    assert _files(tmp_path) == [two.path]


def _files(directory: Path) -> list[Path]:
    return list(directory.glob("*/*.json"))


async def test_a_job_that_learned_nothing_takes_its_peers_rate(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _limiter(Learned(rate=0.4, window=10, throttles=2)), _limiter()
    one, two = _member(tmp_path, first, clock), _member(tmp_path, second, clock)
    one.beat()
    ramping = [second.ceiling.ramping]  # slow start: four at once, unpaced
    two.beat()
    ramping.append(second.ceiling.ramping)
    assert ramping == [True, False]
    assert (second.ceiling.rate, second.ceiling.window, second.ceiling.share) == (0.4, 10, 0.5)
    assert [await _admitted_at(second) for _ in range(2)] == [0, 5.25]


async def test_a_stale_or_dead_member_is_dropped_and_its_share_returns(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _limiter(Learned(rate=0.4, window=10, throttles=2)), _limiter()
    one, two = _member(tmp_path, first, clock), _member(tmp_path, second, clock)
    await _held(first)
    await _held(second)
    two.beat()
    one.beat()
    assert first.ceiling.share == 0.5
    # second's job crashed: its file stays, its heartbeat ages.
    clock.now += STALE_S - 0.5
    one.beat()
    assert first.ceiling.share == 0.5  # not stale yet
    clock.now += 1
    one.beat()
    assert first.ceiling.share == 1
    assert not two.path.exists()  # removed by the first member that saw it stale

    # A member whose process is gone is dropped at once, whatever its heartbeat says.
    gone = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import os; print(os.getpid())", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await gone.communicate()
    dead = Membership(
        tmp_path,
        upstream=UPSTREAM,
        key=KEY,
        limiter=second,
        clock=clock,
        pid=int(out),
        host=one_host(one),
    )
    dead.beat()
    assert dead.path.exists()
    one.beat()
    assert (first.ceiling.share, dead.path.exists()) == (1, False)


def one_host(membership: Membership) -> str:
    data = json.loads(membership.path.read_bytes())
    return str(data["host"])


async def test_other_keys_and_upstreams_are_other_groups(tmp_path: Path) -> None:
    clock = Clock()
    first, second = _limiter(Learned(rate=0.4, window=10, throttles=2)), _limiter()
    one = _member(tmp_path, first, clock)
    two = _member(tmp_path, second, clock, key=KEY + "x")
    await _held(first)
    await _held(second)
    two.beat()
    one.beat()
    assert (first.ceiling.share, one.group != two.group) == (1, True)
    assert group_name(UPSTREAM, KEY) == group_name(UPSTREAM + "/", KEY)
    assert group_name(UPSTREAM, KEY) != group_name("https://api.openai.com", KEY)


async def test_the_ledger_is_private_and_holds_no_key(tmp_path: Path) -> None:
    clock = Clock()
    limiter = _limiter()
    shares = tmp_path / "shares"
    member = _member(shares, limiter, clock)
    member.beat()
    assert stat.S_IMODE(shares.stat().st_mode) == 0o700
    assert stat.S_IMODE(member.group.stat().st_mode) == 0o700
    assert stat.S_IMODE(member.path.stat().st_mode) == 0o600
    fingerprint = hashlib.sha256(KEY.encode()).hexdigest()
    for path in shares.rglob("*"):
        text = path.name + (path.read_text() if path.is_file() else "")
        assert KEY not in text
        assert fingerprint[:12] not in text
    assert json.loads(member.path.read_bytes())["pid"] == os.getpid()
    member.leave()
    assert list(shares.iterdir()) == []  # the group went with its last member
