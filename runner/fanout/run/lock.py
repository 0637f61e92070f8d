"""One run per job at a time: a file lock in the state directory.

``fanout run`` by hand, system cron calling ``fanout run``, and ``fanout schedule`` all
take the same lock (``<stateDir>/locks/<job>.lock``, an ``flock`` that the kernel
releases if the holder dies, even by SIGKILL), so two runs of a job never overlap.  The
overlap policy decides what the loser does: ``skip`` gives up (JobLocked, exit 6),
``queue`` waits for the lock, ``replace`` asks the holder to stop (SIGTERM: it drains
and stays resumable) and then takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..errors import JobLocked, StateError
from ..isolation import hidden
from ..spec.model import Overlap

_POLL = 0.2
REPLACE_PATIENCE = 120.0


class JobLock:
    def __init__(self, state_dir: Path, job: str) -> None:
        self.path = state_dir / "locks" / f"{job}.lock"
        self.job = job
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self, **info: Any) -> bool:
        """Take the lock if it is free; record who holds it (for the loser's message)."""
        try:
            # Every run takes this lock first, so this is where a state directory is born
            # (the scheduler's fire log is the other place, before any run).
            hidden.make_state_dir(self.path.parent.parent)
            self.path.parent.mkdir(exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StateError(
                f"cannot open the job lock {self.path}: {exc.strerror or exc}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        record = json.dumps({"pid": os.getpid(), "since": time.time(), **info}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        self._fd = fd
        return True

    def holder(self) -> dict[str, Any]:
        """What the current holder recorded (empty if unknown)."""
        try:
            data = json.loads(self.path.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def describe_holder(self) -> str:
        holder = self.holder()
        parts = []
        if "pid" in holder:
            parts.append(f"pid {holder['pid']}")
        if holder.get("by"):
            parts.append(f"started by {holder['by']}")
        if "since" in holder:
            parts.append(time.strftime("since %Y-%m-%d %H:%M:%S", time.localtime(holder["since"])))
        return ", ".join(parts) or "holder unknown"

    async def acquire(self, overlap: Overlap, **info: Any) -> None:
        """Take the lock as ``overlap`` says; JobLocked if ``skip`` finds it taken."""
        if self.try_acquire(**info):
            return
        if overlap == "skip":
            raise JobLocked(
                f"job {self.job!r} is already running ({self.describe_holder()}); "
                "this run was skipped (overlap = skip)"
            )
        if overlap == "replace":
            pid = self.holder().get("pid")
            if isinstance(pid, int) and pid != os.getpid():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + REPLACE_PATIENCE
        while not self.try_acquire(**info):
            if overlap == "replace" and time.monotonic() > deadline:
                raise JobLocked(
                    f"job {self.job!r}: the running run ({self.describe_holder()}) did not "
                    f"stop within {REPLACE_PATIENCE:g}s of SIGTERM"
                )
            await asyncio.sleep(_POLL)
