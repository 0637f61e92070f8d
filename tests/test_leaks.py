"""The leak scan: a job with a single-line and a multi-line secret whose worker prints
them every way it can, run through the CLI locally under bwrap and over SSH under bwrap.
Nothing fanout wrote, no prompt a worker received, no command line seen while the units
ran and nothing left in the sandbox root holds either secret or any line of one.

Also the aggregate command: a worker's environment, not the coordinator's, its output
redacted, its argv rendered with the run's trigger."""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import socketserver
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.events import Events
from fanout.journal import Journal
from fanout.report import aggregate
from fanout.run.job import Options, Runner
from fanout.transports.local import LocalTransport

from helpers import cli, make_runner, write_job
from sshd import TEST_USER, login_user

FANOUT = [sys.executable, "-m", "fanout"]

# The worker prints both secrets every way a worker might: whole on stdout and stderr,
# re-ended with CRLF, one line alone, inside a JSON string, re-indented, cut in halves
# written a moment apart, and inside a line far longer than 64 KiB.  It sends the prompt
# it received to the test's sink (the prompt must not hold a secret: that is the point),
# then fails on the first rung so that the second rung's prompt quotes last.outputTail.
WORKER = r"""
import json, os, socket, sys, time

prompt = sys.stdin.buffer.read().decode()
with socket.create_connection(("127.0.0.1", int(os.environ["SINK_PORT"]))) as sink:
    record = {"unit": os.environ["FANOUT_UNIT_ID"], "rung": os.environ["FANOUT_RUNG"]}
    with open("/proc/1/cmdline", "rb") as init:  # under bwrap: bwrap, in its PID namespace
        record["init"] = init.read().split(b"\0")[0].decode()
    sink.sendall(json.dumps({**record, "prompt": prompt}).encode())

single, multi = os.environ["LEAK_SINGLE"], os.environ["LEAK_MULTI"]

def say(fd, text):
    data = text.encode()
    while data:
        data = data[os.write(fd, data):]

say(1, f"single on stdout: {single}\n")
say(2, f"multi on stderr:\n{multi}\n")
say(1, "crlf: " + multi.replace("\n", "\r\n") + "\r\n")
say(1, "one line: " + multi.splitlines()[2] + "\n")
say(1, "json: " + json.dumps({"key": multi}) + "\n")
say(1, "indented:\n" + "".join("  " + line + "\n" for line in multi.splitlines()))
say(1, "split: " + single[:7])
time.sleep(0.3)
say(1, single[7:] + "\n")
half = len(multi) // 2
say(2, "split multi: " + multi[:half])
time.sleep(0.3)
say(2, multi[half:] + "\n")
say(1, "x" * 65600 + single[:5])
time.sleep(0.3)
say(1, single[5:] + "y" * 100 + multi + "z" * 70000 + "\n")
say(1, "done\n")
sys.exit(1 if os.environ["FANOUT_RUNG"] == "first" else 0)
"""

# What the worker's output is once redacted: every occurrence one "[secret]".
REDACTED_OUTPUT = (
    "single on stdout: [secret]\n"
    "multi on stderr:\n[secret]\n"
    "crlf: [secret]\r\n"
    "one line: [secret]\n"
    'json: {"key": "[secret]\\n[secret]\\n[secret]\\n[secret]\\n[secret]"}\n'
    "indented:\n" + "  [secret]\n" * 5 + "split: [secret]\n"
    "split multi: [secret]\n"
    + "x" * 65600
    + "[secret]"
    + "y" * 100
    + "[secret]"
    + "z" * 70000
    + "\n"
    "done\n"
)

JOB = """
version = 1
name = "leaks"
[inputs]
items = ["u1", "u2"]
[units]
stage = ["worker.py"]
[task]
prompt = "Unit {{{{ unit.id }}}}: do the work.\\n"
command = ["python3", "worker.py"]
timeout = "60s"
secrets = ["LEAK_SINGLE", "LEAK_MULTI"]
env = {{ SINK_PORT = "{port}" }}
[runtime]
sandbox = "bwrap"
network = true
outputTail = "256KiB"
{hosts}
[retry]
backoff = {{ initial = "10ms", max = "10ms", jitter = "none" }}
[[retry.ladder]]
name = "first"
[[retry.ladder]]
name = "second"
promptSuffix = "Your previous attempt failed:\\n{{{{ last.outputTail }}}}"
[aggregate]
command = ["sh", "-c", "cat; echo --- env ---; env"]
"""


def _secrets() -> tuple[str, str]:
    """A single-line secret and a five-line PEM-like one, every line unique to this run."""
    single = f"sk-leak-{secrets.token_hex(12)}"
    tag = secrets.token_hex(4).upper()
    body = [secrets.token_urlsafe(48) for _ in range(3)]
    multi = "\n".join([f"-----BEGIN LEAK{tag} KEY-----", *body, f"-----END LEAK{tag} KEY-----"])
    return single, multi


def _needles(single: str, multi: str) -> list[bytes]:
    """Every form of the secrets that must not appear anywhere."""
    forms = [single, multi, multi.replace("\n", "\r\n"), *multi.splitlines()]
    return [form.encode() for form in forms]


@dataclass
class Sink:
    """A TCP server on loopback collecting what workers send (their prompts)."""

    received: list[dict[str, str]] = field(default_factory=list)
    port: int = 0


@pytest.fixture
def sink() -> Iterator[Sink]:
    collected = Sink()

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            collected.received.append(json.loads(self.rfile.read()))

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    collected.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collected
    finally:
        server.shutdown()
        server.server_close()


class CommandLines:
    """Samples every process's command line while a run goes on."""

    def __init__(self, needles: list[bytes]) -> None:
        self.needles = needles
        self.hits: list[tuple[int, bytes]] = []
        self.samples = 0
        self.workers_seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> CommandLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.samples += 1
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                try:
                    with open(f"{entry.path}/cmdline", "rb") as stream:
                        line = stream.read()
                except OSError:
                    continue
                if b"worker.py" in line:
                    self.workers_seen += 1
                self.hits += [(int(entry.name), line) for n in self.needles if n in line]
            self._stop.wait(0.01)


def _files_holding(roots: list[Path], needles: list[bytes]) -> dict[str, int]:
    """Every file below ``roots`` holding a needle: its path and how many occurrences."""
    found: dict[str, int] = {}
    for root in roots:
        for path in [root] if root.is_file() else root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                hits = sum(data.count(needle) for needle in needles)
                if hits:
                    found[str(path)] = hits
    return found


def _scan_run(
    tmp_path: Path, sink: Sink, hosts: str, sandbox_root: Path, home: Path
) -> dict[str, Any]:
    """Run the leak job through the CLI and return what there is to check."""
    single, multi = _secrets()
    needles = _needles(single, multi)
    workspace = tmp_path / "ws"
    write_job(workspace, JOB.format(port=sink.port, hosts=hosts))
    (workspace / "worker.py").write_text(WORKER)
    coordinator_only = f"coordinator-only-{secrets.token_hex(6)}"
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "TMPDIR": str(sandbox_root),
        "LEAK_SINGLE": single,
        "LEAK_MULTI": multi,
        "FANOUT_TEST_COORDINATOR_ONLY": coordinator_only,
    }
    with CommandLines(needles) as lines:
        ran = subprocess.run(
            [*FANOUT, "run", str(workspace / "job.toml"), "-v"],
            capture_output=True,
            env=env,
            cwd=workspace,
            timeout=300,
        )
    assert ran.returncode == 0, ran.stderr.decode(errors="replace")
    console = tmp_path / "console.txt"
    console.write_bytes(ran.stdout + ran.stderr)
    return {
        "single": single,
        "multi": multi,
        "needles": needles,
        "lines": lines,
        "state": workspace / ".fanout",
        "files": _files_holding([workspace, console, sandbox_root, home], needles),
        "coordinator_only": coordinator_only,
    }


def _assert_nothing_leaked(found: dict[str, Any], sink: Sink) -> None:
    needles = found["needles"]
    lines: CommandLines = found["lines"]
    assert found["files"] == {}
    assert lines.hits == []
    assert lines.samples > 10
    assert lines.workers_seen > 0, "the sampler must have seen the workers running"
    # Every rung's prompt reached the sink and none holds a secret.
    assert {r["init"] for r in sink.received} == {"bwrap"}
    prompts = sorted((r["unit"], r["rung"], r["prompt"]) for r in sink.received)
    assert [(unit, rung) for unit, rung, _ in prompts] == [
        ("u1", "first"),
        ("u1", "second"),
        ("u2", "first"),
        ("u2", "second"),
    ]
    for unit, rung, prompt in prompts:
        assert [n for n in needles if n in prompt.encode()] == [], (unit, rung)
        if rung == "first":
            assert prompt == f"Unit {unit}: do the work.\n"
        else:
            # The first rung's whole output, redacted, as last.outputTail quotes it.
            assert prompt == (
                f"Unit {unit}: do the work.\nYour previous attempt failed:\n{REDACTED_OUTPUT}"
            )
    # The logs hold the whole output, redacted occurrence by occurrence.
    logs = sorted((found["state"] / "runs").glob("*/logs/*/*.log"))
    assert [p.name for p in logs] == ["r1-a1.log", "r1-a2.log"] * 2
    for log in logs:
        assert log.read_bytes().decode() == REDACTED_OUTPUT
    # The aggregate saw the results and a worker's environment, all of it redacted.
    aggregate = next((found["state"] / "runs").glob("*/aggregate.out")).read_bytes().decode()
    results, _, environment = aggregate.partition("--- env ---\n")
    records = [json.loads(line) for line in results.splitlines()]
    assert [(r["unit"], r["state"], r["rung"], r["attempts"]) for r in records] == [
        ("u1", "succeeded", "second", 2),
        ("u2", "succeeded", "second", 2),
    ]
    variables = dict(line.split("=", 1) for line in environment.splitlines())
    for own in ("PWD", "SHLVL", "OLDPWD", "_"):  # what sh sets itself
        variables.pop(own, None)
    assert sorted(variables) == [
        "FANOUT_REPORT",
        "FANOUT_RUN_ID",
        "HOME",
        "LANG",
        "LEAK_MULTI",
        "LEAK_SINGLE",
        "PATH",
    ]
    assert (variables["LEAK_SINGLE"], variables["LEAK_MULTI"]) == ("[secret]", "[secret]")
    assert found["coordinator_only"] not in aggregate


BWRAP = shutil.which("bwrap")


@pytest.mark.slow
@pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed")
def test_nothing_leaks_from_a_local_bwrap_run(tmp_path: Path, sink: Sink) -> None:
    sandbox_root = tmp_path / "tmp"
    sandbox_root.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    found = _scan_run(tmp_path, sink, "", sandbox_root, home)
    assert sorted(p.name for p in sandbox_root.glob("fanout-*")) == []
    _assert_nothing_leaked(found, sink)
    assert _hosts(found["state"]) == {"local"}


def _hosts(state: Path) -> set[str]:
    """The hosts the run's attempts ran on."""
    journal = Journal(state / "journal.sqlite")
    try:
        (run,) = [p.name for p in (state / "runs").iterdir()]
        return {a["host"] for a in journal.attempts(run)}
    finally:
        journal.close()


@pytest.mark.slow
def test_nothing_leaks_from_an_ssh_bwrap_run(ssh_pool: Any, tmp_path: Path, sink: Sink) -> None:
    server = ssh_pool.add("h1")
    root = ssh_pool.base / "sandboxes"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "hosts.toml").write_text(
        f'[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {server.port}\n'
        f'user = "{ssh_pool.user}"\nidentity = "{ssh_pool.client_key}"\n'
        f'sandboxRoot = "{root}"\nslots = 2\n'
    )
    home = tmp_path / "home"
    (home / ".config" / "fanout").mkdir(parents=True)
    shutil.copy(ssh_pool.known_hosts, home / ".config" / "fanout" / "known_hosts")
    coordinator_tmp = tmp_path / "tmp"
    coordinator_tmp.mkdir()
    found = _scan_run(tmp_path, sink, 'hosts = "hosts.toml"', coordinator_tmp, home)
    # The host's sandbox root: every sandbox removed, nothing of the secrets left.
    assert sorted(p.name for p in root.iterdir()) == []
    host_disk = [ssh_pool.base]
    if ssh_pool.user == TEST_USER:  # the dedicated login user's home is the host's too
        host_disk.append(Path(pwd.getpwnam(TEST_USER).pw_dir))
    assert _files_holding(host_disk, found["needles"]) == {}
    _assert_nothing_leaked(found, sink)
    assert _hosts(found["state"]) == {"h1"}


def _aggregate_runner(tmp_path: Path, aggregate: str, environ: dict[str, str]) -> Runner:
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "agg"
            [inputs]
            items = ["a"]
            [task]
            command = ["true"]
            secrets = ["POST_TOKEN"]
            [runtime]
            sandbox = "none"
            unsandboxedSecrets = true
            [aggregate]
            command = {aggregate}
            """,
        )
    )
    root = tmp_path / "sandboxes"
    root.mkdir()
    return make_runner(
        job,
        LocalTransport(slots=1, sandbox_kind="none", root=root, path=os.environ["PATH"]),
        environ=environ,
    )


async def test_the_aggregate_gets_a_workers_environment_and_its_output_is_redacted(
    tmp_path: Path,
) -> None:
    token = f"tok-{secrets.token_hex(8)}"
    runner = _aggregate_runner(
        tmp_path,
        '["sh", "-c", "env | sort; echo posted with $POST_TOKEN >&2"]',
        {
            "PATH": os.environ["PATH"],
            "HOME": "/home/ops",
            "POST_TOKEN": token,
            "AWS_SECRET_ACCESS_KEY": "the coordinator's own",
            "LANG": "de_DE.UTF-8",
        },
    )
    summary = await runner.execute(Options())
    out = (runner.run_dir(summary.run_id) / "aggregate.out").read_text()
    # sh sets PWD (and SHLVL, OLDPWD, _ under some shells) itself.
    shell_own = {"PWD", "SHLVL", "_", "OLDPWD"}
    assert [line for line in out.splitlines() if line.split("=", 1)[0] not in shell_own] == [
        f"FANOUT_REPORT={runner.run_dir(summary.run_id) / 'report.md'}",
        f"FANOUT_RUN_ID={summary.run_id}",
        "HOME=/home/ops",
        "LANG=C.UTF-8",
        f"PATH={os.environ['PATH']}",
        "POST_TOKEN=[secret]",
        "posted with [secret]",
    ]


async def test_the_aggregate_output_is_redacted_of_the_keys_and_any_token(tmp_path: Path) -> None:
    """Its environment holds no [[apis]] key; what it prints of one (read elsewhere),
    and any gateway token, is redacted all the same."""
    key, token = f"real-key-{secrets.token_hex(8)}", f"fanout-token-{secrets.token_urlsafe(32)}"
    command = f'["sh", "-c", "echo {key} {token}; echo ${{REAL_KEY:-no key}}"]'
    job = _aggregate_runner(tmp_path, command, {}).spec
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await aggregate.run(
        job,
        run_id="r",
        run_dir=run_dir,
        results=iter(()),
        trigger=None,
        secrets={},
        environ={"PATH": os.environ["PATH"], "REAL_KEY": key},
        events=Events(),
        keys=(key,),
    )
    assert (run_dir / "aggregate.out").read_text() == "[secret] [secret]\nno key\n"


async def test_the_aggregate_renders_with_the_runs_trigger(tmp_path: Path) -> None:
    runner = _aggregate_runner(
        tmp_path,
        '["sh", "-c", "echo \\"$0\\" > posted.txt", "{{ trigger.name }} to {{ trigger.vars.channel }}"]',
        {"PATH": os.environ["PATH"], "POST_TOKEN": "t"},
    )
    events: list[dict[str, Any]] = []
    runner.events = Events(events.append)
    trigger = {"name": "nightly", "schedule": "0 3 * * *", "vars": {"channel": "#ops"}, "time": ""}
    summary = await runner.execute(Options(trigger=trigger))
    assert summary.counts == {"succeeded": 1}
    assert (tmp_path / "posted.txt").read_text() == "nightly to #ops\n"
    assert [e["event"] for e in events if e["event"].startswith("aggregate.")] == [
        "aggregate.finished"
    ]


async def test_an_aggregate_template_that_fails_is_an_event_not_a_traceback(
    tmp_path: Path,
) -> None:
    runner = _aggregate_runner(
        tmp_path,
        '["echo", "{{ trigger.vars.channel }}"]',
        {"PATH": os.environ["PATH"], "POST_TOKEN": "t"},
    )
    events: list[dict[str, Any]] = []
    runner.events = Events(events.append)
    summary = await runner.execute(Options())  # by hand: trigger.vars is empty
    assert summary.counts == {"succeeded": 1}
    failed = [e for e in events if e["event"] == "aggregate.failed"]
    assert len(failed) == 1
    assert failed[0]["reason"].startswith("template: ")
    assert "channel" in failed[0]["reason"]


# Sandbox none with [[apis]]: the attack.  Both units run at once; each scans
# every process it can see the way the repro does (``/proc/*/environ`` lines
# ``REAL_KEY=``), and every process's memory for the key's prefix, records what it
# found in a directory of the test's (unredacted: the test reads it raw), then prints
# the key (read from a file of the test's: a worker can always come by it some other
# way), its own token and every other token it found.
PROC_WORKER = r"""
import json, os, pathlib, sys, time
shared = pathlib.Path(os.environ["SHARED"])
unit, me = os.environ["FANOUT_UNIT_ID"], os.getpid()
(shared / f"started-{unit}").touch()
deadline = time.monotonic() + 60
while time.monotonic() < deadline and (
    len(list(shared.glob("started-*"))) < 2 or not (shared / "coordinator.pid").exists()
):
    time.sleep(0.02)
coordinator = int((shared / "coordinator.pid").read_text())
found = {"environ": [], "memory": [], "tokens": [], "coordinator": {}, "read": 0}
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == me:
        continue
    pid = int(entry)
    try:
        with open(f"/proc/{pid}/environ", "rb") as stream:
            lines = stream.read().split(b"\0")
        found["read"] += 1
    except OSError as exc:
        if pid == coordinator:
            found["coordinator"]["environ"] = type(exc).__name__
        continue
    if pid == coordinator:
        found["coordinator"]["environ"] = "read"
    found["environ"] += [l.decode() for l in lines if l.startswith(b"REAL_KEY=")]
    for line in lines:
        name, _, value = line.decode(errors="replace").partition("=")
        if value.startswith("fanout-token-") and value != os.environ["ANTHROPIC_API_KEY"]:
            found["tokens"].append(value)
try:
    regions = open(f"/proc/{coordinator}/maps").read().splitlines()
    with open(f"/proc/{coordinator}/mem", "rb", buffering=0) as memory:
        for region in regions:
            span, perms = region.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                memory.seek(start)
                data = memory.read(end - start)
            except OSError:
                continue
            at = data.find(b"sk-ant-proc-")
            if at >= 0:
                found["memory"].append(data[at : at + 40].decode(errors="replace"))
    found["coordinator"]["mem"] = "read"
except OSError as exc:
    found["coordinator"]["mem"] = type(exc).__name__
(shared / f"found-{unit}.json").write_text(json.dumps(found))
# Both scans done before either exits: each saw the other running.
while time.monotonic() < deadline and len(list(shared.glob("found-*"))) < 2:
    time.sleep(0.02)
print("key from a file:", (shared / "key.txt").read_text())
print("own token:", os.environ["ANTHROPIC_API_KEY"])
for token in found["tokens"]:
    print("another unit's token:", token)
"""

PROC_JOB = """
version = 1
name = "proc-scan"
[inputs]
items = ["u1", "u2"]
[units]
stage = ["worker.py"]
[task]
command = ["{python}", "worker.py"]
timeout = "90s"
env = {{ SHARED = "{shared}" }}
[runtime]
sandbox = "none"
{opt_in}
network = true
maxConcurrentTasks = 2
[[apis]]
name = "anthropic"
upstream = "{upstream}"
style = "anthropic"
keySecret = "REAL_KEY"
"""


def _owned_by(user: str, base: Path, *names: str) -> list[Path]:
    """Directories below ``base`` (itself included) that ``user`` owns."""
    record = pwd.getpwnam(user)
    made = []
    for path in [base, *(base / name for name in names)]:
        path.mkdir(exist_ok=True)
        os.chown(path, record.pw_uid, record.pw_gid)
        made.append(path)
    return made[1:]


def test_sandbox_none_with_apis_is_refused_without_the_opt_in(
    chdir_tmp: Path, mock_api: Any
) -> None:
    job = write_job(
        chdir_tmp,
        PROC_JOB.format(python="python3", shared=chdir_tmp, opt_in="", upstream=mock_api.url),
    )
    ran = cli("run", str(job))
    assert ran.code == 2
    assert ran.err.splitlines() == [
        f"{job}:13:11: runtime.sandbox: sandbox 'none' runs workers in plain directories,"
        " which do not hide the coordinator, the other units or this user's files from a"
        " worker: it could read the other running units' API tokens in /proc and keep"
        " them wherever its user can write; use sandbox 'bwrap' (or 'auto' where"
        " bubblewrap works), or set runtime.unsandboxedSecrets = true to accept that",
    ]
    assert not (chdir_tmp / ".fanout").exists()  # nothing ran, nothing was recorded


@pytest.mark.slow
def test_a_worker_scanning_proc_under_sandbox_none_cannot_read_the_key(
    mock_api: Any, tmp_path: Path
) -> None:
    """Opted in (``unsandboxedSecrets``): the coordinator is non-dumpable, so the key is
    in no environment or memory a worker can read as the same user.  The machine the
    issue describes: no PID namespace for steps (no ``unshare`` on the PATH), so each
    worker is in fanout's own user namespace (one of its own would already keep it from
    reading other namespaces' processes), and not root (whose workers hold
    CAP_SYS_PTRACE: fanout runs as the tests' login user here).  What plain directories
    do not hide, the other unit's token, it does read: that is what the opt-in accepts,
    and every output redacts it all the same."""
    user = login_user()
    base = Path(tempfile.mkdtemp(prefix="fanout-proc-scan-"))
    try:
        workspace, home, sandboxes, shared = _owned_by(user, base, "ws", "home", "tmp", "shared")
        tools = base / "bin"  # what fanout and the worker run, but no unshare
        tools.mkdir()
        for tool in ("sh", "setpriv", "python3"):
            found_tool = shutil.which(tool, path="/usr/bin:/bin")
            assert found_tool is not None, tool
            (tools / tool).symlink_to(found_tool)
        key = f"sk-ant-proc-{secrets.token_hex(12)}"
        (shared / "key.txt").write_text(key)
        job = write_job(
            workspace,
            PROC_JOB.format(
                # The system's: this checkout's python (first on the workers' PATH) may
                # lie under a home the login user cannot enter.
                python=str(tools / "python3"),
                shared=shared,
                opt_in="unsandboxedSecrets = true",
                upstream=mock_api.url,
            ),
        )
        (workspace / "worker.py").write_text(PROC_WORKER)
        for path in (job, workspace / "worker.py", shared / "key.txt"):
            os.chown(path, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
        env = {
            "PATH": str(tools),
            "HOME": str(home),
            "TMPDIR": str(sandboxes),
            "REAL_KEY": key,
        }
        record = pwd.getpwnam(user)
        as_user = (
            ["setpriv", f"--reuid={record.pw_uid}", f"--regid={record.pw_gid}", "--clear-groups"]
            if os.geteuid() == 0
            else []
        )
        process = subprocess.Popen(
            [*as_user, *FANOUT, "run", str(job), "-v"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=workspace,
        )
        (shared / "coordinator.pid").write_text(str(process.pid))  # setpriv execs fanout
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err.decode(errors="replace")
        findings = {
            unit: json.loads((shared / f"found-{unit}.json").read_text()) for unit in ("u1", "u2")
        }
        for unit, found in findings.items():
            # The repro finds nothing, nor does a search of the coordinator's memory:
            # both are the kernel's refusal to read a non-dumpable process.
            assert found["environ"] == [], unit
            assert found["memory"] == [], unit
            assert found["coordinator"] == {"environ": "PermissionError", "mem": "PermissionError"}
            assert found["read"] > 0, unit  # the scan did read other processes' environments
            # The other unit's token, which plain directories do not hide.
            assert len(found["tokens"]) == 1, unit
        tokens = [found["tokens"][0] for found in findings.values()]
        needles = [key.encode(), *(token.encode() for token in tokens)]
        console = base / "console.txt"
        console.write_bytes(out + err)
        assert _files_holding([workspace, console, sandboxes, home], needles) == {}
        logs = sorted((workspace / ".fanout" / "runs").glob("*/logs/*/*.log"))
        assert [log.read_text() for log in logs] == [
            "key from a file: [secret]\nown token: [secret]\nanother unit's token: [secret]\n"
        ] * 2
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_input_command_gets_no_api_key(
    chdir_tmp: Path, mock_api: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The input command runs with fanout's own environment, less the [[apis]] keys
    (the gateway's alone): in `fanout plan` and in `fanout run` alike.  task.secrets it
    keeps, as the README says."""
    monkeypatch.setenv("REAL_KEY", f"sk-ant-input-{secrets.token_hex(8)}")
    monkeypatch.setenv("POST_TOKEN", "posted")
    write_job(
        chdir_tmp,
        f"""
        version = 1
        name = "input-env"
        [inputs]
        command = ["sh", "-c", "echo key-${{REAL_KEY:+set}}; echo secret-${{POST_TOKEN:+set}}"]
        format = "lines"
        [task]
        command = ["true"]
        secrets = ["POST_TOKEN"]
        [runtime]
        network = true
        [[apis]]
        name = "anthropic"
        upstream = "{mock_api.url}"
        style = "anthropic"
        keySecret = "REAL_KEY"
        """,
    )
    planned = cli("plan", "job.toml")
    assert planned.code == 0, planned.err
    shown = [line.split()[1] for line in planned.out.splitlines() if re.match(r" +\d+\. ", line)]
    assert shown == ["key-", "secret-set"]
    ran = cli("run", "job.toml")
    assert ran.code == 0, ran.err
    (report,) = (chdir_tmp / ".fanout" / "runs").glob("*/report.json")
    assert sorted(u["unit"] for u in json.loads(report.read_text())["units"]) == [
        "key-",
        "secret-set",
    ]
