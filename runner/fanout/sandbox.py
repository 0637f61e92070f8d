"""Local sandboxes: which tool isolates a worker, and the argv that wraps it.

A sandbox is one directory: the unit's staged files, the worker's cwd, and the
throttle control file (never collected).  Under bwrap the whole system is
read-only, /tmp is private, only the sandbox directory is writable, the network is cut
unless the job asks for it, the state directory and ~/.ssh are hidden, and every
process dies with fanout (``--die-with-parent`` and a private PID namespace).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import EnvironmentProblem

Kind = Literal["bwrap", "podman", "none"]
# Found once and started by its absolute path: a PATH search would run in the vfork
# child while fanout waits for it.
SETPRIV = shutil.which("setpriv")

# A worker must never outlive fanout: the resumed run would run its unit a second time
# beside it.  The parent-death signal (setpriv --pdeathsig, bwrap --die-with-parent)
# fires only if fanout dies after the signal was set; fanout SIGKILLed while a worker
# was being spawned would leave that worker running.  So the guard first sets the
# signal, then checks that its parent is still fanout, and only then execs the worker.
# It costs one exec of sh per step: about 0.4 ms of wall time per unit in bench/local.py.
_GUARD = (
    '[ "$PPID" = "$1" ] || exit 137; shift; command -v "$1" > /dev/null'
    ' || { echo "fanout: cannot start $1: command not found" >&2; exit 127; }; exec "$@"'
)
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class Choice:
    kind: Kind
    warning: str | None = None


def choose(requested: str, image: str | None = None) -> Choice:
    """The sandbox to use on this machine for ``runtime.sandbox = requested``."""
    if requested == "none":
        return Choice("none")
    if requested == "podman":
        if shutil.which("podman") is None:
            raise EnvironmentProblem("runtime.sandbox is 'podman' but podman is not installed")
        return Choice("podman")
    works = shutil.which("bwrap") is not None and _bwrap_works()
    if works:
        return Choice("bwrap")
    if requested == "bwrap":
        raise EnvironmentProblem(
            "runtime.sandbox is 'bwrap' but bubblewrap is not installed or cannot create "
            "namespaces here (apt-get install bubblewrap)"
        )
    return Choice(
        "none",
        "bubblewrap (bwrap) not found: units run in plain directories without isolation",
    )


def _bwrap_works() -> bool:
    try:
        probe = subprocess.run(
            ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def wrap(
    kind: Kind,
    argv: Sequence[str],
    *,
    sandbox: Path,
    network: bool,
    hidden: Sequence[Path] = (),
    image: str | None = None,
    env_names: Sequence[str] = (),
    tools: Sequence[Path] = (),
) -> list[str]:
    """The argv that runs ``argv`` inside the sandbox.  Environment values never appear
    here: they reach the worker through the wrapper's own environment.  ``tools`` are
    directories under the private /tmp that must stay visible (see ``tool_dirs``)."""
    if kind == "none":
        return _guarded(argv)
    if kind == "podman":
        command = ["podman", "run", "--rm", "-i", "--network", "host" if network else "none"]
        command += ["-v", f"{sandbox}:{sandbox}", "-w", str(sandbox)]
        for name in env_names:
            command += ["-e", name]  # a bare name: podman copies the value from its own env
        return [*command, str(image), *argv]
    command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    command += ["--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
    for path in hidden:
        if path.is_dir():
            command += ["--tmpfs", str(path)]
    for path in tools:
        command += ["--ro-bind-try", str(path), str(path)]
    command += ["--bind", str(sandbox), str(sandbox), "--chdir", str(sandbox)]
    command += ["--unshare-all", "--die-with-parent", "--new-session"]
    if network:
        command.append("--share-net")
    return _guarded([*command, "--", *argv])


def _guarded(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the guard.  setpriv sets the signal without a preexec_fn (which
    would force a slow fork instead of vfork for every worker); without setpriv,
    ``preexec`` does the same in Python."""
    if SETPRIV is None:
        return list(argv)
    return [
        SETPRIV,
        "--pdeathsig",
        "KILL",
        "--",
        "/bin/sh",
        "-c",
        _GUARD,
        "fanout",
        str(os.getpid()),
        *argv,
    ]


def preexec(kind: Kind) -> Callable[[], None] | None:
    """The preexec_fn that keeps a worker from outliving fanout where setpriv is missing."""
    if SETPRIV is not None or kind == "podman":
        return None
    coordinator = os.getpid()

    def die_with_fanout() -> None:  # pragma: no cover - runs in the child before exec
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != coordinator:
            os._exit(137)

    return die_with_fanout


_PRIVATE = (Path("/tmp"), Path("/var/tmp"))


def tool_dirs(path: str) -> list[Path]:
    """Directories of ``path`` (a PATH value) that a private /tmp would hide: a checkout
    and its virtualenv under /tmp must still run inside bwrap.  A ``.../bin`` entry
    brings its whole prefix (a virtualenv needs its ``lib``), read-only."""
    found: list[Path] = []
    for entry in path.split(":"):
        directory = Path(entry)
        if not directory.is_absolute() or not any(
            directory.is_relative_to(private) for private in _PRIVATE
        ):
            continue
        root = directory.parent if directory.name == "bin" else directory
        if root not in found and root not in _PRIVATE:
            found.append(root)
    return found
