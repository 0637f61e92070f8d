"""The wheel carries the schema and the SSH agent: install it into a fresh venv and use
them from there."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_installed_wheel_validates_with_its_own_schema(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(REPO),
        ],
        check=True,
    )
    (wheel,) = dist.glob("fanout-*.whl")
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    # Dependencies come from the test environment (no network needed); fanout itself
    # only from the wheel.  A path line in a .pth does not run the editable install's hook.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True)
    job = tmp_path / "job.toml"
    job.write_text((REPO / "fanout.toml.example").read_text())
    where = subprocess.run(
        [str(python), "-c", "import fanout.spec.schema as s; print(s.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(site)
    done = subprocess.run(
        [str(fresh / "bin" / "fanout"), "validate", "job.toml"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout) == (0, "1 job file(s) valid\n"), done.stderr
    # The SSH agent is package data of fanout.transports.ssh, read by importlib.resources.
    agent = subprocess.run(
        [str(python), "-c", "from fanout.transports.ssh import wire; print(wire.agent_script())"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert "fanout-end" in agent
    assert not (Path(site) / "fanout" / "wrapper.sh").exists()
    printed = subprocess.run(
        [str(fresh / "bin" / "fanout"), "schema"], capture_output=True, text=True, check=True
    ).stdout
    assert printed == (REPO / "schemas" / "fanout.schema.json").read_text()
