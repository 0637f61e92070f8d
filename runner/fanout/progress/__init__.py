"""Showing a run as it goes: a live display on a terminal, one line per event otherwise.

The live display is a ``rich.progress.Progress`` with one task per round: a bar (pulsing
while the total is unknown), the units done (of the total once the selection has ended,
of those selected so far while it streams), the rate, the round's elapsed time and the
time remaining (``at least`` while the selection streams: only the units known so far
are counted).  Below it, the units running, queued, failed and interrupted, what sets
the pace (a task limit, an API's window or the worker slots: ``limits.pacer``) and
each paused limit's countdown; with SSH hosts a line of hosts (busy/slots, up, lost or
quarantined).  It prints a line above itself for every failure, notice and host
change.  Without a terminal (cron, CI, a pipe) each finished attempt, settled unit and
host change is one plain, greppable line, and the live display's text is printed as a
``progress:`` line once a minute.

What the display knows is ``counts.Counts``, folded from the events here; the live
display is drawn by ``live``.

Unit ids, reasons and paths come from the backlog and the workers: every line goes
through ``safetext.for_terminal``, so an id with ``ESC[2J`` cannot clear the screen nor
a newline forge a line of its own, and lines are rich ``Text``, never markup, so
``[bold]`` or ``:smile:`` in an id prints as it is.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.progress import TaskID
from rich.text import Text

from ..values import safetext
from ..values.quantities import format_duration
from .counts import Counts
from .live import RunProgress, below

# Without a terminal, how often the live display's text is printed as a progress line.
PROGRESS_EVERY = 60.0


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
        self.counts = Counts(clock)
        self._started = False
        self.round = 1
        self._task: TaskID | None = None
        # Rendered afresh at each refresh (four a second), so the clock, the ETA and a
        # pause's countdown move while no event comes (an agent's unit can take minutes).
        self.progress = RunProgress(
            functools.partial(below, self.counts),
            console=console,
            get_time=clock,
            refresh_per_second=4,
            transient=True,
        )
        self._new_round()

    def _new_round(self) -> None:
        self.counts.new_round()
        # A task's total cannot go back to unknown: each round is a task of its own.
        if self._task is not None:
            self.progress.remove_task(self._task)
        self._task = self.progress.add_task(
            f"round {self.round}", total=None, **self.counts.fields()
        )

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
                    self._task,
                    total=self.counts.total,
                    completed=self.counts.done(),
                    **self.counts.fields(),
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
        self.counts.concurrency = event.get("concurrency", self.counts.concurrency)
        self.counts.paces = event.get("paces", self.counts.paces)
        if event["round"] > 1 or not self.live_mode:
            doing = "resuming" if event.get("resumed") else "selecting units"
            self._line(f"round {event['round']}: {doing}{self._pace_note()}")

    def _pace_note(self) -> str:
        parts = []
        if self.counts.concurrency:
            parts.append(f"up to {self.counts.concurrency} at once")
        tightest = next((pace for pace in self.counts.paces if "limit" in pace), None)
        if tightest:
            parts.append(f"tightest limit {tightest['limit']} {tightest['perMinute']:g}/min")
        return f" ({', '.join(parts)})" if parts else ""

    def _on_round_selecting(self, event: dict[str, Any]) -> None:
        self.counts.selected = max(self.counts.selected, event["units"])

    def _on_round_selected(self, event: dict[str, Any]) -> None:
        self.counts.total = self.counts.selected = event["units"]
        succeeded, failed = event.get("succeeded", 0), event.get("failed", 0)
        self.counts.before = succeeded + failed
        text = f"round {event['round']}: {event['units']} unit(s) from {event['records']} record(s)"
        if self.counts.before:
            text += (
                f", {self.counts.before} settled before ({succeeded} succeeded, {failed} failed),"
                f" {event['units'] - self.counts.before} remain"
            )
        for key, said in (("reused", "reused"), ("quarantined", "quarantined")):
            if event.get(key):
                text += f", {event[key]} {said}"
        if event.get("unchanged"):
            text += (
                f"; {event['unchanged']} not retried: unchanged since they failed in an"
                " earlier round"
            )
        self._line(text)

    def _on_run_finished(self, event: dict[str, Any]) -> None:
        if event.get("note"):
            self._line(event["note"])

    def _on_notify_sent(self, event: dict[str, Any]) -> None:
        self._line(f"notified {event['to']} of {', '.join(event['events'])}")

    def _on_notify_failed(self, event: dict[str, Any]) -> None:
        said = ", ".join(event["events"])
        self._line(
            f"could not notify {event['to']} of {said}: {event['reason']} (the run's result"
            " stands)",
            "yellow",
        )

    def _on_traces_exported(self, event: dict[str, Any]) -> None:
        self._line(f"exported {event['spans']} span(s) to {event['to']}")

    def _on_traces_failed(self, event: dict[str, Any]) -> None:
        self._line(
            f"could not export spans to {event['to']}: {event['reason']} (the run's result stands)",
            "yellow",
        )

    def _on_publish_published(self, event: dict[str, Any]) -> None:
        self._line(
            f"published {event['files']} file(s) in {event['commits']} commit(s) to"
            f" {event['branch']} on {event['remote']}; pull request {event['pr']}"
        )

    def _on_publish_skipped(self, event: dict[str, Any]) -> None:
        self._line(f"not published: {event['reason']}")

    def _on_publish_refused(self, event: dict[str, Any]) -> None:
        self._line(
            f"publish refused: {event['reason']}; nothing was committed or pushed (the"
            " run's result stands)",
            "yellow",
        )

    def _on_publish_failed(self, event: dict[str, Any]) -> None:
        self._line(f"could not publish: {event['reason']} (the run's result stands)", "yellow")

    # Attempts and units ----------------------------------------------------------

    def _on_attempt_started(self, event: dict[str, Any]) -> None:
        self.counts.running[event["unit"]] = ""
        if self.counts.total is None:
            # Without a round.selecting (an older emitter), a started unit was selected.
            self.counts.selected = max(
                self.counts.selected, self.counts.done() + len(self.counts.running)
            )
        if self.verbose:
            self._line(f"{event['unit']}: attempt {event['attempt']} ({event['rung']}) started")

    def _on_attempt_placed(self, event: dict[str, Any]) -> None:
        host = self.counts.hosts.get(event["host"])
        if host is not None and event["unit"] in self.counts.running:
            self.counts.running[event["unit"]] = event["host"]
            host.busy += 1

    def _on_attempt_finished(self, event: dict[str, Any]) -> None:
        self.counts.free(event["unit"])
        self.counts.finish(event)
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
        self.counts.free(event["unit"])
        self.counts.last_settled = self.clock()
        if event["state"] == "succeeded":
            self.counts.succeeded += 1
        elif event["state"] == "quarantined":
            self.counts.quarantined += 1
            self._line(f"QUARANTINED {event['unit']}: {event['reason']}", "yellow")
        else:
            self.counts.failed += 1
            self._line(
                f"FAILED {event['unit']} after {event['attempts']} attempt(s),"
                f" rung {event['rung']}: {event['reason']}",
                "bold red",
            )

    def _on_units_reused(self, event: dict[str, Any]) -> None:
        self.counts.reused += event["count"]
        self.counts.last_settled = self.clock()

    def _on_unit_quarantined(self, event: dict[str, Any]) -> None:
        self._line(
            f"{event['unit']} failed the same way ({event['failure']}) in {event['runs']}"
            " runs in a row: quarantined, the next runs do not start it until it changes"
            " or `fanout release` lets it",
            "yellow",
        )

    def _on_unit_interrupted(self, event: dict[str, Any]) -> None:
        self.counts.free(event["unit"])
        self.counts.interrupted += 1

    def _on_file_conflict(self, event: dict[str, Any]) -> None:
        self._line(
            f"conflict: {event['path']} changed in the workspace since {event['unit']} staged it",
            "red",
        )

    # Hosts and limits ------------------------------------------------------------

    def _on_host_up(self, event: dict[str, Any]) -> None:
        self.counts.host(event).state = "up"
        slots = f"{event.get('slots', 0)} slot(s)"
        if event.get("back"):
            self._line(f"host {event['host']} is back: {slots}")
        elif not self.live_mode:  # the live display's hosts line shows the hosts that start
            self._line(f"host {event['host']} up: {slots}, sandbox {event.get('sandbox', '?')}")

    def _on_host_lost(self, event: dict[str, Any]) -> None:
        host = self.counts.host(event)
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
        self.counts.host(event).state = "quarantined"
        if event.get("start"):
            self._line(
                f"host {event['host']} is unavailable: {event['reason']} (quarantined)", "yellow"
            )
        else:
            self._line(f"host {event['host']} quarantined: {event['reason']}", "yellow")

    def _on_limit_paused(self, event: dict[str, Any]) -> None:
        self.counts.paused[event["limit"]] = self.clock() + event["seconds"]
        # A throttle of a start made before the pause began lengthens it, never doubles it.
        same = " (same episode)" if event.get("episode") == "same" else ""
        self._line(
            f"limit {event['limit']} paused for {format_duration(event['seconds'])}"
            f" ({event['reason']}){same}",
            "yellow",
        )

    def _on_limit_learned(self, event: dict[str, Any]) -> None:
        self._learned(event, f"limit {event['limit']}")

    def _on_api_learned(self, event: dict[str, Any]) -> None:
        self._learned(event, f"api {event['api']}")

    def _learned(self, event: dict[str, Any], name: str) -> None:
        """A ceiling learned (or kept from an earlier run): the live line's pace names
        it; a log says each change of what was learned."""
        before = self.counts.learn(event)
        if self.live_mode and not self.verbose:
            return
        if event.get("kept"):
            self._line(f"{name} starts at {event['text']}, as an earlier run left it")
        elif before is None or event["text"] != before.get("text"):
            self._line(f"{name}: {event['text']}")

    def _on_limit_ramp(self, event: dict[str, Any]) -> None:
        limit, ramping = event["limit"], bool(event["ramping"])
        if ramping == (limit in self.counts.ramping):
            return  # the flight grew: said once, at its start and at its end
        if ramping:
            self.counts.ramping.add(limit)
        else:
            self.counts.ramping.discard(limit)
        if self.live_mode and not self.verbose:
            return
        if ramping:
            self._line(f"limit {limit}: slow start, finding the pace (nothing learned yet)")
        else:
            self._line(f"limit {limit}: slow start over, the slots bound it")

    def _on_api_throttled(self, event: dict[str, Any]) -> None:
        # The gateway absorbed it (the worker never sees it): said only when asked, or
        # in a log, where a run slower than planned should say why.
        if self.verbose or not self.live_mode:
            self._line(
                f"api {event['api']}: {event['status']} for {event['unit']}, paused"
                f" {format_duration(event['pause'])} and retried (the worker does not see it)",
                "yellow",
            )

    def _on_api_unpriced(self, event: dict[str, Any]) -> None:
        model = event.get("model") or "(no model named)"
        self._line(
            f"api {event['api']}: no price matches model {model}: its tokens cost $0 in the"
            " report and the budget (add it to [[apis]] prices)",
            "yellow",
        )

    def _on_notice(self, event: dict[str, Any]) -> None:
        self._line(event["message"], "yellow")
