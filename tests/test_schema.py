"""The JSON Schema: valid draft-07, closed, and in agreement with the spec dataclasses."""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import re
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fanout import spec
from fanout.spec import schema
from fanout.spec.schema import job_schema, schema_text, with_defaults
from fanout.values import quantities
from fanout.values.quantities import parse_duration, parse_size

from helpers import MINIMAL, write_job

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
    (("definitions", "task"), spec.Task, {"from_agent"}),
    (("definitions", "runtime"), spec.Runtime, {"hosts_file"}),
    (("definitions", "host"), spec.Host, set()),
    (("definitions", "limit"), spec.Limit, set()),
    (("definitions", "api"), spec.Api, set()),
    (("definitions", "window"), spec.Window, set()),
    (("definitions", "price"), spec.Price, set()),
    (("definitions", "backoff"), spec.Backoff, set()),
    (("definitions", "retry", "properties", "throttle"), spec.Throttle, set()),
    (("definitions", "retry"), spec.Retry, set()),
    (("definitions", "rung"), spec.Rung, set()),
    (("definitions", "trigger"), spec.Trigger, set()),
    (("properties", "rounds"), spec.Rounds, set()),
    (("properties", "collect"), spec.Collect, set()),
    (("properties", "aggregate"), spec.Aggregate, set()),
    (("properties", "notify"), spec.Notify, set()),
    (("properties", "publish"), spec.Publish, set()),
]


# A key whose field is named for its one value: ``budget = { usd = 20 }`` is
# ``Api.budget_usd`` (a budget in another currency would be another key).
FIELD_OF_KEY: dict[tuple[type, str], str] = {
    (spec.Api, "budget"): "budget_usd",
    (spec.Task, "budget"): "budget_usd",
}


def _field_name(cls: type, key: str) -> str:
    return FIELD_OF_KEY.get((cls, key), spec.snake_case(key))


@pytest.mark.parametrize(
    ("where", "cls", "extra"), AGREEMENT, ids=[cls.__name__ for _, cls, _ in AGREEMENT]
)
def test_schema_keys_and_dataclass_fields_agree(
    where: tuple[str, ...], cls: type, extra: set[str]
) -> None:
    node: Any = job_schema()
    for part in where:
        node = node[part]
    keys = {_field_name(cls, key) for key in node["properties"]}
    assert keys == set(spec.dataclass_fields(cls)) - extra


def test_case_conversion_round_trips_every_key() -> None:
    for node in _subschemas(job_schema()):
        for key in node.get("properties", {}):
            assert spec.camel_case(spec.snake_case(key)) == key


# Defaults: the schema states each one once; the model derives its dataclass defaults
# from it and the builder fills it into the document.  These tests hold the three
# together without trusting the code that links them.

# Fields with a schema default that the model cannot carry: they are resolved against
# the job file's directory and the workspace when the spec is built.
RESOLVED_WHEN_BUILT = {
    (spec.Spec, "runtime"),
    (spec.Runtime, "workspace"),
    (spec.Runtime, "state_dir"),
    # Templates: the schema's default is compiled when the job is built.
    (spec.Publish, "branch"),
    (spec.Publish, "message"),
    (spec.Publish, "unit_message"),
    (spec.Publish, "title"),
    (spec.Publish, "pr"),
    (spec.Publish, "update"),
}


def _property_nodes() -> Iterator[tuple[type, str, dict[str, Any], dataclasses.Field[Any]]]:
    for where, cls, _ in AGREEMENT:
        node: Any = job_schema()
        for part in where:
            node = node[part]
        by_name = {f.name: f for f in dataclasses.fields(cls)}
        for key, prop in node["properties"].items():
            yield cls, key, prop, by_name[_field_name(cls, key)]


def _model_default(item: dataclasses.Field[Any]) -> Any:
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return item.default


def _in_model_units(prop: dict[str, Any]) -> Any:
    value = prop["default"]
    if prop.get("$ref") == "#/definitions/duration":
        return parse_duration(value)
    if prop.get("$ref") == "#/definitions/size":
        return parse_size(value)
    return value


def _literal_values(hint: Any) -> list[Any]:
    """The values a Literal field may hold (a union's Literal members too)."""
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    if hint is bool:
        return [True, False]
    return [v for arg in typing.get_args(hint) for v in _literal_values(arg)]


def test_every_choice_the_model_spells_is_the_schemas() -> None:
    checked = []
    for cls, key, prop, item in _property_nodes():
        node = prop
        while "$ref" in node:
            node = schema.node_at(node["$ref"].removeprefix("#"))
        if "enum" not in node:
            continue
        values = _literal_values(typing.get_type_hints(cls)[item.name])
        if values:  # a plain str (inputs.format) is checked where it is read
            assert values == node["enum"], (cls.__name__, key)
            checked.append(key)
    assert {"overlap", "catchUp", "sandbox", "jitter"} <= set(checked)


def test_the_overlap_choices_of_the_model_and_the_cli_are_the_schemas() -> None:
    from fanout.cli.app import OverlapPolicy

    choices = schema.node_at("/definitions/trigger/properties/overlap")["enum"]
    assert list(typing.get_args(spec.model.Overlap)) == choices
    assert [policy.value for policy in OverlapPolicy] == choices


def test_the_notify_events_of_the_model_are_the_schemas() -> None:
    items = schema.node_at("/properties/notify/properties/on/items")
    assert [event.value for event in spec.NotifyEvent] == items["enum"]


def test_the_publish_commits_of_the_model_are_the_schemas() -> None:
    choices = schema.node_at("/properties/publish/properties/commits")
    assert [commits.value for commits in spec.PublishCommits] == choices["enum"]


def test_every_schema_default_is_the_models_default() -> None:
    checked = []
    for cls, key, prop, item in _property_nodes():
        if "default" not in prop or (cls, item.name) in RESOLVED_WHEN_BUILT:
            continue
        model = _model_default(item)
        if prop["default"] == {}:
            # A table that may be left out: the model holds its all-defaults value.
            assert model == type(model)(), (cls.__name__, key)
        elif key == "ladder":
            assert [{"name": rung.name} for rung in model] == prop["default"]
            assert model == (spec.Rung(name="default"),)
        elif isinstance(prop["default"], list):
            assert model == tuple(prop["default"]), (cls.__name__, key)
        elif isinstance(model, enum.StrEnum):
            # A choice the code decides on is an enum of the schema's values.
            assert model.value == prop["default"], (cls.__name__, key)
        else:
            assert model == _in_model_units(prop), (cls.__name__, key)
            assert type(model) is type(_in_model_units(prop)), (cls.__name__, key)
        checked.append(f"{cls.__name__}.{item.name}")
    assert len(checked) == 48


def test_every_model_default_is_declared_in_the_schema() -> None:
    """A model default with no schema ``default`` is a second source (or a key that may be
    absent with nothing assumed: None or empty, and then no default belongs in either)."""
    for cls, key, prop, item in _property_nodes():
        if item.default is dataclasses.MISSING and item.default_factory is dataclasses.MISSING:
            assert "default" not in prop or (cls, item.name) in RESOLVED_WHEN_BUILT, key
            continue
        model = _model_default(item)
        if model is None or model == () or model == {}:
            assert "default" not in prop, (cls.__name__, key)
        else:
            assert "default" in prop, (cls.__name__, key)


def test_every_default_a_description_mentions_is_the_schema_default() -> None:
    def written(value: Any) -> str:
        return f"'{value}'" if isinstance(value, str) else json.dumps(value)

    mentioned = 0
    for node in _subschemas(job_schema()):
        for key, prop in node.get("properties", {}).items():
            said = re.search(r"\(default ([^):;]+)", prop.get("description", ""))
            if said:
                mentioned += 1
                assert "default" in prop, key
                assert said.group(1).split(", or ")[0] == written(prop["default"]), key
    assert mentioned == 27


def test_a_job_that_sets_nothing_builds_to_the_model_defaults(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        """\
        version = 1
        name = "defaults"
        [inputs]
        command = ["true"]
        format = "lines"
        [task]
        command = ["true"]
        [[runtime.hosts]]
        address = "w1"
        [[limits]]
        name = "api"
        requests = 1
        per = "1s"
        [aggregate]
        command = ["cat"]
        [notify]
        command = ["cat"]
        [[triggers]]
        type = "cron"
        schedule = "@daily"
        """,
    )
    job = spec.load(path)
    assert job.description == ""
    assert job.inputs == spec.Inputs(command=job.inputs.command, format="lines")
    assert job.units == spec.Units()
    assert job.task == spec.Task(command=job.task.command)
    assert job.runtime == spec.Runtime(
        hosts=(spec.Host(name="w1", address="w1"),),
        workspace=tmp_path.resolve(),
        state_dir=tmp_path.resolve() / ".fanout",
    )
    assert job.limits == (spec.Limit(name="api", requests=1, per=1.0),)
    assert job.retry == spec.Retry()
    assert job.rounds == spec.Rounds()
    assert job.collect == spec.Collect()
    assert job.aggregate == spec.Aggregate(command=job.aggregate.command)  # type: ignore[union-attr]
    assert job.notify is not None
    assert job.notify == spec.Notify(command=job.notify.command)
    assert job.notify.on == ("failed", "parked", "spend", "quarantined")
    assert job.triggers == (
        spec.Trigger(type="cron", name="@daily", schedule=job.triggers[0].schedule),
    )
    ladder = write_job(tmp_path, MINIMAL + '[[retry.ladder]]\nname = "only"\n', "ladder.toml")
    assert spec.load(ladder).retry.ladder == (spec.Rung(name="only"),)


def test_defaults_fill_a_copy_and_only_keys_that_have_one() -> None:
    document = tomllib.loads(MINIMAL + '[runtime]\nsandbox = "none"\n')
    before = copy.deepcopy(document)
    filled = with_defaults(document)
    assert document == before
    assert filled["runtime"] == {
        "sandbox": "none",
        "sandboxRoot": "auto",
        "maxConcurrentTasks": 4,
        "unsandboxedSecrets": False,
        "network": False,
        "workspace": ".",
        "stateDir": ".fanout",
        "logLimit": "10MiB",
        "outputTail": "4KiB",
    }
    assert filled["retry"]["ladder"] == [{"name": "default", "attempts": 1}]
    assert filled["units"] == {"version": "", "reuse": "succeeded", "quarantineAfter": 3}
    assert set(filled) - set(document) == {
        "description",
        "units",
        "retry",
        "rounds",
        "collect",
    }


def _pattern_nodes() -> Iterator[tuple[str, dict[str, Any]]]:
    def walk(node: Any, pointer: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if isinstance(node, dict):
            if "pattern" in node:
                yield pointer, node
            for key, value in node.items():
                yield from walk(value, f"{pointer}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                yield from walk(value, f"{pointer}/{index}")

    yield from walk(job_schema(), "#")


def test_every_pattern_has_a_friendly_message_keyed_by_where_it_is() -> None:
    keyed = set(schema._PATTERN_MESSAGES)
    assert {pointer for pointer, _ in _pattern_nodes()} == keyed
    for pointer, node in _pattern_nodes():
        message = schema.pattern_message(node, "!")
        if pointer == "#/definitions/secretName":  # the value may be the secret itself
            assert message.startswith("is not an environment variable name"), message
            assert "!" not in message, message
        else:
            assert message.startswith("'!' is not a"), message


def test_a_secret_pasted_where_its_name_goes_is_not_repeated() -> None:
    pasted = "sk-live-" + "x7Q" * 10
    message = schema.pattern_message(schema.node_at("/definitions/secretName"), pasted)
    assert message == (
        "is not an environment variable name (letters, digits and '_'): write the name of"
        " the coordinator's variable that holds the secret, never the secret (38"
        " characters, not shown)"
    )


def test_a_pattern_message_does_not_depend_on_the_regex_text() -> None:
    # Two definitions with the same regex still get their own words.
    copy_of_env_name = dict(schema.node_at("/definitions/envName"))
    assert schema.pattern_message(copy_of_env_name, "1A") == (
        "'1A' does not match '^[A-Za-z_][A-Za-z0-9_]*$'"
    )
    assert schema.pattern_message(schema.node_at("/definitions/envName"), "1A") == (
        "'1A' is not an environment variable name (letters, digits and '_')"
    )


def test_the_parsers_read_what_the_schema_patterns_allow() -> None:
    # The pattern is written twice, in the schema editors read and in the parser; the
    # parser's message is the schema's (see schema._refused_by).
    assert schema.node_at("/definitions/duration")["pattern"] == quantities.DURATION_PATTERN
    assert schema.node_at("/definitions/size")["pattern"] == quantities.SIZE_PATTERN
