"""The JSON Schema: valid draft-07, closed, and in agreement with the spec dataclasses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from fanout import spec
from fanout.schema import job_schema, schema_text

# Keywords added after draft-07 that taplo / Even Better TOML would not understand.
LATER_KEYWORDS = {
    "$defs",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedProperties",
    "unevaluatedItems",
    "prefixItems",
    "minContains",
    "maxContains",
}


def _subschemas(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _subschemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _subschemas(value)


def test_schema_is_valid_draft_07() -> None:
    schema = job_schema()
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)


def test_schema_uses_no_keyword_newer_than_draft_07() -> None:
    used = {key for node in _subschemas(job_schema()) for key in node}
    assert used & LATER_KEYWORDS == set()


def test_every_table_is_closed() -> None:
    for node in _subschemas(job_schema()):
        if node.get("type") == "object":
            assert "additionalProperties" in node, node.get("description")
            assert node["additionalProperties"] is not True


def test_the_schema_file_is_the_one_fanout_reads(repo: Any) -> None:
    assert schema_text() == (repo / "schemas" / "fanout.schema.json").read_text()
    json.loads(schema_text())


# (schema definition or property path, dataclass, dataclass fields that are not keys)
AGREEMENT = [
    ((), spec.Spec, {"file", "templates", "positions"}),
    (("definitions", "inputs"), spec.Inputs, set()),
    (("definitions", "units"), spec.Units, set()),
    (("definitions", "task"), spec.Task, set()),
    (("definitions", "runtime"), spec.Runtime, {"hosts_file"}),
    (("definitions", "host"), spec.Host, set()),
    (("definitions", "limit"), spec.Limit, set()),
    (("definitions", "backoff"), spec.Backoff, set()),
    (("definitions", "retry", "properties", "throttle"), spec.Throttle, set()),
    (("definitions", "retry"), spec.Retry, set()),
    (("definitions", "rung"), spec.Rung, set()),
    (("definitions", "trigger"), spec.Trigger, set()),
    (("properties", "rounds"), spec.Rounds, set()),
    (("properties", "collect"), spec.Collect, set()),
    (("properties", "aggregate"), spec.Aggregate, set()),
]


@pytest.mark.parametrize(
    ("where", "cls", "extra"), AGREEMENT, ids=[cls.__name__ for _, cls, _ in AGREEMENT]
)
def test_schema_keys_and_dataclass_fields_agree(
    where: tuple[str, ...], cls: type, extra: set[str]
) -> None:
    node: Any = job_schema()
    for part in where:
        node = node[part]
    keys = {spec.snake_case(key) for key in node["properties"]}
    assert keys == set(spec.dataclass_fields(cls)) - extra


def test_case_conversion_round_trips_every_key() -> None:
    for node in _subschemas(job_schema()):
        for key in node.get("properties", {}):
            assert spec.camel_case(spec.snake_case(key)) == key
