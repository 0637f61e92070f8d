"""The examples `examples/claude-local.toml` and `examples/claude-ssh.toml` run as a
user runs them: the real Claude Code CLI with the claude preset and the examples' own
`--allowedTools Read,Edit`, units from the examples' own `ruff check` over
`examples/lint-sweep/src`, through the gateway, against the mock Messages API
(tests/mockapi.py) scripted to Read the unit's file, Edit it into one ruff passes, and
end the turn.  The fixed files come back through collect and `collect.apply`.

Each test copies the example (and `lint-sweep/`, its workspace) into the test's
directory and changes one line, the `[[apis]]` upstream, to the mock's URL: the fanout
CLI overrides the hosts file (`--hosts`, used for the SSH example's inventory) and the
concurrency, but no API's upstream, and a run writes its state (`.fanout/`) and applies
its fixes beside the job file, which must not be the repository's own copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout.attempt import staging

from helpers import cli
from mockapi import Edit, MockApi

pytestmark = pytest.mark.slow

KEY = "sk-ant-examples-claude-3c7e1a9b5d2f"
EXAMPLES = Path(__file__).parent.parent / "examples"
UPSTREAM = 'upstream = "https://api.anthropic.com"'
# What each file of the sweep looks like once its findings are fixed, under any of the
# rule sets ruff may apply to it (the defaults, or pyproject's UP and I on top).
FIXED = {
    "lint-sweep/src/greet.py": (
        'def greet(name):\n    return f"Hello, {name}!"\n\n\n'
        'def shout(name):\n    return f"HEY {name}"\n'
    ),
    "lint-sweep/src/inventory.py": (
        "def totals(rows: list[dict[str, int]]) -> dict[str, int]:\n"
        "    result: dict[str, int] = {}\n"
        "    for row in rows:\n"
        "        for key, value in row.items():\n"
        "            result[key] = result.get(key, 0) + value\n"
        "    return result\n"
    ),
    "lint-sweep/src/report.py": (
        "import json\n\n\n"
        "def summary(items, limit=None):\n"
        "    if limit is None:\n"
        "        limit = len(items)\n"
        "    return json.dumps(items[:limit])\n"
    ),
    "lint-sweep/src/shapes.py": (
        "def widths(boxes: list[tuple[int, int]]) -> list[int]:\n"
        "    return [width for width, _ in boxes]\n"
    ),
}


def _example(name: str, directory: Path, mock: MockApi) -> tuple[Path, list[str]]:
    """`examples/<name>` and its workspace copied into `directory`, the upstream line
    pointed at the mock, the mock scripted to fix each file of the sweep; and the units
    the example's inputs will select there (the files ruff finds fault with)."""
    shutil.copytree(EXAMPLES / "lint-sweep", directory / "lint-sweep")
    text = (EXAMPLES / name).read_text()
    assert text.count(UPSTREAM) == 1
    job = directory / name
    job.write_text(text.replace(UPSTREAM, f'upstream = "{mock.url}"'))
    edits = tuple(
        Edit(path=path, old=(directory / path).read_text(), new=new) for path, new in FIXED.items()
    )
    mock.configure(edits=edits, require_key=KEY)
    found = subprocess.run(
        ["ruff", "check", "--output-format=json", "lint-sweep/src"],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
    )
    units = sorted({os.path.relpath(f["filename"], directory) for f in json.loads(found.stdout)})
    assert units, found.stderr
    assert set(units) <= set(FIXED)
    return job, units


@pytest.fixture
def claude_on_path(claude_cli: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """claude (the preset's command) and ruff (the inputs' and verify's) on the PATH the
    coordinator and its workers get, the key exported as the examples say."""
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is required (scripts/system-deps installs it)")
    ruff = Path(sys.executable).parent
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(claude_cli.parent), str(ruff), os.environ["PATH"]])
    )
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)


def _check_run(directory: Path, mock: MockApi, ran: Any, units: list[str]) -> dict[str, Any]:
    assert ran.code == 0, ran.out + ran.err
    (path,) = (directory / ".fanout" / "runs").glob("*/report.json")
    report: dict[str, Any] = json.loads(path.read_text())
    assert sorted(unit["unit"] for unit in report["units"]) == units
    assert report["totals"] == {"succeeded": len(units)}
    assert report["agentOutcomes"] == {"success": len(units)}
    # Three requests a unit (Read, Edit, the end of the turn), all with the real key.
    posts = mock.posts()
    assert [p.status for p in posts] == [200] * 3 * len(units), ran.out + ran.err
    assert {p.key for p in posts} == {KEY}
    for unit in report["units"]:
        assert unit["rung"] == "standard"
        assert unit["collected"] == [unit["unit"]]
        folder = path.parent / "units" / staging.unit_folder_name(unit["unit"])
        assert (folder / unit["unit"]).read_text() == FIXED[unit["unit"]]
        # collect.apply: the fixed file is back in the workspace.
        assert (directory / unit["unit"]).read_text() == FIXED[unit["unit"]]
        (used,) = unit["usage"]
        assert (used["api"], used["requests"]) == ("anthropic", 3)
    # The files ruff had nothing to say about are untouched.
    assert (directory / "lint-sweep/src/clean.py").read_text() == (
        EXAMPLES / "lint-sweep/src/clean.py"
    ).read_text()
    for file in directory.rglob("*"):
        if file.is_file() and not file.is_symlink():
            assert KEY.encode() not in file.read_bytes(), file
    return report


def test_the_local_example_fixes_the_sweep_with_the_real_claude_cli(
    claude_on_path: None, mock_api: MockApi, tmp_path: Path
) -> None:
    job, units = _example("claude-local.toml", tmp_path, mock_api)
    ran = cli("run", str(job))
    _check_run(tmp_path, mock_api, ran, units)


def test_the_ssh_example_fixes_the_sweep_with_the_real_claude_cli_on_an_ssh_host(
    claude_on_path: None, mock_api: MockApi, tmp_path: Path, ssh_pool: Any
) -> None:
    job, units = _example("claude-ssh.toml", tmp_path, mock_api)
    # The example's hosts.toml names hosts of its own: --hosts swaps in the pool's, as
    # examples/hosts.toml says to for an inventory per environment.
    # The host has claude and ruff on its PATH, as the example's comment asks.
    tools = os.environ["PATH"].split(os.pathsep)[:2]
    server = ssh_pool.add("h1", extra=[f"SetEnv PATH={':'.join(tools)}:/usr/bin:/bin"])
    (tmp_path / "pool").mkdir()
    hosts = ssh_pool.inventory(tmp_path / "pool", server, slots=4)
    root = ssh_pool.base / "sandboxes"
    ran = cli("run", str(job), "--hosts", str(hosts))
    _check_run(tmp_path, mock_api, ran, units)
    assert sorted(root.iterdir()) == []  # every sandbox removed, claude's HOME with it
    events = next((tmp_path / ".fanout" / "runs").glob("*/events.jsonl")).read_text()
    hosts_seen = {json.loads(line).get("host") for line in events.splitlines()}
    assert "h1" in hosts_seen
