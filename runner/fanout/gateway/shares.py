"""A per-user pacing ledger: jobs that call the same API with the same key share its
limit, instead of each pacing as if it were alone.

A *group* is an upstream URL and a key: its directory is named by a sha256 of the URL
and of the key's own sha256 (the key is never written, nor anything it could be read
back from), under ``shares`` beside the state-dir registry (``hidden.registry``,
``~/.local/state/fanout/shares``), 0700, so only this user's jobs join.  Each running
gateway is a *member* of the group of each API it calls with a key: a file of its own
(``<pid>-<random>.json``, 0600, replaced whole so a reader never sees half of one)
holding its pid and host, its demand (requests waiting or in flight) and when it last
had any, what its limiter learned and when it was last throttled, and a heartbeat,
rewritten every ``BEAT_S`` by a task the gateway runs (``Shares.run``), and at once when
a request arrives while its file says it has no demand, or a throttle is about to teach
its ceiling.  Each time it reads the other members:

- **Fair part.**  The limit is split equally among the members with demand: this job's
  limiter paces at ``1 / (n + 1)`` of it, n the other members that had demand in the
  last ``STALE_S`` (all of it when it is alone).  In the last ``STALE_S``, not at the
  beat: a worker making one request after another has none between two, and a job
  that has just joined (its gateway starts as its units do) none yet.  The learned pace
  and every declared window are scaled by it (``Limiter.shared``), and the ceiling
  counts what got through of this job's starts as its part's worth, so each job learns
  the key's whole rate, not its own.
- **Counted together.**  Each file also holds the member's requests the upstream
  counts now (``Limiter.counted``, on the heartbeat clock, at most ``COUNTED_MAX``),
  rewritten as each is answered or refused while others share the group: a throttle's window
  estimate (``Ceiling._window_from``) is when one more fits less the stated limit's
  newest request of all of them, not of this job's alone (which put the window's
  start too early and its length too long, or a late Retry-After's 2 s for it).
- **Pooled learning.**  A member's throttle teaches the others: the lowest learned rate
  of the members throttled since the last beat (and within two of its windows) is
  adopted when it is below this job's (``Limiter.adopt``), so the job that did not meet
  the 429 slows down too, rather than meet it next.  A job that has learned nothing
  takes the lowest rate its peers know at once, instead of slow-starting into them.

A crashed job (killed, out of memory, a lost machine of a shared home) leaves its file
behind, holding its share: a member whose heartbeat is older than ``STALE_S`` or whose
pid is gone (on this host) is ignored, and removed by the first member that sees it.
So its share returns to the others within ``STALE_S`` of its last beat, and until then
they pace below the limit, never above it.  A gateway that closes removes its own
files at once.  Over SSH and Ray the gateway runs in the coordinator, so its ledger is
the coordinator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..pacing.ceiling import Learned
from .limiter import Limiter

BEAT_S = 1.0
STALE_S = 5.0
COUNTED_MAX = 256  # a member's newest counted requests in its file
GONE_S = 120.0  # how long a member that left is still counted: two windows of a minute


def group_name(upstream: str, key: str) -> str:
    """The directory name of the group of ``upstream`` and ``key``: neither can be read
    back from it, the key not even by who knows the URL (only its own sha256 enters)."""
    fingerprint = hashlib.sha256(key.encode()).hexdigest()
    return hashlib.sha256(f"{upstream.rstrip('/')}\n{fingerprint}".encode()).hexdigest()[:32]


@dataclass(frozen=True, kw_only=True, slots=True)
class Member:
    """One member's file, as read."""

    pid: int
    host: str
    demand: int
    busy_at: float  # the heartbeat clock's time it last had demand (or joined)
    learned: Learned | None
    throttled_at: float | None  # the heartbeat clock's time of its newest throttle
    heartbeat: float
    counted: tuple[float, ...] = ()  # its requests the upstream counts (heartbeat clock)
    left: bool = False  # its gateway closed; its counted requests still count

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "host": self.host,
            "demand": self.demand,
            "busyAt": self.busy_at,
            "learned": None if self.learned is None else self.learned.as_dict(),
            "said": self.learned is not None and self.learned.said,
            "throttledAt": self.throttled_at,
            "heartbeat": self.heartbeat,
            "counted": list(self.counted),
            "left": self.left,
        }

    @classmethod
    def from_dict(cls, data: Any) -> Member | None:
        try:
            learned = data["learned"]
            throttled_at = data["throttledAt"]
            said = data.get("said") is True
            member = cls(
                pid=int(data["pid"]),
                host=str(data["host"]),
                demand=max(0, int(data["demand"])),
                busy_at=float(data["busyAt"]),
                learned=None if learned is None else _said(Learned.from_dict(learned), said),
                throttled_at=None if throttled_at is None else float(throttled_at),
                heartbeat=float(data["heartbeat"]),
                counted=tuple(float(t) for t in data.get("counted", ())[-COUNTED_MAX:]),
                left=data.get("left") is True,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        return member if math.isfinite(member.heartbeat) else None


def _said(learned: Learned | None, said: bool) -> Learned | None:
    return None if learned is None else dataclasses.replace(learned, said=said)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process has the pid now: not ours, but not gone
    return True


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        os.chmod(path, 0o700)


class Membership:
    """This gateway's place in one group, for one API's limiter."""

    def __init__(
        self,
        directory: Path,
        *,
        upstream: str,
        key: str,
        limiter: Limiter,
        clock: Callable[[], float] = time.time,
        pid: int | None = None,
        host: str | None = None,
        alive: Callable[[int], bool] = _alive,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.group = directory / group_name(upstream, key)
        self._directory = directory
        self._limiter = limiter
        self._clock = clock
        self._pid = os.getpid() if pid is None else pid
        self._host = socket.gethostname() if host is None else host
        self._alive = alive
        self.path = self.group / f"{self._pid}-{secrets.token_hex(4)}.json"
        known = limiter.ceiling.known()
        self._throttles = 0 if known is None else known.throttles
        self._throttled_at: float | None = None
        self._heard = -math.inf  # the newest peer throttle already considered
        self._written_demand = 0
        self._busy_at = clock()  # joined: its units are starting
        self._left = False
        self._warn = warn
        self.peers: list[Member] = []
        # The counted requests of members that left, by (host, pid), on the heartbeat
        # clock: the upstream counts them until its window passes (``GONE_S``).
        self._counted: dict[tuple[str, int], tuple[float, ...]] = {}
        self._gone: list[float] = []
        limiter.peers = self

    def arrived(self) -> None:
        """A request arrived: when the file says this job has no demand, the others must
        know at once that it has (and it, what they have), not at the next beat."""
        if self._written_demand == 0:
            self.beat()

    def settled(self) -> None:
        """A request got through, or was refused: while others share the group, they
        count it at once, or no longer (a beat later their window estimates would be
        wrong)."""
        if self.peers:
            self.beat()

    def throttling(self) -> None:
        """A throttle is about to teach the ceiling: its part of the limit, and the
        others' counted requests, current."""
        self.beat()

    def beat(self) -> None:
        """Write this member's file, read the others' (dropping the stale and the
        dead), and set this job's part of the limit and what it learns from theirs.
        A directory that cannot be written is said (``warn``), and the job paces on
        with the part it had."""
        try:
            self._beat()
        except OSError as exc:
            if self._warn is None:
                raise
            self._warn(
                f"fanout gateway: cannot keep the pacing ledger in {self._directory}"
                f" ({exc.strerror or exc}): this job paces as if no other shared its key"
            )

    def _beat(self) -> None:
        now = self._clock()
        if self._limiter.demand():
            self._busy_at = now
        known = self._limiter.ceiling.known()
        if known is not None and known.throttles > self._throttles:
            self._throttles, self._throttled_at = known.throttles, now
        _private_dir(self._directory)
        _private_dir(self.group)
        own = self._own(now, known)
        try:
            _write(self.path, own.as_dict())
        except FileNotFoundError:  # the last other member left, taking the folder
            _private_dir(self.group)
            _write(self.path, own.as_dict())
        self._written_demand = own.demand
        self.peers = list(self._read(now))
        demanding = sum(
            1 for p in self.peers if not p.left and (p.demand or now - p.busy_at < STALE_S)
        )
        # What the others have sent first: a larger part admits at once (``shared``).
        offset = now - self._limiter.now()
        self._limiter.heard(sorted(t - offset for t in self._heard_counted(now)))
        self._limiter.shared(1 / (demanding + 1))
        self._learn(now)

    def _own(self, now: float, known: Learned | None) -> Member:
        # The limiter's clock (a loop's) to the heartbeat clock (the machine's).
        offset = now - self._limiter.now()
        return Member(
            pid=self._pid,
            host=self._host,
            demand=0 if self._left else self._limiter.demand(),
            busy_at=self._busy_at,
            learned=known,
            throttled_at=self._throttled_at,
            heartbeat=now,
            counted=tuple(t + offset for t in self._limiter.counted()[-COUNTED_MAX:]),
            left=self._left,
        )

    def _heard_counted(self, now: float) -> list[float]:
        """The peers' counted requests, and those of the peers that left in the last
        ``GONE_S``."""
        counted = {(p.host, p.pid): p.counted for p in self.peers}
        for key in self._counted.keys() - counted.keys():
            self._gone.extend(self._counted[key])
        self._counted = counted
        self._gone = [t for t in self._gone if t > now - GONE_S]
        return [t for times in counted.values() for t in times] + self._gone

    def _read(self, now: float) -> Iterable[Member]:
        for path in self.group.glob("*.json"):
            if path == self.path:
                continue
            try:
                member = Member.from_dict(json.loads(path.read_bytes()))
            except FileNotFoundError:
                continue  # it left, or another member removed it
            except (OSError, ValueError):
                member = None
            if member is None:
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < time.time() - STALE_S:
                        path.unlink()  # never written by a member (or by one long gone)
                continue
            if member.left:  # counted until the upstream's window has passed
                if now - member.heartbeat > GONE_S:
                    with contextlib.suppress(OSError):
                        path.unlink()
                    continue
                yield member
                continue
            dead = member.host == self._host and member.pid != self._pid
            if now - member.heartbeat > STALE_S or (dead and not self._alive(member.pid)):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            yield member

    def _learn(self, now: float) -> None:
        """Adopt the lowest learned rate of the peers throttled since the last beat, or
        of any peer while this job has learned nothing."""
        if self._limiter.ceiling.known() is None:
            known = [peer.learned for peer in self.peers if peer.learned is not None]
            if known:
                self._limiter.adopt(min(known, key=lambda learned: learned.rate))
        fresh = [
            peer
            for peer in self.peers
            if peer.learned is not None
            and peer.throttled_at is not None
            and peer.throttled_at > max(self._heard, self._throttled_at or -math.inf)
            and peer.throttled_at > now - 2 * peer.learned.window
        ]
        if not fresh:
            return
        self._heard = max(peer.throttled_at or -math.inf for peer in fresh)
        lowest = min((peer.learned for peer in fresh if peer.learned), key=lambda k: k.rate)
        self._limiter.adopt(lowest)

    def leave(self) -> None:
        """The gateway is closing: its file says it left, with the requests the
        upstream still counts of it (a job that takes its share back waits for them;
        readers remove it ``GONE_S`` later), or goes when there are none."""
        self._limiter.peers = None
        self._left = True
        own = self._own(self._clock(), self._limiter.ceiling.known())
        if own.counted:
            with contextlib.suppress(OSError):
                _write(self.path, own.as_dict())
                return
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self.group.rmdir()  # only when no member is left


def _write(path: Path, data: dict[str, Any]) -> None:
    fresh = path.with_name(f".{path.name}.new")
    descriptor = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(descriptor, json.dumps(data).encode())
    finally:
        os.close(descriptor)
    os.replace(fresh, path)


class Shares:
    """Every membership of one gateway, and the task that keeps them (``run``)."""

    def __init__(self, memberships: Iterable[Membership]) -> None:
        self.memberships = list(memberships)

    def beat(self) -> None:
        for membership in self.memberships:
            membership.beat()

    async def run(self) -> None:
        """Beat every ``BEAT_S`` until cancelled.  A beat writes and reads a few small
        files in a local directory: done on the loop, as the journal's writes are."""
        while True:
            await asyncio.sleep(BEAT_S)
            self.beat()

    def leave(self) -> None:
        for membership in self.memberships:
            membership.leave()
