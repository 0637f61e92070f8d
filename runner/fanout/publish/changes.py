"""Which changed files are the run's: the files the journal says it applied
(``collect.apply``), as paths from the repository's top, told apart from changes
someone else made; and how they are split into commits.

Decision: a change in the work tree is the run's if the run applied that file, or if
it holds what the publish branch holds already (a change an earlier run published and
left in the work tree: publishing never touches the checkout).  Anything else is
someone's own work, and publishing it under a bot's commit would be wrong: it is
refused, by name, before the run (``fanout run`` exits 4) and after it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..attempt.staging import ChangeState
from ..journal import Journal

# How many foreign files a refusal names (the rest are counted).
NAMED = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class Applied:
    """A file the run applied, by the unit (and round) that wrote it last."""

    path: str
    unit: str
    round: int


def applied(journal: Journal, run_id: str, prefix: str) -> list[Applied]:
    """The files run ``run_id`` applied, from the repository's top (``prefix``: the
    workspace's directory under it, '' at the top), each once: by the last unit that
    wrote it, in the order of rounds, then units (the journal's order)."""
    last: dict[str, Applied] = {}
    for row in journal.changes(run_id):
        if row["state"] == ChangeState.APPLIED:
            path = f"{prefix}{row['path']}"
            last.pop(path, None)  # re-inserted: the order is the last writer's
            last[path] = Applied(path=path, unit=row["unit"], round=row["round"])
    return list(last.values())


def prefix_of(workspace: Path, top: Path) -> str:
    """The workspace's directory under the repository's top, as a path prefix."""
    inside = workspace.resolve().relative_to(top.resolve()).as_posix()
    return "" if inside == "." else f"{inside}/"


def by_unit(files: Sequence[Applied]) -> list[tuple[str, list[str]]]:
    """The files grouped by the unit that wrote them last, units in the order they
    first appear (rounds, then ids)."""
    groups: dict[str, list[str]] = {}
    for file in sorted(files, key=lambda f: (f.round, f.unit)):
        groups.setdefault(file.unit, []).append(file.path)
    return list(groups.items())


def foreign_text(foreign: Iterable[str]) -> str:
    """The files a refusal names: "a.txt, b/c.txt (and 3 more)"."""
    listed = sorted(foreign)
    named = ", ".join(listed[:NAMED])
    return named + (f" (and {len(listed) - NAMED} more)" if len(listed) > NAMED else "")
