"""Hostile unit values: NUL bytes and lone surrogates are refused per unit, the same way
on every transport, before any process starts; so are values longer than a program or
a file system takes (an argument, a stage path), where they once passed validate and
plan and failed at run time, or exited 70."""

from __future__ import annotations

import asyncio
import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.attempt.seam import Transport
from fanout.run.job import Options
from fanout.transports.local import LocalTransport

from helpers import cli, make_runner, run_report, write_job
from procs import pids_with, short_marker

NUL_REASON = (
    "template: task.command[4]: the value contains a NUL byte"
    " (unit values cannot pass NUL to a program)"
)
SURROGATE_REASON = (
    "template: task.prompt: the value is not valid UTF-8"
    " (a lone surrogate U+D800 at character 0; unit values must be text)"
)


def _hostile_job(tmp_path: Path, shared: Path) -> tuple[spec.Spec, str]:
    """Three units: one fine, one with a NUL in an argument, one with a lone surrogate
    in its prompt (as a JSON input yields them); each started worker leaves a line in
    ``shared/done.txt`` and sleeps a findable marker."""
    token = short_marker()
    records = [
        {"id": "fine", "v": "plain", "p": "hello"},
        {"id": "nul", "v": "a\u0000b", "p": "hello"},
        {"id": "surrogate", "v": "plain", "p": "\ud800"},
    ]
    (tmp_path / "units.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    done = shared / "done.txt"
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "hostile"
            [inputs]
            jsonl = "units.jsonl"
            [units]
            id = "{{{{ unit.items[0].id }}}}"
            [task]
            prompt = "{{{{ unit.items[0].p }}}}"
            command = ["sh", "-c", "cat >/dev/null; echo \\"$1\\" >> {done}; sleep {token}", "sh", "{{{{ unit.items[0].v }}}}"]
            timeout = "30s"
            [runtime]
            sandbox = "none"
            """,
        )
    )
    return job, token


async def _run_and_check(job: spec.Spec, transport: Transport, token: str, done: Path) -> None:
    runner = make_runner(job, transport)
    # A worker left blocked on a prompt it cannot be sent would hang the run: bound it.
    summary = await asyncio.wait_for(runner.execute(Options()), 60)
    assert summary.counts == {"failed": 2, "succeeded": 1}
    rows = {r.unit.id: r for r in runner.journal.units(summary.run_id)}
    assert rows["nul"].reason == NUL_REASON
    assert rows["surrogate"].reason == SURROGATE_REASON
    assert rows["fine"].reason == "ok"
    assert await asyncio.to_thread(done.read_text) == "plain\n"
    assert pids_with(token) == []
    runner.journal.close()


async def test_hostile_values_are_refused_locally(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    job, token = _hostile_job(tmp_path, shared)
    root = tmp_path / "sandboxes"
    root.mkdir()
    transport = LocalTransport(slots=4, sandbox_kind="none", root=root, path=os.environ["PATH"])
    await _run_and_check(job, transport, token, shared / "done.txt")


@pytest.mark.slow
async def test_hostile_values_are_refused_over_ssh_the_same_way(
    ssh_pool: Any, tmp_path: Path
) -> None:
    from fanout.transports.ssh import SshTransport

    server = ssh_pool.add("h1")
    shared = ssh_pool.base / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    host = ssh_pool.host(server)
    job, token = _hostile_job(tmp_path, shared)
    transport = SshTransport(
        [host], known_hosts=[ssh_pool.known_hosts], sandbox_kind="none", rng=random.Random(3)
    )
    await _run_and_check(job, transport, token, shared / "done.txt")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        (
            "{{ 'x' * 300 }}",
            "stage: 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' has a name of 300"
            " bytes; a file name can be 255 at most",
        ),
        (
            "{{ range(100000) | join(',') }}",
            "stage: '0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,…' is 588,889 bytes"
            " long; a path can be 4,095 at most",
        ),
    ],
)
def test_a_path_no_file_system_takes_fails_its_unit_with_a_reason(
    chdir_tmp: Path, path: str, reason: str
) -> None:
    # Both passed validate and plan, then failed every unit with "fanout internal
    # error: OSError: [Errno 36] File name too long".
    write_job(
        chdir_tmp,
        f"""
        version = 1
        name = "long-paths"
        [inputs]
        items = ["a", "b"]
        [units]
        stage = ["{path}"]
        [task]
        command = ["true"]
        """,
    )
    planned = cli("plan", "job.toml")
    assert planned.code == 2
    assert planned.err.splitlines()[-1] == (
        f"job.toml:7:10: units.stage[0]: {reason.removeprefix('stage: ')} (rendered for unit 'a')"
    )
    ran = cli("run", "job.toml")
    assert ran.code == 1, ran.out + ran.err
    assert {(u["unit"], u["reason"]) for u in run_report(chdir_tmp)["units"]} == {
        ("a", reason),
        ("b", reason),
    }


def test_an_argument_too_long_for_a_program_is_a_located_problem(chdir_tmp: Path) -> None:
    # It failed at run time only, with the worker's "Argument list too long".
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "long-argument"
        [inputs]
        items = ["a"]
        [task]
        command = ["echo", "{{ range(100000) | join(',') }}"]
        env = { LONG = "{{ 'x' * 200000 }}" }
        """,
    )
    planned = cli("plan", "job.toml")
    assert planned.code == 2
    assert planned.err.splitlines()[-1] == (
        "job.toml:8:16: task.env.LONG: the value is 200,005 bytes; an environment variable"
        " can be 131,071 at most (rendering for unit 'a')"
    )
    ran = cli("run", "job.toml")
    assert ran.code == 1
    (unit,) = run_report(chdir_tmp)["units"]
    assert unit["reason"] == (
        "template: task.env.LONG: the value is 200,005 bytes; an environment variable can be"
        " 131,071 at most"
    )


def test_a_command_name_too_long_for_a_file_system_is_not_found(chdir_tmp: Path) -> None:
    # The start check exited 70 ("internal error: OSError: File name too long").
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "long-command"
        [inputs]
        items = ["a"]
        [task]
        command = ["{{ 'x' * 300 }}"]
        """,
    )
    ran = cli("run", "job.toml")
    assert ran.code == 4, ran.err
    assert ran.err.splitlines()[0] == (
        f"task.command: cannot start {'x' * 300}: it has a name of 300 bytes; a file name can"
        " be 255 at most"
    )
