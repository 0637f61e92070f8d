"""fanout view: a run's report.html, written or served."""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import Annotated, Any

import typer

from .app import StateDir, app


@app.command(rich_help_panel="Runs")
def view(
    run_id: Annotated[
        str | None,
        typer.Argument(metavar="[RUN]", help="The run to show (default: the latest)."),
    ] = None,
    state_dir: StateDir = Path(".fanout"),
    serve: Annotated[
        bool,
        typer.Option(
            "--serve",
            help="Serve the page on 127.0.0.1 and follow the run while it goes (Ctrl-C stops).",
        ),
    ] = False,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="With --serve: the port (0: any free).")
    ] = 0,
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the page in the default browser.")
    ] = False,
) -> None:
    """Write RUN's report.html (beside report.md) and print its path, or serve it.

    One self-contained page, offline: the summary, the units table (sort, filter,
    search), each unit's attempts (argv, prompt, environment names, log, diff,
    transcript), the timeline and the distributions.  A strict Content-Security-Policy
    lets it run its own script and reach nothing else.
    """
    from ..journal import Journal
    from ..view import data, transcript_reader, write

    journal_path = state_dir / "journal.sqlite"
    journal = Journal(journal_path, read_only=True)
    try:
        run = _run(journal, run_id)
        run_dir = state_dir / "runs" / run.id
        job = _job(run.job_file)
        if not serve:
            path = write(journal, run.id, run_dir, job=job)
            print(path)
            if open_browser:
                webbrowser.open(path.resolve().as_uri())
            return
    finally:
        journal.close()

    from ..view.serve import Server

    def load() -> dict[str, Any]:
        fresh = Journal(journal_path, read_only=True)
        try:
            return data.build(fresh, run.id, run_dir, job=job, transcript_of=transcript_reader())
        finally:
            fresh.close()

    server = Server(load, port)
    print(f"serving run {run.id} on {server.url} (Ctrl-C stops)", flush=True)
    if open_browser:
        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _run(journal: Any, run_id: str | None) -> Any:
    from ..errors import StateError

    if run_id is not None:
        return journal.run(run_id)
    latest = journal.runs(limit=1)
    if not latest:
        raise StateError(f"no runs yet in {journal.path}")
    return latest[0]


def _job(job_file: str) -> Any:
    """The run's job file, loaded to re-render each attempt's argv and prompt; None when
    it is gone or no longer loads (the page then shows what the journal kept)."""
    from .. import spec
    from ..errors import FanoutError

    try:
        return spec.load(Path(job_file))
    except (FanoutError, OSError):
        return None
