"""``fanout history``: a job's runs, one row each, oldest first, as a table a person
reads or as JSON records a dashboard reads (``records``: their keys are stable).

The table is plain text in columns as wide as their widest cell, as ``fanout status``
prints, not a rich table: it reads the same on a terminal, in a pipe and in a cron mail,
and a terminal's width never folds a row.  A column about a feature no run shown used
(reused, quarantined, unchanged units; tokens and spend without [[apis]]) is left out,
and the line under the table names what it left out: a nightly job without them keeps
to the width of a terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..journal import Journal, RunHistory
from ..outcome import RunState, UnitState
from ..values import safetext
from ..values.quantities import format_duration, usd_text


def records(journal: Journal, job: str, last: int) -> list[dict[str, Any]]:
    """``fanout history --format json``: the newest ``last`` runs of ``job`` (0: all),
    one record per run, oldest first.  Every key is
    always present.  Times are the epoch's seconds as in report.json; ``trigger`` is the
    cron trigger's name (null: started by hand), ``retryOf`` the run a ``fanout retry``
    retried; ``units`` counts each unit in its latest round by state, plus ``selected``
    (all of them), ``ran`` (those with an attempt) and ``unchanged`` (selected again by
    a later round but not run: unchanged since they failed); ``tokens`` and ``costUsd``
    are what the run's requests through the gateway used (input tokens without the
    cached ones, which are apart, as the APIs bill them); ``unitsPerMinute`` is units
    run per minute of wall time (null without wall time)."""
    return [
        {
            "run": run.run,
            "started": run.started,
            "finished": run.finished,
            "state": str(run.state),
            "trigger": run.trigger,
            "retryOf": run.retry_of,
            "rounds": run.rounds,
            "wallSeconds": round(run.wall_seconds, 3),
            "units": {
                "selected": run.selected,
                "ran": run.ran,
                "unchanged": run.unchanged,
                **{str(state): run.states[state] for state in UnitState},
            },
            "attempts": run.attempts,
            "tokens": {
                "input": run.input_tokens,
                "cacheRead": run.cache_read_tokens,
                "cacheWrite": run.cache_write_tokens,
                "output": run.output_tokens,
            },
            "costUsd": round(run.cost_usd, 6),
            "unitsPerMinute": _rounded(run.units_per_minute),
        }
        for run in journal.history(job, last or None)
    ]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


@dataclass(frozen=True, slots=True)
class _Column:
    head: str
    cell: Callable[[RunHistory], str]
    # Left out when no run shown has anything in it (see the module docstring).
    optional: bool = False
    left: bool = False


def _count(value: int) -> str:
    return f"{value:,}"


def _tokens(value: int) -> str:
    """A token count in three figures: 980, 12.4k, 3.1M."""
    for size, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return str(value)


def _rate(run: RunHistory) -> str:
    rate = run.units_per_minute
    if rate is None:
        return "-"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def _started(run: RunHistory) -> str:
    return datetime.fromtimestamp(run.started).strftime("%Y-%m-%d %H:%M")


def _note(run: RunHistory) -> str:
    said = [] if run.state is RunState.FINISHED else [str(run.state)]
    if run.retry_of:
        said.append(f"retry of {safetext.for_terminal(run.retry_of)}")
    return ", ".join(said)


_COLUMNS = (
    _Column("started", _started, left=True),
    _Column(
        "trigger",
        lambda run: safetext.for_terminal(run.trigger) if run.trigger else "manual",
        left=True,
    ),
    _Column("units", lambda run: _count(run.selected)),
    _Column("ran", lambda run: _count(run.ran)),
    _Column("reused", lambda run: _count(run.states[UnitState.REUSED]), optional=True),
    _Column("succeeded", lambda run: _count(run.states[UnitState.SUCCEEDED])),
    _Column("failed", lambda run: _count(run.states[UnitState.FAILED])),
    _Column("quarantined", lambda run: _count(run.states[UnitState.QUARANTINED]), optional=True),
    _Column("unchanged", lambda run: _count(run.unchanged), optional=True),
    _Column("wall", lambda run: format_duration(run.wall_seconds)),
    _Column("attempts", lambda run: _count(run.attempts)),
    _Column(
        "tokens in/out",
        lambda run: (
            f"{_tokens(run.input_tokens + run.cache_read_tokens + run.cache_write_tokens)}"
            f"/{_tokens(run.output_tokens)}"
        ),
        optional=True,
    ),
    _Column("spend", lambda run: usd_text(run.cost_usd), optional=True),
    _Column("units/min", _rate),
    _Column("", _note, left=True),
)

# What makes an optional column worth showing, by its head.
_USED: dict[str, Callable[[RunHistory], bool]] = {
    "reused": lambda run: run.states[UnitState.REUSED] > 0,
    "quarantined": lambda run: run.states[UnitState.QUARANTINED] > 0,
    "unchanged": lambda run: run.unchanged > 0,
    "tokens in/out": lambda run: run.used_apis,
    "spend": lambda run: run.used_apis,
}


def text(journal: Journal, job: str, last: int) -> str:
    """The table of the newest ``last`` runs of ``job`` (0: all), oldest first: started
    (local time), trigger, units selected, ran, reused, succeeded, failed, quarantined,
    unchanged (not retried), wall time, attempts, tokens read and written, spend, units
    run per minute of wall time, and what was unusual about the run (not finished, a
    retry); under it, the columns left out and how many runs were not shown."""
    name = safetext.for_terminal(job)
    runs = journal.history(job, last or None)
    if not runs:
        return f"no runs of {name} yet\n"
    total = journal.run_count(job) if last and len(runs) == last else len(runs)
    shown = [c for c in _COLUMNS if not c.optional or any(map(_USED[c.head], runs))]
    if not any(_note(run) for run in runs):
        shown = [c for c in shown if c.head]
    rows = [[c.head for c in shown], *([c.cell(run) for c in shown] for run in runs)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(shown))]
    lines = [
        "  ".join(
            cell.ljust(width) if column.left else cell.rjust(width)
            for cell, width, column in zip(row, widths, shown, strict=True)
        ).rstrip()
        for row in rows
    ]
    left_out = [c.head for c in _COLUMNS if c.optional and c not in shown]
    if left_out:
        lines.append(f"(left out, nothing in any run shown: {', '.join(left_out)})")
    if total > len(runs):
        lines.append(
            f"the last {len(runs)} of {total} runs of {name}: --last N shows more, --last 0 all"
        )
    return "\n".join(lines) + "\n"
