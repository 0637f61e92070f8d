"""Fakes of the transport's two levels: a scripted transport for dispatch logic, and
sandboxes that run steps as plain subprocesses for the conformance suite (the real
transports are tested with real processes)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fanout.attempt import collecting
from fanout.attempt.capture import OutputCapture
from fanout.attempt.collecting import Entry, Kind
from fanout.attempt.driver import execute
from fanout.attempt.model import LAYOUT, Attempt
from fanout.attempt.sandbox import Command, Sandbox, StagedFile
from fanout.isolation import removal
from fanout.isolation.place import Place
from fanout.outcome import AttemptResult, Status

from procs import group_running

Script = Callable[[Attempt], AttemptResult]


def ok(attempt: Attempt) -> AttemptResult:
    return AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0, duration=1.0)


@dataclass
class FakeTransport:
    """Runs every attempt through ``script`` after ``delay`` seconds (virtual under
    looptime), recording what it was asked to run and the peak concurrency."""

    script: Script = ok
    slots: int = 1000
    delay: float = 1.0
    attempts: list[Attempt] = field(default_factory=list)
    running: int = 0
    peak: int = 0
    started: bool = False
    closed: bool = False
    # Seconds ``close`` takes (virtual under looptime): a host that stopped answering.
    close_delay: float = 0.0

    @property
    def capacity(self) -> int:
        return self.slots

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        if self.close_delay:
            await asyncio.sleep(self.close_delay)
        self.closed = True

    async def run(self, attempt: Attempt) -> AttemptResult:
        self.attempts.append(attempt)
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(self.delay)
            return self.script(attempt)
        finally:
            self.running -= 1


class FakeSandboxes:
    """Sandboxes as the simplest honest executor, for the conformance suite: a temp
    directory per sandbox laid out as ``LAYOUT`` under ``root``, each step a plain
    asyncio subprocess in a new session whose process group is killed when the step
    ends or is cancelled.  No namespace: its containment is the process group only, so
    a process that calls setsid escapes it (the suite skips that behaviour here)."""

    def __init__(self, *, root: Path, slots: int = 4, path: str = os.defpath) -> None:
        self.root = root
        self.path = path
        self._slots = slots
        self._free = asyncio.Semaphore(slots)

    @property
    def capacity(self) -> int:
        return self._slots

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def run(self, attempt: Attempt) -> AttemptResult:
        return await execute(attempt, self)

    @contextlib.asynccontextmanager
    async def sandbox(self, attempt: Attempt) -> AsyncIterator[Sandbox]:
        async with self._free:
            base = Path(tempfile.mkdtemp(prefix="fake-", dir=self.root))
            try:
                for name in LAYOUT.directories:
                    (base / name).mkdir()
                place = Place(host="fake", kind="none", base=str(base), path=self.path)
                yield _FakeSandbox(place, base)
            finally:
                removal.remove(base, deadline=time.monotonic() + removal.PATIENCE)


class _FakeSandbox:
    def __init__(self, place: Place, base: Path) -> None:
        self.place = place
        self._base = base
        self._work = base / LAYOUT.work

    async def stage(self, files: Sequence[StagedFile]) -> None:
        for item in files:
            target = self._work / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(item.source, target)  # copies the permission bits too

    async def run(self, command: Command, capture: OutputCapture, *, backstop: float) -> int:
        # Output goes to an unnamed file, not a pipe: a step ends when its process
        # exits, never held open by something that kept its output.
        with tempfile.TemporaryFile(dir=self._base.parent) as output:
            try:
                process = await asyncio.create_subprocess_exec(
                    *command.argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=output,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=command.cwd,
                    env=dict(command.env),
                    start_new_session=True,
                )
            except FileNotFoundError:
                # What a POSIX shell says and returns (and fanout's local guard).
                message = f"fanout: cannot start {command.argv[0]}: command not found\n"
                capture.feed(message.encode())
                return 127
            except OSError as exc:
                message = f"fanout: cannot start {command.argv[0]}: {exc.strerror}\n"
                capture.feed(message.encode())
                return 126
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(_feed(process, command.stdin))
                    code = await process.wait()
                # A step killed by a signal exits 128 + its number, as a shell reports it.
                return code if code >= 0 else 128 - code
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
                await _gone(process.pid)
                output.seek(0)
                while chunk := output.read(65536):
                    capture.feed(chunk)

    async def read(self, name: str) -> bytes | None:
        try:
            descriptor = os.open(self._base / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(descriptor, "rb") as stream:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return None
            return stream.read(LAYOUT.control_limit)

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        found: list[Entry] = []
        # (name, path) still to look at: a stack, since the worker chose the depth.
        todo: list[tuple[str, Path]] = []

        def below(directory: Path, prefix: str) -> None:
            for entry in sorted(os.scandir(directory), key=lambda e: e.name, reverse=True):
                todo.append((prefix + entry.name, Path(entry.path)))

        if "." in roots:
            below(self._work, "")
        else:
            todo.extend((root, self._work / root) for root in reversed(roots))
        while todo:
            name, path = todo.pop()
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            kind = Kind.of_mode(mode)
            found.append(Entry(name, kind))
            if kind is Kind.DIR:
                below(path, name + "/")
        return found

    async def fetch(self, names: Sequence[str], destination: Path) -> None:
        for name in names:
            target = collecting.target(destination, name)
            descriptor = os.open(self._work / name, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(descriptor, "rb") as source, target.open("wb") as copy:
                shutil.copyfileobj(source, copy)


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    """The prompt on the step's stdin, then EOF; a step that exits unread is fine."""
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        process.stdin.write(data)
        await process.stdin.drain()
        process.stdin.close()
        await process.stdin.wait_closed()


async def _gone(group: int, bound: float = 5.0) -> None:
    """Until no process of the group is left running (``procs.group_running``: a
    zombie has ended): a SIGKILLed process dies when it is next
    scheduled, which on a loaded machine is after ``killpg`` returned (the conformance
    suite checks that nothing is left when ``run`` returns; a real transport's PID
    namespace waits for its init).  Bounded: a process that will not die shows in the
    test, not as a hang."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + bound
    while loop.time() < ends:
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        if not group_running(group):
            return
        await asyncio.sleep(0.005)
