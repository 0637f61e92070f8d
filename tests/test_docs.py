"""Every TOML block in the README and the docs site, and every example file, is a valid job
(or hosts) file."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import jsonschema
import pytest

from fanout import spec
from fanout.spec.schema import subschema

REPO = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```toml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
DOC_BLOCKS = [
    (page.relative_to(REPO / "docs").as_posix(), block)
    for page in sorted((REPO / "docs").rglob("*.md"))
    for block in re.findall(r"```toml\n(.*?)```", page.read_text(), re.S)
]
EXAMPLES = [REPO / "fanout.toml.example", *sorted((REPO / "examples").glob("*.toml"))]


def _is_hosts_file(text: str, path: Path | None = None) -> bool:
    return text.startswith("# hosts.toml") or (path is not None and "hosts" in path.name)


def test_the_readme_has_its_annotated_job_file() -> None:
    assert len(BLOCKS) == 1


def _validate_block(block: str, tmp_path: Path) -> None:
    if _is_hosts_file(block):
        jsonschema.validate(tomllib.loads(block), subschema("hostsFile"))
        return
    path = tmp_path / "job.toml"
    path.write_text(block)
    spec.load(path, require_hosts=False)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"readme-{n}" for n in range(len(BLOCKS))])
def test_readme_toml_blocks_validate(block: str, tmp_path: Path) -> None:
    _validate_block(block, tmp_path)


def test_the_docs_have_toml_blocks() -> None:
    assert len(DOC_BLOCKS) >= 8


@pytest.mark.parametrize(
    "block",
    [b for _, b in DOC_BLOCKS],
    ids=[f"{page}-{n}" for n, (page, _) in enumerate(DOC_BLOCKS)],
)
def test_docs_toml_blocks_validate(block: str, tmp_path: Path) -> None:
    _validate_block(block, tmp_path)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_files_validate(path: Path) -> None:
    if _is_hosts_file(path.read_text(), path):
        jsonschema.validate(tomllib.loads(path.read_text()), subschema("hostsFile"))
        return
    spec.load(path)


def test_readme_has_exactly_two_setup_commands() -> None:
    shell_blocks = re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert [b.strip() for b in shell_blocks[:2]] == [
        "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
        ".venv/bin/fanout run fanout.toml.example",
        "scripts/test",
    ]
    assert len(shell_blocks) == 2


def test_ci_runs_the_readme_test_command() -> None:
    assert "scripts/test" in (REPO / ".ci" / "run").read_text()
