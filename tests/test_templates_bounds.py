"""Templates are bounded (templates/bounds.py): a step that could make far more than it
is given is refused before it runs, a render's time and what it makes are bounded, all
of one attempt's templates share one Budget, and a unit's render runs off the event
loop, where a cancel stops it.  The real runs: a unit whose prompt loops without end
fails alone while the other units and the gateway go on, and a SIGTERM stops such a run
at once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.attempt import invocation
from fanout.backlog.units import Unit
from fanout.spec.templates import RenderError, Templates, bounded, render_off_loop
from fanout.spec.templates.bounds import Budget

from helpers import cli, run_report, write_job
from mockapi import MockApi

FANOUT = [sys.executable, "-m", "fanout"]
SIZE = "rendering makes more than 16,777,216 characters or items"
# A loop that calls nothing and writes nothing: only the loop's own steps bound it.
ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


# Each just past its bound: should a check break, the test fails without taking minutes
# or gigabytes (lipsum(10**6) took 149 s, center(10**7) made plan take 22 s).
@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "{{ unit.id | center(2000000) }}",
            "'center' would pad a value to more than a million characters",
        ),
        ("{{ lipsum(2000) }}", "'lipsum' would write more than a million characters"),
        ("{{ 'x'.ljust(2000000) }}", "'ljust' would pad a value to more than a million characters"),
        ("{{ 'x'.zfill(2000000) }}", "'zfill' would pad a value to more than a million characters"),
        (
            "{{ ('x\n' * 500000) | indent(1000) }}",
            "'indent' would add more than a million characters",
        ),
        (
            "{{ ('x' * 1000000 ~ 'y' * 100000) | wordwrap }}",
            "'wordwrap' would wrap more than a million characters",
        ),
        (
            "{{ ('xy' * 500000) | wordwrap(1) }}",
            "'wordwrap' would cut words of up to 1,000,000 characters into pieces of 1, which"
            " takes too long",
        ),
        (
            "{{ ('x ' * 500000) | wordwrap(1, wrapstring='-' * 1000) }}",
            "'wordwrap' would add more than a million characters",
        ),
        (
            "{{ ('ab' * 500000) | replace('a', 'xxxx') }}",
            "'replace' would add more than a million characters",
        ),
        (
            "{{ ('ab' * 500000).replace('a', 'xxxx') }}",
            "'replace' would add more than a million characters",
        ),
        (
            "{{ ('\t' * 1000).expandtabs(10**4) }}",
            "'expandtabs' would add more than a million characters",
        ),
        (
            "{{ ('a' * 10000).translate({97: 'b' * 1000}) }}",
            "'translate' would add more than a million characters",
        ),
        (
            "{{ ('a ' * 10000) | urlize(target='x' * 1000) }}",
            "'urlize' would add more than a million characters",
        ),
        (
            "{{ [1] | batch(2000000, 0) | list }}",
            "'batch' would fill a list to more than a million items",
        ),
        ("{{ [1] | slice(1100000) | list }}", "'slice' would make more than a million lists"),
        ("{{ '%2000000d' % 1 }}", "'%' would pad to more than a million characters"),
        ("{{ '%*d' % (9, 1) }}", "'%' with a '*' width is refused (write the width)"),
        ("{{ '%2000000d' | format(1) }}", "'format' would pad to more than a million characters"),
        ("{{ '{:>2000000}'.format(1) }}", "'format' would pad to more than a million characters"),
        ("{{ '{:>{}}'.format(1, 9) }}", "'format' with a field inside a field's format is refused"),
    ],
)
def test_a_step_that_would_make_too_much_is_refused_before_it_runs(
    tmp_path: Path, source: str, message: str
) -> None:
    with pytest.raises(RenderError) as caught:
        Templates(tmp_path).compile(source).render({"unit": {"id": "a"}})
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "doubled",
    [
        "ns.s ~ ns.s",
        "ns.s + ns.s",
        "[ns.s, ns.s] | join",
        "ns.s.join(['', '', ''])",
        "'%s%s' % (ns.s, ns.s)",
        "'{}{}'.format(ns.s, ns.s)",
        "twice(ns.s)",
        "(ns.s | list) + (ns.s | list)",
        "[ns.s] | tojson(indent=ns.s | length)",
    ],
)
def test_what_a_render_makes_is_bounded(tmp_path: Path, doubled: str) -> None:
    # Each round doubles the value (no one step past a million): only the Budget's
    # count of what the render made stops it, after 23 rounds or so.  (26 rounds make
    # 128 MiB: should the bound break, the test fails without filling the machine.)
    source = (
        "{% macro twice(s) %}{{ s }}{{ s }}{% endmacro %}"
        "{% set ns = namespace(s='ab') %}"
        "{% for i in range(26) %}{% set ns.s = " + doubled + " %}{% endfor %}{{ ns.s | length }}"
    )
    with pytest.raises(RenderError) as caught:
        Templates(tmp_path).compile(source).render({})
    assert str(caught.value) == SIZE


def test_text_a_block_collects_counts_as_it_is_written(tmp_path: Path) -> None:
    # Literal text, repeated into a block that never reaches the output.
    line = "x" * 1000
    source = "{% set kept %}{% for i in range(20000) %}" + line + "{% endfor %}{% endset %}done"
    with pytest.raises(RenderError) as caught:
        Templates(tmp_path).compile(source).render({})
    assert str(caught.value) == SIZE


@pytest.mark.slow
@pytest.mark.parametrize(
    "source",
    [
        ENDLESS,
        "{% set big = range(100000) | list %}"
        "{% for i in range(100000) %}{% if -1 in big %}{% endif %}{% endfor %}",
    ],
)
def test_a_render_is_bounded_in_cpu_time(tmp_path: Path, source: str) -> None:
    template = Templates(tmp_path).compile(source)
    with pytest.raises(RenderError) as caught, bounded(Budget(seconds=0.25)):
        template.render({})
    assert str(caught.value) == "rendering took more than 0.25 s of CPU time (a loop too long?)"


def test_a_stopped_budget_ends_the_render_at_its_next_step(tmp_path: Path) -> None:
    budget = Budget()
    budget.stop()
    with pytest.raises(RenderError) as caught, bounded(budget):
        Templates(tmp_path).compile("{% for i in range(10) %}{{ i }}{% endfor %}").render({})
    assert str(caught.value) == "rendering was stopped"


def test_compiling_does_not_run_a_constant_filter_past_its_bound(tmp_path: Path) -> None:
    # Jinja folds a filter of constants while compiling (fanout validate): a wordwrap
    # of a long literal took 18 s there, before any unit rendered.
    source = "{{ '" + "x" * 400_000 + "' | wordwrap(1) }}"
    templates = Templates(tmp_path)
    assert templates.check(source, {}) == []
    with pytest.raises(RenderError) as caught:
        templates.compile(source).render({})
    assert str(caught.value) == (
        "'wordwrap' would cut words of up to 400,000 characters into pieces of 1, which takes"
        " too long"
    )


def test_plan_refuses_a_padded_stage_path_at_once(chdir_tmp: Path) -> None:
    # plan took 22 s over it: the 10,000,000-character path rendered, then compiled as
    # a glob.
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "padded"
        [inputs]
        items = ["a"]
        [units]
        stage = ["{{ unit.id | center(10**7) }}"]
        [task]
        command = ["true"]
        """,
    )
    planned = cli("plan", "job.toml")
    assert planned.code == 2
    assert planned.err.splitlines()[-1] == (
        "job.toml:7:10: units.stage[0]: 'center' would pad a value to more than a million"
        " characters (rendering for unit 'a')"
    )


def test_an_attempts_templates_share_one_budget(tmp_path: Path) -> None:
    # Six million characters, made and written: twelve million of the sixteen each.
    six_million = "{% for i in range(6) %}{{ 'x' * 1000000 }}{% endfor %}"
    job = spec.load(
        write_job(
            tmp_path,
            f"""
            version = 1
            name = "shared"
            [inputs]
            items = ["a"]
            [task]
            prompt = "{six_million}"
            command = ["true"]
            [[retry.ladder]]
            name = "only"
            promptSuffix = "{six_million}"
            """,
        )
    )
    unit = Unit(id="a", index=0, items=("a",), origin="inputs.items[0]")
    assert job.task.prompt is not None
    assert len(job.task.prompt.render({})) == 6_000_000  # alone, each is within it
    with pytest.raises(RenderError) as caught:
        invocation.render(job, unit)
    assert str(caught.value) == f"retry.ladder[0].promptSuffix: {SIZE}"


async def test_a_render_runs_off_the_loop_and_a_cancel_stops_it(tmp_path: Path) -> None:
    template = Templates(tmp_path).compile(ENDLESS)
    started = threading.Event()
    threads: list[str] = []

    def render() -> str:
        threads.append(threading.current_thread().name)
        started.set()
        return template.render({})

    # An hour of CPU time: only the cancel ends this render within the test.
    rendering = asyncio.create_task(render_off_loop(render, Budget(seconds=3600)))
    await asyncio.to_thread(started.wait)
    ticks = 0
    for _ in range(5):  # the loop goes on while the render does
        await asyncio.sleep(0.01)
        ticks += 1
    assert (ticks, rendering.done()) == (5, False)
    rendering.cancel()
    done, _ = await asyncio.wait([rendering], timeout=60)
    assert done == {rendering}
    assert rendering.cancelled()
    assert threads != [threading.current_thread().name]


# --- real runs ---------------------------------------------------------------------------

KEY = "sk-ant-real-7c1e9b3a5d2f8e4c6a0b"
# One request to the gateway, as an Anthropic SDK would make it.
WORKER = r"""
import json, os, urllib.request
body = json.dumps({"model": "claude-test-1", "max_tokens": 8,
                   "messages": [{"role": "user", "content": "hi"}]}).encode()
request = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
    data=body, headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"],
    "content-type": "application/json", "anthropic-version": "2023-06-01"})
with urllib.request.urlopen(request) as answer:
    json.load(answer)
"""


def _endless_for(directory: Path, units: list[str], upstream: str) -> Path:
    """A job whose unit 'b' has a prompt that loops without end; each unit's worker
    makes one request through the gateway."""
    items = ", ".join(json.dumps(unit) for unit in units)
    prompt = "{% if unit.id == 'b' %}" + ENDLESS + "{% endif %}Fix {{ unit.id }}."
    return write_job(
        directory,
        f"""
        version = 1
        name = "endless-prompt"
        [inputs]
        items = [{items}]
        [task]
        prompt = "{prompt}"
        command = {json.dumps(["python3", "-c", WORKER])}
        timeout = "1s"
        [runtime]
        network = true
        [[apis]]
        name = "anthropic"
        upstream = "{upstream}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        """,
    )


def _environ() -> dict[str, str]:
    return {**os.environ, "FANOUT_TEST_ANTHROPIC_KEY": KEY}


@pytest.mark.slow
def test_a_prompt_that_loops_without_end_fails_its_unit_while_the_others_run(
    mock_api: MockApi, tmp_path: Path
) -> None:
    # It once ran on the event loop: the gateway froze, the 1 s timeout never fired and
    # the unit "succeeded in 0.0s" after 10.9 s.  Here the loop would take hours.
    job = _endless_for(tmp_path, ["a", "b", "c"], mock_api.url)
    ran = subprocess.run(
        [*FANOUT, "run", str(job)], capture_output=True, text=True, env=_environ(), timeout=60
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    report = run_report(tmp_path)
    outcomes = {u["unit"]: (u["state"], u["reason"]) for u in report["units"]}
    assert outcomes == {
        "a": ("succeeded", "ok"),
        "b": (
            "failed",
            "template: task.prompt: rendering took more than 2 s of CPU time (a loop too long?)",
        ),
        "c": ("succeeded", "ok"),
    }
    # The gateway answered the others' requests while b rendered (on the event loop,
    # the render held their answers back until it ended); b never started a worker.
    assert [p.status for p in mock_api.posts()] == [200, 200]
    assert [e["unit"] for e in _events(tmp_path) if e["event"] == "unit.settled"][-1] == "b"


@pytest.mark.slow
def test_a_sigterm_stops_a_run_whose_unit_is_rendering(mock_api: MockApi, tmp_path: Path) -> None:
    # It once took effect 11 s after it was sent, when the render ended.  The 10 s
    # allowed here are far more than a run needs to stop; what tells is b's state.
    job = _endless_for(tmp_path, ["b"], mock_api.url)
    process = subprocess.Popen(
        [*FANOUT, "run", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_environ(),
    )
    assert process.stdout is not None
    for line in process.stdout:  # the unit is selected: its render is under way
        if "1 unit(s) from 1 record(s)" in line:
            break
    time.sleep(0.3)
    process.send_signal(signal.SIGTERM)
    try:
        rest = process.communicate(timeout=10)[0]
    finally:
        process.kill()
    assert process.returncode == 130, rest
    # Stopped mid-render, left to resume (a render on the event loop would have run to
    # its bound first, and b would have failed before the signal was seen).
    assert [(e["event"], e.get("unit")) for e in _events(tmp_path) if "unit" in e] == [
        ("unit.interrupted", "b")
    ]


def _events(directory: Path) -> list[dict[str, Any]]:
    (path,) = (directory / ".fanout" / "runs").glob("*/events.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]
