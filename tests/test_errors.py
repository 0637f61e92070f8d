"""The exception tree and the one table of exit codes: every class takes its code from
``EXIT_CODES``, and the tree drawn in the module's docstring matches the classes."""

from __future__ import annotations

import re

from fanout import errors
from fanout.errors import EXIT_CODES, ExitCode, FanoutError


def _classes() -> list[type[FanoutError]]:
    found: list[type[FanoutError]] = [FanoutError]
    for cls in found:
        found += cls.__subclasses__()
    return found


def test_the_table_has_each_code_once_in_order() -> None:
    assert [row.code for row in EXIT_CODES] == sorted(ExitCode)
    assert [row.name for row in EXIT_CODES][:3] == ["ok", "failed", "job-invalid"]


def test_every_error_class_takes_its_code_from_the_table() -> None:
    listed = {row.code for row in EXIT_CODES}
    for cls in _classes():
        assert isinstance(cls.exit_code, ExitCode), cls
        assert cls.exit_code in listed, cls


def test_the_docstring_draws_every_class_with_its_code() -> None:
    doc = errors.__doc__ or ""
    drawn = {name: int(code) for name, code in re.findall(r"── (\w+) +(\d+) ", doc)}
    assert drawn == {cls.__name__: int(cls.exit_code) for cls in _classes()}
    internal = re.search(r"anything else +(\d+) ", doc)
    assert internal is not None
    assert int(internal.group(1)) == errors.INTERNAL_ERROR_EXIT == ExitCode.INTERNAL


def test_run_help_lists_the_run_codes_in_the_tables_words() -> None:
    assert errors.run_exits().startswith("Exit 0 if every unit succeeded, 1 if some failed")
    assert errors.run_exits().endswith(", 70 for an internal error, 130 if interrupted.")
    assert "141" not in errors.run_exits()  # run stops its run instead: 130
