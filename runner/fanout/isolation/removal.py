"""Removing a directory tree a unit made, whatever the unit did to it.

A worker shapes its sandbox as it likes: a thousand levels of ``mkdir -p`` (which took
``shutil.rmtree`` past Python's recursion limit, and every later run with it), folders
it shut (``chmod 000``) and, as root without bwrap, files and folders it made
immutable or append-only (``chattr +i``, ``+a``).  ``remove`` takes all of it down:

- any depth, without recursion and with four descriptors open at most: it walks down
  with ``openat``, keeps only the names of the subfolders still to visit on its way,
  and climbs back up through ``..``, checked to be the folder it came from;
- nothing is followed: a symlink is removed as a name, and a mount point in the tree
  (in mountinfo, which root reads first, or a folder on another device, FUSE
  included) is never entered: the tree is reported instead;
- a folder it cannot read or change is given back its owner's permissions, and an
  immutable or append-only flag is cleared (``inodes``); only root can clear one, so
  for anyone else such a file makes the tree ``Unremovable``, saying how root
  removes it;
- bounded: past its deadline it stops with ``OutOfTime``, the rest left for later.

Every process of the tree's unit is gone when it runs (the transports see to that):
nothing races it but another run's sweep of the same leftover, whose removals it
skips; it still never trusts a name it did not just look at.  ``dispose``
is what fanout does with a tree it cannot remove: it sets it aside, where no run looks
again, and says so once.  Only the standard library: a non-root test runs it with the
system's python.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shlex
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from . import inodes

T = TypeVar("T")

# The longest fanout spends removing one tree (a sandbox, a unit folder), or at a run's
# start the sandboxes of runs that ended; what is left then waits for a later run.  A
# worker's tree takes about as long to remove as it took to make, which the unit's
# timeout bounded.
PATIENCE = 60.0

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# How many entries go between two looks at the clock.
_EVERY = 256
# The longest path in the tree a reason shows whole.
_SHOWN = 160


class Unremovable(Exception):
    """A tree that is still there: ``reason`` says what stopped it (naming a path
    relative to the tree), ``remedy`` which command removes it."""

    def __init__(self, reason: str, *, immutable: bool = False, mount: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.immutable = immutable  # a flag only root can clear
        self.mount = mount  # a mount point in the tree (relative; "": the tree itself)

    def remedy(self, path: Path) -> str:
        """The command that removes the tree, now at ``path``."""
        quoted = shlex.quote(str(path))
        root = os.geteuid() == 0
        if self.mount is not None:
            point = shlex.quote(str(path / self.mount))
            # Only root mounts in place; anyone else's mount is FUSE's.
            return f"{'umount' if root else 'fusermount -u'} {point} && rm -rf {quoted}"
        if self.immutable:
            sudo = "" if root else "sudo "
            return f"{sudo}chattr -R -i -a {quoted} && {sudo}rm -rf {quoted}"
        return f"rm -rf {quoted}"


class OutOfTime(Exception):
    """The deadline passed with part of the tree removed."""


def remove(path: Path, *, deadline: float) -> None:
    """Remove ``path`` (absolute) and everything below it; a missing path is removed.
    ``deadline`` is on ``time.monotonic()``.  Raises Unremovable or OutOfTime."""
    try:
        # The tree's parent is the caller's (a sandbox root may be a symlink: followed).
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise Unremovable(_said(exc, "its folder")) from None
    walk = _Walk(path, parent, deadline)
    try:
        walk.run()
    except OSError as exc:  # what no step expects (a descriptor limit, an I/O error)
        raise Unremovable(_said(exc, "the folder itself")) from None
    finally:
        walk.move(-1)
        os.close(parent)


def dispose(path: Path, aside: Path, *, deadline: float) -> str | None:
    """Remove ``path``: None once it is gone, else what to tell the user, once.  A tree
    that cannot be removed is renamed ``aside`` (a name no fanout run looks at again:
    it must never stand in another run's way), and the words say where it is, why it
    is there and how to remove it.  Raises OutOfTime, the tree left where it is."""
    try:
        remove(path, deadline=deadline)
    except Unremovable as exc:
        try:
            os.rename(path, aside)
        except OSError as failed:
            return (
                f"cannot remove {path}: {exc.reason}; remove it with: {exc.remedy(path)}"
                f" (it could not be renamed {aside.name}, {failed.strerror or failed}:"
                " the next run tries again)"
            )
        return (
            f"cannot remove {aside}: {exc.reason}; no fanout run touches it again,"
            f" remove it with: {exc.remedy(aside)}"
        )
    return None


async def off_loop(call: Callable[[], T], then: Callable[[T], None] = lambda result: None) -> T:
    """``call`` (a removal, bounded by its deadline) in a thread, its result handed to
    ``then``, awaited to its end even when cancelled (the cancellation is raised
    after): whoever comes next must not find what it removes half gone, and a thread
    left running would hold the interpreter's exit all the same."""
    running = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        result = await asyncio.shield(running)
    except asyncio.CancelledError:
        await asyncio.wait([running])
        if not running.cancelled() and running.exception() is None:
            then(running.result())
        raise
    then(result)
    return result


class _Frame:
    """A folder on the walk's way down: its name in its parent, its identity, and the
    subfolders it still holds (None until it is read)."""

    __slots__ = ("device", "inode", "name", "pending")

    def __init__(self, name: str, status: os.stat_result) -> None:
        self.name = name
        self.device = status.st_dev
        self.inode = status.st_ino
        self.pending: list[str] | None = None


class _Walk:
    """One removal: the folders from the top down to the one the walk is in
    (``frames``), that one open as ``fd`` (-1: none), the top's parent as ``parent``."""

    def __init__(self, top: Path, parent: int, deadline: float) -> None:
        self.top = top
        self.parent = parent
        self.deadline = deadline
        self.entries = 0
        self.frames: list[_Frame] = []
        self.fd = -1

    def move(self, fd: int) -> None:
        """Make ``fd`` the folder the walk is in, closing the one it was in."""
        old, self.fd = self.fd, fd
        if old >= 0:
            os.close(old)

    def run(self) -> None:
        name = self.top.name
        try:
            status = os.lstat(name, dir_fd=self.parent)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(status.st_mode):
            self.remove(os.unlink, self.parent, name, top=True)
            return
        self.refuse_mounts()
        try:
            fd, status = self.enter(self.parent, name, status.st_dev, top=True)
        except (FileNotFoundError, NotADirectoryError):
            return  # removed meanwhile (another run's sweep)
        self.move(fd)
        self.frames.append(_Frame(name, status))
        while self.frames:
            self.step()

    def step(self) -> None:
        """One move: into the next subfolder of the folder the walk is in, or, once
        that folder is empty, back up to its parent, removing it."""
        frame = self.frames[-1]
        if frame.pending is None:
            frame.pending = self.empty()
        while frame.pending:
            name = frame.pending.pop()
            try:
                child, status = self.enter(self.fd, name, frame.device)
            except FileNotFoundError:
                continue
            except NotADirectoryError:  # no longer a folder: a name like any other
                self.remove(os.unlink, self.fd, name)
                continue
            self.move(child)
            self.frames.append(_Frame(name, status))
            return
        done = self.frames.pop()
        if not self.frames:
            self.move(-1)
            self.remove(os.rmdir, self.parent, done.name, top=True)
            return
        self.move(self.climb())
        self.remove(os.rmdir, self.fd, done.name)

    def empty(self) -> list[str]:
        """Remove everything but the subfolders in the folder the walk is in; the
        names of those."""
        folders = []
        with os.scandir(self.fd) as entries:
            for entry in entries:
                if self.entries % _EVERY == 0 and time.monotonic() > self.deadline:
                    raise OutOfTime()
                self.entries += 1
                try:
                    folder = entry.is_dir(follow_symlinks=False)
                except OSError:
                    folder = False
                if folder:
                    folders.append(entry.name)
                else:
                    self.remove(os.unlink, self.fd, entry.name)
        return folders

    def enter(
        self, fd: int, name: str, device: int, *, top: bool = False
    ) -> tuple[int, os.stat_result]:
        """The subfolder ``name`` of the folder open as ``fd`` (the walk's, or with
        ``top`` the tree's parent), opened (never through a symlink:
        NotADirectoryError), with its status; one its owner shut (``chmod 000``)
        opened after giving it back its owner's permissions."""
        try:
            child = os.open(name, _DIRECTORY, dir_fd=fd)
        except PermissionError:
            self.own(fd, name, top=top)
            try:
                child = os.open(name, _DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise self.stuck(exc, self.at(name, top)) from None
        except (FileNotFoundError, NotADirectoryError):
            raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink
                raise NotADirectoryError(exc.errno, exc.strerror) from None
            raise self.stuck(exc, self.at(name, top)) from None
        status = os.fstat(child)
        if status.st_dev != device:
            os.close(child)
            raise Unremovable(
                f"{_shown(self.at(name, top))} is a mount point", mount=self.at(name, top)
            )
        return child, status

    def climb(self) -> int:
        """The parent of the folder the walk is in, which must be the folder the walk
        came down from."""
        expected = self.frames[-1]
        # A folder removed meanwhile (another run's sweep of the same leftover) still
        # has its "..": the walk goes on up, where what is gone is skipped.
        up = os.open("..", _DIRECTORY, dir_fd=self.fd)
        status = os.fstat(up)
        if (status.st_dev, status.st_ino) != (expected.device, expected.inode):
            os.close(up)
            raise Unremovable(f"{_shown(self.where(''))} moved while it was being removed")
        return up

    def remove(
        self, remover: Callable[..., None], fd: int, name: str, *, top: bool = False
    ) -> None:
        """``remover(name, dir_fd=fd)`` (``os.unlink`` or ``os.rmdir``) in the folder
        the walk is in (with ``top``: the tree's parent); refused, once more after
        ``name`` and that folder (never the tree's parent) lost what refused it: their
        flags, the folder's permissions."""
        try:
            remover(name, dir_fd=fd)
            return
        except FileNotFoundError:
            return
        except PermissionError as exc:
            refused = exc
        except OSError as exc:
            raise self.stuck(exc, self.at(name, top)) from None
        where = self.at(name, top)
        if not top:
            self.unlocked(inodes.unlock(fd), where.rpartition("/")[0])
            if refused.errno == errno.EACCES:
                with contextlib.suppress(PermissionError):  # not its owner: said below
                    os.fchmod(fd, _owner_mode(os.fstat(fd).st_mode))
        self.unlocked(inodes.unlock_at(fd, name), where)
        try:
            remover(name, dir_fd=fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self.stuck(exc, where) from None

    def own(self, fd: int, name: str, *, top: bool) -> None:
        """Give the subfolder ``name`` its owner's permissions back, never through a
        symlink (an O_PATH descriptor, changed through /proc)."""
        try:
            handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise self.stuck(exc, self.at(name, top)) from None
        try:
            mode = _owner_mode(os.fstat(handle).st_mode)
            with contextlib.suppress(PermissionError):  # not its owner: said by the retry
                os.chmod(f"/proc/self/fd/{handle}", mode)
        finally:
            os.close(handle)

    def unlocked(self, unlocked: bool, where: str) -> None:
        """Go on if an entry's flags are cleared (``inodes``), else say why it stays."""
        if not unlocked:
            raise Unremovable(
                f"{_shown(where)} is immutable or append-only (chattr +i or +a),"
                " which only root can clear",
                immutable=True,
            )

    def refuse_mounts(self) -> None:
        """A mount point anywhere in the tree, before anything is removed: a bind mount
        shares the device of what it shows, so the walk's own device check would go
        into it.  Only root can mount where fanout looks (a root worker without bwrap);
        anyone else's mounts here are FUSE's, another device (a worker's own mount
        namespace dies with it), so only root reads mountinfo (0.2 ms here)."""
        if os.geteuid() != 0:
            return
        top = os.path.realpath(self.top)
        for point in inodes.mount_points():
            if point == top or point.startswith(top + "/"):
                where = point[len(top) + 1 :]
                raise Unremovable(f"{_shown(where)} is a mount point", mount=where)

    def where(self, name: str) -> str:
        """``name`` in the folder the walk is in, relative to the top (only for what
        is said: it costs the depth)."""
        return "/".join([frame.name for frame in self.frames[1:]] + ([name] if name else []))

    def at(self, name: str, top: bool) -> str:
        """``where``, for ``name`` in the tree's parent (the top itself) with ``top``."""
        return "" if top else self.where(name)

    def stuck(self, exc: OSError, where: str) -> Unremovable:
        return Unremovable(_said(exc, _shown(where)))


def _shown(where: str) -> str:
    """A path in the tree as a reason shows it: a deep one by its ends."""
    if len(where) > _SHOWN:
        where = f"{where[: _SHOWN // 2]}...{where[-_SHOWN // 2 :]}"
    return repr(where) if where else "the folder itself"


def _said(exc: OSError, what: str) -> str:
    return f"{what}: {exc.strerror or exc}"


def _owner_mode(mode: int) -> int:
    return stat.S_IMODE(mode) | stat.S_IRWXU
