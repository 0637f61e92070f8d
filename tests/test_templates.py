"""Templates: sandboxed, strict, checked statically, and never a path into a shell."""

from __future__ import annotations

import gc
import random
import subprocess
from pathlib import Path

import pytest

from fanout import spec
from fanout.attempt import invocation
from fanout.backlog.units import Unit
from fanout.errors import JobError
from fanout.run.job import Options
from fanout.spec.templates import UNIT_SHAPE, RenderError, Templates

from fakes import FakeTransport
from helpers import make_runner, write_job

HOSTILE = "a b; rm -rf ~ $(touch pwned) `id` 'q\" \\ \n*"


def test_hostile_unit_values_reach_the_worker_as_one_literal_argument(tmp_path: Path) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "hostile"
            [inputs]
            items = ["x"]
            [task]
            command = ["python3", "-c", "import sys; print(repr(sys.argv[1:]))", "{{ unit.record.v }}", "--{{ unit.record.v }}"]
            """,
        )
    )
    unit = Unit(id="x", index=0, items=({"v": HOSTILE},), origin="test")
    argv = invocation.render(job, unit).argv
    assert argv[3] == HOSTILE
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert done.stdout.strip() == repr([HOSTILE, "--" + HOSTILE])
    assert not (tmp_path / "pwned").exists()


def test_the_sandbox_refuses_python_internals(tmp_path: Path) -> None:
    template = Templates(tmp_path).compile("{{ unit.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(RenderError, match="unsafe"):
        template.render({"unit": {"id": "x"}})


def test_missing_values_are_errors_not_empty_strings(tmp_path: Path) -> None:
    template = Templates(tmp_path).compile("{{ unit.record.email }}")
    with pytest.raises(RenderError) as caught:
        template.render({"unit": {"record": {"name": "Ada"}}})
    assert str(caught.value) == "the value has no attribute 'email'"


def test_record_fields_named_like_dict_methods_read_the_field(tmp_path: Path) -> None:
    template = Templates(tmp_path).compile(
        "{% for i in unit.items %}{{ i.values }},{{ i.keys }};{% endfor %}"
    )
    rendered = template.render({"unit": {"items": [{"values": 1, "keys": 2}]}})
    assert rendered == "1,2;"


def test_filters(tmp_path: Path) -> None:
    templates = Templates(tmp_path)
    context = {"p": str(tmp_path / "src" / "a.py"), "o": "/elsewhere/b.py", "d": {"t": "<&>"}}
    text = "{{ p | relpath }} {{ o | relpath }} {{ d | tojson }} {{ 'a b' | shquote }}"
    assert (
        templates.compile(text).render(context) == 'src/a.py /elsewhere/b.py {"t": "<&>"} \'a b\''
    )


def test_static_check_reports_each_problem_with_its_line(tmp_path: Path) -> None:
    templates = Templates(tmp_path)
    source = "ok {{ unit.id }}\n{{ unit.idd }}\n{% for f in unit.items %}{{ f.anything }}{% endfor %}\n{{ lats.x }}"
    problems = templates.check(source, {"unit": UNIT_SHAPE})
    assert [(p.lineno, p.message) for p in problems] == [
        (4, "undefined variable 'lats'; available: unit"),
        (2, "'unit' has no attribute 'idd' (did you mean 'id'?)"),
    ]


def test_unknown_filter_is_caught_before_any_unit_renders(tmp_path: Path) -> None:
    problems = Templates(tmp_path).check("{{ unit.id | relpth }}", {"unit": UNIT_SHAPE})
    assert [p.message for p in problems] == ["unknown filter 'relpth' (did you mean 'relpath'?)"]


def test_rung_vars_prompt_suffix_and_last_attempt(tmp_path: Path) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            """
            version = 1
            name = "ladder"
            [inputs]
            items = ["u1"]
            [task]
            prompt = "Fix {{ unit.id }} (round {{ round }}, attempt {{ attempt }})."
            command = ["agent", "--model", "{{ rung.vars.model }}"]
            [[retry.ladder]]
            name = "standard"
            vars = { model = "sonnet" }
            [[retry.ladder]]
            name = "escalate"
            vars = { model = "opus" }
            timeout = "30m"
            promptSuffix = "\\nLast time ({{ last.status }}, exit {{ last.exitCode }}):\\n{{ last.outputTail }}"
            """,
        )
    )
    unit = Unit(id="u1", index=0, items=("u1",), origin="inputs.items[0]")
    first = invocation.render(job, unit)
    assert first.argv == ("agent", "--model", "sonnet")
    assert first.prompt == "Fix u1 (round 1, attempt 1)."
    assert first.timeout == 600
    last = {"status": "failed", "exitCode": 1, "outputTail": "E501 line too long"}
    second = invocation.render(
        job,
        unit,
        rung_index=1,
        attempt=2,
        round_number=2,
        last={**invocation.NO_LAST_ATTEMPT, **last},
    )
    assert second.argv == ("agent", "--model", "opus")
    assert second.timeout == 1800
    assert second.prompt == (
        "Fix u1 (round 2, attempt 2).\nLast time (failed, exit 1):\nE501 line too long"
    )


def test_default_filter_and_defined_test_may_name_missing_things(tmp_path: Path) -> None:
    templates = Templates(tmp_path)
    source = "{{ unit.nope | default('x') }}{% if unit.other is defined %}y{% endif %}"
    assert templates.check(source, {"unit": UNIT_SHAPE}) == []
    assert templates.compile(source).render({"unit": {"id": "a"}}) == "x"


def test_a_slice_does_not_stop_the_attribute_check(tmp_path: Path) -> None:
    templates = Templates(tmp_path)
    assert templates.check("{{ unit.id[1:] }}", {"unit": UNIT_SHAPE}) == []
    [problem] = templates.check("{{ unit.idd[1:] }}", {"unit": UNIT_SHAPE})
    assert problem.message == "'unit' has no attribute 'idd' (did you mean 'id'?)"
    assert templates.compile("{{ unit.id[1:] }}").render({"unit": {"id": "abc"}}) == "bc"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ [].pop() }}", "IndexError: pop from empty list"),
        ("{{ {}['x'] }}", "the value has no attribute 'x'"),
        (
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(1) }}",
            "the template recurses too deeply (a macro that calls itself?)",
        ),
        ("{{ 9 ** 999999999 }}", "'**' would make a number of more than a million bits"),
        ("{{ 'x' * 10 ** 9 }}", "'*' would repeat a value to more than a million items"),
        ("{{ [1] * 10 ** 9 }}", "'*' would repeat a value to more than a million items"),
        ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
    ],
)
def test_every_failure_while_rendering_is_a_render_error(
    tmp_path: Path, source: str, message: str
) -> None:
    template = Templates(tmp_path).compile(source)
    with pytest.raises(RenderError) as caught:
        template.render({})
    assert str(caught.value) == message


def test_render_errors_name_the_key_and_line_they_come_from(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        """\
        version = 1
        name = "t"
        [inputs]
        items = ["a"]
        [task]
        command = ["echo", "{{ [].pop() }}"]
        """,
    )
    job = spec.load(path)
    with pytest.raises(RenderError) as caught:
        invocation.render(job, Unit(id="a", index=0, items=({"id": "a"},), origin="items[0]"))
    assert str(caught.value) == "task.command[1]: IndexError: pop from empty list"
    assert caught.value.located() == (
        f"{path}:6:20: task.command[1]: IndexError: pop from empty list"
    )


def test_templates_nested_too_deeply_are_a_problem_not_a_crash(tmp_path: Path) -> None:
    source = "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}"
    [problem] = Templates(tmp_path).check(source, {})
    assert problem.message == "the template is nested too deeply to check"
    assert gc.isenabled()  # collection, off while Jinja compiled it, is back on


def test_a_template_line_in_a_one_line_string_is_that_line(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        """\
        version = 1
        name = "t"
        [inputs]
        items = ["a"]
        [task]
        prompt = "first\\n{{ unit.idd }}"
        command = ["true"]
        """,
    )
    with pytest.raises(JobError) as caught:
        spec.load(path)
    assert str(caught.value) == (
        f"{path}:6:10: task.prompt: 'unit' has no attribute 'idd' (did you mean 'id'?)"
    )


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{{ [].pop() }}", "IndexError: pop from empty list"),
        (
            "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
            "the template recurses too deeply (a macro that calls itself?)",
        ),
    ],
)
async def test_a_template_raising_at_render_time_fails_its_unit_not_the_run(
    tmp_path: Path, template: str, reason: str
) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            f"""\
            version = 1
            name = "t"
            [inputs]
            items = ["a", "b"]
            [task]
            command = ["agent", "{template}"]
            """,
        )
    )
    transport = FakeTransport()
    runner = make_runner(job, transport, events=lambda event: None, rng=random.Random(7))
    summary = await runner.execute(Options())
    assert summary.counts == {"failed": 2}
    assert transport.attempts == []
    reasons = {row.reason for row in runner.journal.units(summary.run_id)}
    assert reasons == {f"template: task.command[1]: {reason}"}


# Expressions (units.where): the same sandbox and checks, evaluated to a value.

WHERE = {"record": None, "job": None, "trigger": None}


def test_an_expression_evaluates_to_a_value_in_the_sandbox(tmp_path: Path) -> None:
    templates = Templates(tmp_path)
    where = templates.compile_expression("record.messages | length > 0 and record.x == 'y'")
    assert where.evaluate({"record": {"messages": [1], "x": "y"}}) is True
    assert where.evaluate({"record": {"messages": [], "x": "y"}}) is False
    escape = templates.compile_expression("record.__class__.__mro__[1].__subclasses__()")
    with pytest.raises(RenderError, match="unsafe"):
        escape.evaluate({"record": {}})
    with pytest.raises(RenderError) as caught:
        templates.compile_expression("2 ** 10000000 > 1").evaluate({})
    assert str(caught.value) == "'**' would make a number of more than a million bits"


@pytest.mark.parametrize(
    ("source", "message", "lineno"),
    [
        ("record.errorCount >", "the expression ends too early", 1),
        ("(record.a\n and record.b", "the expression ends too early (expected ')')", 2),
        (
            "record.severity = 'error'",
            "text follows the end of the expression (compare with '==', combine with 'and')",
            1,
        ),
        (
            "{{ record.errorCount > 0 }}",
            "an expression, not a template: write it without '{{ }}', "
            'e.g. where = "record.errorCount > 0"',
            1,
        ),
        ("record.path | basname == 'a'", "unknown filter 'basname' (did you mean 'basename'?)", 1),
        ("recrd.errorCount > 0", "undefined variable 'recrd' (did you mean 'record'?)", 1),
        ("job.nme == 'x'", "'job' has no attribute 'nme' (did you mean 'name'?)", 1),
    ],
)
def test_expression_problems_are_found_without_evaluating(
    tmp_path: Path, source: str, message: str, lineno: int
) -> None:
    shapes = {**WHERE, "job": {"name": None, "description": None, "file": None}}
    found = Templates(tmp_path).check_expression(source, shapes)
    assert [(p.message, p.lineno) for p in found] == [(message, lineno)]


def test_a_string_holding_braces_is_still_an_expression(tmp_path: Path) -> None:
    where = Templates(tmp_path).compile_expression("'{{' in record.message")
    assert where.evaluate({"record": {"message": "a {{ b"}}) is True
