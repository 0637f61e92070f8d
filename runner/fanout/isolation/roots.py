"""Where this machine's sandboxes go (``runtime.sandboxRoot``).

A no-op unit's sandbox is a handful of mkdirs and rmdirs.  On an ext4 disk a
mkdir/rmdir pair costs about 2 ms (the journal commits each), on a tmpfs 0.02 ms: for
1,000 no-op units the disk made the whole run 1.2-1.4x slower (docs/performance.md,
"Local sandboxes").  So ``auto`` puts sandboxes on a tmpfs when the machine has one
with room, in this order:

1. ``$TMPDIR`` when it is set: whoever set it chose where temporary files go (a disk
   with room for big worker files, or a private folder a test looks in);
2. ``$XDG_RUNTIME_DIR``, then ``/dev/shm``, the first that is a tmpfs this user can
   write with ``ROOM_BASE`` plus ``ROOM_PER_SLOT`` for each concurrent task free;
3. else the temporary directory (``/tmp``).

A tmpfs is memory: what workers write there (their files, and everything under
``$TMPDIR``, which is the sandbox) uses RAM until the sandbox is removed.  A job whose
workers write gigabytes sets ``sandboxRoot`` to a folder on a disk.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import EnvironmentProblem

# Free space a tmpfs needs to be chosen: a base, and a share per concurrent task
# (a task's files plus its TMPDIR).  4 tasks need 1.25 GiB; 32 need 3 GiB.
ROOM_BASE = 1 << 30
ROOM_PER_SLOT = 64 << 20
MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True, slots=True)
class Root:
    """The folder sandboxes are made in, and whether it is memory-backed (whose
    mkdirs are too quick to be worth a thread: ``LocalTransport.sandbox``)."""

    path: Path
    memory: bool
    why: str  # for --verbose and the docs: how it was chosen


def choose(
    requested: str,
    slots: int,
    environ: Mapping[str, str],
    *,
    mountinfo: Path = MOUNTINFO,
    free: Callable[[Path], int] | None = None,
) -> Root:
    """The sandbox root for ``runtime.sandboxRoot = requested`` ("auto" or a path)."""
    room = free or _free
    types = _filesystems(mountinfo)
    if requested != "auto":
        path = Path(requested)
        if not path.is_absolute():
            raise EnvironmentProblem(f"runtime.sandboxRoot {requested!r} must be an absolute path")
        if not _writable(path):
            raise EnvironmentProblem(
                f"runtime.sandboxRoot {requested} is not a folder this user can write:"
                " create it, or leave sandboxRoot out to let fanout choose"
            )
        return Root(path, _type(types, path) == "tmpfs", "runtime.sandboxRoot")
    if environ.get("TMPDIR"):
        path = Path(environ["TMPDIR"])
        if _writable(path):
            return Root(path, _type(types, path) == "tmpfs", "TMPDIR is set")
    need = ROOM_BASE + ROOM_PER_SLOT * slots
    for path in _memory_folders(environ):
        if _type(types, path) != "tmpfs" or not _writable(path):
            continue
        free_bytes = room(path)
        if free_bytes >= need:
            return Root(path, True, f"a tmpfs with {free_bytes >> 20} MiB free")
    path = Path(tempfile.gettempdir())
    return Root(path, _type(types, path) == "tmpfs", "no tmpfs with room")


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def _free(path: Path) -> int:
    try:
        status = os.statvfs(path)
    except OSError:
        return 0
    return status.f_bavail * status.f_frsize


def _filesystems(mountinfo: Path) -> dict[str, str]:
    """Mount point to filesystem type, from ``/proc/self/mountinfo`` (the last mount on
    a point wins, as the kernel shows it); empty where there is none to read."""
    found: dict[str, str] = {}
    try:
        lines = mountinfo.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        kind = rest.split(" ", 1)[0]
        if len(parts) >= 5 and kind:
            # Octal escapes (\040 for a space) in the mount point, as the kernel writes them.
            point = parts[4].encode().decode("unicode_escape", errors="replace")
            found[point] = kind
    return found


def _type(types: Mapping[str, str], path: Path) -> str:
    """The type of the filesystem ``path`` lies on: its longest mount-point prefix."""
    try:
        resolved = os.path.realpath(path)
    except OSError:
        return ""
    while True:
        if resolved in types:
            return types[resolved]
        parent = os.path.dirname(resolved)
        if parent == resolved:
            return ""
        resolved = parent


def candidates(chosen: Path, environ: Mapping[str, str]) -> list[Path]:
    """``chosen`` and every other folder ``auto`` may choose here, that exists: where a
    run that was killed may have left its sandboxes."""
    found = [chosen, Path(tempfile.gettempdir()), *_memory_folders(environ)]
    if environ.get("TMPDIR"):
        found.append(Path(environ["TMPDIR"]))
    return [path for path in dict.fromkeys(found) if path.is_dir()]


def _memory_folders(environ: Mapping[str, str]) -> list[Path]:
    """The tmpfs folders ``auto`` looks at, in its order: ``$XDG_RUNTIME_DIR`` (if set),
    then ``/dev/shm``."""
    runtime = environ.get("XDG_RUNTIME_DIR")
    return [*([Path(runtime)] if runtime else []), Path("/dev/shm")]
