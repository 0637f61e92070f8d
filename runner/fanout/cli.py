"""The ``fanout`` command: parse arguments, make one library call, map the result to an
exit code.  Only this module reads the environment, prints and exits; heavy modules
are imported inside the commands that need them so ``fanout validate`` starts fast.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from . import __version__
from .errors import FanoutError, JobError

app = typer.Typer(
    name="fanout",
    help=(
        "Run a backlog of independent units on short-lived, sandboxed workers.\n\n"
        "A TOML job file declares where the backlog comes from, how it splits into units, "
        "what each worker runs, how fast (rate limits), how persistently (a retry ladder) "
        "and when (cron triggers).  Start with 'fanout init', check with 'fanout validate' "
        "and 'fanout plan', then 'fanout run'."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

T = TypeVar("T")

JobFile = Annotated[
    Path,
    typer.Argument(help="The job file (TOML).", exists=False, dir_okay=False, show_default=False),
]


class OutputFormat(StrEnum):
    text = "text"
    json = "json"


class OverlapPolicy(StrEnum):
    SKIP = "skip"
    QUEUE = "queue"
    REPLACE = "replace"


def _call(action: Callable[[], T]) -> T:
    """Run one library call; a FanoutError becomes its message on stderr and its exit code."""
    try:
        return action()
    except FanoutError as exc:
        print(str(exc) if str(exc) else type(exc).__name__, file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise typer.Exit(130) from None


def _environ() -> dict[str, str]:
    """The coordinator's environment for input commands and local workers.  The
    directory of the Python running fanout goes first on PATH, so tools installed
    beside fanout (in its virtualenv) are found without activating it."""
    environ = dict(os.environ)
    tools = os.path.dirname(sys.executable)
    environ["PATH"] = os.pathsep.join([tools, environ.get("PATH", os.defpath)])
    return environ


def _version(value: bool) -> None:
    if value:
        print(f"fanout {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Run a backlog of independent units on short-lived, sandboxed workers."""


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="Job files to check.", show_default=False)],
    output: Annotated[
        OutputFormat,
        typer.Option(
            "--format", help="text: file:line:col lines; json: an array for CI annotations."
        ),
    ] = OutputFormat.text,
) -> None:
    """Check job files against the schema and fanout's rules.

    Exit 0 if all are valid, 2 if not.

    Every problem is reported at once as FILE:LINE:COL: key.path: what is wrong.
    Input commands are not run (see 'fanout plan' for that).
    """
    from . import spec

    problems = []
    for file in files:
        try:
            spec.load(file, require_hosts=False)
        except JobError as exc:
            problems.extend(exc.problems)
    if output is OutputFormat.json:
        print(json.dumps([p.as_dict() for p in problems], indent=2))
    else:
        for problem in problems:
            print(problem, file=sys.stderr)
        bad = len({p.file for p in problems})
        if problems:
            print(f"{len(problems)} problem(s) in {bad} of {len(files)} file(s)", file=sys.stderr)
        else:
            print(f"{len(files)} job file(s) valid")
    raise typer.Exit(JobError.exit_code if problems else 0)


@app.command()
def plan(
    file: JobFile,
    hosts: Annotated[
        Path | None, typer.Option("--hosts", help="A hosts file replacing runtime.hosts.")
    ] = None,
) -> None:
    """Show what 'fanout run' would do, without running any worker.

    The units selected now, the first unit's rendered prompt and command, concurrency,
    the pace the tightest rate limit allows, the next cron fires and the resolved job
    with defaults filled in.  Runs the input command.  Exit 3 if nothing is selected.
    """
    from . import plan as planning
    from . import spec
    from .errors import NothingSelected

    def make() -> str:
        job = spec.load(file, hosts_file=hosts)
        result = planning.make(job, environ=_environ(), now=datetime.now(UTC))
        text = planning.render_text(result)
        if result.units == 0:
            print(text)
            raise NothingSelected(f"nothing selected: the inputs of {file} yield no units")
        return text

    print(_call(make), end="")


HostsOption = Annotated[
    Path | None,
    typer.Option(
        "--hosts", help="A hosts file replacing runtime.hosts (inventories per environment)."
    ),
]


@app.command()
def run(
    file: JobFile,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the last unfinished run of this job.")
    ] = False,
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
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show every attempt.")] = False,
) -> None:
    """Run a job: every unit in its own sandbox, up the retry ladder, in rounds.

    Selects the units, runs each in a fresh sandbox, retries up the ladder, applies
    collected files between rounds, and writes report.md and report.json.

    Exit 0 if every unit succeeded, 1 if some failed (listed in the report for a human),
    2 for an invalid job, 3 if nothing was selected, 4 if the inputs or hosts cannot
    run, 6 if another run of the job holds its lock, 130 if interrupted.  Ctrl-C drains:
    running units are stopped and their sandboxes removed; --resume picks them up.
    """
    from . import run as running

    options = running.Options(apply=apply, resume=resume, concurrency=jobs)
    raise typer.Exit(
        _call(
            lambda: _execute(
                file, hosts, verbose, lambda r: r.execute(options), overlap=overlap.value
            )
        )
    )


StateDir = Annotated[
    Path,
    typer.Option("--state-dir", help="fanout's state directory (runtime.stateDir of the job)."),
]


@app.command()
def retry(
    run_id: Annotated[
        str, typer.Argument(metavar="RUN", help="The run whose failed units to retry.")
    ],
    failed: Annotated[
        bool,
        typer.Option(
            "--failed", help="Re-run only the units that failed (the default and only mode)."
        ),
    ] = True,
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
    from . import run as running
    from .journal import Journal

    def job_file() -> Path:
        journal = Journal(state_dir / "journal.sqlite")
        try:
            return Path(journal.run(run_id).job_file)
        finally:
            journal.close()

    options = running.Options(apply=apply)

    def action(runner: running.Runner) -> Any:
        return runner.retry_failed(runner.journal.run(run_id), options)

    file = _call(job_file)
    raise typer.Exit(_call(lambda: _execute(file, hosts, verbose, action)))


def _execute(
    file: Path,
    hosts: Path | None,
    verbose: bool,
    action: Callable[[Any], Any],
    overlap: Any = "skip",
) -> int:
    from rich.console import Console

    from . import launch, spec
    from .errors import NothingSelected
    from .progress import Display
    from .quantities import format_duration

    job = spec.load(file, hosts_file=hosts)
    console = Console(stderr=True, highlight=False)
    display = Display(console, verbose=verbose)
    with display:
        summary = launch.run_blocking(job, _environ(), [display], action, overlap=overlap)
    console.print(summary.describe())
    if summary.wall_seconds > 0:
        console.print(
            f"wall {format_duration(summary.wall_seconds)}, worker time "
            f"{format_duration(summary.worker_seconds)}: "
            f"{summary.worker_seconds / summary.wall_seconds:.1f}x"
        )
    console.print(f"report: {summary.report_dir / 'report.md'}")
    if summary.note == "nothing selected":
        raise NothingSelected(f"nothing selected: the inputs of {file} yield no units")
    return summary.exit_code


@app.command()
def status(
    run_id: Annotated[
        str | None, typer.Argument(metavar="[RUN]", help="One run to detail.")
    ] = None,
    state_dir: StateDir = Path(".fanout"),
) -> None:
    """Show recent runs and their units by state, or one run in detail."""
    from . import report
    from .journal import Journal

    def action() -> str:
        journal = Journal(state_dir / "journal.sqlite")
        try:
            return report.status_text(journal, run_id)
        finally:
            journal.close()

    print(_call(action), end="")


@app.command("report")
def show_report(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="The run to report on.")],
    output: Annotated[
        OutputFormat, typer.Option("--format", help="text (markdown) or json.")
    ] = OutputFormat.text,
    state_dir: StateDir = Path(".fanout"),
) -> None:
    """Print the report of RUN (rebuilt from the journal) as markdown or JSON."""
    from . import report
    from .journal import Journal

    def action() -> str:
        journal = Journal(state_dir / "journal.sqlite")
        try:
            data = report.build(journal, run_id)
        finally:
            journal.close()
        return (
            json.dumps(data, indent=2) + "\n"
            if output is OutputFormat.json
            else report.render_markdown(data)
        )

    print(_call(action), end="")


@app.command()
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the job file.")] = Path(
        "fanout.toml"
    ),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter job file that validates as is."""
    from . import starter

    if path.exists() and not force:
        print(f"{path} exists; use --force to overwrite it", file=sys.stderr)
        raise typer.Exit(1)
    path.write_text(starter.text(), encoding="utf-8")
    print(f"wrote {path}; next: fanout validate {path} && fanout plan {path}")


@app.command()
def schema() -> None:
    """Print the job file's JSON Schema (draft-07, for editors and CI)."""
    from .schema import schema_text

    print(schema_text(), end="")


@app.command()
def triggers(
    file: JobFile,
    count: Annotated[int, typer.Option("--count", "-n", min=1, help="Fires per trigger.")] = 5,
    after: Annotated[
        str | None,
        typer.Option(
            "--after", help="Start from this ISO 8601 time (default: now), e.g. 2027-11-07T00:00Z."
        ),
    ] = None,
) -> None:
    """The next fires of each cron trigger, in its time zone and in UTC.

    Each trigger comes with a plain-English reading of its schedule.
    """
    from . import plan as planning
    from . import spec
    from .errors import FanoutError

    def fires() -> str:
        job = spec.load(file, require_hosts=False)
        try:
            start = datetime.fromisoformat(after.replace("Z", "+00:00")) if after else None
        except ValueError:
            raise FanoutError(
                f"--after {after!r} is not an ISO 8601 time like 2027-11-07T00:00Z"
            ) from None
        if start is None:
            start = datetime.now(UTC)
        elif start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
        if not job.triggers:
            return f"{file} has no triggers\n"
        return planning.render_fires(planning.next_fires(job, start, count))

    print(_call(fires), end="")


@app.command()
def schedule(
    files: Annotated[
        list[Path], typer.Argument(help="Job files whose triggers to fire.", show_default=False)
    ],
    hosts: HostsOption = None,
) -> None:
    """Fire the cron triggers of the given jobs until stopped (systemd, containers).

    A foreground process that logs to stdout.  SIGTERM or Ctrl-C stop firing and
    interrupt the runs in progress, which stay resumable.  The last fire of each trigger
    is kept in the state directory, so a restart neither fires twice nor forgets a
    missed fire (each trigger's catchUp decides).
    """
    import asyncio
    import signal

    from rich.console import Console

    from . import launch, spec
    from .progress import Display
    from .schedule import Fire, Scheduler

    jobs = [_call(lambda f=f: spec.load(f, hosts_file=hosts)) for f in files]  # type: ignore[misc]
    environ = _environ()
    console = Console(highlight=False, soft_wrap=True)

    def log(message: str) -> None:
        console.print(
            f"{datetime.now(UTC).isoformat(timespec='seconds')} {message}", highlight=False
        )

    async def start_run(fire: Fire) -> str:
        display = Display(console, live=False, prefix=fire.job.name)
        summary = await launch.run_fire(fire, environ, [display])
        return summary.describe()

    async def main() -> None:
        scheduler = Scheduler(jobs, start_run=start_run, log=log)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, scheduler.stop)
        names = ", ".join(f"{j.name} ({len(j.triggers)} trigger(s))" for j in jobs)
        log(f"scheduling {names}")
        await scheduler.run()
        log("stopped")

    asyncio.run(main())


hosts_app = typer.Typer(
    name="hosts",
    help="Check SSH hosts and trust their keys.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(hosts_app)


def _inventory(file: Path | None, hosts: Path | None) -> Any:
    from . import spec

    if file is not None:
        return spec.load(file, hosts_file=hosts).runtime.hosts
    return spec.load_hosts_file(hosts) if hosts is not None else ()


@hosts_app.command("check")
def hosts_check(
    file: JobFile,
    hosts: HostsOption = None,
) -> None:
    """Probe every host of the job in parallel.

    Reachable, authenticated, remote shell, bwrap, free disk in the sandbox root and
    round-trip time.  Exit 4 if any is not usable.
    """
    import asyncio

    from rich.console import Console
    from rich.table import Table

    from . import hosts as inventory
    from .errors import EnvironmentProblem
    from .ssh import SshTransport

    def probe() -> Any:
        pool = _inventory(file, hosts)
        if not pool:
            raise EnvironmentProblem(f"{file} declares no SSH hosts; its units run on this machine")
        transport = SshTransport(pool, known_hosts=inventory.known_hosts_files(_environ()))
        return asyncio.run(transport.probe_all())

    probes = _call(probe)
    table = Table(
        "host", "address", "reachable", "auth", "shell", "bwrap", "free disk", "rtt", "problem"
    )
    for p in probes:
        table.add_row(
            p.name,
            p.address,
            "yes" if p.reachable else "NO",
            "yes" if p.auth else "NO",
            p.shell,
            "yes" if p.bwrap else "no",
            p.free_disk,
            f"{p.rtt_ms:.1f} ms" if p.rtt_ms is not None else "",
            p.error,
        )
    Console(width=200).print(table)
    raise typer.Exit(0 if all(p.auth and not p.error for p in probes) else 4)


@hosts_app.command("trust")
def hosts_trust(
    host: Annotated[str, typer.Argument(help="A host name from the inventory, or ADDRESS[:PORT].")],
    job: Annotated[
        Path | None, typer.Option("--job", help="Find HOST in this job's hosts.")
    ] = None,
    hosts: HostsOption = None,
    yes: Annotated[bool, typer.Option("--yes", help="Trust without asking.")] = False,
) -> None:
    """Show HOST's SSH host key fingerprint, and trust it once you confirm.

    The key is recorded in fanout's own known_hosts file (~/.config/fanout/known_hosts),
    never in yours.
    """
    import asyncio

    from . import hosts as inventory
    from .ssh import fetch_host_key

    environ = _environ()
    target = _call(lambda: inventory.find(_inventory(job, hosts), host))
    line, fingerprint, kind = _call(lambda: asyncio.run(fetch_host_key(target)))
    print(f"{target.name} ({target.address}{':' + str(target.port) if target.port else ''})")
    print(f"  {kind} key fingerprint {fingerprint}")
    if not yes and not typer.confirm("Trust this key?", default=False):
        print("not trusted", file=sys.stderr)
        raise typer.Exit(1)
    path = inventory.record(line, environ)
    print(f"trusted: recorded in {path}")


def main() -> None:
    app()
