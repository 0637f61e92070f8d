"""Where local sandboxes are made (``runtime.sandboxRoot``, ``isolation.roots``): a
tmpfs with room by default, a folder the job names, TMPDIR when it is set, and the
leftovers of a killed run swept wherever auto put them."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fanout.errors import EnvironmentProblem
from fanout.isolation import roots
from fanout.transports.local import LocalTransport

from helpers import cli, make_attempt, write_job

GIB = 1 << 30


def _mountinfo(tmp_path: Path, *mounts: tuple[str, str]) -> Path:
    """A /proc/self/mountinfo holding ``mounts`` (point, type)."""
    path = tmp_path / "mountinfo"
    lines = [
        f"{n} 1 0:{n} / {point} rw - {kind} {kind} rw" for n, (point, kind) in enumerate(mounts)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_auto_takes_the_first_tmpfs_with_room_for_the_run(tmp_path: Path) -> None:
    runtime, shm = tmp_path / "run-user", tmp_path / "shm"
    runtime.mkdir()
    shm.mkdir()
    info = _mountinfo(tmp_path, ("/", "ext4"), (str(runtime), "tmpfs"), (str(shm), "tmpfs"))
    free = {runtime: GIB, shm: 24 * GIB}
    environ = {"XDG_RUNTIME_DIR": str(runtime)}

    def choose(slots: int) -> roots.Root:
        return roots.choose("auto", slots, environ, mountinfo=info, free=lambda p: free.get(p, 0))

    # 1 GiB free is not 1 GiB plus 64 MiB a task: /dev/shm is not this test's, so the disk.
    assert choose(4) == roots.Root(Path(tempfile_dir()), False, "no tmpfs with room")
    free[runtime] = 2 * GIB
    assert choose(4).path == runtime
    assert choose(4).memory
    assert choose(32).path != runtime  # 3 GiB needed


def test_auto_leaves_sandboxes_where_tmpdir_says(tmp_path: Path) -> None:
    info = _mountinfo(tmp_path, ("/", "ext4"), ("/dev/shm", "tmpfs"))
    chosen = roots.choose(
        "auto", 4, {"TMPDIR": str(tmp_path)}, mountinfo=info, free=lambda p: 100 * GIB
    )
    assert chosen == roots.Root(tmp_path, False, "TMPDIR is set")


def test_a_named_root_must_be_a_folder_this_user_can_write(tmp_path: Path) -> None:
    with pytest.raises(EnvironmentProblem, match="is not a folder this user can write"):
        roots.choose(str(tmp_path / "absent"), 4, {})
    named = roots.choose(str(tmp_path), 4, {})
    assert (named.path, named.why) == (tmp_path, "runtime.sandboxRoot")


def test_a_mount_point_with_a_space_is_read_as_the_kernel_escapes_it(tmp_path: Path) -> None:
    spaced = tmp_path / "a b"
    spaced.mkdir()
    info = tmp_path / "mountinfo"
    escaped = str(spaced).replace(" ", "\\040")
    info.write_text(f"1 0 0:1 / / rw - ext4 x rw\n2 1 0:2 / {escaped} rw - tmpfs tmpfs rw\n")
    assert roots.choose(str(spaced), 1, {}, mountinfo=info).memory


def tempfile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


def test_validate_refuses_a_relative_sandbox_root(tmp_path: Path) -> None:
    job = write_job(
        tmp_path,
        """
        version = 1
        name = "rel"
        [inputs]
        items = ["a"]
        [task]
        command = ["true"]
        [runtime]
        sandbox = "none"
        sandboxRoot = "boxes"
        """,
    )
    ran = cli("validate", str(job))
    assert ran.code == 2, ran.out + ran.err
    assert 'runtime.sandboxRoot: must be "auto" or an absolute path' in ran.out + ran.err


def _job(tmp_path: Path, root: str | None) -> Path:
    line = f'sandboxRoot = "{root}"' if root else ""
    return write_job(
        tmp_path,
        f"""
        version = 1
        name = "where"
        [inputs]
        items = ["a"]
        [units]
        collect = ["where.txt"]
        [task]
        command = ["sh", "-c", "pwd -P > where.txt"]
        [runtime]
        sandbox = "none"
        {line}
        """,
    )


def _ran_in(tmp_path: Path, job: Path, environ: dict[str, str]) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "fanout", "run", str(job)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (where,) = (tmp_path / ".fanout" / "runs").glob("*/units/a-*/where.txt")
    return Path(where.read_text().strip())


def test_a_run_makes_its_sandboxes_in_the_named_root(tmp_path: Path) -> None:
    boxes = tmp_path / "boxes"
    boxes.mkdir()
    environ = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
    work = _ran_in(tmp_path, _job(tmp_path, str(boxes)), environ)
    assert work.parent.parent == boxes.resolve()
    assert work.name == "work"
    assert list(boxes.iterdir()) == []


def test_auto_makes_a_run_s_sandboxes_on_a_tmpfs_with_room(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "XDG_RUNTIME_DIR")}
    expected = roots.choose("auto", 4, environ)
    if not expected.memory:
        pytest.skip("this machine has no tmpfs with room at /dev/shm")
    work = _ran_in(tmp_path, _job(tmp_path, None), environ)
    assert work.parent.parent == Path("/dev/shm").resolve()


async def test_a_killed_run_s_sandboxes_are_swept_from_every_root_auto_may_choose(
    tmp_path: Path,
) -> None:
    # A run killed while auto had chosen TMPDIR; the next run, without TMPDIR, names a
    # root of its own: the leftover is still swept.
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()
    leftover = old / f"fanout-{gone.pid}-x"
    (leftover / "work").mkdir(parents=True)
    transport = LocalTransport(
        slots=1, sandbox_kind="none", sandbox_root=str(new), environ={"TMPDIR": str(old)}
    )
    await transport.start()
    assert not leftover.exists()
    result = await transport.run(make_attempt(tmp_path, ["true"]))
    assert result.exit_code == 0
    assert list(new.iterdir()) == []
