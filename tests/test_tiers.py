"""The suite's tiers: cost markers follow the fixtures a test uses (tests/conftest.py),
a case that names a place or an agent carries what that starts, and a test that starts
sshd, a Ray node, an agent CLI or chromedriver without its marker fails."""

from __future__ import annotations

import subprocess

import pytest
from conftest import (
    _TRIPPED,
    CHROMEDRIVER,
    COSTS,
    SSHD,
    TOOLS,
    CostTripwire,
    pytest_collection_modifyitems,
    spawn_cost,
)

from helpers import agents, places


def test_a_test_using_a_costly_fixture_itself_or_through_another_carries_its_marker() -> None:
    class Item:
        def __init__(self, *fixturenames: str) -> None:
            self.fixturenames = fixturenames
            self.marks: list[str] = []

        def add_marker(self, name: str) -> None:
            self.marks.append(name)

    items = [
        Item("tmp_path", "ssh_pool"),
        Item("tmp_path", "harness", "module_ssh_pool"),  # through a module fixture
        Item("ray_cluster", "root"),
        Item("own_ray_cluster"),
        Item("codex_cli", "codex_mock", "mock_api"),
        Item("bwrap", "gemini_cli"),
        Item("tmp_path", "mock_api", "chdir_tmp"),
        Item("browser", "tmp_path"),
    ]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [sorted(item.marks) for item in items] == [
        ["sshd"],
        ["sshd"],
        ["ray"],
        ["ray"],
        ["agent"],
        ["agent", "bwrap"],
        [],
        ["browser"],
    ]


def test_every_collected_test_using_a_costly_fixture_carries_its_marker(
    request: pytest.FixtureRequest,
) -> None:
    for item in request.session.items:
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in COSTS.items():
            if used & fixtures:
                assert item.get_closest_marker(marker) is not None, (item.nodeid, marker)


def test_a_place_or_an_agent_parameter_carries_what_it_starts() -> None:
    def marks(param: object) -> list[str]:
        return sorted(mark.name for mark in param.marks)  # type: ignore[attr-defined]

    assert [(p.values[0], marks(p)) for p in places("none", "bwrap", "ssh", "ssh-bwrap")] == [
        ("none", []),
        ("bwrap", ["bwrap"]),
        ("ssh", ["sshd"]),
        ("ssh-bwrap", ["bwrap", "sshd"]),
    ]
    assert [(p.values[0], marks(p)) for p in places("local-none", "ray-bwrap", "fake")] == [
        ("local-none", []),
        ("ray-bwrap", ["bwrap", "ray"]),
        ("fake", []),
    ]
    assert [marks(p) for p in agents("codex", "gemini")] == [["agent"], ["agent"]]


def test_what_a_command_starts() -> None:
    clis = str(TOOLS / "node_modules" / ".bin")
    assert spawn_cost([SSHD, "-D", "-e", "-f", "sshd_config"], "/usr/bin") == "sshd"
    assert spawn_cost(["/venv/bin/ray", "start", "--head"], "/usr/bin") == "ray"
    assert spawn_cost(["/venv/bin/ray", "stop"], "/usr/bin") is None
    assert spawn_cost([f"{clis}/codex", "exec"], "/usr/bin") == "agent"
    # Inside a sandbox, by its name, with the tools' directory on PATH.
    assert spawn_cost(["bwrap", "--ro-bind", "/", "/", "claude", "-p"], clis) == "agent"
    assert spawn_cost(["sh", "-c", "claude"], "/usr/bin") is None  # a stand-in
    assert spawn_cost([f"{clis}/eslint", "bad.js"], "/usr/bin") is None
    assert spawn_cost(["ssh", "-p", "22", "h1"], "/usr/bin") is None
    assert spawn_cost([CHROMEDRIVER, "--port=4444"], "/usr/bin") == "browser"
    assert spawn_cost([], "/usr/bin") is None


def test_starting_sshd_without_its_marker_fails_the_test(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("sshd") is None
    with pytest.raises(CostTripwire, match=r"started /usr/sbin/sshd without the 'sshd' marker"):
        subprocess.Popen([SSHD, "-t"])
    # The test's teardown fails it for that too (the code under test may have caught it);
    # this test expected it.
    assert len(request.node.stash[_TRIPPED]) == 1
    request.node.stash[_TRIPPED].clear()


def test_starting_chromedriver_without_its_marker_fails_the_test(
    request: pytest.FixtureRequest,
) -> None:
    assert request.node.get_closest_marker("browser") is None
    with pytest.raises(
        CostTripwire, match=r"started /usr/bin/chromedriver without the 'browser' marker"
    ):
        subprocess.Popen([CHROMEDRIVER, "--version"])
    assert len(request.node.stash[_TRIPPED]) == 1
    request.node.stash[_TRIPPED].clear()
