"""The job file's JSON Schema: loading it, reading its defaults, and turning
jsonschema's findings into Problems.

The schema in ``schemas/fanout.schema.json`` is the single source of truth for what a
job file may say, and for what fanout assumes where it says nothing: each default is
the ``default`` of its key there, and only there.  The schema is the source rather than
the dataclasses because it is what users and their editors read (taplo shows a key's
default as it is written, ``"10m"``), and because it is hand-written JSON that nothing
generates; ``spec.model`` derives its dataclass defaults from it (in seconds and bytes)
and ``spec.build`` fills it into the document before reading it, so neither repeats a
value.  A default here is a value the user could have written; an absent optional key
(no image, no verify command) is None or empty in the model and has no ``default``.

Friendly messages for a failed ``pattern`` are keyed by the JSON Pointer of the schema
node that holds the pattern (``#/definitions/duration``), not by a copy of its regex.
This is the only module that imports jsonschema, and only to say what is wrong (or
where ``conformance`` cannot tell): a valid job is checked without it.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import Problem, did_you_mean
from ..values.quantities import parse_duration, parse_size
from ..values.tomlpos import KeyPath, Positions
from . import conformance

if TYPE_CHECKING:
    import jsonschema

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def schema_text() -> str:
    """The schema as shipped: inside the wheel, or in ``schemas/`` of a source checkout.
    Found beside the package's files rather than through ``importlib.resources``, whose
    import was 5% of ``fanout validate`` (fanout is installed as files, never zipped)."""
    packaged = Path(__file__).resolve().parents[1] / "fanout.schema.json"
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    source = Path(__file__).resolve().parents[3] / "schemas" / "fanout.schema.json"
    return source.read_text(encoding="utf-8")


@functools.cache
def job_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(schema_text())
    return schema


def node_at(pointer: str) -> dict[str, Any]:
    """The schema node at a JSON Pointer (``/definitions/task``; ``""`` is the root)."""
    node: dict[str, Any] = job_schema()
    for part in pointer.split("/")[1:]:
        node = node[part]
    return node


def _resolved(node: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in node:
        node = node_at(node["$ref"].removeprefix("#"))
    return node


def property_node(table: str, key: str) -> Mapping[str, Any]:
    """The schema of ``key`` in the table at JSON Pointer ``table``, as written there (a
    ``$ref`` not followed, so its siblings, ``default`` among them, are kept)."""
    node: Mapping[str, Any] = _resolved(node_at(table))["properties"][key]
    return node


def default(table: str, key: str) -> Any:
    """The default of ``key`` in the table at JSON Pointer ``table``, as a job file
    would write it (``"10m"``, not 600.0).  A fresh copy: callers may keep it."""
    return copy.deepcopy(property_node(table, key)["default"])


def with_defaults(document: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a valid job ``document`` with each absent key that has a default
    filled in, in every table that is written or itself has a default (``{}``)."""
    filled: dict[str, Any] = _fill(document, job_schema())
    return filled


def _fill(value: Any, node: Mapping[str, Any]) -> Any:
    node = _resolved(node)
    if isinstance(value, dict):
        properties: Mapping[str, Any] = node.get("properties", {})
        out = {k: _fill(v, properties[k]) if k in properties else v for k, v in value.items()}
        for key, sub in properties.items():
            if key not in out and "default" in sub:
                out[key] = _fill(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [_fill(item, node["items"]) for item in value]
    return value


@functools.cache
def _definition_validator(name: str) -> Any:
    return _validator_class()(subschema(name))


def conforms(definition: str, value: object) -> bool:
    """Whether ``value`` is valid as the schema's ``definition`` (e.g. ``duration``)."""
    try:
        return conformance.conforms(value, subschema(definition))
    except conformance.Unknown:
        return bool(_definition_validator(definition).is_valid(value))


def subschema(name: str) -> dict[str, Any]:
    """A schema for one definition (``hostsFile``), resolving refs against the job schema."""
    whole = job_schema()
    return {"$ref": f"#/definitions/{name}", "definitions": whole["definitions"]}


def key_name(path: KeyPath) -> str:
    """``("retry", "ladder", 2, "vars")`` -> ``retry.ladder[2].vars``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            shown = part if _BARE.match(part) else json.dumps(part)
            text += f".{shown}" if text else shown
    return text


def check(
    document: Mapping[str, Any],
    *,
    schema: Mapping[str, Any],
    file: str,
    positions: Positions,
) -> list[Problem]:
    """Every schema violation in ``document`` as a located Problem."""
    try:
        if conformance.conforms(document, schema):
            return []
    except conformance.Unknown:
        pass
    validator = _validator_class()(schema)
    problems: list[Problem] = []
    seen: set[tuple[KeyPath, str]] = set()
    for error in validator.iter_errors(document):
        for path, at_key, message in _explain(error):
            if (path, message) in seen:
                continue
            seen.add((path, message))
            line, col = positions.key(path) if at_key else positions.value(path)
            problems.append(
                Problem(file=file, line=line, col=col, key=key_name(path), message=message)
            )
    return problems


@functools.cache
def _validator_class() -> Any:
    """Draft 7 with the schema's integer and number (``conformance``'s)."""
    import jsonschema

    checker = jsonschema.Draft7Validator.TYPE_CHECKER.redefine_many(
        {
            "integer": lambda _, instance: conformance.is_integer(instance),
            "number": lambda _, instance: conformance.is_number(instance),
        }
    )
    return jsonschema.validators.extend(jsonschema.Draft7Validator, type_checker=checker)  # type: ignore[no-untyped-call]


def _quote_list(values: Iterable[object]) -> str:
    shown = [repr(v) if isinstance(v, str) else json.dumps(v) for v in values]
    return ", ".join(shown[:-1]) + f" or {shown[-1]}" if len(shown) > 1 else "".join(shown)


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return repr(value)  # "got 2.0" says why it is not an integer, "got nan" too
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # TOML dates and times


_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "array": "an array",
    "object": "a table",
}


def _refused_by(parse: Callable[[str], object]) -> Callable[[str], str]:
    """The parser's own words for a value it cannot read: how to write a duration or a
    size is said once, where it is parsed."""

    def explain(value: str) -> str:
        try:
            parse(value)
        except ValueError as exc:
            return str(exc)
        raise AssertionError(f"{value!r} failed the schema's pattern but parses")

    return explain


# Keyed by the JSON Pointer of the schema node whose ``pattern`` failed (a test checks
# that every pattern in the schema has one), so a pattern is written only in the schema.
_PATTERN_MESSAGES: dict[str, Callable[[str], str]] = {
    "#/definitions/duration": _refused_by(parse_duration),
    "#/definitions/size": _refused_by(parse_size),
    "#/definitions/envName": lambda v: (
        f"{v!r} is not an environment variable name (letters, digits and '_')"
    ),
    # What is written where a secret's name belongs may be the secret itself, pasted:
    # never repeated (the message goes to consoles and CI logs).
    "#/definitions/secretName": lambda v: (
        "is not an environment variable name (letters, digits and '_'): write the name of"
        f" the coordinator's variable that holds the secret, never the secret ({len(v)}"
        " characters, not shown)"
    ),
    "#/definitions/limitName": lambda v: (
        f"{v!r} is not a limit name (lowercase letters, digits, '_' and '-')"
    ),
    "#/properties/name": lambda v: (
        f"{v!r} is not a job name (at most 64 lowercase letters, digits, '.', '_' and '-')"
    ),
    "#/definitions/api/properties/name": lambda v: (
        f"{v!r} is not an API name (at most 63 lowercase letters, digits and '-', "
        "starting with a letter)"
    ),
    "#/definitions/rung/properties/name": lambda v: (
        f"{v!r} is not a rung name (letters, digits, '.', '_' and '-')"
    ),
    "#/definitions/inputs/properties/pointer": lambda v: (
        f"{v!r} is not a JSON Pointer; write '' or one starting with '/'"
    ),
    "#/definitions/units/properties/groupBy": lambda v: (
        f"{v!r} is not a record field (names of letters, digits, '_' and '-', "
        "joined by '.' for nested fields, as in 'location.file')"
    ),
    # Passed to git as an argument: a leading '-' would be read as an option.
    "#/properties/publish/properties/remote": lambda v: (
        f"{v!r} is not a git remote (a name or URL, without spaces or a leading '-')"
    ),
    "#/properties/publish/properties/base": lambda v: (
        f"{v!r} is not a branch name (without spaces or a leading '-')"
    ),
}


@functools.cache
def _pointers() -> dict[int, str]:
    """The JSON Pointer of each node of the job schema, by the node's identity:
    jsonschema reports the node a keyword failed in (followed through ``$ref``), not
    where that node is."""
    found: dict[int, str] = {}

    def walk(node: object, pointer: str) -> None:
        if isinstance(node, dict):
            found[id(node)] = pointer
            for key, value in node.items():
                walk(value, f"{pointer}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{pointer}/{index}")

    walk(job_schema(), "#")
    return found


def pattern_message(node: Mapping[str, Any], value: str) -> str:
    """What is wrong with ``value``, which failed the ``pattern`` of schema ``node``."""
    explain = _PATTERN_MESSAGES.get(_pointers().get(id(node), ""))
    return explain(value) if explain else f"{value!r} does not match {node['pattern']!r}"


def _explain(error: jsonschema.ValidationError) -> list[tuple[KeyPath, bool, str]]:
    """(key path, point at the key rather than the value, message) for one error."""
    path: KeyPath = tuple(error.absolute_path)
    # jsonschema's stubs type these as "Any | Unset"; on a reported error they are set.
    instance: Any = error.instance
    validator: Any = error.validator
    value: Any = error.validator_value
    node: Any = error.schema
    if validator == "additionalProperties":
        allowed = list(node.get("properties", {}))
        found: list[tuple[KeyPath, bool, str]] = []
        for extra in sorted(set(instance) - set(allowed)):
            guess = did_you_mean(extra, allowed)
            hint = (
                f" (did you mean {guess!r}?)"
                if guess
                else f"; expected one of: {', '.join(allowed)}"
            )
            found.append(((*path, extra), True, f"unknown key{hint}"))
        return found
    if validator == "required":
        missing = [name for name in value if name not in instance]
        return [(path, True, f"missing required key {name!r}") for name in missing]
    if validator == "type":
        wanted = [value] if isinstance(value, str) else list(value)
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in wanted)
        return [(path, False, f"expected {words}, got {_kind(instance)}")]
    if validator == "enum":
        guess = did_you_mean(str(instance), [str(v) for v in value])
        hint = f" (did you mean {guess!r}?)" if guess else ""
        return [(path, False, f"must be {_quote_list(value)}, not {instance!r}{hint}")]
    if validator == "const":
        return [(path, False, f"must be {_quote_list([value])}, not {instance!r}")]
    if validator == "pattern" and "propertyNames" in error.relative_schema_path:
        return [((*path, instance), True, pattern_message(node, instance))]
    if validator == "pattern":
        return [(path, False, pattern_message(node, instance))]
    if validator in ("minimum", "maximum"):
        word = "at least" if validator == "minimum" else "at most"
        return [(path, False, f"must be {word} {value}, not {instance}")]
    if validator in ("exclusiveMinimum", "exclusiveMaximum"):
        word = "more" if validator == "exclusiveMinimum" else "less"
        return [(path, False, f"must be {word} than {value}, not {instance}")]
    if validator in ("minItems", "minLength"):
        return [(path, False, "must not be empty")]
    if validator == "uniqueItems":
        repeated = sorted({repr(v) for v in instance if instance.count(v) > 1})
        return [(path, False, f"lists {', '.join(repeated)} more than once")]
    if validator == "dependencies":
        return [
            ((*path, key), True, f"only applies together with {_quote_list(needed)}")
            for key, needed in value.items()
            if key in instance and any(n not in instance for n in needed)
        ]
    if validator == "oneOf":
        return _explain_one_of(error, path)
    if validator == "anyOf" and all(set(o) == {"required"} for o in value):
        # task: a command, an agent preset that supplies one, or both.
        names = [o["required"][0] for o in value]
        return [(path, True, f"missing required key {_quote_list(names)}")]
    return [(path, False, error.message)]


def _explain_one_of(
    error: jsonschema.ValidationError, path: KeyPath
) -> list[tuple[KeyPath, bool, str]]:
    options: Any = error.validator_value
    instance: Any = error.instance
    if all(set(o) == {"required"} for o in options):
        if not isinstance(instance, dict):
            return [(path, False, f"expected a table, got {_kind(instance)}")]
        names = [o["required"][0] for o in options]
        present = [n for n in names if n in instance]
        found = _quote_list(present).replace(" or ", " and ") if present else "none"
        return [(path, True, f"declare exactly one of {_quote_list(names)}; found {found}")]
    # A value of the right type for one branch failed inside it: explain that branch.
    for index, option in enumerate(options):
        if _matches_type(instance, option.get("type")):
            inner = [e for e in error.context or [] if e.relative_schema_path[0] == index]
            return [found for e in inner for found in _explain(e)]
    kinds = [_TYPE_WORDS.get(str(o.get("type")), "a value") for o in options]
    return [(path, False, f"expected {' or '.join(kinds)}, got {_kind(instance)}")]


def _matches_type(instance: object, kind: object) -> bool:
    python_types: dict[object, type | tuple[type, ...]] = {
        "string": str,
        "array": list,
        "object": dict,
        "integer": int,
        "boolean": bool,
    }
    wanted = python_types.get(kind)
    return wanted is not None and isinstance(instance, wanted)
