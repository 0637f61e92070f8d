"""The start check: a worker command that cannot start is named by `plan` and refused by
`run` before anything is dispatched, on this machine (real bwrap) and on SSH hosts
(real sshd); a failed attempt's line shows what the worker said last."""

from __future__ import annotations

import asyncio
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.errors import HostsUnavailable
from fanout.isolation import tools as sandbox
from fanout.journal import Journal
from fanout.run.job import Options, Runner
from fanout.spec import Host
from fanout.transports import preflight as commands
from fanout.transports.ssh import SshTransport

from helpers import cli, make_runner, wrapped, write_job

MISSING = "fanout-test-no-such-tool"
# fanout puts its own bin first on the PATH workers get (cli.app.environ).
FANOUT_BIN = os.path.dirname(sys.executable)

needs_bwrap = pytest.mark.skipif(
    sandbox.choose("auto").kind != "bwrap", reason="bubblewrap cannot create namespaces here"
)


def _job(directory: Path, command: str, *, sandbox_kind: str = "none", more: str = "") -> Path:
    return write_job(
        directory,
        f"""
        version = 1
        name = "start"
        [inputs]
        items = ["a", "b"]
        [task]
        command = [{command}, "-p"]
        {more}
        [runtime]
        sandbox = "{sandbox_kind}"
        [[retry.ladder]]
        name = "small"
        attempts = 2
        [[retry.ladder]]
        name = "big"
        """,
    )


def _tool(directory: Path, name: str = "claude") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text("#!/bin/sh\necho started\n")
    tool.chmod(0o755)
    return tool


def _commands_lines(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("Commands  "))
    end = next(n for n in range(start + 1, len(lines)) if not lines[n].startswith("    "))
    return lines[start:end]


def _unit_lines(out: str) -> list[str]:
    """The plain lines about unit a, without their clock and with durations as T."""
    clock = re.compile(r"\d\d:\d\d:\d\d ")
    lines = [line[9:] for line in out.splitlines() if clock.match(line)]
    about_a = [line for line in lines if re.search(r"(^| )a[ :]", line)]
    return [re.sub(r" in \d+\.\ds:", " in T:", line) for line in about_a]


def test_plan_warns_for_a_missing_command(chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{chdir_tmp}/bin:/usr/bin:/bin")
    _job(chdir_tmp, f'"{MISSING}"')
    result = cli("plan", "job.toml")
    assert result.code == 0, result.err
    assert _commands_lines(result.out) == [
        f"Commands  WARNING task.command: cannot start {MISSING}: not found on the PATH"
        f" workers get ({FANOUT_BIN}:{chdir_tmp}/bin:/usr/bin:/bin)",
        "          `fanout run` refuses to start until this is fixed",
    ]


@needs_bwrap
def test_plan_warns_for_commands_bwrap_hides_and_finds_what_it_binds(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not chdir_tmp.is_relative_to("/tmp"):
        pytest.skip("the test's directory is not under /tmp")
    # npm's layout: bin/claude is a symlink into lib/; here only a link to it is on
    # PATH, from a directory whose prefix does not hold it.
    real = _tool(chdir_tmp / "npm" / "lib" / "claude-code", "cli.js")
    (chdir_tmp / "npm" / "bin").mkdir()
    (chdir_tmp / "npm" / "bin" / "claude").symlink_to(real)
    (chdir_tmp / "links" / "bin").mkdir(parents=True)
    (chdir_tmp / "links" / "bin" / "claude").symlink_to(chdir_tmp / "npm" / "bin" / "claude")
    configured = _tool(Path(os.environ["HOME"]) / ".config" / "fanout" / "bin", "agent")
    monkeypatch.setenv("PATH", f"{chdir_tmp}/links/bin:{configured.parent}:/usr/bin:/bin")
    _job(chdir_tmp, '"claude"', sandbox_kind="bwrap", more='verify = ["agent"]')
    hidden = cli("plan", "job.toml")
    assert hidden.code == 0, hidden.err
    assert _commands_lines(hidden.out) == [
        "Commands  WARNING task.command: cannot start claude: claude resolves to"
        f" {chdir_tmp}/npm/bin/claude (through {chdir_tmp}/links/bin/claude), under /tmp,"
        " which bwrap replaces with a private /tmp",
        f"          WARNING task.verify: cannot start agent: agent resolves to {configured},"
        f" under {configured.parent.parent}, which the sandbox hides from workers"
        " (fanout's state, configuration and keys)",
        "          `fanout run` refuses to start until this is fixed",
    ]
    # npm's bin directory on PATH: fanout binds its prefix into the sandbox.
    monkeypatch.setenv("PATH", f"{chdir_tmp}/npm/bin:/usr/bin:/bin")
    _job(chdir_tmp, '"claude"', sandbox_kind="bwrap", more='verify = ["true"]')
    bound = cli("plan", "job.toml")
    assert _commands_lines(bound.out) == [
        f"Commands  task.command: claude -> {chdir_tmp}/npm/bin/claude",
        "          task.verify: true -> /usr/bin/true",
    ]


@needs_bwrap
def test_the_check_agrees_with_bwrap(tmp_path: Path) -> None:
    """What the check calls hidden fails under the real sandbox, and what it finds runs."""
    if not tmp_path.is_relative_to("/tmp"):
        pytest.skip("the test's directory is not under /tmp")
    real = _tool(tmp_path / "npm" / "bin")
    (tmp_path / "links" / "bin").mkdir(parents=True)
    (tmp_path / "links" / "bin" / "claude").symlink_to(real)
    job = spec.load(_job(tmp_path, '"claude"', sandbox_kind="bwrap"))
    box = tmp_path / "box"  # the sandbox directory is visible: it must not hold the tool
    box.mkdir()
    for path, started in ((f"{tmp_path}/links/bin", False), (f"{tmp_path}/npm/bin", True)):
        workers = commands.Workers(
            path=f"{path}:/usr/bin:/bin", sandbox="bwrap", workspace=tmp_path, hidden=()
        )
        checked = commands.check(job, workers)
        assert bool(checked.found) is started, checked
        argv = wrapped("bwrap", ["claude"], box, tools=sandbox.bound_tools(path))
        ran = subprocess.run(
            argv, env={"PATH": workers.path}, capture_output=True, text=True, check=False
        )
        assert (ran.returncode == 0) is started, ran.stderr


def test_run_refuses_before_any_unit_starts(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    _job(chdir_tmp, f'"{MISSING}"', more=f'verify = ["{chdir_tmp}/gone/check"]')
    result = cli("run", "job.toml")
    assert (result.code, result.out) == (4, "")
    assert result.err == (
        f"task.command: cannot start {MISSING}: not found on the PATH workers get"
        f" ({FANOUT_BIN}:/usr/bin:/bin)\n"
        f"task.verify: cannot start {chdir_tmp}/gone/check: no such file\n"
        "no unit was started; `fanout plan job.toml` shows where each command resolves\n"
    )
    journal = Journal(chdir_tmp / ".fanout" / "journal.sqlite")
    try:
        assert journal.runs() == []
    finally:
        journal.close()


def test_auto_without_bwrap_refuses_a_job_that_hands_out_tokens_before_it_starts(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine without bwrap (none on the PATH): sandbox auto means plain
    directories, which neither hide the other units from workers given tokens and
    secrets nor give network "apis".  Refused at the start (exit 4), nothing recorded:
    the issue saw a stopped run instead."""
    _tool(chdir_tmp / "bin")
    monkeypatch.setenv("PATH", f"{chdir_tmp}/bin")
    monkeypatch.setenv("CRM_TOKEN", "crm-secret")
    monkeypatch.setenv("ANTHROPIC_KEY", "sk-real")
    _job(
        chdir_tmp,
        '"claude"',
        sandbox_kind="auto",
        more='secrets = ["CRM_TOKEN"]\n[[apis]]\nname = "anthropic"\n'
        'upstream = "https://api.anthropic.com"\nstyle = "anthropic"\nkeySecret = "ANTHROPIC_KEY"',
    )
    text = (chdir_tmp / "job.toml").read_text()
    (chdir_tmp / "job.toml").write_text(text.replace('sandbox = "auto"', 'network = "apis"'))
    where = (
        "runtime.sandbox: 'auto' gives plain directories on this machine (bubblewrap is not"
        " installed or cannot create namespaces here)"
    )
    expected = [
        f"{where}, which do not hide the coordinator, the other units or this user's files"
        " from a worker: it could read the other running units' API tokens and the job's"
        " task.secrets in /proc and keep them wherever its user can write; install bubblewrap"
        " (apt-get install bubblewrap), or set runtime.unsandboxedSecrets = true to accept"
        " that",
        f'{where}: runtime.network = "apis" needs bwrap sandboxes (a network namespace of'
        " their own in which only the gateway is reachable); sandbox 'none' cannot limit a"
        " worker's network: install bubblewrap, or set runtime.network = true",
    ]
    result = cli("run", "job.toml")
    assert (result.code, result.out) == (4, "")
    assert result.err.splitlines() == [
        *expected,
        "no unit was started; `fanout plan job.toml` shows where each command resolves",
    ]
    journal = Journal(chdir_tmp / ".fanout" / "journal.sqlite")
    try:
        assert journal.runs() == []
    finally:
        journal.close()
    planned = cli("plan", "job.toml")
    assert planned.code == 0, planned.err
    assert _commands_lines(planned.out) == [
        f"Commands  task.command: claude -> {chdir_tmp}/bin/claude",
        f"          WARNING {expected[0]}",
        f"          WARNING {expected[1]}",
        "          `fanout run` refuses to start until this is fixed",
    ]


def test_a_unit_dependent_command_is_skipped_and_its_attempts_say_why(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "varies"
        [inputs]
        items = [{ id = "a", tool = "fanout-test-gone" }]
        [task]
        command = ["{{ unit.record.tool }}"]
        [runtime]
        sandbox = "none"
        """,
    )
    plan = cli("plan", "job.toml")
    assert _commands_lines(plan.out) == [
        "Commands  task.command: '{{ unit.record.tool }}' depends on unit: not checked"
    ]
    ran = cli("run", "job.toml")
    assert ran.code == 1, ran.err
    # The guard's own words, on the attempt's line and on the unit's.
    said = "worker exited with status 127: fanout: cannot start fanout-test-gone: command not found"
    assert _unit_lines(ran.err) == [
        f"a: attempt 1 (default) failed in T: {said}",
        f"FAILED a after 1 attempt(s), rung default: {said}",
    ]


def test_a_failed_attempt_shows_the_workers_last_line(chdir_tmp: Path) -> None:
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "says"
        [inputs]
        items = ["a"]
        [task]
        command = ["sh", "-c", "echo working; echo 'Error: the model refused' >&2; echo; exit 3"]
        [runtime]
        sandbox = "none"
        """,
    )
    ran = cli("run", "job.toml")
    assert ran.code == 1, ran.err
    said = "worker exited with status 3: Error: the model refused"
    assert _unit_lines(ran.err) == [
        f"a: attempt 1 (default) failed in T: {said}",
        f"FAILED a after 1 attempt(s), rung default: {said}",
    ]


# SSH: the check runs on each host, in the probe at the run's start.


def _host(pool: Any, server: Any) -> Host:
    return pool.host(server, slots=2)  # type: ignore[no-any-return]


def _ssh_runner(
    pool: Any, job: spec.Spec, events: list[dict[str, Any]], *, sandbox_kind: str = "none"
) -> Runner:
    transport = SshTransport(
        [_host(pool, server) for server in pool.hosts],
        known_hosts=[pool.known_hosts],
        sandbox_kind=sandbox_kind,
        connect_timeout=3.0,
        rng=random.Random(3),
        commands=commands.names(job),
        notice=lambda message: events.append({"event": "notice", "message": message}),
    )
    return make_runner(job, transport, events=events.append)


@pytest.mark.slow
async def test_ssh_hosts_without_the_command_are_refused(ssh_pool: Any, tmp_path: Path) -> None:
    tools = ssh_pool.base / "tools"
    _tool(tools, "fanout-test-tool")
    tools.chmod(0o755)
    # h1's logins find the tool on their PATH, h2's do not.
    ssh_pool.add("h1", extra=[f"SetEnv PATH={tools}:/usr/bin:/bin"])
    ssh_pool.add("h2", extra=["SetEnv PATH=/usr/bin:/bin"])
    job = spec.load(_job(tmp_path, '"fanout-test-tool"'))
    events: list[dict[str, Any]] = []
    summary = await _ssh_runner(ssh_pool, job, events).execute(Options())
    assert summary.counts == {"succeeded": 2}
    notices = [e["message"] for e in events if e["event"] == "notice"]
    assert [n for n in notices if "cannot start" in n] == [
        "host h2 is unavailable: h2 cannot start fanout-test-tool: not found on its PATH"
        " (/usr/bin:/bin)"
    ]
    attempts = Journal(job.runtime.state_dir / "journal.sqlite").attempts(summary.run_id)
    assert {a["host"] for a in attempts} == {"h1"}

    # No host has it: the run stops before any unit starts.
    missing = spec.load(_job(tmp_path / "missing", f'"{MISSING}"'))
    runner = _ssh_runner(ssh_pool, missing, [])
    with pytest.raises(HostsUnavailable) as caught:
        await runner.execute(Options())
    assert str(caught.value).splitlines()[0] == (
        f"no SSH host can run units: h1 cannot start {MISSING}: not found on its PATH"
        f" ({tools}:/usr/bin:/bin); h2 cannot start {MISSING}: not found on its PATH"
        " (/usr/bin:/bin)"
    )
    (run,) = runner.journal.runs()
    assert runner.journal.attempts(run.id) == []


def test_plan_names_what_it_leaves_to_hosts_and_images(chdir_tmp: Path) -> None:
    hosts = '[[runtime.hosts]]\nname = "w1"\naddress = "127.0.0.1"\n'
    _job(chdir_tmp, f'"{MISSING}"', sandbox_kind="none")
    text = (chdir_tmp / "job.toml").read_text()
    (chdir_tmp / "job.toml").write_text(text + hosts)
    assert _commands_lines(cli("plan", "job.toml").out) == [
        f"Commands  {MISSING}: checked on each SSH host when the run starts"
    ]
    (chdir_tmp / "job.toml").write_text(
        text.replace('sandbox = "none"', 'sandbox = "podman"\nimage = "x"')
    )
    assert _commands_lines(cli("plan", "job.toml").out) == [
        "Commands  not checked: the image (runtime.image) decides what is installed"
    ]


def _problems(table: str) -> dict[str, str]:
    """The problem column of `hosts check`'s table by host, its wrapped lines joined."""
    problems: dict[str, list[str]] = {}
    host = ""
    for line in table.splitlines():
        cells = line.split("│")
        if len(cells) < 3:
            continue
        host = cells[1].strip() or host
        problems.setdefault(host, []).append(cells[-2].strip())
    return {name: " ".join(" ".join(parts).split()) for name, parts in problems.items()}


@pytest.mark.slow
@needs_bwrap
async def test_ssh_hosts_whose_bwrap_sandboxes_hide_the_command_are_refused(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """Issue 20: the worker is on each host, at an absolute path under /tmp, which bwrap
    replaces with a private /tmp.  Looked up outside the sandbox it was found; every unit
    then failed with bwrap's ``execvp``, both hosts quarantined.  The probe looks inside
    a sandbox made as a unit's is: the run stops before any unit starts, `hosts check`
    says why, and on the PATH (whose /tmp directories fanout binds back) it runs."""
    tools = ssh_pool.base / "tools"
    _tool(tools, "fanout-test-tool")
    tools.chmod(0o755)
    tool = _tool(ssh_pool.base / "elsewhere", "fanout-test-tool")  # not on the PATH
    tool.parent.chmod(0o755)
    servers = [ssh_pool.add(name, extra=[f"SetEnv PATH={tools}:/usr/bin:/bin"]) for name in "ab"]
    job = spec.load(_job(tmp_path, f'"{tool}"', sandbox_kind="bwrap"))
    events: list[dict[str, Any]] = []
    runner = _ssh_runner(ssh_pool, job, events, sandbox_kind="bwrap")
    with pytest.raises(HostsUnavailable) as caught:
        await runner.execute(Options())
    why = (
        f"cannot start {tool}: {tool} resolves to {tool}, under /tmp, which bwrap replaces"
        " with a private /tmp"
    )
    assert str(caught.value).splitlines()[0] == f"no SSH host can run units: a {why}; b {why}"
    (run,) = runner.journal.runs()
    assert runner.journal.attempts(run.id) == []

    hosts = "".join(
        f'[[hosts]]\nname = "{server.name}"\naddress = "127.0.0.1"\nport = {server.port}\n'
        f'user = "{ssh_pool.user}"\nidentity = "{ssh_pool.client_key}"\n'
        f'sandboxRoot = "{ssh_pool.host(server).sandbox_root}"\n'
        for server in servers
    )
    (tmp_path / "hosts.toml").write_text(hosts)
    config = Path(os.environ["HOME"]) / ".config" / "fanout"
    config.mkdir(parents=True, exist_ok=True)
    (config / "known_hosts").write_text(ssh_pool.known_hosts.read_text())
    text = (tmp_path / "job.toml").read_text()
    text = text.replace('sandbox = "bwrap"', 'sandbox = "bwrap"\nhosts = "hosts.toml"')
    (tmp_path / "job.toml").write_text(text)
    # The CLI runs its own event loop: in a thread, beside this test's.
    checked = await asyncio.to_thread(cli, "hosts", "check", str(tmp_path / "job.toml"))
    assert checked.code == 4, checked.out
    assert _problems(checked.out) == {"a": why, "b": why}

    (tmp_path / "job.toml").write_text(text.replace(f'"{tool}"', '"fanout-test-tool"'))
    on_path = spec.load(tmp_path / "job.toml")
    summary = await _ssh_runner(ssh_pool, on_path, [], sandbox_kind="bwrap").execute(Options())
    assert summary.counts == {"succeeded": 2}
    passed = await asyncio.to_thread(cli, "hosts", "check", str(tmp_path / "job.toml"))
    assert passed.code == 0, passed.out


@pytest.mark.slow
async def test_an_ssh_host_whose_bwrap_cannot_make_a_sandbox_is_refused(
    ssh_pool: Any, tmp_path: Path
) -> None:
    """A bwrap that is installed but cannot make namespaces for the login (a kernel
    without unprivileged user namespaces) would fail every unit; the probe's sandbox
    finds out at the start, with bwrap's own words."""
    fake = ssh_pool.base / "fake"
    fake.mkdir(mode=0o755)
    (fake / "bwrap").write_text(
        "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n"
    )
    (fake / "bwrap").chmod(0o755)
    ssh_pool.add("a", extra=[f"SetEnv PATH={fake}:/usr/bin:/bin"])
    job = spec.load(_job(tmp_path, '"true"', sandbox_kind="bwrap"))
    runner = _ssh_runner(ssh_pool, job, [], sandbox_kind="bwrap")
    with pytest.raises(HostsUnavailable) as caught:
        await runner.execute(Options())
    assert str(caught.value).splitlines()[0] == (
        "no SSH host can run units: a bwrap cannot make a sandbox there"
        " (bwrap: setting up uid map: Permission denied)"
    )
