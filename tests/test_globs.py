from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fanout.globs import compile_glob, to_find_regex


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
    ],
)
def test_malformed(pattern: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        compile_glob(pattern)
    assert str(caught.value) == message


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
    for translate in (compile_glob, to_find_regex):
        with pytest.raises(ValueError) as caught:
            translate(pattern)
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


def test_classes_select_the_same_files_through_find(tmp_path: Path) -> None:
    names = ["]x", "ax", "-", "^", "b", "[", "a.c", "a-c"]
    for name in names:
        (tmp_path / name).write_text("")
    for pattern in ["[]]x", "[!]]x", "[a-]", "[^a]", "[[]", "[.^-]", "[\\^]", "a[.-]c"]:
        found = subprocess.run(
            ["find", ".", "-regextype", "posix-extended", "-regex", to_find_regex(pattern)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        expected = sorted(f"./{n}" for n in names if compile_glob(pattern).match(n))
        assert sorted(found) == expected, pattern
