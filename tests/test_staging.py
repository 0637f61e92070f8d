from __future__ import annotations

from pathlib import Path

import pytest

from fanout.attempt import collecting, staging
from fanout.outcome import CollectedFile


def test_unit_folder_names_are_readable_and_distinct() -> None:
    assert staging.unit_folder_name("src/a.py").startswith("src_a.py-")
    assert staging.unit_folder_name("src/a.py") != staging.unit_folder_name("src_a.py")
    assert staging.unit_folder_name("../..").startswith("unit-")


def test_stage_refuses_paths_out_of_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "secret").write_text("x")
    (tmp_path / "ws" / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(collecting.PathRefused, match="leaves the workspace"):
        staging.stage(tmp_path / "ws", ["../secret"])
    with pytest.raises(collecting.PathRefused, match="leads outside its folder through a symlink"):
        staging.stage(tmp_path / "ws", ["link"])
    with pytest.raises(collecting.PathRefused, match="does not exist"):
        staging.stage(tmp_path / "ws", ["missing.py"])


def test_apply_writes_only_unchanged_files(tmp_path: Path) -> None:
    workspace, unit_dir = tmp_path / "ws", tmp_path / "unit"
    for directory in (workspace, unit_dir):
        directory.mkdir()
    (workspace / "a.txt").write_text("1\n2\n")
    (workspace / "b.txt").write_text("old\n")
    staged = {"a.txt": staging.sha256_file(workspace / "a.txt"), "b.txt": "hash-at-staging"}
    (unit_dir / "a.txt").write_text("1\n2\n3\n")
    (unit_dir / "b.txt").write_text("new\n")
    (unit_dir / "c.txt").write_text("created\n")
    collected = [
        CollectedFile(path=name, sha256=staging.sha256_file(unit_dir / name), size=1)
        for name in ("a.txt", "b.txt", "c.txt")
    ]
    changes = staging.apply(workspace, "u", unit_dir, collected, staged, write=True)
    assert [(c.path, c.added, c.removed, c.state) for c in changes] == [
        ("a.txt", 1, 0, "applied"),
        ("b.txt", 1, 1, "conflict"),
        ("c.txt", 1, 0, "applied"),
    ]
    assert (workspace / "a.txt").read_text() == "1\n2\n3\n"
    assert (workspace / "b.txt").read_text() == "old\n"
    again = staging.apply(workspace, "u", unit_dir, collected[:1], staged, write=True)
    assert [c.state for c in again] == ["unchanged"]
