"""Removing a tree a unit made, whatever it did to it: any depth, nothing followed,
flags and permissions undone, mounts refused, bounded; as root (the suite's user, as in
CI) and as a non-root user (``sshd.TEST_USER``, through runuser and the system's
python: ``removal`` needs nothing beyond the standard library)."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fanout.isolation import inodes, removal
from fanout.isolation.removal import OutOfTime, Unremovable

from sshd import login_user

LATER = 60.0  # a deadline no test reaches


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path) -> Iterator[None]:
    """What a failing test left is removed by GNU rm: pytest's own clean-up of old
    tmp_paths is shutil.rmtree's, which stops at a deep tree."""
    yield
    subprocess.run(["chattr", "-R", "-i", "-a", str(tmp_path)], capture_output=True, check=False)
    subprocess.run(["chmod", "-R", "u+rwx", str(tmp_path)], check=False)
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


def _later() -> float:
    return time.monotonic() + LATER


def _deep(top: Path, depth: int) -> None:
    """``top`` with ``depth`` folders one inside the other, a file in each, made through
    descriptors (deeper than PATH_MAX allows a path to reach)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


@contextlib.contextmanager
def _descriptors(more: int) -> Iterator[None]:
    """At most ``more`` descriptors beyond those open now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + more, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
def test_a_tree_of_any_depth_is_removed_with_four_descriptors(tmp_path: Path) -> None:
    """2,100 levels: beyond Python's recursion limit (shutil.rmtree stopped at 1,000)
    and beyond PATH_MAX, and one descriptor per level would pass the limit here."""
    top = tmp_path / "tree"
    _deep(top, 2100)
    with _descriptors(4):
        removal.remove(top, deadline=_later())
    assert list(tmp_path.iterdir()) == []


def test_nothing_outside_the_tree_is_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "folder" / "kept").write_text("kept")
    (outside / "file").write_text("kept")
    top = tmp_path / "tree"
    (top / "a").mkdir(parents=True)
    (top / "a" / "to-folder").symlink_to(outside / "folder")
    (top / "to-file").symlink_to(outside / "file")
    (top / "to-root").symlink_to("/")
    os.mkfifo(top / "a" / "fifo")
    removal.remove(top, deadline=_later())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["outside"]
    assert (outside / "folder" / "kept").read_text() == "kept"
    assert (outside / "file").read_text() == "kept"


def test_a_path_that_is_a_symlink_is_removed_as_one(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "kept").write_text("kept")
    (tmp_path / "link").symlink_to(tmp_path / "outside")
    removal.remove(tmp_path / "link", deadline=_later())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["outside"]
    assert (tmp_path / "outside" / "kept").read_text() == "kept"


def test_a_tree_below_a_symlinked_folder_is_removed(tmp_path: Path) -> None:
    """Only what is in the tree is never followed: its parent (a sandbox root, a
    TMPDIR) may be a symlink."""
    (tmp_path / "real" / "tree" / "a").mkdir(parents=True)
    (tmp_path / "root").symlink_to(tmp_path / "real")
    removal.remove(tmp_path / "root" / "tree", deadline=_later())
    assert list((tmp_path / "real").iterdir()) == []


def _sweep(top: Path, start: threading.Barrier, failures: list[BaseException]) -> None:
    start.wait()
    try:
        removal.remove(top, deadline=_later())
    except (OSError, Unremovable, OutOfTime) as exc:
        failures.append(exc)


@pytest.mark.slow
def test_two_removals_of_one_tree_at_once_both_end_well(tmp_path: Path) -> None:
    """Two runs that start together sweep the same leftovers: whatever one finds gone,
    the other removed, and neither says the tree cannot be removed."""
    for attempt in range(5):
        top = tmp_path / f"tree{attempt}"
        _deep(top, 200)
        for index in range(40):
            (top / f"wide{index}" / "inner").mkdir(parents=True)
            for name in range(5):
                (top / f"wide{index}" / "inner" / str(name)).write_text("x")
        start = threading.Barrier(2)
        failures: list[BaseException] = []
        threads = [threading.Thread(target=_sweep, args=(top, start, failures)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert (failures, top.exists()) == ([], False)


def test_a_missing_tree_is_removed(tmp_path: Path) -> None:
    removal.remove(tmp_path / "never-made", deadline=_later())
    removal.remove(tmp_path / "no" / "parent", deadline=_later())


def _chattr(flags: str, *paths: Path) -> None:
    subprocess.run(["chattr", flags, *map(str, paths)], check=True)


def test_root_clears_the_immutable_and_append_only_flags_a_root_worker_set(
    tmp_path: Path,
) -> None:
    top = tmp_path / "tree"
    (top / "appending").mkdir(parents=True)
    (top / "appending" / "inside").write_text("x")
    (top / "frozen").mkdir()
    (top / "frozen" / "inside").write_text("x")
    (top / "locked").write_text("x")
    (top / "log").write_text("x")
    _chattr("+a", top / "appending", top / "log")
    _chattr("+i", top / "frozen" / "inside", top / "frozen", top / "locked", top)
    removal.remove(top, deadline=_later())
    assert list(tmp_path.iterdir()) == []


def test_folders_root_cannot_read_are_still_removed(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    (top / "shut" / "inner").mkdir(parents=True)
    (top / "shut" / "inner" / "file").write_text("x")
    for folder in (top / "shut" / "inner", top / "shut", top):
        folder.chmod(0)
    removal.remove(top, deadline=_later())
    assert list(tmp_path.iterdir()) == []


@contextlib.contextmanager
def _bind(source: Path, target: Path) -> Iterator[None]:
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(target)], check=True)


def test_a_mount_point_in_the_tree_is_refused_before_anything_is_removed(
    tmp_path: Path,
) -> None:
    """A bind mount shares its device with what it shows: found in mountinfo, not by
    the walk's device check, and what it shows is never emptied."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("kept")
    top = tmp_path / "tree"
    (top / "work" / "mounted").mkdir(parents=True)
    (top / "work" / "file").write_text("x")
    with _bind(outside, top / "work" / "mounted"):
        with pytest.raises(Unremovable) as refused:
            removal.remove(top, deadline=_later())
        assert (outside / "precious").read_text() == "kept"
        assert (top / "work" / "file").exists()
    assert refused.value.reason == "'work/mounted' is a mount point"
    assert refused.value.remedy(top) == f"umount {top}/work/mounted && rm -rf {top}"
    removal.remove(top, deadline=_later())  # unmounted
    assert sorted(path.name for path in tmp_path.iterdir()) == ["outside"]


def test_another_filesystem_in_the_tree_is_not_entered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should mountinfo not show a mount (unreadable, or one made meanwhile), the walk
    still enters no folder on another device (a tmpfs here, a FUSE mount the same)."""
    monkeypatch.setattr(inodes, "mount_points", list)
    top = tmp_path / "tree"
    (top / "a" / "mounted").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(top / "a" / "mounted")], check=True)
    try:
        (top / "a" / "mounted" / "precious").write_text("kept")
        with pytest.raises(Unremovable) as refused:
            removal.remove(top, deadline=_later())
        assert refused.value.reason == "'a/mounted' is a mount point"
        assert (top / "a" / "mounted" / "precious").read_text() == "kept"
    finally:
        subprocess.run(["umount", str(top / "a" / "mounted")], check=True)


def test_past_its_deadline_it_stops_and_a_later_call_goes_on(tmp_path: Path) -> None:
    top = tmp_path / "tree"
    _deep(top, 300)
    with pytest.raises(OutOfTime):
        removal.remove(top, deadline=time.monotonic() - 1)
    assert (top / "d" / "f").exists()
    removal.remove(top, deadline=_later())
    assert list(tmp_path.iterdir()) == []


def test_an_unremovable_tree_is_set_aside_and_said_once(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    top = tmp_path / "fanout-1-abc"
    (top / "work" / "mounted").mkdir(parents=True)
    aside = tmp_path / "fanout-unremovable-1-abc"
    subprocess.run(["mount", "--bind", str(outside), str(top / "work" / "mounted")], check=True)
    try:
        said = removal.dispose(top, aside, deadline=_later())
        assert sorted(path.name for path in tmp_path.iterdir()) == [aside.name, "outside"]
    finally:  # the mount moved with its folder
        moved = aside if aside.exists() else top
        subprocess.run(["umount", str(moved / "work" / "mounted")], check=True)
    assert said == (
        f"cannot remove {aside}: 'work/mounted' is a mount point; no fanout run touches"
        f" it again, remove it with: umount {aside}/work/mounted && rm -rf {aside}"
    )
    assert removal.dispose(aside, tmp_path / "unused", deadline=_later()) is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["outside"]


# --- as a user who is not root -----------------------------------------------------


@pytest.fixture
def user_dir() -> Iterator[tuple[str, Path]]:
    """A folder the non-root test user owns, where that user can reach it (the test's
    own tmp_path is below root's private folder)."""
    user = login_user()
    folder = Path(tempfile.mkdtemp(prefix="fanout-removal-"))
    shutil.chown(folder, user, user)
    try:
        yield user, folder
    finally:
        subprocess.run(["chattr", "-R", "-i", "-a", str(folder)], check=False)
        removal.remove(folder, deadline=_later())


def _as(user: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.fail("these tests need /usr/bin/python3 for the non-root user")
    package = Path(removal.__file__).parents[2]
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", f"PYTHONPATH={package}", python, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
        check=False,
    )


REMOVE = """
import sys, time
from pathlib import Path
from fanout.isolation import inodes, removal
try:
    print(removal.dispose(Path(sys.argv[1]), Path(sys.argv[2]), deadline=time.monotonic() + 60))
except removal.Unremovable as exc:
    print("unremovable", exc.reason)
"""


def test_a_user_s_folders_shut_to_themselves_are_opened_and_removed(
    user_dir: tuple[str, Path],
) -> None:
    user, folder = user_dir
    top = folder / "fanout-1-abc"
    top.mkdir()
    shutil.chown(top, user, user)
    made = (
        'cd "$1" && mkdir -p a/b c e && touch a/b/f c/g e/h'
        " && chmod 000 a/b a && chmod 500 c && chmod 600 e && chmod 000 ."
    )
    subprocess.run(["runuser", "-u", user, "--", "sh", "-c", made, "sh", str(top)], check=True)
    ran = _as(user, REMOVE, str(top), str(folder / "aside"))
    assert (ran.returncode, ran.stdout, ran.stderr) == (0, "None\n", "")
    assert list(folder.iterdir()) == []


def test_a_user_cannot_clear_an_immutable_flag_and_is_told_how_root_does(
    user_dir: tuple[str, Path],
) -> None:
    user, folder = user_dir
    top = folder / "fanout-1-abc"
    (top / "work").mkdir(parents=True)
    (top / "work" / "locked").write_text("x")
    (top / "work" / "other").write_text("x")
    subprocess.run(["chown", "-R", f"{user}:{user}", str(top)], check=True)
    _chattr("+i", top / "work" / "locked")
    aside = folder / "fanout-unremovable-1-abc"
    ran = _as(user, REMOVE, str(top), str(aside))
    assert (ran.returncode, ran.stderr) == (0, "")
    assert ran.stdout == (
        f"cannot remove {aside}: 'work/locked' is immutable or append-only (chattr +i or"
        " +a), which only root can clear; no fanout run touches it again, remove it with:"
        f" sudo chattr -R -i -a {aside} && sudo rm -rf {aside}\n"
    )
    assert sorted(path.name for path in folder.iterdir()) == [aside.name]
    assert (aside / "work" / "locked").exists()
