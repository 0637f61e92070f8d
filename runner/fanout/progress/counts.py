"""What the progress display knows about a run, folded from its events: the round's
units per state, the hosts, the paused limits and what sets the pace.

The counts come from events only (see ``backlog``, ``dispatch`` and the SSH transport
for who emits what): ``round.started`` (the slots, and what may pace the run),
``round.selecting`` (units selected so far), ``round.selected`` (the total, and for a
resumed round the units an earlier stretch settled), ``attempt.started``/
``attempt.placed``/``attempt.finished`` (running, per host; a finished attempt's
duration and API usage, for the pace),
``unit.settled``/``unit.interrupted``, ``host.up``/``host.lost``/``host.quarantined``,
and what the limits learned: ``limit.learned``, ``api.learned`` (a ceiling learned from
throttles, or kept from an earlier run) and ``limit.ramp`` (slow start, while nothing is
known).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..journal.ceilings import label
from ..pacing import limits
from ..values.quantities import format_duration

# How the rate gate's events name its limit of all dispatch (a job without [[limits]]).
ALL_DISPATCH = label(limits.ALL)


@dataclass(slots=True)
class Host:
    slots: int
    state: str = "up"  # up, lost or quarantined
    busy: int = 0


class Counts:
    """The run's counts; ``new_round`` starts a round's afresh."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.concurrency: int | None = None
        # What may set the pace (``limits.pace_fields``): the task's limits, the APIs'
        # windows.  And what the finished attempts took: their own time (less the time
        # their requests queued in the gateway), and of each API, by (api, usage field).
        self.paces: list[dict[str, Any]] = []
        self.hosts: dict[str, Host] = {}
        self.paused: dict[str, float] = {}
        self.own_seconds = 0.0
        self.used: dict[tuple[str, str], float] = {}
        self.finished = 0
        # What each limit's ceiling learned, by what the pace line calls it (``limit
        # api``, ``all dispatch``, ``api anthropic``): its ``limit.learned`` or
        # ``api.learned`` event.  And the limits still in slow start.
        self.learned: dict[str, dict[str, Any]] = {}
        self.ramping: set[str] = set()
        self.new_round()

    def new_round(self) -> None:
        self.total: int | None = None  # known once the round's selection has ended
        self.selected = 0
        self.before = 0  # units an earlier stretch of a resumed run settled
        self.succeeded = 0
        self.failed = 0
        # Settled without running: an earlier run's success reused, or quarantined.
        self.reused = 0
        self.quarantined = 0
        self.interrupted = 0
        self.last_settled = self.clock()
        # Unit id -> the host its running attempt was placed on ("" until placed).
        self.running: dict[str, str] = {}

    def free(self, unit: str) -> None:
        placed = self.running.pop(unit, "")
        host = self.hosts.get(placed)
        if host is not None:
            host.busy = max(0, host.busy - 1)

    def host(self, event: dict[str, Any]) -> Host:
        host = self.hosts.setdefault(event["host"], Host(slots=event.get("slots", 0)))
        host.slots = event.get("slots", host.slots)
        return host

    def done(self) -> int:
        return self.before + self.settled()

    def settled(self) -> int:
        return self.succeeded + self.failed + self.reused + self.quarantined

    def running_now(self) -> int:
        # With hosts, an attempt runs once placed on one; until then it waits for a host
        # slot (the dispatcher's slots outnumber the hosts' when hosts are down): queued.
        if self.hosts:
            return sum(1 for host in list(self.running.values()) if host)
        return len(self.running)

    def queued(self) -> int:
        return max(0, self.selected - self.done() - self.running_now() - self.interrupted)

    def fields(self) -> dict[str, Any]:
        """What the round's task carries besides done and total (see the columns)."""
        return {
            "selected": self.selected,
            "running": self.running_now(),
            "settled": self.settled(),
            "last_settled": self.last_settled,
            "remain": self.queued() + self.running_now(),
        }

    def finish(self, event: dict[str, Any]) -> None:
        """Count a finished attempt's own time and what it used of each API."""
        queued = 0.0
        for usage in event.get("usage", ()):
            queued += usage.get("queuedSeconds", 0.0)
            for key, value in usage.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self.used[(usage["api"], key)] = self.used.get((usage["api"], key), 0.0) + value
        self.own_seconds += max(0.0, event.get("duration", 0.0) - queued)
        self.finished += 1

    def learn(self, event: dict[str, Any]) -> dict[str, Any] | None:
        """Take a ``limit.learned`` or ``api.learned`` event; the one it replaces."""
        if event["event"] == "api.learned":
            name = f"api {event['api']}"
        else:
            name = event["limit"] if event["limit"] == ALL_DISPATCH else f"limit {event['limit']}"
            self.ramping.discard(event["limit"])
        before = self.learned.get(name)
        self.learned[name] = event
        return before

    def pacer(self) -> str:
        """What bounds the pace now (see ``limits.pacer``), of the slots that are up.

        While a limit is in slow start, slow start does.  A limit whose ceiling was
        learned paces at the learned rate, not at what was declared (the learned one is
        never above it), and is named with it: ``limit api 2.0 per 10s learned``, ``all
        dispatch ...``, ``api anthropic ...`` (an API's requests window)."""
        if self.ramping:
            return "paced by slow start (finding the pace)"
        slots = self.concurrency or 0
        if self.hosts:
            up = sum(h.slots for h in list(self.hosts.values()) if h.state == "up")
            slots = min(slots, up) if slots else up
        what = limits.pacer(
            self._learned_paces(),
            slots=slots,
            attempts=self.finished,
            own_seconds=self.own_seconds,
            used=self.used,
        )
        return f"paced by {what}" if what else ""

    def _learned_paces(self) -> list[dict[str, Any]]:
        """The paces with each learned ceiling in place of what was declared for it,
        labelled with what the pace line says of it."""
        paces = list(self.paces)
        for name, event in list(self.learned.items()):
            window = float(event["window"])
            per_minute = round(float(event["perWindow"]) * 60 / window, 3) if window > 0 else 0.0
            if per_minute <= 0:
                continue
            said = f"{name} {event['perWindow']:.1f} per {format_duration(window)} learned"
            if event["event"] == "api.learned":
                api = event["api"]
                paces = [p for p in paces if (p.get("api"), p.get("window")) != (api, "requests")]
                paces.append(
                    {
                        "api": api,
                        "window": "requests",
                        "perMinute": per_minute,
                        "counts": ["requests"],
                        "label": said,
                    }
                )
            else:
                limit = event["limit"]
                paces = [p for p in paces if p.get("limit") != limit]
                paces.append({"limit": limit, "perMinute": per_minute, "label": said})
        return paces
