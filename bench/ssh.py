"""500 no-op units over one loopback sshd host with 8 slots: fanout's full path (agent,
staging, journal, sandbox none, then bwrap; then units that stage a file, read a
prompt, run verify and have the file collected) against GNU parallel -S, with and without a
warm ControlMaster, in the same run.  Then how long fanout takes, with its default
keepalives, to notice that a host froze under a running unit (``Sshd.freeze``: SIGSTOP
on sshd and everything under it), for three hosts frozen at once.  Needs root (it starts
sshd and a test user) and the test helpers in tests/sshd.py.

Usage: .venv/bin/python bench/ssh.py [UNITS] [SLOTS] [ROUNDS] [--quick]

ROUNDS (1) runs every row that many times, interleaved, and shows each row's median;
--quick measures only fanout with sandbox none and parallel -S with a warm
ControlMaster, and skips the frozen hosts.  Each row also shows the CPU time spent per
unit at both ends (this process and its children, and the sshd host with all it
started, each in a cgroup of its own), which a machine shared with other work changes
less than the wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fanout import spec
from fanout.attempt.model import Attempt
from fanout.events import Events
from fanout.journal import Journal
from fanout.outcome import Status
from fanout.run.job import Options, Runner
from fanout.spec import Host
from fanout.transports.ssh import SshTransport

from helpers import make_attempt
from procs import marker, wait_until_present
from sshd import Pool, Sshd, make_pool


def _host(pool: Pool, port: int, slots: int) -> Host:
    """The loopback host of ``pool`` with a sandbox root anyone may write to."""
    root = pool.base / "sandboxes"
    root.mkdir(mode=0o777, exist_ok=True)
    root.chmod(0o777)
    return Host(
        name="h1",
        address="127.0.0.1",
        port=port,
        user=pool.user,
        identity=str(pool.client_key),
        slots=slots,
        sandbox_root=str(root),
    )


def _timed_run(pool: Pool, host: Host, job: spec.Spec, sandbox: str, units: int) -> float:
    """Seconds ``job`` takes over ``host`` through fanout's whole path; all succeed."""

    async def run() -> float:
        runner = Runner(
            spec=job,
            transport=SshTransport([host], known_hosts=[pool.known_hosts], sandbox_kind=sandbox),
            journal=Journal(job.runtime.state_dir / "journal.sqlite"),
            environ={"PATH": "/usr/bin:/bin"},
            events=Events(),
        )
        start = time.perf_counter()
        summary = await runner.execute(Options())
        elapsed = time.perf_counter() - start
        assert summary.counts == {"succeeded": units}, summary.counts
        return elapsed

    return asyncio.run(run())


def fanout_rate(
    pool: Pool, port: int, units: int, slots: int, sandbox: str, scratch: Path
) -> float:
    host = _host(pool, port, slots)
    workdir = scratch / sandbox
    workdir.mkdir()
    (workdir / "job.toml").write_text(
        f'version = 1\nname = "ssh-{sandbox}"\n[inputs]\ncommand = ["seq", "{units}"]\n'
        f'format = "lines"\n[task]\ncommand = ["true"]\n[runtime]\n'
        f'maxConcurrentTasks = {slots}\nsandbox = "{sandbox}"\n'
    )
    job = spec.load(workdir / "job.toml")

    return _timed_run(pool, host, job, sandbox, units)


def fanout_full_rate(pool: Pool, port: int, units: int, slots: int, scratch: Path) -> float:
    """Units that use the whole attempt: a prompt, a staged file, a worker that edits
    it, verify, and the file collected back (sandbox none)."""
    host = _host(pool, port, slots)
    workdir = scratch / "full"
    (workdir / "src").mkdir(parents=True)
    for number in range(units):
        (workdir / "src" / f"f{number:05d}.txt").write_text("x" * 2000 + "\n")
    (workdir / "job.toml").write_text(
        'version = 1\nname = "ssh-full"\n[inputs]\nfiles = ["src/*.txt"]\n'
        '[units]\nstage = ["{{ unit.id }}"]\ncollect = ["{{ unit.id }}"]\n'
        '[task]\nprompt = "Edit {{ unit.id }}, please.\\n"\n'
        'command = ["sh", "-c", "cat > /dev/null; echo edited >> \\"$1\\"", "sh",'
        ' "{{ unit.id }}"]\n'
        'verify = ["grep", "-q", "edited", "{{ unit.id }}"]\n'
        f'[runtime]\nmaxConcurrentTasks = {slots}\nsandbox = "none"\n'
        "[collect]\napply = false\n"
    )
    job = spec.load(workdir / "job.toml")

    return _timed_run(pool, host, job, "none", units)


def parallel_rate(
    pool: Pool, port: int, units: int, slots: int, master: bool, scratch: Path
) -> float:
    ssh = [
        "ssh",
        "-p",
        str(port),
        "-i",
        str(pool.client_key),
        "-o",
        "BatchMode=yes",
        "-o",
        f"UserKnownHostsFile={pool.known_hosts}",
    ]
    if master:
        control = scratch / "cm-%r@%h:%p"
        ssh += [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={control}",
            "-o",
            "ControlPersist=60",
        ]
        subprocess.run([*ssh, f"{pool.user}@127.0.0.1", "true"], check=True)  # warm it
    numbers = "".join(f"{n}\n" for n in range(units))
    start = time.perf_counter()
    subprocess.run(
        ["parallel", "--ssh", " ".join(ssh), "-S", f"{slots}/{pool.user}@127.0.0.1", "true"],
        input=numbers,
        text=True,
        check=True,
        capture_output=True,
    )
    elapsed = time.perf_counter() - start
    if master:
        subprocess.run(
            [*ssh, "-O", "exit", f"{pool.user}@127.0.0.1"], capture_output=True, check=False
        )
    return elapsed


def frozen_detection(pool: Pool, scratch: Path) -> list[float]:
    """Seconds from freezing each of three hosts under a running unit to its attempt
    coming back lost, with fanout's default keepalives."""
    root = pool.base / "sandboxes"
    root.mkdir(mode=0o777, exist_ok=True)
    root.chmod(0o777)
    servers: list[Sshd] = [pool.add(f"frozen{n}") for n in range(3)]
    hosts = [pool.host(server, slots=1, sandbox_root=str(root)) for server in servers]

    async def measure() -> list[float]:
        transport = SshTransport(hosts, known_hosts=[pool.known_hosts], sandbox_kind="none")
        await transport.start()

        async def one(n: int, server: Sshd) -> float:
            token = marker()
            folder = scratch / f"frozen{n}"
            attempt = make_attempt(folder, ["sleep", token], unit_id=f"u{n}", timeout=120)
            # Freezes 1.7 s apart fall at different phases of the 5 s keepalive cycle.
            return await frozen_one(transport, attempt, server, token, 1.0 + 1.7 * n)

        try:
            return list(await asyncio.gather(*(one(n, s) for n, s in enumerate(servers))))
        finally:
            await transport.close()

    return asyncio.run(measure())


async def frozen_one(
    transport: SshTransport, attempt: Attempt, server: Sshd, token: str, after: float
) -> float:
    running = asyncio.create_task(transport.run(attempt))
    while not await asyncio.to_thread(wait_until_present, token, 0.5):
        pass
    await asyncio.sleep(after)
    frozen = time.perf_counter()
    server.freeze()
    result = await running
    assert result.status is Status.LOST, result
    return time.perf_counter() - frozen


class CpuMeter:
    """The CPU time of a process tree, by a cgroup of its own (v1 cpuacct, as root):
    what a process forks stays in it, a daemonised ssh ControlMaster too."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, name: str, pid: int) -> None:
        self.home = self._current(pid)
        self.path = self.ROOT / f"fanout-bench-{os.getpid()}-{name}"
        self.path.mkdir()
        (self.path / "cgroup.procs").write_text(str(pid))

    @classmethod
    def start(cls, name: str, pid: int) -> CpuMeter | None:
        try:
            return cls(name, pid)
        except OSError:
            return None  # no cgroup v1 cpuacct here, or not root: no CPU column

    def _current(self, pid: int) -> Path:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, where = line.split(":", 2)
            if "cpuacct" in controllers.split(","):
                return self.ROOT / where.lstrip("/")
        raise OSError("no cpuacct cgroup")

    def seconds(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def close(self) -> None:
        """Back where it came from (whatever still runs in it), and the cgroup gone."""
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (self.home / "cgroup.procs").write_text(pid)
            self.path.rmdir()


def main() -> None:
    flags = [arg for arg in sys.argv[1:] if arg.startswith("--")]
    numbers = [int(arg) for arg in sys.argv[1:] if not arg.startswith("--")]
    defaults = [500, 8, 1]
    units, slots, rounds = [*numbers, *defaults[len(numbers) :]][:3]
    quick = "--quick" in flags
    pool = make_pool()
    scratch = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    here = CpuMeter.start("here", os.getpid())
    host: CpuMeter | None = None
    try:
        server = pool.add("h1")
        assert server.process is not None
        host = CpuMeter.start("host", server.process.pid)
        port = server.port
        measures: list[tuple[str, Callable[[Path], float]]] = [
            ("fanout, sandbox none", lambda s: fanout_rate(pool, port, units, slots, "none", s)),
            ("fanout, sandbox bwrap", lambda s: fanout_rate(pool, port, units, slots, "bwrap", s)),
            (
                "fanout, none, prompt + stage + verify + collect",
                lambda s: fanout_full_rate(pool, port, units, slots, s),
            ),
            (PARALLEL, lambda s: parallel_rate(pool, port, units, slots, False, s)),
            (MASTER, lambda s: parallel_rate(pool, port, units, slots, True, s)),
        ]
        if quick:  # the slowest row, and the bwrap and full rows, left out
            measures = [m for m in measures if m[0] in ("fanout, sandbox none", MASTER)]
        # Rounds interleave the rows, so that a change in the machine's load touches
        # each row alike; each row shows its median.
        for number in range(rounds):
            for index, (name, measure) in enumerate(measures):
                folder = scratch / f"r{number}-{index}"  # short: a ControlPath is in it
                folder.mkdir()
                meters = [m for m in (here, host) if m is not None]
                before = sum(m.seconds() for m in meters)
                walls.setdefault(name, []).append(measure(folder))
                time.sleep(0.5)  # the host's last processes exit
                cpus.setdefault(name, []).append(sum(m.seconds() for m in meters) - before)
        frozen = [] if quick else frozen_detection(pool, scratch)
    finally:
        pool.close()
        shutil.rmtree(scratch, ignore_errors=True)
        for meter in (here, host):
            if meter is not None:
                meter.close()
    measured = here is not None and host is not None
    wall = {name: statistics.median(values) for name, values in walls.items()}
    print(f"{units} no-op units over one loopback sshd host, {slots} slots,")
    print(f"median of {rounds} interleaved round(s)\n")
    print(
        "| tool | wall s | units/s | vs parallel -S | vs parallel -S + ControlMaster"
        " | CPU ms/unit, both ends |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, seconds in wall.items():
        plain = f"{wall[PARALLEL] / seconds:.2f}x" if PARALLEL in wall else "-"
        master = f"{wall[MASTER] / seconds:.2f}x"
        cpu = f"{statistics.median(cpus[name]) / units * 1000:.1f}" if measured else "-"
        print(f"| {name} | {seconds:.2f} | {units / seconds:.0f} | {plain} | {master} | {cpu} |")
    if measured:
        print(
            "\n(CPU: this process and its children, and the sshd host with everything"
            " it started, by a cgroup each: what the machine spent per unit.)"
        )
    if frozen:
        print("\nA host frozen under a running unit (default keepalives), three hosts:\n")
        print("| noticed after, s: min | max |")
        print("| ---: | ---: |")
        print(f"| {min(frozen):.1f} | {max(frozen):.1f} |")


PARALLEL = "GNU parallel -S"
MASTER = "GNU parallel -S, warm ControlMaster"


if __name__ == "__main__":
    main()
