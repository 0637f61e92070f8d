"""The stream a command's console writes to, made safe against a reader that went away.

``fanout run job.toml 2>&1 | head -3`` closes the pipe after three lines; a closed
terminal (a dropped SSH session) does the same with EIO.  Every write after that fails,
and the failure must not reach the run: not through the progress display (which dispatch
calls while it settles units), not through rich's refresh thread, not through the
summary lines or the error message at the end, and not through Python's own flush of
stdout and stderr at exit ("Exception ignored ... BrokenPipeError", exit status 120).

Decision: a closed console stops the run, as SIGPIPE would stop a shell tool, because a
run nobody can watch any more should not go on starting units for an hour unseen, and
resuming it costs nothing.  It stops gently (``launch.Drain``): nothing new starts, the
attempts running finish and settle, the run stays resumable, exit 130.  From the first
failed write on, nothing more is written: the console's file descriptor (and stdout, if
it is the same pipe) is pointed at /dev/null, as the Python documentation's note on
SIGPIPE recommends.
"""

from __future__ import annotations

import io
import os
import select
import sys
import threading
from collections.abc import Callable
from typing import TextIO


class ConsoleStream(io.TextIOBase):
    """A text stream passing writes to ``stream`` until one fails with OSError (EPIPE,
    EIO, ENOSPC of a redirected file); then ``on_closed`` is called once, from the
    writing thread, and every later write is dropped."""

    def __init__(self, stream: TextIO, on_closed: Callable[[], None]) -> None:
        super().__init__()
        self._stream = stream
        self._on_closed = on_closed
        self._lock = threading.Lock()
        self.gone = False
        # Asked once: a terminal that hung up answers "not a terminal" (ioctl fails with
        # EIO), and rich, asking again before every refresh, would then stop writing to
        # it instead of finding out that it is gone.
        try:
            self._terminal = stream.isatty()
        except (OSError, ValueError):
            self._terminal = False

    @property  # io.TextIOBase's is a read-only property at run time too
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self._terminal

    def fileno(self) -> int:
        return self._stream.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._stream.write(text)
            except OSError:
                self._closed()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except OSError:
                self._closed()

    def _closed(self) -> None:
        with self._lock:
            if self.gone:
                return
            self.gone = True
        silence(self._stream)
        self._on_closed()


def silence(stream: TextIO) -> None:
    """Point ``stream``'s file descriptor (and stdout's or stderr's, if they write to
    the same file) at /dev/null, so whatever is still buffered or written later goes
    nowhere instead of raising."""
    try:
        fd = stream.fileno()
        dead = os.fstat(fd)
    except (OSError, ValueError):
        return
    targets = {fd}
    for other in (sys.stdout, sys.stderr):
        try:
            other_fd = other.fileno()
            same = os.fstat(other_fd)
        except (OSError, ValueError, AttributeError):
            continue
        if (same.st_dev, same.st_ino) == (dead.st_dev, dead.st_ino):
            targets.add(other_fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for target in targets:
            os.dup2(devnull, target)
    finally:
        os.close(devnull)


def closed_console() -> bool:
    """Whether stdout or stderr writes into a pipe nobody reads any more (``| head``
    exited) or a terminal that hung up; if so, both are silenced (see ``silence``).
    poll() tells without writing: a pipe whose reader is gone reports POLLERR, a
    hung-up terminal POLLHUP."""
    gone = False
    for stream in (sys.stdout, sys.stderr):
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            continue
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
            silence(stream)
            gone = True
    return gone
