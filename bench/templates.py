"""What bounding templates costs and what it buys: the CPU time of rendering one unit's
prompt and argv (the hot path: every attempt renders them), how soon a template that
would run for hours or make gigabytes is stopped, and how long the event loop waits
while renders that run to their bound go on in threads beside it.

Usage: .venv/bin/python bench/templates.py [UNITS]
Prints markdown tables (the render cost is the median of 5 passes over UNITS units).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fanout.spec.templates import RenderError, Templates, render_off_loop

PROMPT = """Fix {{ unit.id }} ({{ unit.index }}) with {{ rung.vars.model }}.
{% for item in unit.items %}- {{ item.path | relpath }}:{{ item.line }} {{ item.message | trim }}
{% endfor %}{{ unit.record | tojson }}"""
ARGV = ["agent", "--model", "{{ rung.vars.model }}", "{{ unit.id | shquote }}"]
ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "nested loops, 10^10 steps": ENDLESS,
    "lipsum(10**6)": "{{ lipsum(10**6) }}",
    "center(10**7)": "{{ 'a' | center(10**7) }}",
    "a string doubled 60 times": "{% set ns = namespace(s='ab') %}"
    "{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "'-1 in list' 10^5 times": "{% set big = range(100000) | list %}"
    "{% for i in range(100000) %}{% if -1 in big %}{% endif %}{% endfor %}",
}


def render_cost(templates: Templates, units: int) -> float:
    """CPU microseconds to render one unit's prompt and argv (20 items a unit)."""
    prompt = templates.compile(PROMPT)
    argv = [templates.compile(part) for part in ARGV]
    items = [{"path": f"src/f{i}.py", "line": i, "message": f"E501 line {i} "} for i in range(20)]
    context = {
        "unit": {"id": "src/a.py", "index": 3, "items": items, "record": items[0]},
        "rung": {"vars": {"model": "sonnet"}},
    }
    passes = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(units):
            prompt.render(context)
            for part in argv:
                part.render(context)
        passes.append((time.process_time() - start) / units * 1e6)
    return statistics.median(passes)


def stopped(templates: Templates, source: str) -> tuple[float, str]:
    start = time.monotonic()
    try:
        templates.compile(source).render({})
    except RenderError as exc:
        return time.monotonic() - start, str(exc)
    return time.monotonic() - start, "rendered"


async def loop_lag(templates: Templates, renders: int) -> tuple[float, float, float]:
    """p50, p99 and worst wait (ms) of a 1 ms sleep on the loop while ``renders``
    endless templates run to their bound off the loop."""
    endless = templates.compile(ENDLESS)

    def render() -> None:
        with contextlib.suppress(RenderError):
            endless.render({})

    rendering = [asyncio.ensure_future(render_off_loop(render)) for _ in range(renders)]
    waits = []
    while not all(task.done() for task in rendering):
        start = time.monotonic()
        await asyncio.sleep(0.001)
        waits.append((time.monotonic() - start - 0.001) * 1000)
    waits.sort()
    return waits[len(waits) // 2], waits[int(len(waits) * 0.99)], waits[-1]


def main() -> None:
    units = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as directory:
        templates = Templates(Path(directory))
        print(
            f"| rendering one unit's prompt and argv | {render_cost(templates, units):.0f} us CPU |"
        )
        print("| --- | --- |\n")
        print("| template | stopped after | reason |\n| --- | ---: | --- |")
        for name, source in HOSTILE.items():
            seconds, reason = stopped(templates, source)
            print(f"| {name} | {seconds:.2f} s | {reason} |")
        print("\n| endless renders beside the loop | loop wait p50 | p99 | worst |")
        print("| ---: | ---: | ---: | ---: |")
        for renders in (1, 2, 4):
            p50, p99, worst = asyncio.run(loop_lag(templates, renders))
            print(f"| {renders} | {p50:.1f} ms | {p99:.1f} ms | {worst:.1f} ms |")


if __name__ == "__main__":
    main()
