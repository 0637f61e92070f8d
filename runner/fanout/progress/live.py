"""The live display on ``rich.progress``: one task per round (a bar, pulsing while the
total is unknown, the units done, the rate, the elapsed time and the time remaining), and
under it the lines ``below`` renders from the counts.

The rate is the round's own (units settled in this stretch of the round over its time
so far), not ``Task.speed``: rich's speed averages the last 30 s of samples, and an
agent's unit takes minutes, so its window is empty most of the time (no rate, no ETA)
and it freezes while nothing settles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import RenderableType
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Column, Table
from rich.text import Text

from ..values import safetext
from ..values.quantities import format_duration
from .counts import Counts


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


class RunProgress(Progress):
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


def below(counts: Counts) -> list[Text]:
    """The lines under the bar: units per state, the pace and the pauses; the hosts."""
    now = counts.clock()
    parts = [
        f"{counts.running_now()} running",
        f"{counts.queued()} queued",
        f"{counts.failed} failed",
    ]
    if counts.interrupted:
        parts.append(f"{counts.interrupted} interrupted")
    pacer = counts.pacer()
    if pacer:
        parts.append(pacer)
    states = Text(safetext.for_terminal("  ".join(parts)))
    for name, until in list(counts.paused.items()):
        if until > now:
            states.append(
                f"  [{safetext.for_terminal(name)} paused {format_duration(until - now)}]",
                style="yellow",
            )
    lines = [states]
    if counts.hosts:
        hosts = Text("hosts")
        for name, host in list(counts.hosts.items()):
            style = {"up": "", "lost": "yellow", "quarantined": "red"}.get(host.state, "")
            hosts.append(
                f"  {safetext.for_terminal(name)} {host.busy}/{host.slots} {host.state}",
                style=style,
            )
        lines.append(hosts)
    return lines
