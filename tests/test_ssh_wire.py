"""The wire format and the remote agent, spoken to directly: the real ``agent.sh`` under
this machine's ``sh`` on pipes (what sshd gives it, without SSH), and the staged tar
streamed as the files are read."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fanout.attempt.capture import OutputCapture
from fanout.attempt.collecting import Entry, Kind
from fanout.attempt.sandbox import Command, StagedFile
from fanout.transports.ssh import wire

TOKEN = "0123456789abcdef"


@dataclass
class Agent:
    process: asyncio.subprocess.Process
    base: Path

    @property
    def stdout(self) -> asyncio.StreamReader:
        assert self.process.stdout is not None
        return self.process.stdout

    async def send(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def run(self, tmp_path: Path, command: Command) -> tuple[int, str]:
        """One step: its status and its output."""
        capture = OutputCapture(tmp_path / "step.log", log_limit=1 << 20, tail_limit=1 << 20)
        assert self.process.stderr is not None
        await self.send(wire.run(command, backstop=30, mark="abc123"))
        status = await wire.status(self.stdout)
        await wire.read_output(self.process.stderr, "abc123", capture)
        capture.close()
        return status, capture.tail


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    root = tmp_path / "root"
    root.mkdir()
    process = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        wire.agent_script(),
        "fanout",
        str(root),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ["PATH"], "AGENT_OWN": "never seen"},
    )
    talking = Agent(process, root / f"fanout-{TOKEN}")
    await talking.send(wire.open_sandbox(TOKEN, ("work",)))
    try:
        yield talking
    finally:
        assert process.stdin is not None
        process.stdin.close()
        await asyncio.wait_for(process.wait(), 10)
        # At EOF the agent removed whatever sandbox it had.
        assert list(root.iterdir()) == []


def _command(agent: Agent, argv: list[str], **more: object) -> Command:
    env = {"PATH": os.environ["PATH"], "HOME": str(agent.base)}
    options: dict[str, object] = {
        "env": env,
        "stdin": b"",
        "cwd": f"{agent.base}/work",
        "program": argv[0],
    }
    options.update(more)
    return Command(argv=tuple(argv), **options)  # type: ignore[arg-type]


HOSTILE = 'it\'s a $(touch pwned) `x` "q"; \\ \n second line\n\n'


async def test_a_step_gets_exactly_its_argv_environment_and_stdin(
    agent: Agent, tmp_path: Path
) -> None:
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "ODD": HOSTILE, "EMPTY": ""}
    script = (
        "import json, os, sys; print(json.dumps([dict(os.environ), sys.argv[1:],"
        " os.getcwd(), sys.stdin.read()]))"
    )
    status, output = await agent.run(
        tmp_path,
        _command(agent, [sys.executable, "-c", script, HOSTILE, ""], env=env, stdin=b"in\n\n"),
    )
    assert status == 0
    assert json.loads(output) == [env, [HOSTILE, ""], f"{agent.base}/work", "in\n\n"]
    assert not (agent.base / "work" / "pwned").exists()


async def test_an_exit_status_comes_back_as_it_is_124_too(agent: Agent, tmp_path: Path) -> None:
    """The agent never says "timeout": only fanout's own deadline decides one."""
    for code in (0, 3, 124, 137):
        status, _ = await agent.run(tmp_path, _command(agent, ["sh", "-c", f"exit {code}"]))
        assert status == code


async def test_listing_cat_and_get_never_follow_a_symlink(agent: Agent, tmp_path: Path) -> None:
    names = ["notes[draft].md", "a b", "new\nline", "ünï", "-x"]
    script = (
        'for n in "$@"; do printf %s "$n" > "$n"; done; mkdir d; echo in > d/f;'
        " ln -s /etc d/up; ln -s /etc/passwd ../control.json; mkfifo fifo"
    )
    status, _ = await agent.run(tmp_path, _command(agent, ["sh", "-c", script, "sh", *names]))
    assert status == 0
    await agent.send(wire.listing(["."]))
    listed = await wire.entries(agent.stdout)
    assert sorted(listed, key=lambda e: e.path) == sorted(
        [
            *(Entry(name, Kind.FILE) for name in names),
            Entry("d", Kind.DIR),
            Entry("d/f", Kind.FILE),
            Entry("d/up", Kind.LINK),
            Entry("fifo", Kind.OTHER),
        ],
        key=lambda e: e.path,
    )
    await agent.send(wire.listing(["d/up", "-x", "missing"]))
    assert await wire.entries(agent.stdout) == [Entry("d/up", Kind.LINK), Entry("-x", Kind.FILE)]
    await agent.send(wire.cat("control.json", 100))
    assert await wire.data(agent.stdout) is None  # a symlink the worker planted
    await agent.send(wire.get([*names, "d/f", "d/up"]))
    spool = io.BytesIO()
    await wire.data_to(agent.stdout, spool)
    spool.seek(0)
    destination = tmp_path / "collected"
    destination.mkdir()
    wire.extract(spool, [*names, "d/f", "d/up"], destination)
    got = sorted(str(p.relative_to(destination)) for p in destination.rglob("*"))
    assert got == sorted([*names, "d", "d/f"])
    for name in names:
        assert (destination / name).read_text() == name
    await agent.send(wire.close(sweep=True))
    await wire.done(agent.stdout)
    assert not agent.base.exists()


async def test_staged_files_arrive_with_their_bits(agent: Agent, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    tool = workspace / "tool"
    tool.write_text("#!/bin/sh\necho ran\n")
    tool.chmod(0o751)
    tar = wire.StagedTar([StagedFile(path="bin/tool", source=tool)])
    await agent.send(f"put {tar.size}\n".encode())
    for chunk in tar.chunks():
        await agent.send(chunk)
    status, output = await agent.run(tmp_path, _command(agent, ["sh", "-c", "bin/tool"]))
    assert (status, output) == (0, "ran\n")
    assert (agent.base / "work" / "bin" / "tool").stat().st_mode & 0o7777 == 0o751


def test_the_staged_tar_is_as_long_as_it_says_and_gnu_tar_reads_it(tmp_path: Path) -> None:
    files = []
    for number, name in enumerate(["a.txt", "ünï/cödé", "x" * 150 + "/long", "new\nline", "e"]):
        source = tmp_path / f"source{number}"
        source.write_bytes(os.urandom(number * 700))
        files.append(StagedFile(path=name, source=source))
    tar = wire.StagedTar(files)
    data = b"".join(tar.chunks())
    assert len(data) == tar.size
    assert tar.size % tarfile.RECORDSIZE == 0
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        assert archive.getnames() == [f.path for f in files]
    out = tmp_path / "out"
    out.mkdir()
    subprocess.run(["tar", "-x", "-f", "-", "-C", str(out)], input=data, check=True)
    for item in files:
        assert (out / item.path).read_bytes() == item.source.read_bytes()


@pytest.mark.parametrize(("change", "then"), [(b"more", "it grew"), (None, "it shrank to 2 bytes")])
def test_a_file_that_changes_while_staged_is_refused(
    tmp_path: Path, change: bytes | None, then: str
) -> None:
    source = tmp_path / "file"
    source.write_bytes(b"12345")
    tar = wire.StagedTar([StagedFile(path="f", source=source)])
    if change is None:
        source.write_bytes(b"12")
    else:
        with source.open("ab") as stream:
            stream.write(change)
    with pytest.raises(OSError) as caught:
        b"".join(tar.chunks())
    assert (caught.value.strerror, caught.value.filename) == (
        f"changed while being staged (5 bytes, then {then})",
        str(source),
    )


def test_only_regular_files_are_staged(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(OSError) as caught:
        wire.StagedTar([StagedFile(path="f", source=tmp_path / "fifo")])
    assert (caught.value.strerror, caught.value.filename) == (
        "not a regular file",
        str(tmp_path / "fifo"),
    )
