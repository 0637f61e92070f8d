"""Showing a run as it goes: a live display on a terminal, one line per event otherwise.

The live display is a ``rich.progress.Progress`` with one task per round: a bar (pulsing
while the total is unknown), the units done (of the total once the selection has ended,
of those selected so far while it streams), the rate, the round's elapsed time and the
time remaining (``at least`` while the selection streams: only the units known so far
are counted).  Below it, the units running, queued, failed and interrupted, what sets
the pace (the tightest rate limit or the worker slots) and each paused limit's
countdown; with SSH hosts a line of hosts (busy/slots, up, lost or quarantined).  It
prints a line above itself for every failure, notice and host change.  Without a
terminal (cron, CI, a pipe) each finished attempt, settled unit and host change is one
plain, greppable line, and the live display's text is printed as a ``progress:`` line
once a minute.

The rate is the round's own (units settled in this stretch of the round over its time
so far), not ``Task.speed``: rich's speed averages the last 30 s of samples, and an
agent's unit takes minutes, so its window is empty most of the time (no rate, no ETA)
and it freezes while nothing settles.

The counts come from events only (see ``backlog``, ``dispatch`` and the SSH transport
for who emits what): ``round.selecting`` (units selected so far), ``round.selected``
(the total, and for a resumed round the units an earlier stretch settled),
``attempt.started``/``attempt.placed``/``attempt.finished`` (running, per host),
``unit.settled``/``unit.interrupted`` and ``host.up``/``host.lost``/``host.quarantined``.

Unit ids, reasons and paths come from the backlog and the workers: every line goes
through ``safetext.for_terminal``, so an id with ``ESC[2J`` cannot clear the screen nor
a newline forge a line of its own, and lines are rich ``Text``, never markup, so
``[bold]`` or ``:smile:`` in an id prints as it is.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.table import Column, Table
from rich.text import Text

from . import safetext
from .quantities import format_duration

# Without a terminal, how often the live display's text is printed as a progress line.
PROGRESS_EVERY = 60.0


@dataclass(slots=True)
class _Host:
    slots: int
    state: str = "up"  # up, lost or quarantined
    busy: int = 0


def _rate(task: Task) -> float:
    """Units settled per second over this stretch of the round (a resumed run's earlier
    units took no time of it), up to now while units remain, else up to the last one."""
    settled = task.fields["settled"]
    if not settled or task.start_time is None:
        return 0.0
    end = task.get_time() if task.fields["remain"] else task.fields["last_settled"]
    spent = end - task.start_time
    return settled / spent if spent > 0 else 0.0


class _Done(ProgressColumn):
    """Units done, of the total once the selection has ended."""

    def render(self, task: Task) -> Text:
        done, selected = int(task.completed), task.fields["selected"]
        if task.total is not None:
            return Text(f"{done}/{int(task.total)} done")
        if not selected and not task.fields["running"]:
            return Text("selecting units")
        return Text(f"{done} done, {selected} selected so far")


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        rate = _rate(task)
        if not rate:
            return Text("")
        return Text(f"{rate:.1f}/s" if rate >= 1 else f"{rate * 60:.1f}/min")


class _Elapsed(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(format_duration(task.elapsed or 0.0))


class _Remaining(ProgressColumn):
    """Time remaining at the round's rate; ``at least`` while the total is unknown."""

    def render(self, task: Task) -> Text:
        rate, remain = _rate(task), task.fields["remain"]
        if not rate or not remain:
            return Text("")
        least = "at least " if task.total is None else ""
        return Text(f"eta {least}{format_duration(remain / rate)}")


# Elapsed before the rate: the rate and the ETA are empty until a unit settles, and an
# empty column at the end leaves no gap in the line.
_WORDS = (_Done, _Elapsed, _Rate, _Remaining)


class _RunProgress(Progress):
    """rich's progress table, and under it the lines ``below`` renders."""

    def __init__(self, below: Callable[[], list[Text]], **options: Any) -> None:
        self._below = below
        self._last: list[RenderableType] = []
        super().__init__(
            TextColumn("{task.description}", markup=False),
            BarColumn(bar_width=20),
            *(column(table_column=Column(no_wrap=True)) for column in _WORDS),
            **options,
        )

    def make_tasks_table(self, tasks: Iterable[Task]) -> Table:
        table = super().make_tasks_table(tasks)
        table.padding = (0, 2)  # words apart as on the progress line, not one space
        return table

    def get_renderables(self) -> Iterable[RenderableType]:
        # Rendered by rich's refresh thread, while the event loop's thread may change the
        # counts: a rendering caught mid-change (a dict changed size) is simply skipped.
        with contextlib.suppress(RuntimeError):
            self._last = [self.make_tasks_table(self.tasks), *self._below()]
        return self._last

    def line(self) -> str:
        """The display as one line of text (the ``progress:`` line of a log)."""
        words = [
            rendered.plain  # the bar is no text: it is left out
            for task in self.tasks
            for column in self.columns
            if isinstance(column, ProgressColumn)
            and isinstance(rendered := column.render(task), Text)
        ]
        below = [text.plain for text in self._below()]
        return "  ".join(word for word in [*words, *below] if word).replace("\n", "  ")


class Display:
    def __init__(
        self,
        console: Console,
        *,
        live: bool | None = None,
        verbose: bool = False,
        prefix: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.console = console
        terminal = console.is_terminal  # an isatty call: asked once, not per line
        self.live_mode = terminal if live is None else live
        self._plain_lines = not terminal
        self.verbose = verbose
        self.prefix = f"{prefix}: " if prefix else ""
        self.clock = clock
        self.wall = wall
        self._progress_at = clock() + PROGRESS_EVERY
        self.concurrency: int | None = None
        self.pace: tuple[str, float] | None = None  # the tightest limit, starts a minute
        self.hosts: dict[str, _Host] = {}
        self.paused: dict[str, float] = {}
        self._durations = 0.0
        self._finished = 0
        self._started = False
        self.round = 1
        self._task: TaskID | None = None
        self._new_counts()
        # Rendered afresh at each refresh (four a second), so the clock, the ETA and a
        # pause's countdown move while no event comes (an agent's unit can take minutes).
        self.progress = _RunProgress(
            self._below,
            console=console,
            get_time=clock,
            refresh_per_second=4,
            transient=True,
        )
        self._new_round()

    def _new_round(self) -> None:
        self._new_counts()
        # A task's total cannot go back to unknown: each round is a task of its own.
        if self._task is not None:
            self.progress.remove_task(self._task)
        self._task = self.progress.add_task(f"round {self.round}", total=None, **self._fields())

    def _new_counts(self) -> None:
        self.total: int | None = None  # known once the round's selection has ended
        self.selected = 0
        self.before = 0  # units an earlier stretch of a resumed run settled
        self.succeeded = 0
        self.failed = 0
        self.interrupted = 0
        self.last_settled = self.clock()
        # Unit id -> the host its running attempt was placed on ("" until placed).
        self.running: dict[str, str] = {}

    def __enter__(self) -> Display:
        if self.live_mode:
            self.progress.start()
            self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._started:
            self.progress.stop()
            self._started = False

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        handler = getattr(self, "_on_" + kind.replace(".", "_"), None)
        if handler is not None:
            handler(event)
            if self._task is not None:
                self.progress.update(
                    self._task, total=self.total, completed=self._done(), **self._fields()
                )
        # A live display redraws itself (see __init__); a log gets a progress line a minute.
        if not self._started and not self.live_mode and self.clock() >= self._progress_at:
            self._progress_at = self.clock() + PROGRESS_EVERY
            self._line("progress: " + self.progress.line())

    def _line(self, text: str, style: str = "") -> None:
        stamp = self.wall().strftime("%H:%M:%S")
        line = safetext.for_terminal(f"{stamp} {self.prefix}{text}")
        if not self._started and self._plain_lines:
            # A line per attempt in a log: plain text, without rich's rendering per line
            # (a tenth of a millisecond each, on the coordinator's one thread).
            self.console.file.write(line + "\n")
            return
        self.console.print(Text(line, style=style), highlight=False, soft_wrap=True)

    # Runs and rounds -------------------------------------------------------------

    def _on_run_started(self, event: dict[str, Any]) -> None:
        self._line(f"run {event['run']} of {event['job']} started")

    def _on_run_resumed(self, event: dict[str, Any]) -> None:
        if event.get("asked", True):
            self._line(f"run {event['run']} resumed at round {event['round']}")
        else:
            self._line(
                f"run {event['run']} did not finish ({event['was']}): resuming it at round"
                f" {event['round']}; --fresh starts a new run instead"
            )

    def _on_round_started(self, event: dict[str, Any]) -> None:
        self.round = event["round"]
        self._new_round()
        self.concurrency = event.get("concurrency", self.concurrency)
        if event.get("tightestLimit"):
            self.pace = (event["tightestLimit"], event["tightestPerMinute"])
        if event["round"] > 1 or not self.live_mode:
            doing = "resuming" if event.get("resumed") else "selecting units"
            self._line(f"round {event['round']}: {doing}{self._pace_note()}")

    def _pace_note(self) -> str:
        parts = []
        if self.concurrency:
            parts.append(f"up to {self.concurrency} at once")
        if self.pace:
            parts.append(f"tightest limit {self.pace[0]} {self.pace[1]:g}/min")
        return f" ({', '.join(parts)})" if parts else ""

    def _on_round_selecting(self, event: dict[str, Any]) -> None:
        self.selected = max(self.selected, event["units"])

    def _on_round_selected(self, event: dict[str, Any]) -> None:
        self.total = self.selected = event["units"]
        succeeded, failed = event.get("succeeded", 0), event.get("failed", 0)
        self.before = succeeded + failed
        text = f"round {event['round']}: {event['units']} unit(s) from {event['records']} record(s)"
        if self.before:
            text += (
                f", {self.before} settled before ({succeeded} succeeded, {failed} failed),"
                f" {event['units'] - self.before} remain"
            )
        self._line(text)

    def _on_run_finished(self, event: dict[str, Any]) -> None:
        if event.get("note"):
            self._line(event["note"])

    # Attempts and units ----------------------------------------------------------

    def _on_attempt_started(self, event: dict[str, Any]) -> None:
        self.running[event["unit"]] = ""
        if self.total is None:
            # Without a round.selecting (an older emitter), a started unit was selected.
            self.selected = max(self.selected, self._done() + len(self.running))
        if self.verbose:
            self._line(f"{event['unit']}: attempt {event['attempt']} ({event['rung']}) started")

    def _on_attempt_placed(self, event: dict[str, Any]) -> None:
        host = self.hosts.get(event["host"])
        if host is not None and event["unit"] in self.running:
            self.running[event["unit"]] = event["host"]
            host.busy += 1

    def _free(self, unit: str) -> None:
        placed = self.running.pop(unit, "")
        host = self.hosts.get(placed)
        if host is not None:
            host.busy = max(0, host.busy - 1)

    def _on_attempt_finished(self, event: dict[str, Any]) -> None:
        self._free(event["unit"])
        self._durations += event.get("duration", 0.0)
        self._finished += 1
        if event["status"] == "succeeded" and not self.verbose and self.live_mode:
            return
        style = "" if event["status"] == "succeeded" else "yellow"
        self._line(
            f"{event['unit']}: attempt {event['attempt']} ({event['rung']}) {event['status']}"
            f" in {format_duration(event['duration'])}"
            + ("" if event["status"] == "succeeded" else f": {event['reason']}"),
            style,
        )

    def _on_unit_settled(self, event: dict[str, Any]) -> None:
        self._free(event["unit"])
        self.last_settled = self.clock()
        if event["state"] == "succeeded":
            self.succeeded += 1
        else:
            self.failed += 1
            self._line(
                f"FAILED {event['unit']} after {event['attempts']} attempt(s),"
                f" rung {event['rung']}: {event['reason']}",
                "bold red",
            )

    def _on_unit_interrupted(self, event: dict[str, Any]) -> None:
        self._free(event["unit"])
        self.interrupted += 1

    def _on_file_conflict(self, event: dict[str, Any]) -> None:
        self._line(
            f"conflict: {event['path']} changed in the workspace since {event['unit']} staged it",
            "red",
        )

    # Hosts and limits ------------------------------------------------------------

    def _host(self, event: dict[str, Any]) -> _Host:
        host = self.hosts.setdefault(event["host"], _Host(slots=event.get("slots", 0)))
        host.slots = event.get("slots", host.slots)
        return host

    def _on_host_up(self, event: dict[str, Any]) -> None:
        self._host(event).state = "up"
        slots = f"{event.get('slots', 0)} slot(s)"
        if event.get("back"):
            self._line(f"host {event['host']} is back: {slots}")
        elif not self.live_mode:  # the live display's hosts line shows the hosts that start
            self._line(f"host {event['host']} up: {slots}, sandbox {event.get('sandbox', '?')}")

    def _on_host_lost(self, event: dict[str, Any]) -> None:
        host = self._host(event)
        if host.state == "quarantined":  # said already; it stays out of the run
            return
        host.state = "lost"
        if event.get("start"):
            self._line(
                f"host {event['host']} is unavailable: {event['reason']} (retrying)", "yellow"
            )
        else:
            running = f" ({host.busy} attempt(s) were running on it)" if host.busy else ""
            self._line(f"host {event['host']} lost: {event['reason']}{running}", "yellow")

    def _on_host_quarantined(self, event: dict[str, Any]) -> None:
        self._host(event).state = "quarantined"
        if event.get("start"):
            self._line(
                f"host {event['host']} is unavailable: {event['reason']} (quarantined)", "yellow"
            )
        else:
            self._line(f"host {event['host']} quarantined: {event['reason']}", "yellow")

    def _on_limit_paused(self, event: dict[str, Any]) -> None:
        self.paused[event["limit"]] = self.clock() + event["seconds"]
        self._line(
            f"limit {event['limit']} paused for {format_duration(event['seconds'])}"
            f" ({event['reason']})",
            "yellow",
        )

    def _on_notice(self, event: dict[str, Any]) -> None:
        self._line(event["message"], "yellow")

    # The live display ------------------------------------------------------------

    def _done(self) -> int:
        return self.before + self.succeeded + self.failed

    def _running(self) -> int:
        # With hosts, an attempt runs once placed on one; until then it waits for a host
        # slot (the dispatcher's slots outnumber the hosts' when hosts are down): queued.
        if self.hosts:
            return sum(1 for host in list(self.running.values()) if host)
        return len(self.running)

    def _queued(self) -> int:
        return max(0, self.selected - self._done() - self._running() - self.interrupted)

    def _fields(self) -> dict[str, Any]:
        """What the round's task carries besides done and total (see the columns)."""
        return {
            "selected": self.selected,
            "running": self._running(),
            "settled": self.succeeded + self.failed,
            "last_settled": self.last_settled,
            "remain": self._queued() + self._running(),
        }

    def _pacer(self) -> str:
        """What bounds the pace now: the tightest rate limit, when its starts per second
        are fewer than the slots can take at the attempts' mean duration so far (before
        any attempt has finished, a declared limit is assumed to), else the slots."""
        slots = self.concurrency or 0
        if self.hosts:
            up = sum(h.slots for h in list(self.hosts.values()) if h.state == "up")
            slots = min(slots, up) if slots else up
        if self.pace:
            name, per_minute = self.pace
            mean = self._durations / self._finished if self._finished else 0.0
            if mean <= 0 or per_minute / 60 < slots / mean:
                return f"paced by limit {name} {per_minute:g}/min"
        return f"paced by {slots} slot(s)" if slots else ""

    def _below(self) -> list[Text]:
        """The lines under the bar: units per state, the pace and the pauses; the hosts."""
        now = self.clock()
        parts = [f"{self._running()} running", f"{self._queued()} queued", f"{self.failed} failed"]
        if self.interrupted:
            parts.append(f"{self.interrupted} interrupted")
        pacer = self._pacer()
        if pacer:
            parts.append(pacer)
        states = Text(safetext.for_terminal("  ".join(parts)))
        for name, until in list(self.paused.items()):
            if until > now:
                states.append(
                    f"  [{safetext.for_terminal(name)} paused {format_duration(until - now)}]",
                    style="yellow",
                )
        lines = [states]
        if self.hosts:
            hosts = Text("hosts")
            for name, host in list(self.hosts.items()):
                style = {"up": "", "lost": "yellow", "quarantined": "red"}.get(host.state, "")
                hosts.append(
                    f"  {safetext.for_terminal(name)} {host.busy}/{host.slots} {host.state}",
                    style=style,
                )
            lines.append(hosts)
        return lines
