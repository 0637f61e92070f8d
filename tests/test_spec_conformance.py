"""spec.conformance decides a job's validity as jsonschema does, without importing it:
every keyword the schema uses is one it knows, and over the example jobs, every bad
job of tests/data/invalid and thousands of changed copies of the example, the two
give the same answer."""

from __future__ import annotations

import copy
import math
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fanout import spec
from fanout.spec import conformance, schema

ROOT = Path(__file__).resolve().parents[1]
JOBS = [
    ROOT / "fanout.toml.example",
    *sorted((ROOT / "examples").glob("*.toml")),
    # Regular files only: one of them is /dev/zero, to show a device is refused.
    *sorted(p for p in (ROOT / "tests" / "data" / "invalid").glob("*.toml") if p.is_file()),
]
# Values put in place of each value of the example, one at a time: each type, the
# edges of the schema's integer and number, and arrays that repeat an item.
ODD_VALUES: list[Any] = [
    True,
    False,
    0,
    1,
    -1,
    10**20,
    1.0,
    0.5,
    -0.5,
    math.inf,
    math.nan,
    "",
    "x",
    "10m",
    "1GiB",
    "A_B",
    "-x",
    [],
    ["a", "a"],
    [1, True],
    [0, False],
    [{}],
    {},
    {"x": 1},
]


def _jsonschema_says(document: Any, whole: dict[str, Any]) -> bool:
    validator = schema._validator_class()(whole)
    return bool(validator.is_valid(document))


def _schema_nodes(node: Any) -> Iterator[dict[str, Any]]:
    """Every schema in ``node`` (a schema), following the keywords that hold schemas."""
    if not isinstance(node, dict):
        return
    yield node
    for key, value in node.items():
        if key in ("properties", "definitions"):
            for sub in value.values():
                yield from _schema_nodes(sub)
        elif key == "dependencies":
            for sub in value.values():
                if isinstance(sub, dict):
                    yield from _schema_nodes(sub)
        elif key in ("items", "additionalProperties", "propertyNames", "not"):
            yield from _schema_nodes(value)
        elif key in ("oneOf", "anyOf", "allOf"):
            for sub in value:
                yield from _schema_nodes(sub)


def test_every_keyword_of_the_job_schema_is_one_conformance_knows() -> None:
    known = conformance._ANNOTATIONS | set(conformance._KEYWORDS) | {"$ref"}
    used = {key for node in _schema_nodes(schema.job_schema()) for key in node}
    assert used - known == set()
    assert {"type", "$ref", "additionalProperties", "oneOf", "dependencies"} <= used


def test_a_keyword_it_does_not_know_is_left_to_jsonschema() -> None:
    with pytest.raises(conformance.Unknown):
        conformance.conforms([1], {"contains": {"type": "string"}})
    with pytest.raises(conformance.Unknown):
        conformance.conforms({"a": 1}, {"$ref": "other.json#/x"})


@pytest.mark.parametrize("job", JOBS, ids=lambda path: path.name)
def test_each_job_file_gets_jsonschema_s_answer(job: Path) -> None:
    text = job.read_text(encoding="utf-8")
    if text.count("{") + text.count("[") > spec.MAX_NESTING:
        pytest.skip("nested too deeply for tomllib: spec.load refuses it before parsing")
    try:
        document = tomllib.loads(text)
    except ValueError:  # TOMLDecodeError, or an integer too long to read
        pytest.skip("not TOML: the parser's error, before the schema")
    whole = schema.job_schema()
    assert conformance.conforms(document, whole) == _jsonschema_says(document, whole)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if path:
        yield path
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _paths(sub, (*path, key))
    elif isinstance(value, list):
        for index, sub in enumerate(value):
            yield from _paths(sub, (*path, index))


def _replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    changed = copy.deepcopy(document)
    node = changed
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return changed


def test_every_value_of_the_example_changed_gets_jsonschema_s_answer() -> None:
    document = tomllib.loads((ROOT / "fanout.toml.example").read_text(encoding="utf-8"))
    whole = schema.job_schema()
    changed = [
        _replaced(document, path, value) for path in _paths(document) for value in ODD_VALUES
    ]
    # And an unknown key in each table.
    changed += [
        _replaced(document, (*path, "unknownKey"), 1)
        for path in [(), *_paths(document)]
        if isinstance(_at(document, path), dict)
    ]
    answers = {True: 0, False: 0}
    for each in changed:
        said = conformance.conforms(each, whole)
        assert said == _jsonschema_says(each, whole), each
        answers[said] += 1
    assert answers[True] > 100
    assert answers[False] > 1000


def _at(document: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        document = document[part]
    return document


def test_true_is_not_1_and_10_0_is_not_an_integer() -> None:
    assert conformance.conforms(1, {"enum": [1]})
    assert not conformance.conforms(True, {"enum": [1]})
    assert not conformance.conforms(1, {"const": True})
    assert conformance.conforms([1, True], {"uniqueItems": True})
    assert not conformance.conforms([1, 1.0], {"uniqueItems": True})
    assert not conformance.conforms(10.0, {"type": "integer"})
    assert not conformance.conforms(math.inf, {"type": "number"})
    assert conformance.conforms(math.inf, {"minimum": 1})  # not a number: not compared
    assert not conformance.conforms(True, {"type": "integer"})
    assert jsonschema.__name__  # the reference the answers above are jsonschema's
