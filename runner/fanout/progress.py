"""Showing a run as it goes: a live display on a terminal, one line per event otherwise.

The live display counts done, running, failed and queued units with the rate and an
ETA, and prints a line above itself for every failure.  Without a terminal (cron, CI,
a pipe) each finished attempt and settled unit is one plain, greppable line.

Unit ids, reasons and paths come from the backlog and the workers: every line goes
through ``safetext.for_terminal``, so an id with ``ESC[2J`` cannot clear the screen nor
a newline forge a line of its own, and lines are rich ``Text``, never markup, so
``[bold]`` or ``:smile:`` in an id prints as it is.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from . import safetext
from .quantities import format_duration


class Display:
    def __init__(
        self,
        console: Console,
        *,
        live: bool | None = None,
        verbose: bool = False,
        prefix: str = "",
    ) -> None:
        self.console = console
        terminal = console.is_terminal  # an isatty call: asked once, not per line
        self.live_mode = terminal if live is None else live
        self._plain_lines = not terminal
        self.verbose = verbose
        self.prefix = f"{prefix}: " if prefix else ""
        self.started = time.monotonic()
        self.selected = 0
        self.selection_done = False
        self.running = 0
        self.succeeded = 0
        self.failed = 0
        self.round = 1
        self.paused: dict[str, float] = {}
        self._live: Live | None = None

    def __enter__(self) -> Display:
        if self.live_mode:
            self._live = Live(
                self._render(), console=self.console, refresh_per_second=8, transient=True
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        handler = getattr(self, "_on_" + kind.replace(".", "_"), None)
        if handler is not None:
            handler(event)
        if self._live is not None:
            self._live.update(self._render())

    def _line(self, text: str, style: str = "") -> None:
        stamp = datetime.now().strftime("%H:%M:%S")
        line = safetext.for_terminal(f"{stamp} {self.prefix}{text}")
        if self._live is None and self._plain_lines:
            # A line per attempt in a log: plain text, without rich's rendering per line
            # (a tenth of a millisecond each, on the coordinator's one thread).
            self.console.file.write(line + "\n")
            return
        self.console.print(Text(line, style=style), highlight=False, soft_wrap=True)

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
        self.selected = 0
        self.selection_done = False
        self.succeeded = self.failed = 0
        if event["round"] > 1 or not self.live_mode:
            self._line(f"round {event['round']}: selecting units")

    def _on_round_selected(self, event: dict[str, Any]) -> None:
        self.selected = event["units"]
        self.selection_done = True
        self._line(
            f"round {event['round']}: {event['units']} unit(s) from {event['records']} record(s)"
        )

    def _on_attempt_started(self, event: dict[str, Any]) -> None:
        self.running += 1
        if not self.selection_done:
            self.selected = max(self.selected, self.succeeded + self.failed + self.running)
        if self.verbose:
            self._line(f"{event['unit']}: attempt {event['attempt']} ({event['rung']}) started")

    def _on_attempt_finished(self, event: dict[str, Any]) -> None:
        self.running = max(0, self.running - 1)
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
        if event["state"] == "succeeded":
            self.succeeded += 1
        else:
            self.failed += 1
            self._line(
                f"FAILED {event['unit']} after {event['attempts']} attempt(s),"
                f" rung {event['rung']}: {event['reason']}",
                "bold red",
            )

    def _on_file_conflict(self, event: dict[str, Any]) -> None:
        self._line(
            f"conflict: {event['path']} changed in the workspace since {event['unit']} staged it",
            "red",
        )

    def _on_limit_paused(self, event: dict[str, Any]) -> None:
        self.paused[event["limit"]] = time.monotonic() + event["seconds"]
        self._line(
            f"limit {event['limit']} paused for {format_duration(event['seconds'])}"
            f" ({event['reason']})",
            "yellow",
        )

    def _on_notice(self, event: dict[str, Any]) -> None:
        self._line(event["message"], "yellow")

    def _on_run_finished(self, event: dict[str, Any]) -> None:
        if event.get("note"):
            self._line(event["note"])

    def _render(self) -> Text:
        elapsed = time.monotonic() - self.started
        done = self.succeeded + self.failed
        queued = max(0, self.selected - done - self.running)
        rate = done / elapsed if elapsed > 0 else 0.0
        total = f"{self.selected}" if self.selection_done else f"{self.selected}+"
        eta = ""
        if self.selection_done and rate > 0 and queued + self.running:
            eta = f"  eta {format_duration((queued + self.running) / rate)}"
        text = Text(
            f"round {self.round}  {done}/{total} done  {self.running} running  {queued} queued  "
            f"{self.failed} failed  {rate:.1f}/s  {format_duration(elapsed)}{eta}"
        )
        now = time.monotonic()
        for name, until in self.paused.items():
            if until > now:
                text.append(
                    f"  [{safetext.for_terminal(name)} paused {format_duration(until - now)}]",
                    style="yellow",
                )
        return text
