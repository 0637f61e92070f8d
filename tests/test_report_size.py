"""report.md fits a pull request whatever the run did (issue 24): under GitHub's 65,536
characters, each failed unit once under its reason, and what did not fit counted, on
real SQLite written through the journal's API."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from fanout.backlog.units import Unit
from fanout.journal import Journal
from fanout.outcome import AttemptResult, Outcome, RunState, Status, UnitState
from fanout.report import budget
from fanout.report import document as report

# What a worker printed: 100 KiB, with a fence of its own near the end.
LOUD = ("x" * 99 + "\n") * 1000 + "```\nFAIL: the end\n" + "y" * 100 + "\n"


def _round(journal: Journal, run: str, number: int, fates: dict[str, tuple[str, str]]) -> None:
    """Round ``number`` of ``run``: each unit of ``fates`` dispatched once and settled with
    its (state, reason), the failed ones with LOUD as their output."""
    journal.add_units(
        run,
        number,
        (Unit(id=uid, index=n, items=({"id": uid},), origin="x") for n, uid in enumerate(fates)),
    )
    for uid, (state, reason) in fates.items():
        failed = state == UnitState.FAILED
        tail = LOUD if failed else ""
        result = AttemptResult(
            status=Status.FAILED if failed else Status.SUCCEEDED,
            reason=reason,
            exit_code=1 if failed else 0,
            duration=1.0,
            output_tail=tail,
        )
        journal.attempt_dispatched(run, number, uid, 1, "default", "local")
        journal.attempt_settled(
            run,
            number,
            uid,
            1,
            result,
            rung=0,
            rung_attempts=1,
            failures=int(failed),
            last=result.last_context("default", 1),
            outcome=Outcome(
                unit_id=uid,
                round=number,
                state=UnitState(state),
                rung="default",
                attempts=1,
                reason=reason,
                output_tail=tail,
            ),
        )


def _failures(text: str) -> str:
    return text.split("### Failed: needs a human")[1].split("\n### ")[0]


def _check_markdown(text: str) -> None:
    """Every block the report opens, it closes: as many ``<details>`` as ``</details>``,
    and each output a code block of its own."""
    page = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(text)
    tags = Counter(re.findall(r"<(/?[a-z0-9]+)", page))
    assert tags["details"] == tags["/details"] == tags["pre"] == text.count("<details>")


# 7 s here: 1,500 settles, each with 100 KiB of output, through the journal's API.
@pytest.mark.slow
def test_500_units_failing_with_100_kib_each_over_3_rounds_fit_and_are_each_named_once(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "state" / "journal.sqlite")
    run = journal.create_run(job="sweep", job_file="sweep.toml", apply=False, run_id="RUN")
    ids = [f"src/pkg{n // 50}/module_{n:03d}.py" for n in range(500)]
    reasons = {uid: f"exit 1: tests failed in {uid.split('/')[1]}" for uid in ids}
    for number in (1, 2, 3):
        _round(journal, run, number, {uid: ("failed", reasons[uid]) for uid in ids})
    journal.finish_run(run, state=RunState.FINISHED, wall=60.0)

    text = report.write(journal, run, tmp_path / "out").read_text(encoding="utf-8")

    assert len(text) < budget.MARKDOWN_LIMIT
    assert budget.size(text) <= budget.BUDGET
    failures = _failures(text)
    assert "\n\n500 unit(s) failed, for 10 reason(s); each is listed once" in failures
    for uid in ids:
        line = f"\n- <code>{uid.replace('_', chr(92) + '_')}</code>: round 3, rung default,"
        assert failures.count(line) == 1, uid
        assert " 1 attempt(s), failed in 3 rounds\n" in failures
    for package in range(10):
        assert failures.count(f"\n#### 50 unit(s): exit 1: tests failed in pkg{package}\n") == 1
    assert "more" not in failures
    # The first unit of each reason shows the end of its output, 1,000 characters at most.
    assert failures.count("<details>") == 10
    assert failures.count("FAIL: the end") == 10
    assert failures.count("x" * 99 + "\n") == 10 * 8
    assert (
        "Full detail: every unit with its reason and output tail in"
        " <code>state/runs/RUN/report.json</code>; each attempt's whole output in"
        " <code>state/runs/RUN/logs/</code>."
    ) in text
    _check_markdown(text)


@pytest.mark.slow
def test_distinct_long_reasons_and_huge_ids_overflow_the_budget_and_say_how_many_more(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "state" / "journal.sqlite")
    run = journal.create_run(job="huge", job_file="huge.toml", apply=False, run_id="RUN")
    ids = [f"{n:04d}-" + "i" * 5000 for n in range(400)]
    fates = {uid: ("failed", f"reason {n}: " + "because " * 300) for n, uid in enumerate(ids)}
    _round(journal, run, 1, fates)
    journal.finish_run(run, state=RunState.FINISHED, wall=60.0)

    text = report.write(journal, run, tmp_path / "out").read_text(encoding="utf-8")

    assert budget.size(text) <= budget.BUDGET
    failures = _failures(text)
    shown = failures.count("\n#### 1 unit(s): reason ")
    # Each listed id is cut to budget.ID_CHARS, each reason to its heading's 300.
    assert failures.count("\n- <code>") == shown
    assert f"<code>0000-{'i' * 194}…</code>" in failures
    assert "\n#### 1 unit(s): reason 0: because because" in failures
    assert 50 < shown < 400
    assert (
        f"\n\n{400 - shown} more failed unit(s), for {400 - shown} more reason(s), in"
        ' report.json (its "failed" list has every id).\n'
    ) in failures
    # The units table shrinks to what is left, and says how many more there are.
    units = text.split("### Units")[1]
    assert re.search(r"\n\n(\d+) more unit\(s\) in report.json.\n$", units)
    _check_markdown(text)


def test_a_unit_that_failed_in_two_rounds_is_listed_once_and_one_that_recovered_not_at_all(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path / "state" / "journal.sqlite")
    run = journal.create_run(job="two", job_file="two.toml", apply=False, run_id="RUN")
    _round(journal, run, 1, {"stuck": ("failed", "exit 2"), "flaky": ("failed", "exit 2")})
    _round(journal, run, 2, {"stuck": ("failed", "exit 3"), "flaky": ("succeeded", "ok")})
    journal.finish_run(run, state=RunState.FINISHED, wall=60.0)

    text = report.write(journal, run, tmp_path / "out").read_text(encoding="utf-8")

    assert _failures(text) == (
        "\n\n1 unit(s) failed, for 1 reason(s); each is listed once, as its last round left"
        " it.\n\n#### 1 unit(s): exit 3\n\n- <code>stuck</code>: round 2, rung default,"
        " 1 attempt(s), failed in 2 rounds\n\n<details><summary>The end of the output of"
        " <code>stuck</code></summary>\n\n````\n"
        # The last 1,000 characters from the first whole line: 8 lines of x, the end.
        + ("x" * 99 + "\n") * 8
        + "```\nFAIL: the end\n"
        + "y" * 100
        + "\n````\n</details>\n"
    )


def test_the_last_guard_cuts_at_a_line_outside_every_block_and_says_where_the_rest_is() -> None:
    lines = ["## title", "", "para", "", "<details><summary>s</summary>", "", "```"]
    lines += ["output line"] * 50 + ["```", "</details>", "", "after"]
    budget_for = budget.lines_size(lines[:20])
    cut = budget.cut(lines, budget_for, "cut here; the rest is in report.json.")
    assert cut == ["## title", "", "para", "", "", "cut here; the rest is in report.json."]
    assert budget.cut(lines, budget.lines_size(lines), "unused") == lines


def test_size_counts_what_github_may_count() -> None:
    # A newline twice (CRLF from GitHub's form), a character outside the BMP twice.
    assert budget.size("ab\ncd") == 6
    assert budget.size("\U0001f600") == 2
    assert budget.BUDGET == budget.MARKDOWN_LIMIT - budget.MARGIN == 64_000
