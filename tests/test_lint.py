"""``format = "lint"`` on the output of the real linters users run.

tests/data/lint/NAME.txt is what linter NAME printed for the files in
tests/data/lint/sources/ (captured from the real tool), NAME.json is its reviewed parse.
One test parses each captured output; another runs each linter again, when installed,
and checks it still prints what the parse expects (paths, lines, columns, codes,
severities, notes), so a linter release that changes its format shows here.  CI
installs every one of them (scripts/system-deps, the dev extra), and there a missing
linter fails instead of skipping.  To capture again after a deliberate change:
``.venv/bin/python tests/test_lint.py``, then review the diff.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.backlog import lint
from fanout.backlog.sources import parse_lint
from fanout.backlog.units import select
from fanout.errors import InputFailed

DATA = Path(__file__).resolve().parent / "data" / "lint"
SOURCES = DATA / "sources"
# Where scripts/system-deps installs the npm tools (eslint and its unix formatter).
TOOLS = Path(os.environ.get("FANOUT_TEST_TOOLS", "/opt/fanout-test-tools"))
# eslint prints absolute paths; the run's directory reads as this in the golden files.
PROJECT = "/project"

# Each linter's command (its first word, or the one after `sh -c`, is the tool), run in a copy of tests/data/lint/sources/, configuration from
# the user's machine ignored.  ruff needs its concise format: the default one puts the
# code before the path.
LINTERS: dict[str, list[str]] = {
    "shellcheck": ["shellcheck", "-f", "gcc", "bad.sh"],
    "eslint": ["node_modules/.bin/eslint", "-f", "unix", "bad.js", "broken.js"],
    "pylint-parseable": [
        "pylint",
        "--rcfile=/dev/null",
        "--persistent=n",
        "--output-format=parseable",
        "bad.py",
    ],
    "pylint-text": ["pylint", "--rcfile=/dev/null", "--persistent=n", "bad.py"],
    "mypy": ["mypy", "--config-file=", "--cache-dir=/dev/null", "bad.py"],
    "mypy-columns": [
        "mypy",
        "--config-file=",
        "--cache-dir=/dev/null",
        "--show-column-numbers",
        "--show-error-end",
        "bad.py",
    ],
    "flake8": ["flake8", "--isolated", "bad.py"],
    "ruff": ["ruff", "check", "--isolated", "--output-format=concise", "--select=E,F,W", "bad.py"],
    # gcc's diagnostics go to stderr: an input command reads them with `2>&1`.
    "gcc": ["sh", "-c", "gcc -fsyntax-only -Wall bad.c 2>&1"],
}
_PYTHON_TOOLS = {"pylint", "mypy", "flake8", "ruff"}


def _needs(name: str) -> str:
    """The tool linter ``name``'s command runs."""
    argv = LINTERS[name]
    return argv[2].split()[0] if argv[0] == "sh" else argv[0]


def _tool(name: str) -> str | None:
    """The installed linter ``name``: the test venv's Python tools, the npm prefix's
    eslint, anything else from PATH."""
    if name in _PYTHON_TOOLS:
        beside = Path(sys.executable).parent / name
        return str(beside) if beside.exists() else shutil.which(name)
    if name == "node_modules/.bin/eslint":
        eslint = TOOLS / "node_modules" / ".bin" / "eslint"
        unix = TOOLS / "node_modules" / "eslint-formatter-unix"
        return str(eslint) if eslint.exists() and unix.exists() else None
    return shutil.which(name)


def _run(name: str, workdir: Path) -> str:
    """Linter ``name``'s output for a fresh copy of the sources in ``workdir``."""
    for source in SOURCES.iterdir():
        # bad.py is stored as bad.py.txt, so the repository's own ruff and mypy skip it.
        shutil.copy(source, workdir / source.name.removesuffix(".txt"))
    argv = list(LINTERS[name])
    if argv[0].startswith("node_modules/"):
        # As in a project with eslint installed locally: `-f unix` finds the formatter there.
        (workdir / "node_modules").symlink_to(TOOLS / "node_modules")
    elif argv[0] != "sh":
        found = _tool(argv[0])
        assert found is not None
        argv[0] = found
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "LC_ALL": "C.UTF-8"}
    ran = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, check=False)
    assert ran.returncode != 0, f"{name} found nothing: {ran.stdout}{ran.stderr}"
    return ran.stdout.replace(str(workdir), PROJECT)


def _parsed(text: str, name: str) -> list[dict[str, Any]]:
    return [
        {"origin": record.origin, "record": record.data}
        for record in parse_lint(io.StringIO(text), name)
    ]


def _golden(name: str) -> tuple[str, list[dict[str, Any]]]:
    text = (DATA / f"{name}.txt").read_text(encoding="utf-8")
    expected = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return text, expected


@pytest.mark.parametrize("name", sorted(LINTERS))
def test_captured_output_parses_to_its_golden_records(name: str) -> None:
    text, expected = _golden(name)
    assert _parsed(text, f"{name}.txt") == expected


def _shape(parsed: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What the format decides (not the wording, which a linter's release may polish)."""
    shape = []
    for entry in parsed:
        record = entry["record"]
        notes = [(n["path"], n["line"], n["col"]) for n in record["notes"]]
        assert record["message"], entry
        where = (record["path"], record["line"], record["col"])
        shape.append((*where, record["code"], record["severity"], tuple(notes)))
    return shape


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LINTERS))
def test_the_real_linter_still_prints_what_the_parse_expects(name: str, tmp_path: Path) -> None:
    tool = _needs(name)
    if _tool(tool) is None:
        reason = f"{Path(tool).name} is not installed (scripts/system-deps installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    output = _run(name, tmp_path)
    _, expected = _golden(name)
    assert _shape(_parsed(output, f"{name}.txt")) == _shape(expected), (
        f"{name}'s output changed shape; if deliberate, capture again: "
        f"python tests/test_lint.py\n{output}"
    )


def test_both_pylint_formats_give_the_same_records_but_the_column() -> None:
    parseable = [e["record"] for e in _golden("pylint-parseable")[1]]
    text = [e["record"] for e in _golden("pylint-text")[1]]
    assert [{**r, "col": None} for r in text] == parseable
    assert parseable[1] == {
        "path": "bad.py",
        "line": 1,
        "col": None,
        "message": "Import alias does not rename original package (useless-import-alias)",
        "code": "C0414",
        "severity": "convention",
        "notes": [],
    }


def _one(line: str) -> dict[str, Any] | None:
    finding = lint.parse_line(line)
    if finding is None:
        return None
    return {
        "path": finding.path,
        "line": finding.line,
        "col": finding.col,
        "message": finding.message,
        "code": finding.code,
        "severity": finding.severity,
    }


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # ruff's [*] marks a fixable finding: not part of the message.
        (
            "a.py:2:8: F401 [*] `sys` imported but unused",
            ("F401", None, "`sys` imported but unused"),
        ),
        ("a.py:1:1: PLR0913 Too many arguments", ("PLR0913", None, "Too many arguments")),
        ("a.py:1:1: ASYNC100 Async with no await", ("ASYNC100", None, "Async with no await")),
        # A plugin's rule id has a scope and a slash of its own.
        (
            "/p/a.ts:3:7: 'x' is unused. [Warning/@typescript-eslint/no-unused-vars]",
            ("@typescript-eslint/no-unused-vars", "warning", "'x' is unused."),
        ),
        # gcc's warning option is its code; clang's fatal error keeps both words.
        (
            "a.c:3:9: warning: unused variable 'u' [-Wunused-variable]",
            ("-Wunused-variable", "warning", "unused variable 'u'"),
        ),
        ("a.c:1:10: fatal error: x.h: No such file", (None, "fatal error", "x.h: No such file")),
        # A severity word is not a code: the message's first word stays in the message.
        (
            "a.py:3: error: E501 is not a name  [name-defined]",
            ("name-defined", "error", "E501 is not a name"),
        ),
        # Colour codes (FORCE_COLOR in the coordinator's environment) are dropped.
        (
            "\x1b[1ma.py\x1b[0m:\x1b[1m3\x1b[0m: \x1b[31merror:\x1b[0m Bad  [misc]",
            ("misc", "error", "Bad"),
        ),
    ],
)
def test_codes_and_severities_of_other_shapes(line: str, expected: tuple[Any, ...]) -> None:
    found = _one(line)
    assert found is not None
    assert (found["code"], found["severity"], found["message"]) == expected


@pytest.mark.parametrize(
    "line",
    [
        "Found 2 errors in 1 file (checked 1 source file)",
        "bad.c: In function 'main':",
        "In file included from bad.c:1:",
        "    4 |     return twice(1, 2);",
        " --> bad.py:1:8",
        "bad.py:3:",
    ],
)
def test_lines_that_are_not_findings(line: str) -> None:
    assert lint.parse_line(line) is None


def test_a_note_with_nothing_before_it_or_with_a_code_is_a_finding() -> None:
    output = (
        'a.py:1: note: Revealed type is "builtins.int"\n'
        "a.py:2: error: Bad  [misc]\n"
        "a.py:3: note: By default the bodies of untyped functions are not checked  [annotation-unchecked]\n"
        "a.py:3: note: Use --check-untyped-defs\n"
    )
    records = [r.data for r in parse_lint(io.StringIO(output), "out")]
    assert [(r["line"], r["severity"], r["code"], len(r["notes"])) for r in records] == [
        (1, "note", None, 0),
        (2, "error", "misc", 0),
        (3, "note", "annotation-unchecked", 1),
    ]


def test_a_finding_is_yielded_as_soon_as_the_next_one_starts() -> None:
    """The stream runs one finding behind: notes can only follow their finding."""
    read: list[str] = []

    def lines() -> Iterator[str]:
        for line in ["a.py:1: error: A  [x]\n", "a.py:1: note: n\n", "a.py:2: error: B  [y]\n"]:
            read.append(line)
            yield line

    stream = lint.parse(lines(), "out")  # type: ignore[arg-type]
    first, origin = next(stream)
    assert (first["message"], [n["message"] for n in first["notes"]], origin) == (
        "A",
        ["n"],
        "out:1",
    )
    assert len(read) == 3
    assert next(stream)[0]["message"] == "B"


@pytest.mark.slow
def test_pylint_exit_status_names_the_okexitcodes_line_that_accepts_it(tmp_path: Path) -> None:
    pylint = _tool("pylint")
    if pylint is None:
        if os.environ.get("CI"):
            pytest.fail("pylint is not installed (the dev extra installs it)")
        pytest.skip("pylint is not installed")
    shutil.copy(SOURCES / "bad.py.txt", tmp_path / "bad.py")
    argv = [pylint, "--rcfile=/dev/null", "--persistent=n", "--output-format=parseable", "bad.py"]
    job = tmp_path / "job.toml"
    job.write_text(
        'version = 1\nname = "t"\n[inputs]\n'
        f"command = {json.dumps(argv)}\n"
        'format = "lint"\n[units]\nid = "{{ unit.record.line }}-{{ unit.record.code }}"\n'
        '[task]\ncommand = ["true"]\n'
    )
    with pytest.raises(InputFailed) as caught:
        list(select(spec.load(job), environ={"PATH": os.environ["PATH"], "HOME": str(tmp_path)}))
    assert str(caught.value) == (
        f"{job}:4:1: inputs.command: input command exited with status 20: "
        f"{pylint} --rcfile=/dev/null --persistent=n --output-format=parseable bad.py"
        " (it printed nothing on stderr)\n"
        "status 20 is not in inputs.okExitCodes [0, 1]; pylint's status is a bit mask "
        "(1 fatal, 2 error, 4 warning, 8 refactor, 16 convention, 32 usage error), and this "
        "line under [inputs] accepts every run that only found messages:\n"
        "    okExitCodes = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30]"
    )
    # The suggested line, as suggested, makes the job read pylint's findings.
    suggested = str(caught.value).splitlines()[-1].strip()
    job.write_text(job.read_text().replace('format = "lint"', f'format = "lint"\n{suggested}'))
    units = list(
        select(spec.load(job), environ={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    )
    assert [(u.record["code"], u.record["severity"]) for u in units][:2] == [
        ("C0114", "convention"),
        ("C0414", "convention"),
    ]


def capture() -> None:
    """Run every linter and write its output and parse as the golden files."""
    import tempfile

    for name in sorted(LINTERS):
        with tempfile.TemporaryDirectory() as workdir:
            output = _run(name, Path(workdir))
        (DATA / f"{name}.txt").write_text(output, encoding="utf-8")
        parsed = _parsed(output, f"{name}.txt")
        (DATA / f"{name}.json").write_text(
            json.dumps(parsed, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
        )
        print(f"{name}: {len(parsed)} records")


if __name__ == "__main__":
    capture()
