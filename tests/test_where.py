"""Where a job's units run: one choice, the table of transports it picks from, and no
side effect in choosing."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fanout import spec
from fanout.errors import EnvironmentProblem
from fanout.run.where import TRANSPORTS, Where, where

from helpers import write_job

BASE = """
version = 1
name = "j"
[inputs]
items = ["a"]
[task]
command = ["true"]
"""
HOST = '[[runtime.hosts]]\nname = "h1"\naddress = "127.0.0.1"\n'


def _job(tmp_path: Path, runtime: str = "") -> spec.Spec:
    return spec.load(write_job(tmp_path, BASE + runtime))


def test_each_place_has_one_transport() -> None:
    assert set(TRANSPORTS) == set(Where)


def test_a_job_runs_here_on_its_hosts_or_on_its_ray_cluster(tmp_path: Path) -> None:
    assert where(_job(tmp_path / "local")) is Where.LOCAL
    assert where(_job(tmp_path / "ssh", HOST)) is Where.SSH
    assert where(_job(tmp_path / "ray", "[runtime.ray]\n")) is Where.RAY


def test_ray_and_hosts_given_on_the_command_line_are_refused(tmp_path: Path) -> None:
    ray = _job(tmp_path, "[runtime.ray]\n")
    hosts = _job(tmp_path / "h", HOST).runtime.hosts
    job = replace(ray, runtime=replace(ray.runtime, hosts=hosts))
    with pytest.raises(EnvironmentProblem) as refused:
        where(job)
    assert str(refused.value) == (
        "runtime.ray and SSH hosts (--hosts) are exclusive: units run on a Ray cluster"
        " or on SSH hosts, not both"
    )


def test_choosing_touches_nothing(tmp_path: Path) -> None:
    job = _job(tmp_path)
    where(job)
    assert not job.runtime.state_dir.exists()
