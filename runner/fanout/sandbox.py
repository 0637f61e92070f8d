"""Local sandboxes: which tool isolates a worker, and the argv that wraps it.

A sandbox is one directory: the unit's staged files, the worker's cwd, and the
throttle control file (never collected).  Under bwrap the whole system is
read-only, /tmp is private, only the sandbox directory is writable, the network is cut
unless the job asks for it, the state directory and ~/.ssh are hidden, and every
process dies with fanout (``--die-with-parent`` and a private PID namespace).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import EnvironmentProblem

Kind = Literal["bwrap", "podman", "none"]
SETPRIV = shutil.which("setpriv") is not None


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
        # setpriv makes the worker die with fanout even if fanout is SIGKILLed, without a
        # preexec_fn (which would force a slow fork instead of vfork for every worker).
        return ["setpriv", "--pdeathsig", "KILL", "--", *argv] if SETPRIV else list(argv)
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
    return [*command, "--", *argv]


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
