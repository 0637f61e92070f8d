"""fanout's spawner (``spawner.c``): one exec that gives a step of sandbox "none" on this
machine its PID namespace, where ``setpriv``, ``unshare`` and an init shell took three
(about 0.9 ms of CPU each, a third of a no-op unit's cost: docs/performance.md, "Local
sandboxes").  It makes the same checks as that chain, and a step behind it is held to
the same conformance suite.

It is C, compiled from the source beside this module by the machine's C compiler the
first time a run needs it, and kept in fanout's cache (``$XDG_CACHE_HOME/fanout/bin``,
else ``~/.cache/fanout/bin``) under a name made from a digest of the source, the
compiler's flags and the machine's architecture: a changed source is a new build, and
an old one is never run.  A machine without a C compiler, whose cache is not fanout's
user's alone, or where the spawner fails its probe (it must run ``true`` in a PID
namespace and exit 0) runs its steps behind the chain, as before: slower, the same
guarantees.  Why compiled here, not shipped: a binary in the repository could not be
reviewed, and one built at install time would need a build step in every way fanout
is installed (an editable install, a wheel, a clone on a Ray node).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from .tools import succeeds

SOURCE = Path(__file__).with_name("spawner.c")
# Static where the C library allows (no dynamic loader at each step: 1.3 against 1.7 ms
# of CPU a step here); the second set where it does not.
FLAGS = (("-O2", "-static"), ("-O2",))
_BUILD_SECONDS = 60.0


@functools.cache
def spawner() -> str | None:
    """The spawner's path, built on first use; None where steps run behind the chain
    (see the module docstring).  Kept for the process's lifetime."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not SOURCE.is_file():
        return None
    source = SOURCE.read_bytes()
    folder = _cache()
    if folder is None:
        return None
    for flags in FLAGS:
        digest = hashlib.sha256(
            b"\0".join([source, *(f.encode() for f in flags), platform.machine().encode()])
        ).hexdigest()[:16]
        target = folder / f"fanout-spawner-{digest}"
        if not _ours(target) and not _build(compiler, flags, target):
            continue
        if _ours(target) and _works(target):
            return str(target)
    return None


def _cache() -> Path | None:
    """fanout's folder of built helpers, made private if it is new; None if it is not
    this user's alone (another user could swap the spawner every step runs)."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    try:
        base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
        folder = base / "fanout" / "bin"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (OSError, RuntimeError):  # no home, a read-only home
        return None
    return folder if _private(folder) else None


def _private(path: Path) -> bool:
    """Owned by this user and writable by nobody else (``path`` itself, not a link)."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _ours(target: Path) -> bool:
    try:
        return _private(target) and stat.S_ISREG(target.lstat().st_mode)
    except OSError:
        return False


def _build(compiler: str, flags: tuple[str, ...], target: Path) -> bool:
    """Compile the spawner to ``target``: into a new file beside it, then renamed over
    it, so a run that starts meanwhile finds the old build or the new one, whole."""
    descriptor, scratch = tempfile.mkstemp(prefix=".build-", dir=target.parent)
    os.close(descriptor)
    try:
        done = subprocess.run(
            [compiler, *flags, "-o", scratch, str(SOURCE)],
            capture_output=True,
            timeout=_BUILD_SECONDS,
            check=False,
        )
        if done.returncode != 0:
            return False
        os.chmod(scratch, 0o700)
        os.replace(scratch, target)
        return True
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        with_scratch = Path(scratch)
        if with_scratch.exists():
            with_scratch.unlink()


def _works(target: Path) -> bool:
    """Whether the spawner runs ``true`` in a PID namespace here (a machine that allows
    none has its steps in a process group: ``tools.containment``)."""
    return succeeds([str(target), str(os.getpid()), "--", "true"])
