"""The search for a step's escapees on this machine: processes that left its process
group (setsid) yet hold its output, work in its sandbox or carry its ``FANOUT_CONTROL``,
found in /proc and killed; and whether a coordinator that left a sandbox is alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence


def kill(directories: Sequence[str], *, pipe: str | None) -> int:
    """SIGKILL every other process that holds ``pipe`` open, has its cwd in one of
    ``directories`` (sandboxes) or inherited a ``FANOUT_CONTROL`` that points into one;
    how many it signalled (an exited one, a zombie, is no longer found).  A daemon that
    closed its output and changed directory still has its environment."""
    me = os.getpid()
    inside = tuple(directory.rstrip("/") + "/" for directory in directories)
    controls = tuple(b"FANOUT_CONTROL=" + os.fsencode(prefix) for prefix in inside)
    signalled = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        if _works_in(entry.path, inside, controls) or (pipe and _holds(entry.path, pipe)):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                signalled += 1
    return signalled


def kill_until_gone(directories: Sequence[str], pipe: str | None, deadline: float) -> None:
    """``kill`` until a search finds nothing, or until ``deadline`` (``time.monotonic``):
    a killed process is found again until it has exited."""
    while kill(directories, pipe=pipe) and time.monotonic() < deadline:
        time.sleep(0.01)


def _works_in(process_dir: str, inside: tuple[str, ...], controls: tuple[bytes, ...]) -> bool:
    try:
        cwd = os.readlink(f"{process_dir}/cwd") + "/"
        if cwd.startswith(inside):
            return True
        with open(f"{process_dir}/environ", "rb") as stream:
            environ = stream.read()
    except OSError:  # gone, a kernel thread, or another user's
        return False
    return any(entry.startswith(controls) for entry in environ.split(b"\0"))


def _holds(process_dir: str, pipe: str) -> bool:
    try:
        with os.scandir(f"{process_dir}/fd") as fds:
            for fd in fds:
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) == pipe:
                        return True
    except OSError:  # gone, or another user's
        pass
    return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
