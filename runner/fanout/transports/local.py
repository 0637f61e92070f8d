"""Sandboxes on this machine: a transport that only moves bytes (``attempt`` decides
what an attempt runs, in what order and until when).

Each sandbox is a fresh directory under the sandbox root, laid out as
``attempt.LAYOUT``; each step runs as a child of fanout in its own process group (and
PID namespace: see ``sandbox``), and the directory is removed when the sandbox's block
ends, on success, failure, timeout and cancellation alike.

A sandbox's tree is the worker's to shape: it is removed by ``removal`` (any depth,
permissions and root's immutable flags undone, bounded by ``removal.PATIENCE``) off
the event loop, and one that cannot be removed is set aside under a name no run looks
at again, said once, so that it never stands in another run's way.

A step ends when its main process exits, not when its output pipe closes (a daemon may
hold the pipe forever): then its process group is killed, which takes its PID
namespace down with it, and its output is drained for a bounded time.  Where this
machine gives no PID namespace, fanout also looks for the step's escapees (processes
holding its output, working in its sandbox or carrying its ``FANOUT_CONTROL``) and kills
them; the next run does the same for sandboxes a killed coordinator left behind.  (The
step as a child is ``steps``; the search for escapees, ``escapees``.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from ..attempt import collecting, staging
from ..attempt.capture import OutputCapture
from ..attempt.collecting import Entry, Kind
from ..attempt.model import LAYOUT, Attempt
from ..attempt.sandbox import Command, Sandbox, StagedFile
from ..errors import EnvironmentProblem
from ..isolation import escapees, removal, roots, spawner
from ..isolation import tools as sandbox
from ..isolation.exposure import network_refusal
from ..isolation.place import Place
from . import steps

if TYPE_CHECKING:
    from ..outcome import AttemptResult

# A sandbox that cannot be removed is renamed with this prefix (fanout-<pid>-* becomes
# fanout-unremovable-<pid>-*), which no sweep takes for a run's.
_ASIDE = "fanout-unremovable-"


class LocalTransport:
    """Attempts on this machine, ``slots`` at once."""

    def __init__(
        self,
        *,
        slots: int,
        sandbox_kind: str = "auto",
        image: str | None = None,
        root: Path | None = None,
        sandbox_root: str = "auto",
        environ: Mapping[str, str] | None = None,
        path: str = os.defpath,
        hidden: Sequence[Path] = (),
        warn: Callable[[str], None] = lambda message: None,
        gateway_port: int | None = None,
        network: bool | Literal["apis"] = False,
        gateway_socket: Path | None = None,
    ) -> None:
        self._slots = slots
        self._requested = sandbox_kind
        self._image = image
        # ``root`` (a test's, a Ray node's) or else runtime.sandboxRoot, chosen at start.
        self._requested_root = str(root) if root is not None else sandbox_root
        self._environ = os.environ if environ is None else environ
        self.root = root or Path(tempfile.gettempdir())
        # On a tmpfs a sandbox's mkdirs and rmdirs take microseconds, and are done on
        # the loop; on a disk each costs a journal commit, and a thread does them.
        self._memory = False
        self._path = path
        self._hidden = tuple(hidden)
        self._tools = sandbox.bound_tools(path)
        self._warn = warn
        self.kind: sandbox.Kind = "none"
        self.containment = sandbox.Containment.GROUP
        # Sandboxes share this machine's network (a job with APIs needs runtime.network),
        # so workers reach the gateway on its own loopback port.
        self._gateway = None if gateway_port is None else f"http://127.0.0.1:{gateway_port}"
        # network "apis": sandboxes have a network of their own, in which a forwarder
        # relays the sandbox's loopback port to the gateway's unix socket, bound in.
        self._network = network
        self._socket = gateway_socket
        if network == "apis" and gateway_socket is not None:
            self._gateway = sandbox.gateway_url()
        self._place = Place(host="local", kind="none", base="", path=path, gateway=self._gateway)

    @property
    def capacity(self) -> int:
        return self._slots

    async def start(self) -> None:
        if sys.version_info < (3, 12) and hasattr(os, "pidfd_open"):
            # Python 3.11 watches each child with a thread of its own; a pidfd is cheaper
            # (and is what 3.12 does by default).
            watcher = asyncio.PidfdChildWatcher()
            watcher.attach_loop(asyncio.get_running_loop())
            asyncio.set_child_watcher(watcher)
        chosen = roots.choose(self._requested_root, self._slots, self._environ)
        self.root, self._memory = chosen.path, chosen.memory
        # Every root a run may have chosen (auto's choice changes with free space and
        # TMPDIR): a killed run's leftovers are swept wherever they are.
        for place in roots.candidates(self.root, self._environ):
            for said in await removal.off_loop(functools.partial(sweep, place)):
                self._warn(said)
        choice = await asyncio.to_thread(sandbox.choose, self._requested, self._image)
        namespace = sandbox.pid_namespace() if choice.kind == "none" else ()
        # Built (once a machine) and probed in a thread: a compile takes a second.
        steps_by = await asyncio.to_thread(spawner.spawner) if namespace else None
        if self._network == "apis":
            refusal = network_refusal(choice.kind)
            if refusal is not None:
                raise EnvironmentProblem(refusal)
            if self._socket is None:
                raise EnvironmentProblem(
                    'runtime.network = "apis" but the run has no API gateway to reach'
                )
        self.kind = choice.kind
        self.containment = choice.containment
        self._place = Place(
            host="local",
            kind=choice.kind,
            base="",  # each sandbox's own
            path=self._path,
            hidden=sandbox.hidden_entries(self._hidden),
            tools=tuple(str(tool) for tool in self._tools),
            namespace=namespace,
            lifeline=os.getpid(),
            spawner=steps_by,
            image=self._image,
            containment=choice.containment,
            root=os.geteuid() == 0,
            gateway=self._gateway,
            # fanout's own python runs the forwarder: it exists, and bwrap binds it back
            # (``bound_tools``) should it lie under /tmp.
            gateway_socket=str(self._socket) if self._network == "apis" else None,
            python=sys.executable if self._network == "apis" else None,
        )
        if choice.warning:
            self._warn(choice.warning)

    async def close(self) -> None:
        return None

    async def run(self, attempt: Attempt) -> AttemptResult:
        # Imported here: a Ray node imports this module for its sandboxes and never
        # drives an attempt (the driver brings the job language: 0.1 s of an actor's start).
        from ..attempt.driver import execute

        return await execute(attempt, self)

    @contextlib.asynccontextmanager
    async def sandbox(self, attempt: Attempt) -> AsyncIterator[Sandbox]:
        base = await self._made()
        try:
            yield LocalSandbox(replace(self._place, base=str(base)), base, self.containment)
        finally:
            await self._remove(base)

    async def _made(self) -> Path:
        """A new sandbox directory: on a tmpfs here, on a disk in a thread.  A
        cancellation (Ctrl-C, a unit's deadline) while the thread makes it does not stop
        the thread: the directory is removed once it is made, then the cancellation goes
        on (before, it was left behind for the next run to sweep)."""
        make = functools.partial(_make, self.root)
        if self._memory:
            return make()
        making = asyncio.ensure_future(asyncio.to_thread(make))
        try:
            return await asyncio.shield(making)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):  # making it failed: nothing to remove
                await self._remove(await making)
            raise

    async def _remove(self, base: Path) -> None:
        """Remove a sandbox directory.  Most are left as they were made (a no-op unit):
        their few rmdirs first, where a walk opens and scans each directory (a sixth
        of a no-op unit's cost); the others by ``removal`` (off the loop)."""
        unmade = functools.partial(unmake, base)
        if unmade() if self._memory else await asyncio.to_thread(unmade):
            return
        await removal.off_loop(functools.partial(_dispose, base), then=self._tell)

    def _tell(self, said: str | None) -> None:
        if said is not None:
            self._warn(said)


def _make(root: Path) -> Path:
    """A fresh sandbox directory in ``root``, laid out as ``LAYOUT`` (0700: mkdtemp)."""
    base = Path(tempfile.mkdtemp(prefix=f"fanout-{os.getpid()}-", dir=root))
    lay_out(base)
    return base


def lay_out(base: Path) -> None:
    """The folders ``LAYOUT`` puts in a fresh sandbox directory ``base`` (this
    transport's, or a Ray node's made at the name its coordinator chose)."""
    for name in LAYOUT.directories:
        (base / name).mkdir()


def unmake(base: Path) -> bool:
    """Remove the sandbox ``base`` if it is as it was made (its folders empty): whether
    it is gone.  A few rmdirs, where a walk opens and scans each directory first."""
    try:
        for name in LAYOUT.directories:
            os.rmdir(base / name)
        os.rmdir(base)
    except OSError:
        return False
    return True


def sweep(root: Path) -> list[str]:
    """Remove the sandboxes in ``root`` of runs that ended, killing first what still
    works in them; what to tell the user.  A sandbox's name carries its coordinator's
    PID, and one whose coordinator is gone is garbage.  In a PID namespace nothing can
    be left running; without one (or in the instant between unshare's fork and its
    child arming the parent-death signal) a worker's children may be, and must not do
    their work beside the resumed run.  Only this user's: another user's sandbox is
    theirs to remove (and root's, under a sticky /tmp, this user could not)."""
    me = os.geteuid()
    leftovers = []
    for leftover in sorted(root.glob("fanout-*-*")):
        owner = leftover.name.split("-")[1]
        if not owner.isdigit() or escapees.alive(int(owner)):
            continue
        try:
            status = os.lstat(leftover)
        except OSError:
            continue
        if stat.S_ISDIR(status.st_mode) and status.st_uid == me:
            leftovers.append(leftover)
    return clear(leftovers) if leftovers else []


def clear(directories: Sequence[Path]) -> list[str]:
    """Kill what works in ``directories`` until a search finds nothing (a killed
    process is found again until it has exited), then remove them, all of it bounded
    by ``removal.PATIENCE``; what to tell the user (``removal.dispose``)."""
    deadline = time.monotonic() + removal.PATIENCE
    escapees.kill_until_gone([str(directory) for directory in directories], None, deadline)
    said = []
    for index, directory in enumerate(directories):
        try:
            warning = removal.dispose(directory, _aside(directory), deadline=deadline)
        except removal.OutOfTime:
            said.append(_out_of_time(directory, len(directories) - index - 1))
            break
        if warning is not None:
            said.append(warning)
    return said


def _dispose(base: Path) -> str | None:
    """Remove the sandbox ``base`` of this run, bounded: what to tell the user."""
    try:
        return removal.dispose(base, _aside(base), deadline=time.monotonic() + removal.PATIENCE)
    except removal.OutOfTime:
        return _out_of_time(base, 0) + ", once this one has ended"


def _aside(directory: Path) -> Path:
    return directory.with_name(_ASIDE + directory.name.removeprefix("fanout-"))


def _out_of_time(directory: Path, more: int) -> str:
    others = f" (and {more} more sandbox{'es' if more > 1 else ''})" if more else ""
    return (
        f"{directory}{others} could not be removed within {removal.PATIENCE:g}s: the next run"
        " removes the rest"
    )


class LocalSandbox:
    """A sandbox directory on this machine (see ``transport.Sandbox``): made by
    ``LocalTransport.sandbox``, or by a Ray node at the name its coordinator chose
    (``ray.node``)."""

    def __init__(self, place: Place, base: Path, containment: sandbox.Containment) -> None:
        self.place = place
        self._base = base
        self._work = base / LAYOUT.work
        self._containment = containment

    async def stage(self, files: Sequence[StagedFile]) -> None:
        if files:
            await asyncio.to_thread(_copy_in, files, self._work)

    async def read(self, name: str) -> bytes | None:
        try:
            descriptor = os.open(self._base / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None  # absent, or a symlink the worker made: never followed
        with os.fdopen(descriptor, "rb") as stream:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return None
            return stream.read(LAYOUT.control_limit)

    async def listing(self, roots: Sequence[str]) -> list[Entry]:
        return await asyncio.to_thread(_list, self._work, roots)

    async def fetch(self, names: Sequence[str], destination: Path) -> None:
        await asyncio.to_thread(_copy_out, self._work, names, destination)

    async def run(self, command: Command, capture: OutputCapture, *, backstop: float) -> int:
        """The step as a child of fanout (whose death kills it: ``sandbox.guarded``);
        the coordinator's deadline is here, so ``backstop`` is not needed."""
        kind = self.place.kind
        inner = command.argv
        status = _status_pipe(inner) if kind == "bwrap" else None
        if status is not None:  # bwrap names its namespace's init (steps.SandboxInit)
            inner = (inner[0], "--json-status-fd", str(status[1]), *inner[1:])
        argv = (
            inner
            if kind == "podman"
            else tuple(sandbox.guarded(inner, command.program, self.place))
        )
        starting = asyncio.ensure_future(
            steps.spawn(
                argv,
                cwd=command.cwd,
                env=command.env,
                preexec=sandbox.preexec(self.place),
                pass_fds=() if status is None else (status[1],),
            )
        )
        step = steps.Step(self._base, self._containment)
        if status is not None:
            step.init = steps.SandboxInit(status[0])
        try:
            # A cancellation while the process is being set up must still find it to kill.
            step.process, step.exits, step.transport = await asyncio.shield(starting)
        except OSError as exc:
            if step.init is not None:
                await step.init.gone(0)
            capture.feed(f"fanout: cannot start {argv[0]}: {exc.strerror or exc}\n".encode())
            return 127
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                step.process, step.exits, step.transport = await starting
                await step.stop(None)
            raise
        finally:
            if status is not None:
                os.close(status[1])  # bwrap's now; its end closes with it
        step.pipe = steps.output_pipe(step.process.pid)
        steps.feed(step.process, command.stdin)
        reader = asyncio.create_task(steps.read(step.process, capture))
        try:
            # The process's exit, not asyncio's wait(), which also waits for the pipes:
            # a daemon holding the output would hold the attempt.
            await asyncio.shield(step.exits.exited)
            assert step.process.returncode is not None
            return step.process.returncode
        finally:
            await step.stop(reader)


def _status_pipe(argv: Sequence[str]) -> tuple[int, int] | None:
    """A pipe for bwrap's status (read end, write end), or None if ``argv`` is not bwrap."""
    if not argv or argv[0] != "bwrap":
        return None
    return os.pipe()


def _copy_in(files: Sequence[StagedFile], work: Path) -> None:
    """The staged files into ``work``, each with its permission bits."""
    for item in files:
        target = work / item.path
        staging.make_folders(target.parent)
        shutil.copy(item.source, target)


def _list(work: Path, roots: Sequence[str]) -> list[Entry]:
    """``work``'s entries under ``roots``, as ``collecting`` reads them; nothing is
    followed (``os.scandir`` entries are lstat'ed)."""
    found: list[Entry] = []
    # The folders still to list, as (path, prefix): a stack, not recursion (the worker
    # chose the depth), in any order (``Collect.select`` orders what is found).
    folders: list[tuple[Path, str]] = []
    if "." in roots:
        folders.append((work, ""))
    else:
        for root in roots:
            try:
                mode = os.lstat(work / root).st_mode
            except OSError:
                continue
            kind = Kind.of_mode(mode)
            found.append(Entry(root, kind))
            if kind is Kind.DIR:
                folders.append((work / root, root + "/"))
    while folders:
        directory, prefix = folders.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            continue
        for entry in entries:
            path = prefix + entry.name
            kind = _kind(entry)
            found.append(Entry(path, kind))
            if kind is Kind.DIR:
                folders.append((Path(entry.path), path + "/"))
    return found


def _kind(entry: os.DirEntry[str]) -> Kind:
    try:
        return Kind.of_mode(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return Kind.OTHER


def _copy_out(work: Path, names: Sequence[str], destination: Path) -> None:
    """The regular files ``names`` of ``work`` into ``destination``.  Every process of
    the attempt is gone and ``names`` came from a listing that found no symlink on
    their way, so only the last component needs guarding (O_NOFOLLOW)."""
    for name in names:
        target = collecting.target(destination, name)
        descriptor = os.open(work / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(descriptor, "rb") as source, target.open("wb") as copy:
            shutil.copyfileobj(source, copy)
