"""The wire protocol between fanout and its remote agent (``wrapper.sh``): what one unit
looks like on the agent's stdin, and how its verdict and output come back.

A unit is one line of shell code with every value single-quoted (newlines spelled
``"$nl"``, so the agent reads it with a builtin), then the staged files as a tar.  The
agent answers on stdout with ``worker RC``, ``verify RC``, ``timeout``, ``control LEN``,
``collect LEN`` frames and ``done TOKEN``, or ``error MESSAGE`` when the host cannot
run units at all; the unit's output comes on stderr up to an end mark no worker knows.
Nothing here depends on the SSH library: ``ssh`` moves these bytes.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol

from . import fanin, globs
from .capture import OutputCapture
from .outcome import CollectedFile
from .transport import Attempt


class Reader(Protocol):
    async def read(self, n: int = -1) -> bytes: ...

    async def readline(self) -> bytes: ...

    async def readexactly(self, n: int) -> bytes: ...


def wrapper_script() -> str:
    """The wrapper as sent: without comment lines and indentation (less for sh to read)."""
    text = resources.files("fanout").joinpath("wrapper.sh").read_text(encoding="utf-8")
    lines = (line.strip() for line in text.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("#")) + "\n"


@dataclass
class Report:
    worker: int | None = None
    verify: int | None = None
    control: str = ""
    collected: bytes = b""
    timed_out: bool = False
    lost: str = ""
    complete: bool = False  # the agent said "done": it is ready for the next unit
    refused: str = ""  # the host cannot run units at all (its sandbox root, say)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def message(attempt: Attempt, token: str, deadline: int, mark: str) -> bytes:
    """One unit for the agent: a line "TOKEN DEADLINE MARK SETUP", then the staged tar."""
    invocation = attempt.invocation
    words: list[str] = []
    for name, value in {**attempt.base_env(), **invocation.env, **attempt.secrets}.items():
        if not _ENV_NAME.fullmatch(name):
            raise fanin.PathRefused(f"env: {name!r} is not an environment variable name")
        words.append(f"export {name}={_quote(value)};")
    words.append(f"prompt={_quote(invocation.prompt)};")
    words.append(f"worker() {{ launch {_join(invocation.argv)}; }};")
    if invocation.verify:
        words.append(f"verify() {{ launch {_join(invocation.verify)}; }};")
    if invocation.collect:
        try:
            words.append(f"collect() {{ collect_files {_collect_tests(invocation.collect)}; }};")
        except ValueError as exc:
            raise fanin.PathRefused(f"collect: {exc}") from None
    stage = _stage_tar(attempt)
    line = f"{token} {deadline} {mark} " + " ".join(words) + "\n"
    return line.encode() + f"{len(stage)}\n".encode() + stage


def _collect_tests(patterns: Sequence[str]) -> str:
    """find's tests for what ``patterns`` collect: the regular files they select, and the
    symlinks among them or on the way to a named path, so that the coordinator applies
    the local rule to them (``fanin.copy_collected``) instead of the agent skipping them."""
    selected = [f"-regex {_quote(globs.to_find_regex(p))}" for p in patterns]
    on_the_way = []
    for pattern in patterns:
        if not globs.is_glob(pattern):
            parts = pattern.split("/")
            for end in range(1, len(parts)):
                exact = globs.to_find_regex("/".join(parts[:end])).removesuffix("(/.*)?")
                on_the_way.append(f"-regex {_quote(exact)}")
    files = " -o ".join(selected)
    links = " -o ".join(selected + on_the_way)
    return f"'(' -type f '(' {files} ')' ')' -o '(' -type l '(' {links} ')' ')'"


def _quote(value: str) -> str:
    """A shell word for ``value`` on one line: newlines become the agent's "$nl"."""
    return '"$nl"'.join(shlex.quote(piece) for piece in value.split("\n"))


def _join(argv: Sequence[str]) -> str:
    return " ".join(_quote(arg) for arg in argv)


def _stage_tar(attempt: Attempt) -> bytes:
    if not attempt.staged:
        return b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for item in attempt.staged:
            info = archive.gettarinfo(str(item.source), arcname=item.path)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with item.source.open("rb") as stream:
                archive.addfile(info, stream)
    return buffer.getvalue()


def end_mark(mark: str) -> bytes:
    """What the agent prints on stderr after a unit's output."""
    return f"\n\x1efanout-end {mark}\n".encode()


async def read_output(stderr: Reader, mark: str, capture: OutputCapture) -> None:
    """Feed the unit's output to ``capture`` up to its end mark (or end of stream)."""
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


async def read_verdict(stdout: Reader, token: str, report: Report) -> None:
    """Read the agent's answer for the unit ``token`` into ``report``."""
    while True:
        line = await stdout.readline()
        if not line:
            return
        words = line.decode(errors="replace").split()
        if not words:
            continue
        if words[0] == "worker":
            report.worker = int(words[1])
        elif words[0] == "verify":
            report.verify = int(words[1])
        elif words[0] == "timeout":
            report.timed_out = True
        elif words[0] in ("control", "collect"):
            payload = await stdout.readexactly(int(words[1]))
            if words[0] == "control":
                report.control = payload.decode(errors="replace")
            else:
                report.collected = payload
        elif words[0] == "error":
            report.refused = " ".join(words[1:])
            return
        elif words[0] == "done" and words[1:] == [token]:
            report.complete = True
            return


def extract(data: bytes, destination: Path, patterns: Sequence[str]) -> tuple[CollectedFile, ...]:
    """The collected files of an attempt, from the agent's tar, into ``destination``.

    The tar is unpacked as it was in the sandbox, symlinks included, into a scratch
    folder beside ``destination``; then the local rule picks the files, exactly as for a
    local sandbox (``fanin.copy_collected``: a named path through a symlink that leads
    outside its folder fails the unit, other symlinks are not collected).
    """
    if not data:
        return ()
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".remote-", dir=destination.parent) as scratch:
        _unpack(data, Path(scratch))
        return fanin.copy_collected(Path(scratch), patterns, destination)


def _unpack(data: bytes, scratch: Path) -> None:
    """Regular files and symlinks of the agent's tar into ``scratch``.  A symlink is made,
    never followed: nothing is written through one (a member under a symlinked folder
    that leads outside is refused)."""
    root = scratch.resolve()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive.getmembers():
            name = member.name.removeprefix("./")
            if not (member.isfile() or member.islnk() or member.issym()):
                continue
            try:
                globs.compile_glob(name)
            except ValueError as exc:
                raise fanin.PathRefused(f"collect: {exc}") from None
            target = root / name
            if not fanin.inside(target.parent.resolve(), root) or target.is_symlink():
                raise fanin.PathRefused(f"collect: {name!r} leaves the unit folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            if member.issym():
                os.symlink(member.linkname, target)
                continue
            source = archive.extractfile(member)  # a hard link reads its first copy
            assert source is not None
            target.write_bytes(source.read())
