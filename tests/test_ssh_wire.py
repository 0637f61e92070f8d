"""The wire format and the remote agent, spoken to directly: the real ``agent.sh`` under
this machine's ``sh`` on pipes (what sshd gives it, without SSH), and the staged tar
streamed as the files are read."""

from __future__ import annotations

import asyncio
import glob
import io
import json
import os
import secrets
import shutil
import signal
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

from procs import pids_with, wait_until_gone

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


async def _start(root: Path, python: str, path: str = os.environ["PATH"]) -> Agent:
    """The agent as the pool starts it (its keeper run by ``python``; "": none)."""
    process = await asyncio.create_subprocess_exec(
        "sh",
        "-c",
        wire.agent_script(),
        "fanout",
        str(root),
        secrets.token_hex(8),  # names the keeper's FIFOs in /tmp: one per agent
        python,
        wire.keeper_script() if python else "",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": path, "AGENT_OWN": "never seen"},
    )
    return Agent(process, root / f"fanout-{TOKEN}")


@pytest.fixture(params=["keeper", "no python3"])
async def agent(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Agent]:
    root = tmp_path / "root"
    root.mkdir()
    talking = await _start(root, sys.executable if request.param == "keeper" else "")
    process = talking.process
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
    await agent.send(wire.close("sweep"))
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


# What the agent spawns ------------------------------------------------------------

LOGGED = ("mkdir", "rm", "grep")


def _logging_path(tmp_path: Path) -> tuple[str, Path]:
    """A PATH for the agent whose ``mkdir``, ``rm`` and ``grep`` write their names to a
    log before they run (the steps have a PATH of their own: only the agent's count)."""
    shims, log = tmp_path / "shims", tmp_path / "spawned.log"
    shims.mkdir()
    for name in LOGGED:
        real = shutil.which(name)
        shim = shims / name
        shim.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec {real} "$@"\n')
        shim.chmod(0o755)
    return f"{shims}:{os.environ['PATH']}", log


async def _units(agent: Agent, tmp_path: Path, tokens: list[str], script: str = "true") -> None:
    """One sandbox after another, each running ``script``, closed as under unshare."""
    for token in tokens:
        agent.base = agent.base.parent / f"fanout-{token}"
        await agent.send(wire.open_sandbox(token, ("work",)))
        status, _ = await agent.run(tmp_path, _command(agent, ["sh", "-c", script]))
        assert status == 0
        await agent.send(wire.close("ended"))
        assert await wire.done(agent.stdout) is None
        assert not agent.base.exists()


async def _stop(agent: Agent) -> None:
    assert agent.process.stdin is not None
    agent.process.stdin.close()
    await asyncio.wait_for(agent.process.wait(), 10)


def _keeper(agent: Agent, root: Path) -> int:
    (keeper,) = [pid for pid in pids_with(str(root)) if pid != agent.process.pid]
    return keeper


def agent_token(keeper: int) -> str:
    """The agent's token, from its keeper's argv (its FIFOs' paths)."""
    argv = Path(f"/proc/{keeper}/cmdline").read_bytes().split(b"\0")
    return argv[-2].decode().removeprefix("/tmp/fanout-keeper-").removesuffix("-in")


async def test_with_a_keeper_a_unit_costs_the_host_no_mkdir_rm_or_grep(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    path, log = _logging_path(tmp_path)
    agent = await _start(root, sys.executable, path)
    await _units(agent, tmp_path, [f"{n:016x}" for n in range(3)])
    fifos = f"/tmp/fanout-keeper-{agent_token(_keeper(agent, root))}-*"
    assert glob.glob(fifos) == []  # unlinked before the keeper's first answer
    await _stop(agent)
    assert not log.exists()
    assert list(root.iterdir()) == []
    assert wait_until_gone(str(root)) == []  # the keeper exited with its agent


async def test_without_python3_the_agent_makes_and_removes_sandboxes_itself(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    path, log = _logging_path(tmp_path)
    agent = await _start(root, "", path)
    await _units(agent, tmp_path, [f"{n:016x}" for n in range(3)])
    await _stop(agent)
    # No grep: an unshare'd step's namespace was empty when its step returned.
    assert log.read_text().split() == ["mkdir", "rm"] * 3
    assert list(root.iterdir()) == []


async def test_a_keeper_gone_leaves_the_agent_to_do_its_work(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    path, log = _logging_path(tmp_path)
    agent = await _start(root, sys.executable, path)
    await _units(agent, tmp_path, ["00000000000000a1"])
    os.kill(_keeper(agent, root), signal.SIGKILL)
    await _units(agent, tmp_path, ["00000000000000a2", "00000000000000a3"])
    await _stop(agent)
    assert log.read_text().split() == ["mkdir", "rm"] * 2
    assert list(root.iterdir()) == []


async def test_what_the_keeper_cannot_remove_the_agent_removes(tmp_path: Path) -> None:
    """Folders a worker shut (chmod 000) and a tree deeper than Python's recursion limit:
    the keeper gives up, the agent's ``rm`` and ``chmod`` do what they always did."""
    root = tmp_path / "root"
    root.mkdir()
    path, log = _logging_path(tmp_path)
    agent = await _start(root, sys.executable, path)
    deep = "mkdir -p $(printf 'd/%.0s' $(seq 1200))"
    await _units(agent, tmp_path, ["00000000000000b1"], "mkdir -p s/t && chmod 000 s/t s")
    await _units(agent, tmp_path, ["00000000000000b2"], deep)
    await _stop(agent)
    assert set(log.read_text().split()) <= {"rm"}
    assert list(root.iterdir()) == []


async def test_the_last_step_closes_its_sandbox_in_its_answer(agent: Agent, tmp_path: Path) -> None:
    """The attempt's last step with nothing to collect: its answer, the control file
    and the sandbox's end come back together, and the agent serves the next one."""
    for number, script in enumerate(["echo out", "echo '{}' > ../control.json; exit 3"]):
        if number:  # the first: the fixture's
            agent.base = agent.base.parent / "fanout-00000000000000c1"
            await agent.send(wire.open_sandbox("00000000000000c1", ("work",)))
        command = _command(agent, ["sh", "-c", script])
        assert agent.process.stderr is not None
        await agent.send(
            wire.run(
                command, backstop=30, mark="abc123", then=(100, "control.json"), ending="ended"
            )
        )
        assert await wire.status(agent.stdout) == 3 * number
        assert await wire.data(agent.stdout) == (b"{}\n" if number else None)
        assert await wire.done(agent.stdout) is None
        assert not agent.base.exists()
        capture = OutputCapture(tmp_path / f"{number}.log", log_limit=1 << 20, tail_limit=1 << 20)
        await wire.read_output(agent.process.stderr, "abc123", capture)
        capture.close()
        assert capture.tail == ("out\n" if number == 0 else "")
