"""Whether a document conforms to the job schema, decided without jsonschema: importing
it (and referencing, attrs) was a quarter of ``fanout validate``'s start.

``conforms`` knows the Draft 7 keywords the job schema uses, with jsonschema's meaning
of each (``$ref`` hides its siblings; a keyword ignores a value of a type it does not
apply to; ``enum``, ``const`` and ``uniqueItems`` tell ``true`` from ``1``) and the
schema's own types (``schema.py``: an integer is never a float or a boolean, a number
never inf or nan).  It only answers: a schema with any other keyword raises Unknown,
and ``schema`` asks jsonschema, which also says what is wrong whenever this says a
document does not conform.  tests/test_spec_conformance.py holds the two to the same
answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any


class Unknown(Exception):
    """A schema this module cannot decide (a keyword or a reference it does not know)."""


# Keywords that say nothing about validity in Draft 7 (``format`` asserts nothing
# without a format checker, and fanout passes none).
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "title", "description", "default", "examples"}
    | {"definitions", "format", "markdownDescription", "readOnly", "writeOnly"}
)


def is_integer(value: object) -> bool:
    """The schema's integer: TOML tells 10 from 10.0, and a count must be an int."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """The schema's number: not inf or nan, which no fanout setting can mean."""
    if isinstance(value, float):
        return math.isfinite(value)
    return is_integer(value)


_TYPES: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": is_integer,
    "number": is_number,
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _unbool(value: object) -> object:
    # jsonschema's ``_utils.unbool``: true and 1, false and 0, are different values.
    return ("bool", value) if isinstance(value, bool) else value


def _equal(one: object, two: object) -> bool:
    """jsonschema's ``_utils.equal``."""
    if one is two:
        return True
    if isinstance(one, str) or isinstance(two, str):
        return one == two
    if isinstance(one, Sequence) and isinstance(two, Sequence):
        return len(one) == len(two) and all(_equal(a, b) for a, b in zip(one, two, strict=True))
    if isinstance(one, Mapping) and isinstance(two, Mapping):
        return one.keys() == two.keys() and all(_equal(one[k], two[k]) for k in one)
    return _unbool(one) == _unbool(two)


def _unique(items: list[Any]) -> bool:
    seen: list[object] = []
    for item in items:
        if any(_equal(earlier, item) for earlier in seen):
            return False
        seen.append(item)
    return True


def conforms(document: object, schema: Mapping[str, Any]) -> bool:
    """Whether ``document`` is valid against ``schema`` (a whole schema: its ``$ref``s
    are JSON Pointers into it).  Raises Unknown where it cannot tell."""
    return _Checker(schema).valid(document, schema)


class _Checker:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def resolve(self, ref: str) -> object:
        if not ref.startswith("#"):
            raise Unknown(ref)
        node: Any = self.root
        for part in ref[1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise Unknown(ref)
            node = node[part]
        return node

    def valid(self, value: Any, schema: object) -> bool:
        if schema is True or schema is False:
            return schema
        if not isinstance(schema, dict):
            raise Unknown(repr(schema))
        if "$ref" in schema:  # Draft 7: its siblings are not applied
            return self.valid(value, self.resolve(schema["$ref"]))
        return all(self.keyword(key, rule, value, schema) for key, rule in schema.items())

    def keyword(self, key: str, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        if key in _ANNOTATIONS:
            return True
        check = _KEYWORDS.get(key)
        if check is None:
            raise Unknown(key)
        return check(self, rule, value, schema)

    def _type(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        names = [rule] if isinstance(rule, str) else rule
        if any(name not in _TYPES for name in names):
            raise Unknown(f"type {rule!r}")
        return any(_TYPES[name](value) for name in names)

    def _properties(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        if not isinstance(value, dict):
            return True
        return all(self.valid(value[k], sub) for k, sub in rule.items() if k in value)

    def _additional_properties(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        if not isinstance(value, dict):
            return True
        if "patternProperties" in schema:
            raise Unknown("patternProperties")
        extras = [k for k in value if k not in schema.get("properties", {})]
        if isinstance(rule, dict):
            return all(self.valid(value[k], rule) for k in extras)
        return bool(rule) or not extras

    def _required(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not isinstance(value, dict) or all(name in value for name in rule)

    def _property_names(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not isinstance(value, dict) or all(self.valid(k, rule) for k in value)

    def _dependencies(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        if not isinstance(value, dict):
            return True
        for key, needed in rule.items():
            if key not in value:
                continue
            if isinstance(needed, list):
                if any(name not in value for name in needed):
                    return False
            elif not self.valid(value, needed):
                return False
        return True

    def _items(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        if not isinstance(value, list):
            return True
        if isinstance(rule, list):
            raise Unknown("items as a list")
        return all(self.valid(item, rule) for item in value)

    def _min_items(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not isinstance(value, list) or len(value) >= rule

    def _max_items(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not isinstance(value, list) or len(value) <= rule

    def _unique_items(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not rule or not isinstance(value, list) or _unique(value)

    def _min_length(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not isinstance(value, str) or len(value) >= rule

    def _max_length(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not isinstance(value, str) or len(value) <= rule

    def _pattern(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not isinstance(value, str) or re.search(rule, value) is not None

    def _minimum(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not is_number(value) or value >= rule

    def _maximum(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not is_number(value) or value <= rule

    def _exclusive_minimum(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not is_number(value) or value > rule

    def _exclusive_maximum(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not is_number(value) or value < rule

    def _enum(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return any(_equal(each, value) for each in rule)

    def _const(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return _equal(value, rule)

    def _one_of(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return sum(1 for sub in rule if self.valid(value, sub)) == 1

    def _any_of(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return any(self.valid(value, sub) for sub in rule)

    def _all_of(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return all(self.valid(value, sub) for sub in rule)

    def _not(self, rule: Any, value: Any, schema: dict[str, Any]) -> bool:
        return not self.valid(value, rule)


# Each keyword's check: (checker, the keyword's value, the instance, its schema).
_KEYWORDS: dict[str, Callable[[_Checker, Any, Any, dict[str, Any]], bool]] = {
    "type": _Checker._type,
    "properties": _Checker._properties,
    "additionalProperties": _Checker._additional_properties,
    "required": _Checker._required,
    "propertyNames": _Checker._property_names,
    "dependencies": _Checker._dependencies,
    "items": _Checker._items,
    "minItems": _Checker._min_items,
    "maxItems": _Checker._max_items,
    "uniqueItems": _Checker._unique_items,
    "minLength": _Checker._min_length,
    "maxLength": _Checker._max_length,
    "pattern": _Checker._pattern,
    "minimum": _Checker._minimum,
    "maximum": _Checker._maximum,
    "exclusiveMinimum": _Checker._exclusive_minimum,
    "exclusiveMaximum": _Checker._exclusive_maximum,
    "enum": _Checker._enum,
    "const": _Checker._const,
    "oneOf": _Checker._one_of,
    "anyOf": _Checker._any_of,
    "allOf": _Checker._all_of,
    "not": _Checker._not,
}
