"""Every bad job file in tests/data/invalid/ produces exactly its expected message.

Each case is NAME.toml beside NAME.expected, which holds what ``fanout plan`` prints on
stderr followed by a final ``exit N`` line, the repository's absolute path written
``<repo>`` (a message that names the workspace names it whole).  Regenerate nothing
automatically: an expected file is a reviewed statement of what a user should read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import cli

CASES = sorted((Path(__file__).parent / "data" / "invalid").glob("*.toml"))


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_bad_job_file(case: Path, repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    relative = case.relative_to(repo).as_posix()
    result = cli("plan", relative)
    expected = case.with_suffix(".expected").read_text(encoding="utf-8")
    shown = result.err.replace(str(repo.resolve()), "<repo>")
    assert f"{shown}exit {result.code}\n" == expected
    assert "Traceback" not in result.err
