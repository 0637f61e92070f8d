"""Commands about cron triggers: triggers, schedule."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from .app import HostsOption, JobFile, app, sealed_environ


@app.command(rich_help_panel="Schedules")
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
    from .. import plan as planning
    from .. import spec
    from ..errors import FanoutError

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

    print(fires(), end="")


@app.command(rich_help_panel="Schedules")
def schedule(
    files: Annotated[
        list[Path],
        typer.Argument(
            metavar="FILE", help="Job files whose triggers to fire.", show_default=False
        ),
    ],
    hosts: HostsOption = None,
) -> None:
    """Fire the cron triggers of the given jobs until stopped (systemd, containers).

    A foreground process that logs to stdout.  SIGTERM or Ctrl-C stop firing and
    interrupt the runs in progress, which stay resumable.  The last fire of each trigger
    is kept in the state directory, so a restart neither fires twice nor forgets a
    missed fire (each trigger's catchUp decides).  A run that parks on an agent's usage
    window is continued just after the reset time the agent named, not at the next fire.
    """
    import asyncio
    import signal

    from rich.console import Console

    from .. import spec
    from ..progress import Display
    from ..run import launch
    from ..schedule.scheduler import Fire, Scheduler

    jobs = [spec.load(f, hosts_file=hosts) for f in files]
    # Read once, for every fire: the keys and secrets leave the process's environment.
    coordinator_env = sealed_environ(jobs)
    console = Console(highlight=False, soft_wrap=True)

    def log(message: str) -> None:
        console.print(
            f"{datetime.now(UTC).isoformat(timespec='seconds')} {message}", highlight=False
        )

    async def start_run(fire: Fire) -> str:
        display = Display(console, live=False, prefix=fire.job.name)
        summary = await launch.run_fire(fire, coordinator_env, [display])
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
