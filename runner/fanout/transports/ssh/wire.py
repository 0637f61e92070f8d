"""The wire format between fanout and its remote agent (``agent.sh``): the commands one
sandbox sends, and how their answers come back.  No SSH library here: ``ssh`` moves
these bytes.

A command is one line, ``VERB WORD... CODE``: fixed words the agent checks (a token,
a mark, a number), then optional shell code in which every value is single-quoted
(newlines spelled ``"$nl"``), so the agent reads the line with a builtin and takes the
values with ``eval``.  Secrets are in such code, so they live in the agent shell's
memory and the step's environment only: never argv, never disk.

    open TOKEN CODE          CODE: set -- DIR...      make $root/fanout-TOKEN and DIRs
    put LENGTH               + LENGTH bytes of tar    extracted into work/
    run BACKSTOP MARK LENGTH LIMIT NAME ENDING CODE   + LENGTH bytes of stdin (and a '.')
                             CODE: cd, exports, program=, set -- ARGV; LIMIT > 0:
                             then cat NAME; ENDING (not "-"): then close ENDING
    cat LIMIT CODE           CODE: set -- NAME        a regular file of the sandbox
    list CODE                CODE: set -- ROOT...     find -P ROOT... under work/
    get CODE                 CODE: set -- NAME...     a tar of those regular files
    close HOW                wait for what is left to die, remove, say so; HOW:
                             sweep   kill what is left first (by /proc), then settle
                             settle  wait until nothing carries the sandbox's control
                             ended   the steps' PID namespaces ended with them: settle
                                     only after a step that did not end by itself

The agent answers on its stdout: ``error MESSAGE`` (the host cannot run units: it
exits), ``ran STATUS`` after a step (whose output came on stderr up to an end mark no
worker knows), ``data LENGTH`` + bytes or ``none`` for ``cat`` and ``get``,
NUL-terminated ``KIND PATH`` entries and an empty one for ``list``, ``closed``.  A
``run`` that also cats and closes answers ``ran``, ``none`` and ``closed`` in one write.

A no-op attempt is one write each way: ``open`` and ``run`` (which cats the control
file and closes the sandbox), then ``ran``, ``none`` and ``closed`` (with the step's
output and end mark on stderr).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Literal, Protocol

from ...attempt import collecting
from ...attempt.capture import OutputCapture
from ...attempt.collecting import Entry, Kind
from ...attempt.sandbox import Command, StagedFile


class Reader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...

    async def readline(self) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...

    async def readuntil(self, separator: bytes) -> bytes: ...


def agent_script() -> str:
    """The agent as sent: without comment lines and indentation (less for sh to read)."""
    text = resources.files("fanout.transports.ssh").joinpath("agent.sh").read_text(encoding="utf-8")
    lines = (line.strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("#")) + "\n"


def keeper_script() -> str:
    """The agent's keeper (``keeper.py``) as sent: run by the host's python3."""
    return resources.files("fanout.transports.ssh").joinpath("keeper.py").read_text("utf-8")


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FILE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")


def quote(value: str) -> str:
    """A shell word for ``value`` on one line: newlines become the agent's "$nl"."""
    return '"$nl"'.join(shlex.quote(piece) for piece in value.split("\n"))


def _set(words: Sequence[str]) -> str:
    return "set -- " + " ".join(quote(word) for word in words)


# How a sandbox ends (``close``): what its steps may have left to wait for.
Ending = Literal["sweep", "settle", "ended"]


def open_sandbox(token: str, directories: Sequence[str]) -> bytes:
    return f"open {token} {_set(directories)}\n".encode()


def run(
    command: Command,
    *,
    backstop: int,
    mark: str,
    then: tuple[int, str] | None = None,
    ending: Ending | None = None,
) -> bytes:
    """A step for the agent: its line, then its stdin; ``then``: (LIMIT, NAME) of a
    file to ``cat`` right after the step's answer; ``ending``: ``close`` the sandbox
    that way after that.  Raises ValueError for an environment name the shell cannot
    export (the schema allows none)."""
    # cd sets (and dash exports) PWD and OLDPWD: the step gets exactly ``env``.
    words = [f"cd {quote(command.cwd)} || exit 126", "unset OLDPWD PWD"]
    for name, value in command.env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"env: {name!r} is not an environment variable name")
        words.append(f"export {name}={quote(value)}")
    words.append(f"program={quote(command.program)}")
    words.append(_set(command.argv))
    limit, name = then or (0, "-")
    if not _FILE_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a name of the sandbox's layout")
    head = f"run {backstop} {mark} {len(command.stdin)} {limit} {name} {ending or '-'} "
    line = head + "; ".join(words) + "\n"
    # The agent reads stdin with $(...), which drops trailing newlines: a '.' keeps them.
    return line.encode() + (command.stdin + b"." if command.stdin else b"")


def cat(name: str, limit: int) -> bytes:
    return f"cat {limit} {_set([name])}\n".encode()


def listing(roots: Sequence[str]) -> bytes:
    # "./" first: a root named "-x" is not an option of find's.
    return f"list {_set(['.' if root == '.' else f'./{root}' for root in roots])}\n".encode()


def get(names: Sequence[str]) -> bytes:
    return f"get {_set(names)}\n".encode()


def close(how: Ending) -> bytes:
    return f"close {how}\n".encode()


def end_mark(mark: str) -> bytes:
    """What the agent prints on stderr after a step's output."""
    return f"\n\x1efanout-end {mark}\n".encode()


# Staged files -------------------------------------------------------------------

# How much of the staged tar is read (in a thread) and written to the channel at once.
CHUNK = 1 << 18
_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE


@dataclass(frozen=True, slots=True)
class _Member:
    item: StagedFile
    header: bytes
    size: int


class StagedTar:
    """The staged files as one tar, streamed: its size is known before a byte of data
    is read (headers plus padded sizes), and ``chunks`` reads each file as it goes, so
    a large workspace is never held in memory.  A file whose size changed since its
    header was written fails the attempt (``stage:``): the tar would lie about it."""

    def __init__(self, files: Sequence[StagedFile]) -> None:
        """Stats every file; raises OSError (a file gone or unreadable)."""
        members = []
        for item in files:
            status = os.stat(item.source)
            if not stat.S_ISREG(status.st_mode):
                raise OSError(0, "not a regular file", str(item.source))
            info = tarfile.TarInfo(item.path)
            info.size = status.st_size
            info.mode = stat.S_IMODE(status.st_mode)  # a staged script stays executable
            info.mtime = int(status.st_mtime)
            header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            members.append(_Member(item, header, status.st_size))
        self._members = tuple(members)
        body = sum(len(m.header) + _padded(m.size) for m in members) + 2 * _BLOCK
        self.size = -(-body // _RECORD) * _RECORD

    def chunks(self) -> Iterator[bytes]:
        """The tar, ``CHUNK`` bytes at a time (blocking reads: run each ``next`` in a
        thread).  Raises OSError when a file changed size while being staged."""
        pending = bytearray()
        for member in self._members:
            pending += member.header
            with open(member.item.source, "rb") as stream:
                left = member.size
                while left:
                    data = stream.read(min(left, CHUNK))
                    if not data:
                        raise _changed(member, member.size - left)
                    pending += data
                    left -= len(data)
                    if len(pending) >= CHUNK:
                        yield bytes(pending)
                        pending.clear()
                if stream.read(1):
                    raise _changed(member, None)
            pending += bytes(_padded(member.size) - member.size)
        written = sum(len(m.header) + _padded(m.size) for m in self._members)
        pending += bytes(self.size - written)
        yield bytes(pending)


def _padded(size: int) -> int:
    return -(-size // _BLOCK) * _BLOCK


def _changed(member: _Member, now: int | None) -> OSError:
    what = "grew" if now is None else f"shrank to {now} bytes"
    return OSError(
        0,
        f"changed while being staged ({member.size} bytes, then it {what})",
        str(member.item.source),
    )


# Answers --------------------------------------------------------------------------


async def read_output(stderr: Reader, mark: str, capture: OutputCapture) -> None:
    """Feed a step's output to ``capture`` up to its end mark (or end of stream)."""
    end = end_mark(mark)
    keep = len(end) - 1
    pending = b""
    while True:
        chunk = await stderr.read(65536)
        if not chunk:
            capture.feed(pending)
            return
        pending += chunk
        found = pending.find(end)
        if found >= 0:
            capture.feed(pending[:found])
            return
        if len(pending) > keep:
            capture.feed(pending[:-keep])
            pending = pending[-keep:]


class Refused(Exception):
    """The agent said ``error``: this host cannot run units at all."""


class Closed(Exception):
    """The agent's stdout ended: it exited (or its channel closed)."""


async def answer(stdout: Reader) -> list[str]:
    """The agent's next answer line as words; raises Refused or Closed."""
    line = await stdout.readline()
    if not line.endswith(b"\n"):
        raise Closed()
    words = line.decode(errors="replace").split()
    if words[:1] == ["error"]:
        raise Refused(" ".join(words[1:]))
    return words


async def status(stdout: Reader) -> int:
    words = await answer(stdout)
    if len(words) != 2 or words[0] != "ran" or not words[1].isdigit():
        raise Closed()
    return int(words[1])


async def data(stdout: Reader) -> bytes | None:
    """The payload of a ``data LENGTH`` answer, None for ``none``."""
    words = await answer(stdout)
    if words == ["none"]:
        return None
    if len(words) != 2 or words[0] != "data" or not words[1].isdigit():
        raise Closed()
    return await stdout.readexactly(int(words[1]))


async def data_to(stdout: Reader, sink: IO[bytes]) -> None:
    """A ``data LENGTH`` answer's payload into ``sink``, a chunk at a time."""
    words = await answer(stdout)
    if len(words) != 2 or words[0] != "data" or not words[1].isdigit():
        raise Closed()
    left = int(words[1])
    while left:
        chunk = await stdout.readexactly(min(left, CHUNK))
        sink.write(chunk)
        left -= len(chunk)


_KINDS = {"f": Kind.FILE, "d": Kind.DIR, "l": Kind.LINK}


async def entries(stdout: Reader) -> list[Entry]:
    """A ``list`` answer: ``find -P -printf '%y%p\\0'`` entries up to an empty one, as
    paths relative to work/ (the listing's own ``.`` left out)."""
    found: list[Entry] = []
    while True:
        record = await stdout.readuntil(b"\0")
        if record == b"\0":
            return found
        kind, path = chr(record[0]), os.fsdecode(record[1:-1])
        path = path.removeprefix("./")
        if path and path != ".":
            found.append(Entry(path, _KINDS.get(kind, Kind.OTHER)))


async def done(stdout: Reader) -> str | None:
    """A ``close`` answer: None once the sandbox is gone, else the name (in the host's
    sandbox root) of what the agent could not remove."""
    words = await answer(stdout)
    if words == ["closed"]:
        return None
    if len(words) == 3 and words[:2] == ["closed", "left"] and _FILE_NAME.fullmatch(words[2]):
        return words[2]
    raise Closed()


def extract(archive: IO[bytes], names: Sequence[str], destination: Path) -> None:
    """The regular files ``names`` from ``get``'s tar into ``destination``, each at
    ``collecting.target``.  What the agent sends is not trusted: any other member
    (a symlink, a device, a name not asked for) is skipped, never created."""
    wanted = set(names)
    with tarfile.open(
        fileobj=archive, mode="r:", encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for member in tar:
            if member.name not in wanted or not member.isreg():
                continue
            wanted.discard(member.name)  # once: a second member of that name is not read
            source = tar.extractfile(member)
            assert source is not None
            with collecting.target(destination, member.name).open("wb") as copy:
                while chunk := source.read(CHUNK):
                    copy.write(chunk)
