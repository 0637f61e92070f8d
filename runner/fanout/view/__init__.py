"""report.html: a run you open in a browser (``write``), or follow as it goes
(``serve``).  ``data`` reads the run, ``page`` renders it under a strict CSP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..journal import Journal
from . import data, page
from .data import Transcripts, no_transcript

__all__ = ["AT_RUN_END", "Transcripts", "no_transcript", "transcript_reader", "write"]

# A run writes report.html at its end up to this many unit rows: 10,000 took 3.5-6 s
# and 100,000 15 s here (bench/view.py); past it, ``fanout view`` writes it on demand.
AT_RUN_END = 20_000


def transcript_reader() -> Transcripts:
    """The one place the agents' transcript parser plugs into the viewer: each agent
    attempt's log read as its CLI wrote it (``agents.transcript``)."""
    from ..agents import transcript

    def read(agent: str | None, output: bytes) -> list[dict[str, Any]]:
        if agent is None:
            return []
        return [turn.as_dict() for turn in transcript.parse(agent, output)]

    return read


def write(
    journal: Journal,
    run_id: str,
    run_dir: Path,
    *,
    job: Any = None,
    transcript_of: Transcripts | None = None,
) -> Path:
    """Write ``report.html`` into ``run_dir``; returns its path."""
    built = data.build(
        journal, run_id, run_dir, job=job, transcript_of=transcript_of or transcript_reader()
    )
    path = run_dir / "report.html"
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(page.render(built), encoding="utf-8")
    return path
