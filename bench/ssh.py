"""500 no-op units over one loopback sshd host with 8 slots: fanout's full path (agent,
staging, journal, sandbox none, then bwrap; then units that stage a file, read a
prompt, run verify and have the file collected) against GNU parallel -S, with and without a
warm ControlMaster, in the same run.  Then how long fanout takes, with its default
keepalives, to notice that a host froze under a running unit (``Sshd.freeze``: SIGSTOP
on sshd and everything under it), for three hosts frozen at once.  Needs root (it starts
sshd and a test user) and the test helpers in tests/sshd.py.

Usage: .venv/bin/python bench/ssh.py [UNITS] [SLOTS]
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
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


def main() -> None:
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    slots = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    pool = make_pool()
    scratch = Path(tempfile.mkdtemp(prefix="fanout-bench-"))
    try:
        server = pool.add("h1")
        rows = [
            ("fanout, sandbox none", fanout_rate(pool, server.port, units, slots, "none", scratch)),
            (
                "fanout, sandbox bwrap",
                fanout_rate(pool, server.port, units, slots, "bwrap", scratch),
            ),
            (
                "fanout, none, prompt + stage + verify + collect",
                fanout_full_rate(pool, server.port, units, slots, scratch),
            ),
            ("GNU parallel -S", parallel_rate(pool, server.port, units, slots, False, scratch)),
            (
                "GNU parallel -S, warm ControlMaster",
                parallel_rate(pool, server.port, units, slots, True, scratch),
            ),
        ]
        frozen = frozen_detection(pool, scratch)
    finally:
        pool.close()
        shutil.rmtree(scratch, ignore_errors=True)
    base = dict(rows)["GNU parallel -S, warm ControlMaster"]
    print(f"{units} no-op units over one loopback sshd host, {slots} slots\n")
    print("| tool | wall s | units/s | vs parallel + ControlMaster |")
    print("| --- | ---: | ---: | ---: |")
    for name, wall in rows:
        print(f"| {name} | {wall:.2f} | {units / wall:.0f} | {base / wall:.2f}x |")
    print("\nA host frozen under a running unit (default keepalives), three hosts:\n")
    print("| noticed after, s: min | max |")
    print("| ---: | ---: |")
    print(f"| {min(frozen):.1f} | {max(frozen):.1f} |")


if __name__ == "__main__":
    main()
