"""What a worker can read: with real bwrap and a worker running as root (as the
README's systemd recipes run), no fanout state directory (this job's or another's), no
fanout configuration or secrets file, no keys, no other user's files; and staging never
copies a state directory into a sandbox."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout import spec
from fanout.attempt import collecting, staging
from fanout.isolation import hidden
from fanout.run.where import transport_for
from fanout.transports.local import LocalTransport

from helpers import cli, make_attempt, write_job
from procs import marker
from sshd import login_user

# For each path: "sees" if the worker read something there, else "nothing".
PROBE = """
for p in "$@"; do
  if [ -d "$p" ]; then out=$(ls -A "$p" 2>/dev/null); else out=$(cat "$p" 2>/dev/null); fi
  if [ -n "$out" ]; then echo "sees $p"; else echo "nothing $p"; fi
done
"""

JOB = """
version = 1
name = "{name}"
[inputs]
items = ["u1"]
[task]
command = {command}
[units]
stage = {stage}
[runtime]
sandbox = "{sandbox}"
"""


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory outside /tmp (bwrap's private /tmp would hide anything under it
    anyway), holding the jobs and the user's home, as /srv/repo and /root would."""
    base = Path("/var/lib") / f"fanout-test-{marker()}"
    (base / "home").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(base / "home"))
    try:
        yield base
    finally:
        shutil.rmtree(base)


@pytest.fixture
def etc_secret() -> Iterator[Path]:
    """A 0600 root secrets file in the real /etc/fanout, as the recipes' EnvironmentFile."""
    directory = Path("/etc/fanout")
    created = not directory.exists()
    directory.mkdir(exist_ok=True)
    secret = directory / f"test-{marker()}.env"
    secret.write_text("API_TOKEN=from-etc\n")
    secret.chmod(0o600)
    try:
        yield secret
    finally:
        secret.unlink()
        if created:
            with contextlib.suppress(OSError):  # another test's file is in it
                directory.rmdir()


def _job(directory: Path, name: str, command: list[str], stage: list[str] = []) -> Path:  # noqa: B006
    text = JOB.format(
        name=name, command=_toml_list(command), stage=_toml_list(stage), sandbox="bwrap"
    )
    return write_job(directory, text)


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join("'''" + value + "'''" for value in values) + "]"


def _output(workspace: Path) -> str:
    (log,) = (workspace / ".fanout" / "runs").glob("*/logs/*/r1-a1.log")
    return log.read_text()


def test_a_root_worker_reads_nothing_of_fanout_other_jobs_or_other_users(
    outside: Path, etc_secret: Path
) -> None:
    assert os.geteuid() == 0, "this test is about workers running as root"
    home = outside / "home"
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".config" / "fanout").mkdir(parents=True)
    (home / ".config" / "fanout" / "known_hosts").write_text("host key\n")
    (outside / "visible.txt").write_text("anyone may read this\n")
    users = outside / "alice.txt"
    users.write_text("alice's own\n")
    users.chmod(0o600)
    fanouttest = pwd.getpwnam(login_user())
    os.chown(users, fanouttest.pw_uid, fanouttest.pw_gid)
    # Another job ran on this machine before: its state directory holds its journal
    # and its units' logs.
    other = _job(outside / "other", "other", ["sh", "-c", "echo other job output"])
    ran = cli("run", str(other))
    assert ran.code == 0, ran.err
    this_state = outside / "this" / ".fanout"
    paths = [
        str(etc_secret),
        str(outside / "other" / ".fanout"),
        str(this_state),
        str(home / ".ssh"),
        str(home / ".config" / "fanout"),
        str(home / ".local" / "state" / "fanout"),
        str(users),
        str(outside / "visible.txt"),
    ]
    this = _job(outside / "this", "this", ["sh", "-c", PROBE, "probe", *paths])
    ran = cli("run", str(this))
    assert ran.code == 0, ran.err
    assert _output(outside / "this").splitlines() == [f"nothing {path}" for path in paths[:-1]] + [
        f"sees {outside / 'visible.txt'}"
    ]
    assert hidden.state_dirs(os.environ) == [
        outside / "other" / ".fanout",
        this_state,
    ]


def test_stage_everything_never_copies_a_state_directory(outside: Path) -> None:
    workspace = outside / "ws"
    (workspace / "src").mkdir(parents=True)
    (workspace / "src" / "a.py").write_text("x = 1\n")
    # A second job in the same workspace, with a state directory of another name.
    text = JOB.format(name="second", command="['true']", stage="[]", sandbox="none")
    second = write_job(
        workspace, text.replace("[runtime]", "[runtime]\nstateDir = '.state-second'"), "second.toml"
    )
    assert cli("run", str(second)).code == 0
    assert (workspace / ".state-second" / "journal.sqlite").is_file()
    for name, stage in (("everything", ["**"]), ("dot", ["."])):
        job = _job(workspace, name, ["sh", "-c", "find . -type f | sort"], stage)
        ran = cli("run", str(job))
        assert ran.code == 0, ran.err
        assert _output(workspace).splitlines() == ["./job.toml", "./second.toml", "./src/a.py"]
        shutil.rmtree(workspace / ".fanout" / "runs")


def test_a_file_named_inside_a_state_directory_is_refused(tmp_path: Path) -> None:
    state = tmp_path / ".fanout"
    (state / "locks").mkdir(parents=True)
    (state / "journal.sqlite").write_text("")
    (state / "runs").mkdir()
    (state / "runs" / "log.txt").write_text("another unit's output")
    (tmp_path / "a.txt").write_text("a")
    with pytest.raises(collecting.PathRefused) as refused:
        staging.stage(tmp_path, ["a.txt", ".fanout/runs/log.txt"])
    assert str(refused.value) == (
        "stage: '.fanout/runs/log.txt' is inside '.fanout', a fanout state directory; "
        "workers never see fanout's state"
    )
    with pytest.raises(collecting.PathRefused) as whole:
        staging.stage(tmp_path, [".fanout"])
    assert str(whole.value) == (
        "stage: '.fanout' is a fanout state directory; workers never see fanout's state"
    )
    assert [item.path for item in staging.stage(tmp_path, ["**", "."])] == ["a.txt"]
    assert staging.stage(tmp_path, [".fanout/**"]) == ()


def test_what_a_sandbox_hides(tmp_path: Path) -> None:
    environ = {
        "HOME": "/home/u",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "CREDENTIALS_DIRECTORY": "/run/credentials/fanout.service",
    }
    a, b, gone = tmp_path / "a" / ".fanout", tmp_path / "b" / "state", tmp_path / "gone"
    for directory in (a, b, gone):
        directory.mkdir(parents=True)
    for directory in (a, gone, b, a):
        hidden.remember(directory, environ)
    registry = tmp_path / "state" / "fanout" / "state-dirs"
    assert registry.read_text() == f"{a}\n{gone}\n{b}\n"
    assert registry.stat().st_mode & 0o777 == 0o600
    assert [str(p) for p in hidden.paths(environ, tmp_path / "c")] == [
        str(tmp_path / "c"),
        str(a),
        str(gone),
        str(b),
        str(tmp_path / "state" / "fanout"),
        "/home/u/.config/fanout",
        "/home/u/.ssh",
        "/etc/fanout",
        "/etc/default/fanout",
        "/etc/sysconfig/fanout",
        "/run/credentials/fanout.service",
    ]
    link = tmp_path / ".ssh"
    link.symlink_to(tmp_path / "keys")
    assert hidden.paths({**environ, "HOME": str(tmp_path)}, a)[-1] == tmp_path / "keys"
    # A state directory that was removed leaves the registry at the next run.
    gone.rmdir()
    hidden.remember(b, environ)
    assert registry.read_text() == f"{a}\n{b}\n"


def test_without_home_the_passwd_home_is_used() -> None:
    assert hidden.home({}) == Path(pwd.getpwuid(os.getuid()).pw_dir)


def test_an_unwritable_registry_is_a_notice_not_a_failure(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    job = spec.load(
        write_job(tmp_path, JOB.format(name="j", command="['true']", stage="[]", sandbox="none"))
    )
    notices: list[str] = []
    transport_for(job, {"HOME": str(tmp_path), "XDG_STATE_HOME": str(blocker)}, notices.append)
    assert notices == [
        f"cannot record the state directory in {blocker}/fanout/state-dirs (Not a directory): "
        "sandboxes of other jobs will not hide it"
    ]


async def test_a_hidden_file_reads_empty_and_a_hidden_directory_is_empty(outside: Path) -> None:
    secrets = outside / "secrets.env"
    secrets.write_text("API_TOKEN=x\n")
    keys = outside / "keys"
    keys.mkdir()
    (keys / "id").write_text("key\n")
    root = outside / "sandboxes"
    root.mkdir()
    transport = LocalTransport(
        slots=1,
        sandbox_kind="bwrap",
        root=root,
        hidden=[secrets, keys, outside / "missing"],
        path=os.environ["PATH"],
    )
    await transport.start()
    result = await transport.run(
        make_attempt(outside, ["sh", "-c", PROBE, "probe", str(secrets), str(keys)])
    )
    assert result.output_tail.splitlines() == [f"nothing {secrets}", f"nothing {keys}"]
