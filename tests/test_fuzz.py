"""Property tests: mutated job files never crash validation or planning, and every
problem is reported at the line of what was mutated.

A valid, rich job is written out as TOML by ``emit``, which remembers the line each key
lands on; hypothesis then mutates it (wrong types, unknown keys at every depth, unicode,
huge numbers, deep nesting, broken TOML, bad globs, durations, cron expressions, time
zones, templates that fail while rendering) and each file goes through ``spec.load``
and ``plan.make`` in-process, and through ``fanout validate`` for one property.  Zero
tracebacks: anything but a JobError fails the test.  Where the mutated key is known,
some reported problem must be on its line.  The examples are new on every run; on a
failure hypothesis prints the falsifying file (``note``) and a blob to replay it.

Together the properties generate well over 1,000 job files per run; the last test
checks the count.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from fanout import plan, spec
from fanout.errors import InputFailed, JobError, Problem
from fanout.spec.schema import key_name
from fanout.values.tomlpos import KeyPath

from helpers import cli

# FANOUT_FUZZ_SCALE=20 multiplies every property's examples for a deeper hunt.
SCALE = int(os.environ.get("FANOUT_FUZZ_SCALE", "1"))


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples * SCALE,
        deadline=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


GENERATED: list[int] = []

BASE: dict[str, Any] = {
    "version": 1,
    "name": "fuzz",
    "description": "a job the properties mutate",
    "inputs": {"items": ["alpha", {"id": "beta", "size": 2}]},
    "units": {"stage": ["{{ unit.id }}.txt"], "collect": ["out/{{ unit.id }}"]},
    "task": {
        "prompt": "Fix {{ unit.id }} ({{ unit.index }}) with {{ rung.vars.model }}.\n",
        "command": ["echo", "{{ unit.id }}", "--model", "{{ rung.vars.model }}"],
        "verify": ["test", "-n", "{{ unit.id | shquote }}"],
        "timeout": "10m",
        "env": {"MODE": "fast", "UNIT": "{{ unit.id }}"},
        "secrets": ["API_KEY"],
        "limits": ["api"],
        "throttlePatterns": ["rate.limit"],
    },
    "runtime": {
        "maxConcurrentTasks": 2,
        "sandbox": "none",
        # Secrets in plain directories: accepted, so the base job is valid.
        "unsandboxedSecrets": True,
        "network": False,
        "logLimit": "1MiB",
        "outputTail": "4KiB",
        "hosts": [
            {"name": "b1", "address": "build-1.internal", "user": "fanout", "slots": 2},
            {"address": "10.0.0.7", "port": 2222, "labels": ["gpu"]},
        ],
    },
    "limits": [{"name": "api", "requests": 10, "per": "1m", "requestsPerTask": 1}],
    "retry": {
        "backoff": {"initial": "1s", "max": "1m", "jitter": "full"},
        "ladder": [
            {"name": "first", "vars": {"model": "small"}},
            {
                "name": "second",
                "attempts": 2,
                "timeout": "5m",
                "vars": {"model": "large"},
                "promptSuffix": "Previous: {{ last.reason }}",
            },
        ],
    },
    "rounds": {"max": 2},
    "collect": {"apply": False},
    "aggregate": {"command": ["echo", "{{ job.name }}"], "timeout": "1m"},
    "triggers": [
        {
            "type": "cron",
            "name": "nightly",
            "schedule": "0 3 * * 1-5",
            "timezone": "Europe/Berlin",
            "overlap": "skip",
            "catchUp": "latest",
            "startingDeadline": "1h",
            "vars": {"mode": "full", "depth": 2},
        }
    ],
}

# Tables whose keys the schema closes (additionalProperties: false): an extra key there
# is always an error.  Maps such as task.env or rung vars take any key.
CLOSED: tuple[KeyPath, ...] = (
    (),
    ("inputs",),
    ("units",),
    ("task",),
    ("runtime",),
    ("limits", 0),
    ("retry",),
    ("retry", "backoff"),
    ("retry", "ladder", 0),
    ("retry", "ladder", 1),
    ("rounds",),
    ("collect",),
    ("aggregate",),
    ("triggers", 0),
    ("runtime", "hosts", 0),
    ("runtime", "hosts", 1),
)

# Templates: plan renders the first unit's task on the first rung; the second rung's
# suffix and the aggregate command are only checked.
TEMPLATES: tuple[KeyPath, ...] = (
    ("task", "prompt"),
    ("task", "command", 1),
    ("task", "verify", 2),
    ("task", "env", "UNIT"),
    ("units", "stage", 0),
    ("units", "collect", 0),
    ("units", "id"),
    ("retry", "ladder", 1, "promptSuffix"),
    ("aggregate", "command", 1),
)

DURATIONS: tuple[KeyPath, ...] = (
    ("task", "timeout"),
    ("limits", 0, "per"),
    ("retry", "backoff", "initial"),
    ("retry", "backoff", "max"),
    ("retry", "ladder", 1, "timeout"),
    ("aggregate", "timeout"),
    ("triggers", 0, "startingDeadline"),
)


@dataclass(frozen=True)
class Raw:
    """TOML text written as is for a value (huge integers, deep nesting, broken syntax)."""

    text: str


# --- writing TOML and remembering lines ---------------------------------------------

_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(name: str) -> str:
    return name if _BARE.fullmatch(name) else _string(name)


def _string(text: str) -> str:
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _inline(value: Any) -> str:
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_inline(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def emit(doc: dict[str, Any], headers: frozenset[KeyPath]) -> tuple[str, dict[KeyPath, int]]:
    """``doc`` as TOML and the line each key path is written on.  Tables and arrays of
    tables in ``headers`` get ``[a.b]`` / ``[[a.b]]`` headers, everything else is inline;
    a table holding only sub-tables gets no header of its own (``[retry.backoff]``
    without ``[retry]``)."""
    lines: list[str] = []
    where: dict[KeyPath, int] = {}

    def put(text: str, path: KeyPath | None = None) -> None:
        lines.append(text)
        if path is not None:
            where.setdefault(path, len(lines))

    def table(path: KeyPath, value: dict[str, Any], header: str | None) -> None:
        deferred: list[tuple[KeyPath, Any, str]] = []
        plain: list[tuple[KeyPath, str, Any]] = []
        for name, item in value.items():
            sub = (*path, name)
            if sub in headers and isinstance(item, dict):
                deferred.append((sub, item, "table"))
            elif (
                sub in headers
                and isinstance(item, list)
                and item
                and all(isinstance(entry, dict) for entry in item)
            ):
                deferred.append((sub, item, "array"))
            else:
                plain.append((sub, name, item))
        if header is not None and (plain or not deferred):
            put(header, path)
        for sub, name, item in plain:
            put(f"{_key(name)} = {_inline(item)}", sub)
        for sub, item, kind in deferred:
            dotted = ".".join(_key(str(p)) for p in sub)
            if kind == "table":
                table(sub, item, f"[{dotted}]")
            else:
                for index, entry in enumerate(item):
                    put(f"[[{dotted}]]", (*sub, index))
                    where.setdefault(sub, len(lines))
                    table((*sub, index), entry, None)

    table((), doc, None)
    return "\n".join(lines) + "\n", where


def line_of(where: dict[KeyPath, int], path: KeyPath) -> int:
    for end in range(len(path), 0, -1):
        if path[:end] in where:
            return where[path[:end]]
    return 1


# --- mutating documents -------------------------------------------------------------


def paths(value: Any, path: KeyPath = ()) -> Iterator[KeyPath]:
    """Every key path in ``value`` (tables and arrays are followed)."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield (*path, name)
            yield from paths(item, (*path, name))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*path, index)
            yield from paths(item, (*path, index))


def get(doc: Any, path: KeyPath) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def put_value(doc: dict[str, Any], path: KeyPath, value: Any) -> None:
    parent = get(doc, path[:-1])
    parent[path[-1]] = value


headers_strategy = st.frozensets(
    st.sampled_from(
        [
            ("inputs",),
            ("units",),
            ("task",),
            ("task", "env"),
            ("runtime",),
            ("runtime", "hosts"),
            ("limits",),
            ("retry",),
            ("retry", "backoff"),
            ("retry", "ladder"),
            ("rounds",),
            ("collect",),
            ("aggregate",),
            ("triggers",),
        ]
    )
)

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=30),
    st.dates(),
    st.datetimes(timezones=st.just(datetime.UTC)),
    st.times(),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(min_size=1, max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


hostile = st.one_of(
    st.integers(min_value=20, max_value=6000).map(lambda n: Raw("9" * n)),
    st.integers(min_value=20, max_value=400).map(lambda n: Raw("-1" + "0" * n)),
    st.sampled_from([1e308, -1e308, 5e-324, float("nan"), float("inf")]),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=40),
    st.sampled_from(["", "\x00", "a\x00b", "\u202e", "\ufeff", "💥" * 50, "x" * 5000]),
    st.integers(min_value=1, max_value=250).flatmap(
        lambda depth: st.sampled_from(
            [Raw("[" * depth + "1" + "]" * depth), Raw("{ a = " * depth + "1" + " }" * depth)]
        )
    ),
)


@dataclass
class Case:
    """One mutated job file: its text, the mutated key and the lines a problem may be on."""

    text: str
    key: KeyPath | None
    lines: frozenset[int]
    # True when the mutation is always an error (an unknown key in a closed table).
    must_fail: bool = False


def _case(
    doc: dict[str, Any], headers: frozenset[KeyPath], key: KeyPath | None, also: KeyPath = ()
) -> Case:
    text, where = emit(doc, headers)
    lines = {line_of(where, key)} if key is not None else set()
    if also:
        lines.add(line_of(where, also))
    return Case(text=text, key=key, lines=frozenset(lines))


@st.composite
def unknown_keys(draw: st.DrawFn) -> Case:
    doc = copy.deepcopy(BASE)
    table = draw(st.sampled_from(CLOSED))
    known = get(doc, table)
    near = [k[:-1] + "x" for k in known] + [k.upper() for k in known] + [k + "s" for k in known]
    name = draw(st.sampled_from(near) | st.text(min_size=1, max_size=12))
    assume(name not in known)
    known[name] = draw(values)
    case = _case(doc, draw(headers_strategy), (*table, name))
    case.must_fail = True
    return case


@st.composite
def wrong_types(draw: st.DrawFn) -> Case:
    doc = copy.deepcopy(BASE)
    path = draw(st.sampled_from(sorted(paths(doc), key=str)))
    old = get(doc, path)
    new = draw(values)
    assume(_kind(new) != _kind(old))
    put_value(doc, path, new)
    return _case(doc, draw(headers_strategy), path, also=_reported_at(path))


def _reported_at(path: KeyPath) -> KeyPath:
    """Where a hostile value at ``path`` may be reported instead of at its own line.  A
    record of inline data that breaks selection is reported by ``units`` (which decides
    what a unit's id is), not at the record; a rung's var that no program can be given
    (a NUL byte) by the first template that renders it, the prompt; a limit renamed by
    the task's reference to the old name (``task.limits``: an unknown limit)."""
    if path[:2] == ("inputs", "items"):
        return ("units",)
    if path[:1] == ("limits",) and path[-1] == "name":
        return ("task", "limits")
    if path[:2] == ("retry", "ladder") and "vars" in path:
        return ("task", "prompt")
    return ()


@st.composite
def hostile_values(draw: st.DrawFn) -> Case:
    doc = copy.deepcopy(BASE)
    path = draw(st.sampled_from(sorted(paths(doc), key=str)))
    put_value(doc, path, draw(hostile))
    return _case(doc, draw(headers_strategy), path, also=_reported_at(path))


glob_text = st.text(alphabet="ab*?[]!^-/.z\\", min_size=1, max_size=12)
duration_text = st.one_of(
    st.text(alphabet="0123456789dhms", min_size=1, max_size=10),
    st.integers(min_value=10, max_value=500).map(lambda n: "9" * n + "s"),
)
cron_text = st.one_of(
    st.lists(
        st.text(alphabet="0123456789*/,-LW#?", min_size=1, max_size=6), min_size=1, max_size=7
    ).map(" ".join),
    st.sampled_from(["@daily", "@reboot", "@every 5m", "", " ", "61 * * * *", "* * 31 2 *"]),
)
zone_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["Europe/Berlin", "utc", "America", "../etc/passwd", "Europe/", "\x00"]),
    st.integers(min_value=100, max_value=400).map(lambda n: "Europe/" + "A" * n),
)


@st.composite
def bad_globs(draw: st.DrawFn) -> Case:
    doc = copy.deepcopy(BASE)
    doc["inputs"] = {"files": draw(st.lists(glob_text, min_size=1, max_size=3))}
    if draw(st.booleans()):
        doc["inputs"]["exclude"] = draw(st.lists(glob_text, min_size=1, max_size=2))
    text, where = emit(doc, draw(headers_strategy))
    lines = {line_of(where, ("inputs", key)) for key in doc["inputs"]}
    return Case(text=text, key=("inputs",), lines=frozenset(lines))


@st.composite
def bad_schedules(draw: st.DrawFn) -> Case:
    doc = copy.deepcopy(BASE)
    kind = draw(st.sampled_from(["duration", "schedule", "timezone"]))
    if kind == "duration":
        path = draw(st.sampled_from(DURATIONS))
        put_value(doc, path, draw(duration_text))
        # backoff's initial and max are compared: the problem may sit on either line.
        other = path[:-1] + (("max",) if path[-1] == "initial" else ("initial",))
        return _case(doc, draw(headers_strategy), path, also=other if path[1] == "backoff" else ())
    path = ("triggers", 0, kind)
    put_value(doc, path, draw(cron_text if kind == "schedule" else zone_text))
    return _case(doc, draw(headers_strategy), path)


fragments = st.sampled_from(
    [
        "{{ unit.id }}",
        "{{ unit.id[1:] }}",
        "{{ unit.id[::-1] }}",
        "{{ unit.idd }}",
        "{{ unit.record.size }}",
        "{{ [].pop() }}",
        "{{ {}.x.y }}",
        "{{ 1 / 0 }}",
        "{{ 9 ** 99999999 }}",
        "{{ 'x' * 10 ** 9 }}",
        "{{ range(10 ** 9) | list }}",
        "{{ unit.__class__ }}",
        "{{ missing }}",
        "{{ rung.vars.nothing }}",
        "{{ rung.vars.model | upper }}",
        "{{ unit.id | nofilter }}",
        "{{ unit.index + 'a' }}",
        "{{ '%d' % 'x' }}",
        "{{ unit.items | tojson }}",
        "{{ [1, 2][5] }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(1) }}",
        "{% for i in unit.items %}{{ i }}{% endfor %}",
        # Each once hung plan for seconds or minutes, or failed every unit at run time.
        "{{ unit.id | center(10**7) }}",
        "{{ lipsum(10**6) }}",
        "{{ 'x' * 300 }}",
        "{{ range(100000) | join(',') }}",
        "{% for %}",
        "{% if unit.id %}",
        "{% endif %}",
        "{{ ",
        " }}",
        "{# ",
        "{{ (((((((((((((((((((1))))))))))))))))))) }}",
        "{{ unit.id | default('x') }}",
        "{{ '\\u0000' }}",
        "\n",
        "plain",
    ]
)


@st.composite
def templates(draw: st.DrawFn) -> Case:
    doc = copy.deepcopy(BASE)
    path = draw(st.sampled_from(TEMPLATES))
    source = "".join(draw(st.lists(fragments, min_size=1, max_size=4)))
    put_value(doc, path, source)
    return _case(doc, draw(headers_strategy), path)


SOURCE_FILES = {"jsonl": "data.jsonl", "csv": "data.csv", "json": "data.json"}


@st.composite
def sources(draw: st.DrawFn) -> Case:
    """Each input source with one key mutated; plan reads the workspace's data files
    (an unreadable or malformed one is an InputFailed, as for a user)."""
    doc = copy.deepcopy(BASE)
    source = draw(st.sampled_from(["jsonl", "csv", "json", "files"]))
    inputs: dict[str, Any] = (
        {"files": ["*.py"], "exclude": ["b*"], "gitignore": False}
        if source == "files"
        else {source: SOURCE_FILES[source]}
    )
    if source == "json":
        inputs["pointer"] = "/results"
    doc["inputs"] = inputs
    key = draw(st.sampled_from([*inputs, "format", "pointer", "okExitCodes", "timeout"]))
    inputs[key] = draw(values | hostile | st.sampled_from(["", "/", "/x/0", "json", "../x"]))
    return _case(doc, draw(headers_strategy), ("inputs", key), also=("inputs",))


edits = st.tuples(
    st.floats(min_value=0, max_value=1),
    st.integers(min_value=0, max_value=12),
    st.text(alphabet="[]{}=\"'\n,.#\\ \t0123456789ab-_:+é\x00\x7f\ufeff", max_size=6),
)


@st.composite
def broken_toml(draw: st.DrawFn) -> Case:
    text, _ = emit(copy.deepcopy(BASE), draw(headers_strategy))
    for where, removed, inserted in draw(st.lists(edits, min_size=1, max_size=3)):
        at = int(where * len(text))
        text = text[:at] + inserted + text[at + removed :]
    return Case(text=text, key=None, lines=frozenset())


# --- checking ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    for name in ("a.py", "b.txt", "src/z.py", "[x].md", "-.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x\n")
    (root / "data.jsonl").write_text('{"id": "a", "n": 1}\n{"id": "b"}\nnot json\n')
    (root / "data.csv").write_text("id,n\na,1\nb,2,3\n")
    (root / "data.json").write_text('{"results": [{"id": "a"}, {"id": "b", "deep": [1, 2]}]}')
    return root


def _write(workspace: Path, case: Case) -> Path:
    GENERATED.append(1)
    note(f"job file:\n{case.text}")
    path = workspace / "job.toml"
    path.write_bytes(case.text.encode("utf-8", errors="surrogatepass"))
    return path


def _check_located(problems: list[Problem], case: Case, path: Path, text: str) -> None:
    last_line = text.count("\n") + 1
    for problem in problems:
        assert problem.file == str(path)
        assert 1 <= problem.line <= last_line, problem
        assert problem.col >= 1, problem
        assert "Traceback" not in problem.message
    if case.lines:
        on_line = [p for p in problems if p.line in case.lines]
        assert on_line, f"no problem on line {sorted(case.lines)}: {problems}"
    if case.must_fail and case.key is not None:
        assert any(
            p.key == key_name(case.key) and p.message.startswith("unknown key") for p in problems
        ), problems


def _load_and_plan(workspace: Path, case: Case) -> None:
    """spec.load, then plan.make for a valid file: only JobError may come out, and each
    problem must be located (on the mutated key's line when it is known)."""
    path = _write(workspace, case)
    try:
        job = spec.load(path, require_hosts=False)
    except JobError as exc:
        _check_located(exc.problems, case, path, case.text)
        return
    assert not case.must_fail, "an unknown key was accepted"
    try:
        result = plan.make(job, environ={}, now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    except JobError as exc:  # a units.id or selection problem
        _check_located(exc.problems, case, path, case.text)
        return
    except InputFailed as exc:  # a data file that is not what the job says it is
        refused = str(exc)
    else:
        plan.render_text(result)
        if result.first_task_problem is not None and case.key is not None:
            _check_located([result.first_task_problem], case, path, case.text)
        return
    assert refused, "an InputFailed without a message"
    assert "Traceback" not in refused


@pytest.mark.slow
@fuzz(140)
@given(case=unknown_keys())
def test_unknown_keys_at_every_depth(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@pytest.mark.slow
@fuzz(160)
@given(case=wrong_types())
def test_wrong_types_anywhere(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@pytest.mark.slow
@fuzz(140)
@given(case=hostile_values())
def test_huge_numbers_unicode_and_deep_nesting(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@fuzz(1)
@given(length=st.just(5000))
def test_a_renamed_limit_is_reported_where_the_task_names_it(workspace: Path, length: int) -> None:
    # Found by test_huge_numbers_unicode_and_deep_nesting: a limit's name changed (here
    # to 5,000 x's) is reported on task.limits' line, which still names the old one.
    doc = copy.deepcopy(BASE)
    path: KeyPath = ("limits", 0, "name")
    put_value(doc, path, "x" * length)
    _load_and_plan(workspace, _case(doc, frozenset(), path, also=_reported_at(path)))


@pytest.mark.slow
@fuzz(120)
@given(case=bad_globs())
def test_bad_globs(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@pytest.mark.slow
@fuzz(140)
@given(case=bad_schedules())
def test_durations_cron_and_time_zones(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@pytest.mark.slow
@fuzz(160)
@given(case=templates())
def test_templates_that_fail_to_check_or_to_render(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@fuzz(120)
@given(case=sources())
def test_input_sources(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@pytest.mark.slow
@fuzz(200)
@given(case=broken_toml())
def test_broken_toml(workspace: Path, case: Case) -> None:
    _load_and_plan(workspace, case)


@pytest.mark.slow
@fuzz(80)
@given(case=st.one_of(wrong_types(), hostile_values(), broken_toml(), templates()))
def test_fanout_validate_exits_0_or_2_with_located_lines(workspace: Path, case: Case) -> None:
    path = _write(workspace, case)
    result = cli("validate", "--format", "json", str(path))
    assert result.code in (0, 2), result.err
    assert result.err == ""
    problems = [Problem(**p) for p in json.loads(result.out)]
    assert bool(problems) == (result.code == 2)
    if problems:
        _check_located(problems, case, path, case.text)


def test_the_base_job_is_valid_in_every_layout(workspace: Path) -> None:
    for headers in ([("task",)], [("task",), ("retry", "backoff"), ("retry", "ladder")]):
        text, where = emit(copy.deepcopy(BASE), frozenset(headers))
        path = workspace / "base.toml"
        path.write_text(text)
        job = spec.load(path, require_hosts=False)
        assert job.retry.ladder[1].name == "second"
        assert where[("task", "timeout")] == text.split("\n").index('timeout = "10m"') + 1


@pytest.mark.slow  # with the properties it counts, most of which are slow
def test_at_least_1000_job_files_were_generated() -> None:
    # Runs last (file order, in one process: the full suite, not --fast's workers): the
    # properties above must have produced the figure.
    print(f"{len(GENERATED)} job files generated")
    assert len(GENERATED) >= 1000, len(GENERATED)
