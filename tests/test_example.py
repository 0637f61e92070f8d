"""The README's main command: fanout.toml.example does real work, offline, in rounds."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest


def committed(repo: Path, target: Path, *paths: str) -> None:
    """Extract ``paths`` as HEAD has them into ``target``."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", "HEAD", "--", *paths],
        capture_output=True,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(target, filter="data")


@pytest.mark.slow
def test_the_main_example_fixes_every_file_over_two_rounds(repo: Path, tmp_path: Path) -> None:
    # The example as committed, not as the work tree has it: the README's Quick start
    # runs it in place, and a fixed work tree must not fail the suite (exit 3).
    committed(repo, tmp_path, "fanout.toml.example", "examples/lint-sweep")
    done = subprocess.run(
        [sys.executable, "-m", "fanout", "run", "fanout.toml.example"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    (report_file,) = (tmp_path / ".fanout" / "runs").glob("*/report.json")
    report = json.loads(report_file.read_text())
    assert [r["units"] for r in report["rounds"]] == [4, 1, 0]
    rungs = {(u["unit"], u["round"]): u["rung"] for u in report["units"]}
    assert rungs[("examples/lint-sweep/src/report.py", 1)] == "unsafe"
    assert rungs[("examples/lint-sweep/src/shapes.py", 2)] == "targeted"
    assert report["totals"] == {"succeeded": 4}
    check = subprocess.run(
        [
            str(Path(sys.executable).parent / "ruff"),
            "check",
            "--isolated",
            "--no-cache",
            "--target-version=py311",
            "--select=F401,F841,E711,I001,UP006,UP032",
            "examples/lint-sweep/src",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout
    assert (tmp_path / "examples/lint-sweep/src/shapes.py").read_text() == (
        "\n\ndef widths(boxes: list[tuple[int, int]]) -> list[int]:\n    return [width for width, _ in boxes]\n"
    )
