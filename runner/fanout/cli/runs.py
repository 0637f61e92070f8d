"""Commands about runs: run, retry, status, report."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import IO, Annotated, Any, cast

import typer

from ..errors import run_exits
from .app import (
    HostsOption,
    JobFile,
    OverlapPolicy,
    StateDir,
    app,
    nothing_selected,
    sealed_environ,
)


@app.command(rich_help_panel="Runs", epilog=run_exits())
def run(
    file: JobFile,
    resume: Annotated[
        bool | None,
        typer.Option(
            "--resume/--fresh",
            help="--resume: continue the job's last run, which must be unfinished."
            "  --fresh: start a new run even if the last one did not finish."
            "  [default: continue the last run if it did not finish, else start one]",
            show_default=False,
        ),
    ] = None,
    apply: Annotated[
        bool | None,
        typer.Option(
            "--apply/--no-apply",
            help="Write collected files back to the workspace (default: collect.apply).",
        ),
    ] = None,
    hosts: HostsOption = None,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            help="Run at most N units at once (overrides maxConcurrentTasks).",
        ),
    ] = None,
    overlap: Annotated[
        OverlapPolicy,
        typer.Option(
            "--overlap",
            help="If a run of this job is going: skip (exit 6), queue (wait), or replace it.",
        ),
    ] = OverlapPolicy.SKIP,
    reuse: Annotated[
        bool,
        typer.Option(
            "--reuse/--no-reuse",
            help="--no-reuse: run every selected unit, even one whose fingerprint matches"
            " an earlier run's success (units.reuse).",
        ),
    ] = True,
    expect_plan: Annotated[
        str | None,
        typer.Option(
            "--expect-plan",
            metavar="HASH",
            help="Refuse (exit 10, before anything starts) unless the job's plan hash is"
            " HASH: the one 'fanout plan --hash' printed when the change was reviewed.",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every attempt.")] = False,
) -> None:
    """Run a job: every unit in its own sandbox, up the retry ladder, in rounds.

    Selects the units, runs each in a fresh sandbox, retries up the ladder, applies
    collected files between rounds, and writes report.md and report.json.

    A unit whose fingerprint (its records, staged files, rendered prompt and command,
    ladder, agent version, units.version) matches a unit that succeeded in an earlier
    run is reused, not run (units.reuse); one that failed the same way in
    units.quarantineAfter runs in a row is quarantined until it changes or
    `fanout release` lets it.

    Ctrl-C drains: running units are stopped and their sandboxes removed.  A closed
    console (| head) stops the run: nothing new starts, running attempts finish.  A run
    stopped either way, or by an error (see the exit codes below), stays resumable.

    If the job's last run did not finish (Ctrl-C, a crash, every host down), this
    continues it: settled units are not run again.  --fresh starts a new run instead.
    """
    from ..run import job as running

    options = running.Options(apply=apply, resume=resume, concurrency=jobs, reuse=reuse)
    raise typer.Exit(
        _execute(
            file,
            hosts,
            verbose,
            lambda r: r.execute(options),
            overlap=overlap.value,
            expect_plan=expect_plan,
        )
    )


@app.command(rich_help_panel="Runs")
def retry(
    run_id: Annotated[
        str, typer.Argument(metavar="RUN", help="The run whose failed units to retry.")
    ],
    apply: Annotated[
        bool | None, typer.Option("--apply/--no-apply", help="Apply collected files.")
    ] = None,
    hosts: HostsOption = None,
    state_dir: StateDir = Path(".fanout"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every attempt.")] = False,
) -> None:
    """Start a new run over the units that failed in RUN, from the first rung.

    It uses the job file RUN was started from.
    """
    from ..journal import Journal
    from ..run import job as running

    def job_file() -> Path:
        journal = Journal(state_dir / "journal.sqlite", read_only=True)
        try:
            return Path(journal.run(run_id).job_file)
        finally:
            journal.close()

    options = running.Options(apply=apply)

    def action(runner: running.Runner) -> Any:
        return runner.retry_failed(runner.journal.run(run_id), options)

    file = job_file()
    raise typer.Exit(_execute(file, hosts, verbose, action))


def _execute(
    file: Path,
    hosts: Path | None,
    verbose: bool,
    action: Callable[[Any], Any],
    overlap: Any = "skip",
    expect_plan: str | None = None,
) -> int:
    from rich.console import Console

    from .. import spec
    from ..outcome import StopReason
    from ..progress import Display
    from ..run import launch
    from ..values.quantities import format_duration
    from .console import ConsoleStream

    job = spec.load(file, hosts_file=hosts)
    if expect_plan is not None:
        _check_plan(job, file, expect_plan)
    coordinator_env = sealed_environ([job])
    # A closed console (``| head``, a dropped terminal) stops the run (running attempts
    # finish) and silences everything after it: see cli/console.py and launch.Drain.
    drain = launch.Drain()
    stream = ConsoleStream(sys.stderr, drain.request)
    console = Console(file=cast("IO[str]", stream), highlight=False)
    display = Display(console, verbose=verbose)
    with display:
        summary = launch.run_blocking(
            job, coordinator_env, [display], action, overlap=overlap, drain=drain
        )
    console.print(summary.describe())
    if summary.wall_seconds > 0 and summary.worker_seconds > 0:
        console.print(
            f"wall {format_duration(summary.wall_seconds)}, worker time "
            f"{format_duration(summary.worker_seconds)}: "
            f"{summary.worker_seconds / summary.wall_seconds:.1f}x"
        )
    console.print(f"report: {summary.report_dir / 'report.md'}")
    if summary.reason is StopReason.NOTHING_SELECTED:
        raise nothing_selected(file, summary.unmatched)
    return summary.exit_code


def _check_plan(job: Any, file: Path, expected: str) -> None:
    """``--expect-plan``: refuse a job whose plan is not the one reviewed, before the
    run is recorded or anything starts."""
    from ..errors import PlanChanged
    from ..plan.approval import plan_hash

    now = plan_hash(job)
    if expected.strip().lower() != now:
        quoted = shlex.quote(str(file))
        raise PlanChanged(
            f"{file}: the plan changed since it was reviewed: --expect-plan {expected.strip()},"
            f" and the job's plan hash is now {now}. Nothing ran. See what changed with"
            f" `fanout plan {quoted} --base REV` (REV: the reviewed commit), then approve"
            f" the new hash (`fanout plan {quoted} --hash`)"
        )


@app.command(rich_help_panel="Runs")
def status(
    run_id: Annotated[
        str | None, typer.Argument(metavar="[RUN]", help="One run to detail.")
    ] = None,
    state_dir: StateDir = Path(".fanout"),
    units: Annotated[
        int,
        typer.Option("--units", "-n", min=0, help="With RUN: list at most N units per state."),
    ] = 10,
) -> None:
    """Show recent runs and their units by state, or one run in detail.

    With RUN: its units by state, the failed ones first, each with its rung, attempts
    and reason, and the run it retries.  Nothing is written: without a journal in the
    state directory this says so and exits 5.
    """
    from ..journal import Journal
    from ..report.status import status_text

    # The same journal for the rest of the units: the report command names it too.
    command = "fanout report"
    if state_dir != Path(".fanout"):
        command += f" --state-dir {shlex.quote(str(state_dir))}"

    def action() -> str:
        journal = Journal(state_dir / "journal.sqlite", read_only=True)
        try:
            return status_text(journal, run_id, shown=units, report_command=command)
        finally:
            journal.close()

    print(action(), end="")


class ReportFormat(StrEnum):
    text = "text"
    json = "json"


def _report_format(value: str) -> ReportFormat:
    """``--format`` of ``report``.  ``github`` was offered and printed the markdown: a
    report has no job-file lines to annotate (a failed unit is not a problem in a file,
    even when its id is a path), and GitHub already renders markdown where a report is
    read (a step summary, a pull request comment), so it was dropped rather than made
    into annotations.  A script that still passes it is told where to go instead."""
    if value == "github":
        raise typer.BadParameter(
            "'github' is not a report format: the report is markdown, which GitHub shows"
            ' as it is (fanout report RUN >> "$GITHUB_STEP_SUMMARY"); annotations on job'
            " files are fanout validate --format github"
        )
    try:
        return ReportFormat(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not one of 'text', 'json'.") from None


@app.command("report", rich_help_panel="Runs")
def show_report(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run to report on.")],
    output: Annotated[
        ReportFormat,
        typer.Option(
            "--format",
            parser=_report_format,
            metavar="<text|json>",
            help="text (markdown) or json.",
        ),
    ] = ReportFormat.text,
    state_dir: StateDir = Path(".fanout"),
) -> None:
    """Print the report of RUN (rebuilt from the journal) as markdown or JSON."""
    from ..journal import Journal
    from ..report import document as report

    def action() -> str:
        journal = Journal(state_dir / "journal.sqlite", read_only=True)
        try:
            if output is ReportFormat.json:
                # Streamed: a 100k-unit run is never one string in memory.
                report.write_json(journal, run_id, sys.stdout)
                return ""
            return report.render_markdown(report.markdown_data(journal, run_id))
        finally:
            journal.close()

    print(action(), end="")
