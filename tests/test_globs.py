from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fanout import spec
from fanout.attempt.collecting import Collect, Entry, Kind
from fanout.backlog.units import select
from fanout.values.globs import compile_glob


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("src/**/*.py", "src/a.py", True),
        ("src/**/*.py", "src/pkg/deep/a.py", True),
        ("src/**/*.py", "src/a.pyc", False),
        ("src/**/*.py", "lib/src/a.py", False),
        ("*.py", "a.py", True),
        ("*.py", "pkg/a.py", False),
        ("**/*.py", "a.py", True),
        ("**/vendor/**", "x/vendor/y/z.py", True),
        ("**/vendor/**", "vendor/z.py", True),
        ("data/file-?.csv", "data/file-1.csv", True),
        ("data/file-[!0-9].csv", "data/file-1.csv", False),
        ("data/file-[!0-9].csv", "data/file-x.csv", True),
        ("a+b.(c).txt", "a+b.(c).txt", True),
    ],
)
def test_matching(pattern: str, path: str, matches: bool) -> None:
    assert bool(compile_glob(pattern).match(path)) is matches


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("/etc/*", "'/etc/*' is absolute; patterns are relative to the workspace"),
        ("../x/*.py", "'../x/*.py' leaves the workspace ('..' is not allowed)"),
        ("src/**.py", "'src/**.py': '**' must be a whole path component, as in 'src/**/*.py'"),
        ("src//a.py", "'src//a.py' has an empty path component ('//' or a trailing '/')"),
        ("a[bc", "'a[bc': '[' at position 2 is never closed"),
        (
            "src/" + "x" * 256,
            "'src/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…' has a name of 256 bytes; a"
            " file name can be 255 at most",
        ),
        (
            "a/" * 2048,
            "'a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/a/…' is 4,096 bytes long; a path"
            " can be 4,095 at most",
        ),
    ],
)
def test_malformed(pattern: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        compile_glob(pattern)
    assert str(caught.value) == message


def test_a_glob_may_have_long_components_a_name_may_not() -> None:
    # A class matches one character: 300 bytes of them can match a short name.
    assert compile_glob("[ab]" * 75).match("ab" * 37 + "a")


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("src/[z-a]*.py", "'src/[z-a]*.py': the range 'z-a' is reversed (did you mean 'a-z'?)"),
        (
            "x[!]",
            "'x[!]': '[' at position 2 is never closed (a ']' right after '[!' belongs to the class)",
        ),
        (
            "[^]",
            "'[^]': '[' at position 1 is never closed (a ']' right after '[^' belongs to the class)",
        ),
    ],
)
def test_malformed_classes(pattern: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        compile_glob(pattern)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("[]]x", "]x", True),
        ("[!]]x", "ax", True),
        ("[!]]x", "]x", False),
        ("[^a]", "b", True),
        ("[^a]", "a", False),
        ("a[!b]c", "a/c", False),
        ("[a-]", "-", True),
        ("[\\]", "\\", True),
        ("[[]", "[", True),
        ("[*?.]", "?", True),
        ("[*?.]", "x", False),
    ],
)
def test_class_members(pattern: str, path: str, matches: bool) -> None:
    assert bool(compile_glob(pattern).match(path)) is matches


# Hidden names (issue 10 defect 10): wildcards never match a leading '.', as in bash
# without dotglob; a pattern component that starts with '.' does.


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("src/**/*.py", "src/.cache/e.py", False),
        ("src/**/*.py", "src/pkg/.e.py", False),
        ("src/**/*.py", "src/pkg/e.py", True),
        ("**/*.py", ".venv/lib/site.py", False),
        ("**", ".env", False),
        ("**", "a/.git/config", False),
        ("**", "a/b/c", True),
        ("src/**", "src/.cache/e.py", False),
        ("*.py", ".py", False),
        ("*.py", ".hidden.py", False),
        ("*x", "x", True),
        ("*x", ".x", False),
        ("?env", ".env", False),
        ("[!a]env", ".env", False),
        ("[,-0]x", ".x", False),
        ("[,-0]x", "-x", True),
        ("[,-0]x", "0x", True),
        (".*", ".env", True),
        ("src/.*/*.py", "src/.cache/e.py", True),
        (".github/**/*.yml", ".github/workflows/ci.yml", True),
        ("**/.*", "a/.env", True),
        ("src/.cache/e.py", "src/.cache/e.py", True),
    ],
)
def test_wildcards_do_not_match_hidden_names(pattern: str, path: str, matches: bool) -> None:
    assert bool(compile_glob(pattern).match(path)) is matches


def test_exclude_patterns_match_hidden_names_too() -> None:
    assert compile_glob("**/*.min.js", hidden=True).match(".vscode/x.min.js")
    assert compile_glob("**", hidden=True).match("a/.git/config")


def test_a_class_that_only_a_dot_could_match_is_an_error() -> None:
    with pytest.raises(ValueError) as caught:
        compile_glob("src/[.]cache/*.py")
    assert str(caught.value) == (
        "'src/[.]cache/*.py': '[.]cache' can only match a name starting with '.', and such "
        "names are matched by a literal '.' (write '.name', not '[.]name')"
    )


HIDDEN_TREE = [
    "a.py",
    ".env",
    ".hidden.py",
    "-x",
    ".x",
    "src/a.py",
    "src/.cache/e.py",
    "src/pkg/.e.py",
    "src/pkg/b.py",
    ".github/workflows/ci.yml",
    ".venv/lib/site.py",
]


def _tree(root: Path) -> None:
    for name in HIDDEN_TREE:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")


def _entries(root: Path) -> list[Entry]:
    """What a sandbox lists for ``root``: every path below it and its kind."""
    found = []
    for path in sorted(root.rglob("*")):
        kind = Kind.DIR if path.is_dir() else Kind.FILE
        found.append(Entry(path.relative_to(root).as_posix(), kind))
    return found


def test_collect_takes_a_workers_hidden_output_only_when_named(tmp_path: Path) -> None:
    """``collect = ["**"]`` brings back what the worker wrote, not its tools' caches
    (.pytest_cache, .mypy_cache); a hidden file is collected when a pattern names it,
    and a plain directory is taken whole: one rule, on the coordinator, for every
    transport."""
    sandbox = tmp_path / "sandbox"
    _tree(sandbox)
    cases = {
        ("**",): ["a.py", "-x", "src/a.py", "src/pkg/b.py"],
        ("**", ".env"): ["a.py", "-x", "src/a.py", "src/pkg/b.py", ".env"],
        ("src",): ["src/a.py", "src/.cache/e.py", "src/pkg/.e.py", "src/pkg/b.py"],
    }
    for patterns, expected in cases.items():
        chosen = Collect.compile(patterns).select(_entries(sandbox))
        assert sorted(chosen) == sorted(expected), patterns


def test_input_files_skip_hidden_folders_unless_named(tmp_path: Path) -> None:
    """The issue's case: git does not ignore src/.cache, and src/**/*.py picked it."""
    _tree(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "job.toml").write_text(
        'version = 1\nname = "t"\n[inputs]\nfiles = ["src/**/*.py", ".github/**"]\n'
        'exclude = ["**/ci.yml"]\n[task]\ncommand = ["true"]\n'
    )
    job = spec.load(tmp_path / "job.toml")
    assert [u.id for u in select(job, environ={"PATH": os.environ["PATH"]})] == [
        "src/a.py",
        "src/pkg/b.py",
    ]
