"""The workspace side of an attempt's files: what a unit stages, and applying what it
collected back to the workspace (which files are collected is ``collecting``'s).

Every stage path a template renders is checked here: relative, without ``..``, never
through a symlink that leads outside the workspace.  A collected file lands in the
run's unit folder and can only be written back to a workspace file that has not changed
since it was staged; anything else is reported as a conflict, never overwritten.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ..isolation import hidden
from ..outcome import CollectedFile
from ..values import globs
from .collecting import PathRefused
from .sandbox import StagedFile

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def unit_folder_name(unit_id: str) -> str:
    """A readable, collision-free folder name for a unit id (ids may contain '/')."""
    digest = hashlib.sha256(unit_id.encode()).hexdigest()[:8]
    readable = _UNSAFE.sub("_", unit_id).strip("._")[:80] or "unit"
    return f"{readable}-{digest}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 16), b""):
            digest.update(block)
    return digest.hexdigest()


def inside(path: Path, root: Path) -> bool:
    """Whether ``path`` is ``root`` or below it (both already resolved)."""
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def _regular_files(root: Path, top: Path, *, skip_state: bool = False) -> Iterator[Path]:
    """Regular files under ``top`` (a directory or file inside ``root``), no symlinks;
    with ``skip_state``, nothing inside a fanout state directory."""
    if top.is_symlink():
        return
    if top.is_file():
        yield top
        return

    def descend(path: Path) -> bool:
        return not (skip_state and hidden.is_state_dir(path))

    for entry in globs.walk(top, descend):
        if entry.is_file(follow_symlinks=False):
            yield Path(entry.path)


def select_files(root: Path, patterns: Iterable[str], *, skip_state: bool = False) -> list[str]:
    """Relative POSIX paths of regular files under ``root`` that ``patterns`` name.

    A pattern is a path (a file, or a directory taken whole) or a glob.  Raises
    PathRefused for absolute paths, ``..``, and paths through symlinks.  With
    ``skip_state``, files inside fanout state directories are never selected.
    """
    root = root.resolve()
    chosen: dict[str, None] = {}
    for pattern in patterns:
        try:
            matcher = globs.compile_glob(pattern)
        except ValueError as exc:
            raise PathRefused(str(exc)) from None
        if globs.is_glob(pattern):
            for path in _regular_files(root, root, skip_state=skip_state):
                relative = path.relative_to(root).as_posix()
                if matcher.match(relative):
                    chosen[relative] = None
            continue
        target = root / pattern
        if not inside(target.resolve(), root):
            raise PathRefused(f"{pattern!r} leads outside its folder through a symlink")
        for path in _regular_files(root, target, skip_state=skip_state):
            chosen[path.relative_to(root).as_posix()] = None
    return list(chosen)


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # longer than a path can be, with the workspace's in front
        return False


def stage(workspace: Path, patterns: Iterable[str]) -> tuple[StagedFile, ...]:
    """The workspace files a unit stages.  A named path that does not exist is an error.

    A worker never gets fanout's state (journals, logs, other units' files and output):
    what ``.``, a directory or a glob select skips every state directory, and a path
    named inside one is refused."""
    staged = []
    for pattern in patterns:
        try:  # the glob's rules first: a name longer than a file name can be, say
            globs.compile_glob(pattern)
        except ValueError as exc:
            raise PathRefused(f"stage: {exc}") from None
        if not globs.is_glob(pattern) and not _exists(workspace / pattern):
            raise PathRefused(f"stage: {pattern!r} does not exist in the workspace")
        try:
            names = select_files(workspace, [pattern], skip_state=True)
        except PathRefused as exc:
            raise PathRefused(f"stage: {exc}") from None
        state = None if globs.is_glob(pattern) else hidden.state_dir_on_the_way(workspace, pattern)
        if state is not None:
            where = "is" if state == Path(pattern).as_posix() else f"is inside {state!r},"
            raise PathRefused(
                f"stage: {pattern!r} {where} a fanout state directory; "
                "workers never see fanout's state"
            )
        staged += [StagedFile(path=name, source=workspace / name) for name in names]
    unique = {item.path: item for item in staged}
    return tuple(unique.values())


class ChangeState(StrEnum):
    """What applying a collected file does to the workspace (as the report words it)."""

    UNCHANGED = "unchanged"  # the workspace already holds these bytes
    CHANGED = "changed"  # would overwrite the staged version (without --apply)
    NEW = "new"  # would create the file (without --apply)
    CONFLICT = "conflict"  # the workspace file changed since it was staged: never touched
    APPLIED = "applied"  # written back


@dataclass(frozen=True, kw_only=True, slots=True)
class Change:
    """A collected file compared with the workspace: what applying it would do."""

    unit_id: str
    path: str
    added: int
    removed: int
    state: ChangeState


def staged_hashes(staged: Iterable[StagedFile]) -> dict[str, str]:
    return {item.path: sha256_file(item.source) for item in staged if item.source.is_file()}


def diffstat(old: Path | None, new: Path) -> tuple[int, int]:
    """Lines added and removed going from ``old`` (None: absent) to ``new``."""

    def lines(path: Path | None) -> list[str]:
        if path is None or not path.exists():
            return []
        return path.read_text(encoding="utf-8", errors="replace").splitlines()

    added = removed = 0
    for line in difflib.unified_diff(lines(old), lines(new), lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def apply(
    workspace: Path,
    unit_id: str,
    unit_dir: Path,
    collected: Iterable[CollectedFile],
    staged: dict[str, str],
    *,
    write: bool,
) -> list[Change]:
    """Compare (and with ``write``, apply) a unit's collected files to the workspace.

    A file is written back only if the workspace copy still has the hash it had when it
    was staged (or did not exist and was not staged); otherwise it is a conflict.
    """
    changes = []
    for item in collected:
        source = unit_dir / item.path
        target = workspace / item.path
        if not inside(target.resolve(), workspace.resolve()):
            changes.append(
                Change(
                    unit_id=unit_id, path=item.path, added=0, removed=0, state=ChangeState.CONFLICT
                )
            )
            continue
        current = sha256_file(target) if target.is_file() else None
        if current == item.sha256:
            changes.append(
                Change(
                    unit_id=unit_id, path=item.path, added=0, removed=0, state=ChangeState.UNCHANGED
                )
            )
            continue
        added, removed = diffstat(target if current else None, source)
        if current != staged.get(item.path):
            changes.append(
                Change(
                    unit_id=unit_id,
                    path=item.path,
                    added=added,
                    removed=removed,
                    state=ChangeState.CONFLICT,
                )
            )
            continue
        if write:
            make_folders(target.parent)
            temporary = target.with_name(f".{target.name}.fanout-tmp")
            shutil.copyfile(source, temporary)
            if target.exists():
                shutil.copymode(target, temporary)
            os.replace(temporary, target)
        if write:
            state = ChangeState.APPLIED
        else:
            state = ChangeState.NEW if current is None else ChangeState.CHANGED
        changes.append(
            Change(unit_id=unit_id, path=item.path, added=added, removed=removed, state=state)
        )
    return changes


def make_folders(path: Path) -> None:
    """``path`` and the folders it lies in, made where missing, without recursion
    (``Path.mkdir(parents=True)`` recurses, and a unit's collected files set the depth
    of what is applied, and so of what is staged next)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(exist_ok=True)
