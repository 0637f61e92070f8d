"""Positions of keys and values in TOML text, including arrays of tables and inline tables."""

from __future__ import annotations

import dataclasses
import tomllib
from typing import Any

import pytest
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from fanout.values.tomlpos import KeyPath, huge_integer, scan, too_deep

DOCUMENT = '''\
#:schema x
version = 1
name = "a" # trailing comment
[inputs]
command = ["ruff", "check",
  "src"]
[units]
groupBy = 'filename'
"quoted.key" = 3
[task]
prompt = """
line1
{{ x }}"""
env = { A = "1", B = { c = [1, {d = 2}] } }
[[retry.ladder]]
name = "a"
[[retry.ladder]]
name = "b"
[[retry.ladder]]
name = "c"
vars.model = "opus"
[retry.ladder.extra]
when = 1979-05-27 07:32:00Z
'''


def test_keys_and_values_of_a_realistic_document() -> None:
    tomllib.loads(DOCUMENT)
    positions = scan(DOCUMENT)
    assert positions.key(("name",)) == (3, 1)
    assert positions.value(("name",)) == (3, 8)
    assert positions.value(("inputs", "command", 2)) == (6, 3)
    assert positions.key(("units", "quoted.key")) == (9, 1)
    assert positions.value(("task", "env", "B", "c", 1, "d")) == (14, 37)
    assert positions.key(("retry", "ladder", 2)) == (19, 1)
    assert positions.key(("retry", "ladder", 2, "vars", "model")) == (21, 1)
    assert positions.key(("retry", "ladder", 2, "vars")) == (21, 1)
    assert positions.key(("retry", "ladder", 2, "extra", "when")) == (23, 1)
    assert ("task", "prompt") in positions.trimmed_newline


def test_unknown_paths_fall_back_to_the_nearest_known_ancestor() -> None:
    positions = scan(DOCUMENT)
    assert positions.key(("retry", "ladder", 1, "missing")) == (17, 1)
    assert positions.key(("nothing", "here")) == (1, 1)


def test_nested_array_of_tables_follows_the_latest_parent() -> None:
    text = "[[a]]\nx = 1\n[[a]]\n[[a.b]]\ny = 2\n[[a.b]]\ny = 3\n"
    tomllib.loads(text)
    positions = scan(text)
    assert positions.key(("a", 1, "b", 1, "y")) == (7, 1)
    assert positions.key(("a", 0, "x")) == (2, 1)


def test_strings_with_brackets_quotes_and_escapes_do_not_confuse_the_scanner() -> None:
    text = 'a = "[x] = {y}"\nb = \'c = "d"\'\nc = """x\n""" # """\nd = "q\\"uote"\ne = [\n  # ]\n  1,\n]\nf = 2\n'
    tomllib.loads(text)
    positions = scan(text)
    assert positions.key(("f",)) == (10, 1)
    assert positions.value(("e", 0)) == (8, 3)
    assert positions.key(("d",)) == (5, 1)


_keys = st.text(alphabet="abcxyzAB_-", min_size=1, max_size=6)
_scalars = st.one_of(st.integers(), st.booleans(), st.text(max_size=8))
_values: st.SearchStrategy[Any] = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_keys, inner, max_size=3)),
    max_leaves=12,
)


def _leaves(value: Any, path: KeyPath = ()) -> list[tuple[KeyPath, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))]
    return [(path, value)]


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_keys, _values, min_size=1, max_size=4))
def test_every_scalar_is_found_where_its_text_starts(document: dict[str, Any]) -> None:
    """For any document tomli-w writes, each scalar's recorded position is where the
    scalar's own literal starts."""
    text = tomli_w.dumps(document)
    positions = scan(text)
    lines = text.split("\n")
    for path, value in _leaves(tomllib.loads(text)):
        assert path in positions.values, path
        line, col = positions.values[path]
        literal = tomli_w.dumps({"v": value})[len("v = ") : -1]
        assert lines[line - 1][col - 1 :].startswith(literal), (path, literal)


def test_tables_named_only_by_dotted_headers_are_located_at_their_first_header() -> None:
    text = 'version = 1\n\n[task.env]\nA = "1"\n[retry.backoff]\ninitial = "1s"\n[retry]\n'
    tomllib.loads(text)
    positions = scan(text)
    assert positions.key(("task",)) == (3, 1)
    # A header of its own, once there is one, is where the table is.
    assert positions.key(("retry",)) == (7, 1)
    assert positions.key(("retry", "backoff")) == (5, 1)


def test_nesting_depth_is_found_before_tomllib_recurses() -> None:
    assert too_deep("a = [[1], {b = [2]}]\n", 3) is None
    assert too_deep('a = "[[[[[[["\n# [[[[[[[\nb = [[[[1]]]]\n', 3) == (3, 8)
    assert too_deep("s = '''\n[[[[\n'''\nt = [[[[\n", 3) == (4, 8)


def test_an_integer_of_more_than_4300_digits_is_located() -> None:
    assert huge_integer("a = 1\nb = " + "7" * 4301 + "\n") == (2, 5)
    assert huge_integer("a = " + "7" * 4300) is None


def test_quoted_keys_with_unicode_escapes_are_found() -> None:
    text = '"\\u001f" = 0\n[tab]\n"a\\U0001F4A5b" = 1\n"\\tx" = { "\\u00e9" = 2 }\n'
    tomllib.loads(text)
    positions = scan(text)
    assert positions.key(("\x1f",)) == (1, 1)
    assert positions.key(("tab", "a\U0001f4a5b")) == (3, 1)
    assert positions.value(("tab", "\tx", "\u00e9")) == (4, 22)


def test_positions_are_read_only() -> None:
    # The loaded Spec keeps them, and Spec is deeply frozen.
    positions = scan('a = """\nx"""\n')
    with pytest.raises(dataclasses.FrozenInstanceError):
        positions.keys = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        positions.keys[("b",)] = (2, 1)  # type: ignore[index]
    assert positions.trimmed_newline == frozenset({("a",)})
