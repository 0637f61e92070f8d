from __future__ import annotations

import pytest

from fanout.globs import compile_glob


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
