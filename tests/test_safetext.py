"""Text from units and workers made safe: report.md for PR comments, and the console."""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from fanout import spec
from fanout.attempt.model import Attempt
from fanout.attempt.staging import Change, ChangeState
from fanout.outcome import AttemptResult, Status
from fanout.report import document as report
from fanout.run.job import Options, Runner
from fanout.values import safetext

from fakes import FakeTransport
from helpers import make_runner, write_job

GOLDEN = Path(__file__).parent / "data" / "report" / "hostile.md"

# Unit ids as a backlog it did not write can have them (TOML escapes: \u001b is ESC).
HOSTILE_JOB = r"""
version = 1
name = "hostile"
[inputs]
items = [
  "plain",
  "u1 <img src=x onerror=alert(1)> & co",
  "a|b\\|c",
  "\u001b[2J\u001b]0;pwned\u0007cleared",
  "**bold** _em_ [link](https://evil.example) `tick` ~~gone~~ $x$",
  "# heading",
  "\u202eevil\u2066x\u2069 \u0085next",
  "```fence",
  "</code></summary></details><h1>forged</h1>",
]
[task]
command = ["agent"]
[runtime]
maxConcurrentTasks = 1
"""

# What a worker printed: a fence of its own, a heading and a link after it, colours, a
# carriage return that would overwrite the line on a terminal, a bidi override.
HOSTILE_OUTPUT = (
    "checking...\n"
    "```\n"
    "## All checks passed\n"
    "[Approve this PR](https://evil.example/approve)\n"
    "``````\n"
    "\x1b[31mred\x1b[0m\rover \u202egnp.exe\n"
    "<script>alert(1)</script> | `x` ~~~\n"
)


def _script(attempt: Attempt) -> AttemptResult:
    if attempt.unit_id == "plain":
        return AttemptResult(status=Status.SUCCEEDED, reason="ok", exit_code=0, duration=1.0)
    return AttemptResult(
        status=Status.FAILED,
        reason="exit 1 </summary><h1>x</h1> *not bold* \x1b[2K",
        exit_code=1,
        output_tail=HOSTILE_OUTPUT,
        duration=1.0,
    )


async def _hostile_run(tmp_path: Path) -> tuple[Runner, str, list[dict[str, object]]]:
    job = spec.load(write_job(tmp_path, HOSTILE_JOB))
    events: list[dict[str, object]] = []
    runner = make_runner(
        job,
        FakeTransport(script=_script),
        events=events.append,
        rng=random.Random(7),
        monotonic=asyncio.get_running_loop().time,
    )
    summary = await runner.execute(Options())
    return runner, summary.run_id, events


@pytest.mark.looptime
async def test_report_md_of_a_hostile_run_matches_the_reviewed_golden_file(
    tmp_path: Path,
) -> None:
    runner, run_id, _ = await _hostile_run(tmp_path)
    # Files the units changed, with names a worker chose.
    runner.journal.record_changes(
        run_id,
        1,
        [
            Change(
                unit_id="plain", path="docs/`x`|y\\|z.md", added=3, removed=1, state=ChangeState.NEW
            ),
            Change(
                unit_id="# heading", path="\u202ecod.exe", added=1, removed=0, state=ChangeState.NEW
            ),
        ],
    )
    written = report.write(runner.journal, run_id, runner.run_dir(run_id))
    text = written.read_text(encoding="utf-8").replace(run_id, "RUN")
    if os.environ.get("FANOUT_UPDATE_GOLDEN"):
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")
    # What the golden file proves, on the HTML a CommonMark renderer with GitHub's
    # tables and strikethrough makes of it (markdown-it, which rich brings along):
    assert not any(ch in text for ch in "\x1b\r\x07\x85\u202e\u2066\u2069")
    page = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)
    assert re.findall(r"<h\d>[^<]*", page) == [
        "<h2>fanout: hostile (run ",
        "<h3>Compute",
        "<h3>Failed: needs a human",
        # The reason heads its group as text: its tags are entities, its stars literal.
        "<h4>8 unit(s): exit 1 &lt;/summary&gt;&lt;h1&gt;x&lt;/h1&gt; *not bold* \\x1b[2K",
        "<h3>Changed files",
        "<h3>Units",
    ]
    tags = Counter(re.findall(r"<([a-z0-9]+)", page))
    assert {tag: tags[tag] for tag in ("a", "img", "script", "h1", "em", "del")} == dict.fromkeys(
        ("a", "img", "script", "h1", "em", "del"), 0
    )
    # The 8 failed units are one group (one reason), one list item each; the output of
    # the group's first unit is its one output block.
    assert (tags["strong"], tags["li"], tags["details"], tags["pre"]) == (1, 8, 1, 1)
    assert "<li><code>a|b\\|c</code>: round 1, rung default, 1 attempt(s)</li>" in page
    # The output block stays one block, whole: no fence in it closed it early.
    assert page.count("[Approve this PR](https://evil.example/approve)\n``````\n") == 1
    # Every row keeps its columns: no pipe from an id or a path split a cell.
    assert (tags["tr"], tags["td"]) == (2 + 2 + 3 + 10, 5 + 4 + 2 * 5 + 9 * 6)
    assert "<td><code>docs/`x`|y\\|z.md</code></td>" in page
    assert "<td><code>a|b\\|c</code></td>" in page


def test_for_markdown_escapes_markup_and_html() -> None:
    assert safetext.for_markdown("a *b* _c_ `d` [e](f) <g> & h|i ~j~ #k $l$ \\m") == (
        "a \\*b\\* \\_c\\_ \\`d\\` \\[e\\](f) &lt;g&gt; &amp; h\\|i \\~j\\~ \\#k \\$l\\$ \\\\m"
    )


def test_control_and_bidi_characters_become_visible_escapes() -> None:
    hostile = "id\x1b[2J\r\n\t\x07\x7f\x9b\u202e\u2066\u2069\u200f\udcff."
    expected = "id\\x1b[2J\\r\\n\\t\\x07\\x7f\\x9b\\u202e\\u2066\\u2069\\u200f\\udcff."
    assert safetext.for_terminal(hostile) == expected
    assert safetext.visible("a\nb\tc\x1b", multiline=True) == "a\nb\tc\\x1b"


def test_a_code_fence_is_longer_than_any_backtick_run_in_it() -> None:
    assert safetext.code_fence("plain") == "```\nplain\n```"
    assert safetext.code_fence("a ```` b\n`") == "`````\na ```` b\n`\n`````"


def test_html_text_and_table_code() -> None:
    assert safetext.for_html('</summary>"x" & *y*') == "&lt;/summary&gt;&quot;x&quot; &amp; *y*"
    assert safetext.code("a\\|b`c") == "<code>a\\\\\\|b\\`c</code>"


def test_shorten_cuts_to_the_limit_with_the_ellipsis_inside_it() -> None:
    assert safetext.shorten("abcdef", 6) == "abcdef"
    assert safetext.shorten("abcdefg", 6) == "abcde…"
    assert safetext.shorten("abcdefg", 6, ellipsis="...") == "abc..."
    assert safetext.shorten("a  b\nc", 10) == "a  b\nc"  # only cut, never re-spaced


def test_one_line_collapses_whitespace_then_shortens() -> None:
    assert safetext.one_line("  the scanner\n\tlost  its place ", 100) == (
        "the scanner lost its place"
    )
    assert safetext.one_line("a\nb c d e", 5) == "a b …"
    assert safetext.one_line("a\nb c d e", 5, ellipsis="...") == "a ..."
