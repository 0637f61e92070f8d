"""Each unit's page in report.html: per attempt its argv, prompt and environment
variable names, exit status, classified kind, reason, the end of its log (redacted on
disk as it was written), its verify command, the transcript an agent's log holds, and
the diff of the files the unit collected against the workspace.

What is not stored is re-rendered: the journal keeps no argv or prompt, so they come
from the job file as it is now (``invocation.render`` with the attempt's rung and
number; an attempt after the first sees the unit's last context, as the journal kept
it), and each attempt says ``rendered: "job file"`` or, without one, nothing.

Bounded: ``LOG_TAIL`` bytes of each log, ``DIFF_CHARS`` of each unit's diff, and
``BUDGET`` characters of detail for the whole page; units past it (the succeeded ones
come last) carry none, and the page says where their logs are."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..attempt import staging
from ..attempt.invocation import NO_LAST_ATTEMPT, render
from ..journal import Journal
from ..spec.templates import RenderError

LOG_TAIL = 8 * 1024
DIFF_CHARS = 16 * 1024
# A collected file larger than this is not diffed (its +/- counts are still shown).
DIFF_FILE = 256 * 1024
BUDGET = 8_000_000
# Environment names every attempt has besides the job's (``Attempt.environment``).
BASE_ENV = (
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "FANOUT_RUN_ID",
    "FANOUT_UNIT_ID",
    "FANOUT_ROUND",
    "FANOUT_ATTEMPT",
    "FANOUT_RUNG",
    "FANOUT_CONTROL",
)

Transcripts = Callable[[str | None, bytes], list[dict[str, Any]]]


def details(
    journal: Journal,
    run_id: str,
    run_dir: Path,
    order: Iterable[tuple[int, str, str]],
    *,
    job: Any,
    transcript_of: Transcripts,
    budget: int = BUDGET,
) -> dict[str, Any]:
    """Unit id -> its detail, for the units of ``order`` ((round, id, state), most
    wanted first) until ``budget`` characters of JSON are spent."""
    found: dict[str, Any] = {}
    spent = 0
    for number, unit_id, _state in order:
        one = unit_detail(journal, run_id, run_dir, number, unit_id, job, transcript_of)
        size = len(json.dumps(one, ensure_ascii=False))
        if spent + size > budget:
            break
        spent += size
        found[unit_id] = one
    return found


def unit_detail(
    journal: Journal,
    run_id: str,
    run_dir: Path,
    number: int,
    unit_id: str,
    job: Any,
    transcript_of: Transcripts,
) -> dict[str, Any]:
    row = journal.unit_page_row(run_id, number, unit_id)
    folder = staging.unit_folder_name(unit_id)
    attempts = []
    for a in journal.unit_attempts(run_id, number, unit_id):
        log_path = run_dir / "logs" / folder / f"r{number}-a{a['n']}.log"
        output = _tail(log_path)
        agent = None if job is None else job.task.agent
        attempts.append(
            {
                "n": a["n"],
                "round": number,
                "rung": a["rung"],
                "host": a["host"] or "local",
                "start": a["started"],
                "end": a["finished"],
                "status": a["status"] or "running",
                "exit": a["exit_code"],
                "kind": a["kind"],
                "reason": a["reason"],
                "log": output.decode("utf-8", "replace"),
                "logPath": str(Path("logs") / folder / log_path.name),
                **_invocation(job, row, unit_id, a["rung"], a["n"], number),
                "transcript": transcript_of(agent, output),
            }
        )
    return {
        "round": number,
        "reason": "" if row is None else row["reason"],
        "attempts": attempts,
        "diff": _diff(
            journal,
            run_id,
            run_dir,
            number,
            unit_id,
            folder,
            job,
            [] if row is None else [c["path"] for c in json.loads(row["collected"])],
        ),
    }


def _tail(path: Path) -> bytes:
    try:
        with path.open("rb") as stream:
            size = stream.seek(0, 2)
            stream.seek(max(0, size - LOG_TAIL))
            return stream.read()
    except OSError:
        return b""


def _invocation(job: Any, row: Any, unit_id: str, rung: str, n: int, number: int) -> dict[str, Any]:
    """argv, verify, prompt and env names re-rendered from the job file, or empty."""
    empty = {"argv": [], "verify": [], "prompt": "", "env": [], "rendered": ""}
    if job is None or row is None:
        return empty
    from ..backlog.units import Unit

    names = [r.name for r in job.retry.ladder]
    if rung not in names:
        return empty
    data = json.loads(row["data"])
    unit = Unit(
        id=unit_id,
        index=row["idx"],
        items=tuple(data.get("items", ())),
        origin=data.get("origin", ""),
        group=data.get("group"),
    )
    last = json.loads(row["last"]) if n > 1 else NO_LAST_ATTEMPT
    try:
        task = render(
            job, unit, rung_index=names.index(rung), attempt=n, round_number=number, last=last
        )
    except (RenderError, KeyError, TypeError, ValueError) as exc:
        return {**empty, "rendered": f"not rendered: {exc}"}
    gateway = [name for api in job.apis for name in (api.base_url_env, api.token_env)]
    env = sorted({*BASE_ENV, *task.env, *task.secrets, *gateway})
    return {
        "argv": list(task.argv),
        "verify": list(task.verify),
        "prompt": task.prompt,
        "env": env,
        "rendered": "job file",
    }


def _diff(
    journal: Journal,
    run_id: str,
    run_dir: Path,
    number: int,
    unit_id: str,
    folder: str,
    job: Any,
    collected: list[str],
) -> dict[str, Any]:
    """The unit's changed files (+/- counts from the journal) and, where the collected
    copy and the workspace file are both small text, a unified diff, bounded."""
    files = [
        {"path": c["path"], "added": c["added"], "removed": c["removed"], "state": c["state"]}
        for c in journal.changes(run_id, [(number, unit_id)])
    ]
    # A run that does not apply records no changes: its collected files are the diff.
    known = {f["path"] for f in files}
    files += [
        {"path": path, "added": None, "removed": None, "state": "collected"}
        for path in collected
        if path not in known
    ]
    chunks: list[str] = []
    used = 0
    workspace = None if job is None else Path(job.runtime.workspace)
    for change in files:
        if used >= DIFF_CHARS:
            break
        new = _text(run_dir / "units" / folder / change["path"], run_dir / "units" / folder)
        if new is None:
            continue
        old = _text(workspace / change["path"], workspace) if workspace is not None else None
        lines = difflib.unified_diff(
            (old or "").splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"workspace/{change['path']}",
            tofile=f"collected/{change['path']}",
        )
        text = "".join(lines)[: DIFF_CHARS - used]
        used += len(text)
        chunks.append(text)
    return {"files": files, "text": "".join(chunks), "cut": used >= DIFF_CHARS}


def _text(path: Path, root: Path) -> str | None:
    """The file's text for the diff, None where it is not a small UTF-8 regular file
    under ``root``: a symlink in the workspace (or the collected copy) could point at
    a file the run never touched, and the page is meant to be pasted."""
    try:
        if path.is_symlink() or not path.resolve().is_relative_to(root.resolve()):
            return None
        if not path.is_file() or path.stat().st_size > DIFF_FILE:
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
