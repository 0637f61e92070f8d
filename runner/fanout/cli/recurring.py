"""Commands about a recurring job's runs over time: history, release."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated

import typer

from ..errors import ExitCode
from .app import JobFile, app

# Runs ``fanout history`` shows unless told otherwise: a month of a nightly job.
HISTORY_RUNS = 30


class HistoryFormat(StrEnum):
    text = "text"
    json = "json"


@app.command(rich_help_panel="Runs")
def history(
    file: JobFile,
    output: Annotated[
        HistoryFormat,
        typer.Option(
            "--format",
            metavar="<text|json>",
            help="text: a table to read; json: an array of one record per run, for"
            " dashboards (the recurring jobs guide lists its keys).",
        ),
    ] = HistoryFormat.text,
    last: Annotated[
        int,
        typer.Option("--last", "-n", min=0, help="Show the newest N runs; 0 shows all."),
    ] = HISTORY_RUNS,
) -> None:
    """The job's runs, one row each, oldest first: what each cost and what it did.

    Each row: when the run started (local time), its trigger (the cron trigger's name,
    or manual), units selected, run (had an attempt), reused (unchanged since an earlier
    run's success), succeeded, failed, quarantined (each unit in its latest round), and
    unchanged (a later round did not retry them: unchanged since they failed), its wall
    time, attempts, tokens read and written and spend (for a job with [[apis]]), and
    units run per minute of wall time.  A column no run shown uses is left out.

    Read from the journal of the job's runtime.stateDir; nothing is written.  A job
    that never ran has no runs: exit 0 all the same.
    """
    from .. import spec
    from ..journal import Journal
    from ..report import history as rendering

    def action() -> str:
        job = spec.load(file, require_hosts=False)
        path = job.runtime.state_dir / "journal.sqlite"
        if not path.is_file():  # no run of any job wrote here yet
            return "[]\n" if output is HistoryFormat.json else f"no runs of {job.name} yet\n"
        journal = Journal(path, read_only=True)
        try:
            if output is HistoryFormat.json:
                return json.dumps(rendering.records(journal, job.name, last), indent=2) + "\n"
            return rendering.text(journal, job.name, last)
        finally:
            journal.close()

    print(action(), end="")


@app.command(rich_help_panel="Runs")
def release(
    file: JobFile,
    units: Annotated[
        list[str],
        typer.Argument(metavar="UNIT", help="Ids of quarantined units.", show_default=False),
    ],
) -> None:
    """Let quarantined units run again: the job's next run starts them.

    A unit is quarantined when it failed the same way, unchanged, in units.quarantineAfter
    runs in a row: runs do not start it (exit 9 if nothing else failed), and `fanout
    status` and the report list it under "needs a person".  A change to the unit (its
    records, staged files, prompt or command, the ladder, units.version) ends the
    quarantine by itself; release is for a cause outside the unit, now fixed (a
    service that was down, a tool that was missing).

    Says what each release ended (the failure, how many runs, since when, what it cost).
    A released unit that fails again starts its streak from one.  Exit 0 if every UNIT
    was released, 1 if any was not quarantined (each is named on stderr; the others are
    released all the same).
    """
    from .. import spec
    from ..journal import Journal
    from ..report import attention

    def action() -> tuple[str, str, bool]:
        job = spec.load(file, require_hosts=False)
        after = job.units.quarantine_after
        path = job.runtime.state_dir / "journal.sqlite"
        if not path.is_file():  # nothing ever ran: nothing is quarantined
            done = [attention.Release(unit=unit, released=False, streak=None) for unit in units]
        else:
            journal = Journal(path)
            try:
                done = attention.release(journal, job.name, after, units)
            finally:
                journal.close()
        said, refused = attention.release_text(job.name, after, done)
        return said, refused, all(item.released for item in done)

    said, refused, released = action()
    print(said, end="")
    print(refused, end="", file=sys.stderr)
    raise typer.Exit(ExitCode.OK if released else ExitCode.FAILED)
