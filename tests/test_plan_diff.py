"""``fanout plan --base``: a change to a job reviewed like a Terraform plan, on real git
repositories; the plan hash and ``fanout run --expect-plan``.

The golden file tests/data/golden/plan-diff.md pins the pull request comment
(``FANOUT_UPDATE_GOLDEN=1`` rewrites it), and markdown-it renders it as GitHub would."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from fanout.backlog.units import Unit
from fanout.journal import Journal
from fanout.outcome import ApiUsage, AttemptResult, Outcome, RunState, Status, UnitState
from fanout.plan import diff, diffview, revision
from fanout.report import budget

from helpers import cli

GOLDEN = Path(__file__).parent / "data" / "golden" / "plan-diff.md"
RUN = "20261201T120000-0a0a"
# Before the spring change of 2027 in Paris (28 March, 02:00 -> 03:00).
NOW = datetime(2027, 3, 26, 12, 0, tzinfo=UTC)

OLD_JOB = """\
version = 1
name = "sweep"
description = "Fix each file"

[inputs]
files = ["src/a*.py"]

[units]
stage = ["{{ unit.id }}"]
collect = ["{{ unit.id }}"]

[task]
prompt = "Fix the findings in {{ unit.id }}."
command = ["worker", "--model", "{{ rung.vars.model }}"]

[retry]
ladder = [{ name = "first", vars = { model = "small-1" } }]

[runtime]
sandbox = "none"
network = false

[[triggers]]
type = "cron"
schedule = "30 4 * * *"
timezone = "Europe/Paris"
"""


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout


def _repo(root: Path) -> Path:
    """A repository with three source files and the job committed, then changed in a
    second commit: the model and the prompt changed, the file filter widened to the
    third file, and the network turned on."""
    (root / "src").mkdir(parents=True)
    for name in ("a1.py", "a2.py", "b1.py"):
        (root / "src" / name).write_text(f"print({name!r})\n")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "config", "user.email", "ci@example.com")
    _git(root, "config", "user.name", "CI")
    (root / "sweep.toml").write_text(OLD_JOB)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "a sweep job")
    new = (
        OLD_JOB.replace('"src/a*.py"', '"src/*.py"')
        .replace("small-1", "large-2")
        .replace(
            "Fix the findings in {{ unit.id }}.", "Fix the findings in {{ unit.id }}; explain each."
        )
        .replace("network = false", "network = true")
    )
    (root / "sweep.toml").write_text(new)
    _git(root, "commit", "-qam", "a larger model, every file, the network")
    return root


def _history(root: Path) -> None:
    """The job's one earlier run, as the journal holds it: two units that succeeded at
    the first attempt, spending $0.02 and $0.04."""
    journal = Journal(root / ".fanout" / "journal.sqlite")
    journal.create_run(job="sweep", job_file="sweep.toml", apply=False, run_id=RUN)
    units = [Unit(id=f"src/a{n}.py", index=n - 1, items=(), origin="") for n in (1, 2)]
    journal.add_units(RUN, 1, units)
    for unit, cost in zip(units, (0.02, 0.04), strict=True):
        journal.attempt_dispatched(RUN, 1, unit.id, 1, "first")
        journal.record_usage(RUN, 1, unit.id, 1, [ApiUsage(api="llm", requests=1, cost_usd=cost)])
        journal.attempt_settled(
            RUN,
            1,
            unit.id,
            1,
            AttemptResult(status=Status.SUCCEEDED, reason="succeeded", duration=10.0),
            rung=0,
            rung_attempts=1,
            failures=0,
            last={},
            outcome=Outcome(unit_id=unit.id, round=1, state=UnitState.SUCCEEDED, attempts=1),
        )
    journal.finish_run(RUN, state=RunState.FINISHED, wall=12.0)
    journal.close()


def _diff(job: Path, base: str = "HEAD~1") -> diff.Diff:
    text, label = revision.at_revision(job, base)
    return diff.make_diff(
        job, old_text=text, old_label=label, hosts_file=None, environ=os.environ, now=NOW
    )


def test_plan_base_shows_exactly_what_the_change_does(chdir_tmp: Path) -> None:
    _history(_repo(chdir_tmp))
    found = _diff(Path("sweep.toml"))
    assert (found.added, found.removed, found.invalidated, found.unchanged) == (1, 0, 2, 0)
    assert (found.added_ids, found.invalidated_ids) == (("src/b1.py",), ("src/a1.py", "src/a2.py"))
    assert [change.key for change in found.surface] == ["runtime.network"]
    assert (found.surface[0].old, found.surface[0].new) == (False, True)
    markdown = diffview.render_markdown(found)
    if os.environ.get("FANOUT_UPDATE_GOLDEN"):
        GOLDEN.write_text(markdown)
    assert markdown == GOLDEN.read_text()
    assert len(markdown) < budget.MARKDOWN_LIMIT
    # Rendered as GitHub renders a comment: the tables are tables, the samples folded.
    html = MarkdownIt("commonmark").enable("table").render(markdown)
    assert "<td>:warning: <code>runtime.network</code></td>" in html
    assert "<td>spend p90</td>" in html
    assert html.count("<details>") == 4  # three samples and the resolved diff


def test_the_estimates_differ_by_the_units_the_change_makes_run(chdir_tmp: Path) -> None:
    _history(_repo(chdir_tmp))
    rows = {
        name: (old, new, delta)
        for name, old, new, delta in diffview._estimate_rows(_diff(Path("sweep.toml")))
    }
    # A unit spent $0.03 on average (no unit is reused: the old side's two never ran
    # under these fingerprints), so two units cost $0.06 and three $0.09.
    assert rows["units that would run"] == ("2", "3", "+1")
    assert rows["attempts"] == ("2.0", "3.0", "+1.0")
    assert rows["spend p50"] == ("$0.0600", "$0.0900", "+$0.0300")


def test_plan_base_on_the_command_line_in_each_format(chdir_tmp: Path) -> None:
    _repo(chdir_tmp)
    text = cli("plan", "sweep.toml", "--base", "HEAD~1")
    assert text.code == 0, text.err
    assert "Units: 1 added, 0 removed, 2 invalidated (they run again), 0 unchanged." in text.out
    assert "  CHANGED runtime.network (what the workers may reach)\n" in text.out
    document = json.loads(cli("plan", "sweep.toml", "--base", "HEAD~1", "--format", "json").out)
    assert document["units"]["invalidatedIds"] == ["src/a1.py", "src/a2.py"]
    assert [s["unit"] for s in document["samples"]] == ["src/a1.py", "src/b1.py", "src/a2.py"]
    sample = document["samples"][0]
    assert sample["old"]["argv"] == ["worker", "--model", "small-1"]
    assert sample["new"]["argv"] == ["worker", "--model", "large-2"]
    assert sample["new"]["prompt"] == "Fix the findings in src/a1.py; explain each."
    assert document["new"]["planHash"] == cli("plan", "sweep.toml", "--hash").out.strip()
    assert not (chdir_tmp / ".fanout").exists()  # a plan creates no state


def test_a_job_the_change_adds_has_every_unit_added(chdir_tmp: Path) -> None:
    _repo(chdir_tmp)
    (chdir_tmp / "other.toml").write_text(OLD_JOB.replace('"sweep"', '"other"'))
    found = _diff(Path("other.toml"), "HEAD")
    assert (found.old.spec, found.added, found.invalidated) == (None, 2, 0)
    assert "The job at the base does not exist there: the change adds it." in (
        diffview.render_text(found)
    )


def test_a_base_whose_inputs_fail_now_is_shown_and_the_new_side_planned(chdir_tmp: Path) -> None:
    _repo(chdir_tmp)
    broken = OLD_JOB.replace(
        'files = ["src/a*.py"]', 'command = ["sh", "-c", "exit 3"]\nformat = "lines"'
    )
    (chdir_tmp / "sweep.toml").write_text(broken)
    _git(chdir_tmp, "commit", "-qam", "inputs from a command")
    (chdir_tmp / "sweep.toml").write_text(OLD_JOB)
    ran = cli("plan", "sweep.toml", "--base", "HEAD")
    assert ran.code == 0, ran.err
    assert "The job at the base is invalid there, or could not be planned" in ran.out
    assert (
        "the base's job: it could not be planned: sweep.toml:6:1: inputs.command: input command"
        " exited with status 3: sh -c 'exit 3' (it printed nothing on stderr)\n"
    ) in ran.out
    assert "Units: 2 added, 0 removed, 0 invalidated" in ran.out


def test_a_base_revision_that_is_not_there_is_refused(chdir_tmp: Path) -> None:
    _repo(chdir_tmp)
    ran = cli("plan", "sweep.toml", "--base", "no-such-branch")
    assert ran.code == 2
    assert "--base 'no-such-branch': no such revision in" in ran.err
    assert cli("plan", "sweep.toml", "--base", "--output=x").code == 2
    outside = chdir_tmp / "elsewhere"
    outside.mkdir()
    (outside / "job.toml").write_text(OLD_JOB)
    moved = cli("plan", str(outside / "job.toml"), "--base", "HEAD")
    assert moved.code == 0, moved.err  # the repository is the job file's, not the cwd's


def test_the_next_fires_mark_a_change_of_utc_offset() -> None:
    marks = diffview.dst_marks(
        tuple(
            datetime.fromisoformat(text)
            for text in (
                "2027-03-27T04:30:00+01:00",
                "2027-03-28T04:30:00+02:00",
                "2027-03-29T04:30:00+02:00",
            )
        ),
        NOW,
    )
    assert marks == ["", "DST: UTC+01:00 -> UTC+02:00", ""]


def test_a_comment_keeps_to_githubs_limit_whatever_the_change(chdir_tmp: Path) -> None:
    _repo(chdir_tmp)
    huge = "x" * 70_000
    job = chdir_tmp / "sweep.toml"
    job.write_text(job.read_text().replace("explain each.", f"explain each. {huge}"))
    markdown = diffview.render_markdown(_diff(Path("sweep.toml")))
    assert len(markdown) < budget.MARKDOWN_LIMIT
    assert "_The rest did not fit in a comment: run `fanout plan --base` locally._" in markdown
    assert "Units: 1 added, 0 removed, 2 invalidated" in markdown  # the summary stays


def test_the_plan_hash_is_what_the_job_says_not_how_or_where(tmp_path: Path) -> None:
    def hashed(folder: Path, text: str) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "job.toml").write_text(text)
        ran = cli("plan", str(folder / "job.toml"), "--hash")
        assert ran.code == 0, ran.err
        return ran.out.strip()

    first = hashed(tmp_path / "ci", OLD_JOB)
    assert len(first) == 32
    # Another checkout, a comment, a key written out with its default: the same plan.
    assert hashed(tmp_path / "server", "# reviewed\n" + OLD_JOB) == first
    default = OLD_JOB.replace("network = false", "network = false\nunsandboxedSecrets = false")
    assert hashed(tmp_path / "c", default) == first
    assert hashed(tmp_path / "d", OLD_JOB.replace("small-1", "small-2")) != first


@pytest.mark.parametrize("matches", [False, True])
def test_expect_plan_refuses_a_changed_job_before_any_unit_starts(
    chdir_tmp: Path, matches: bool
) -> None:
    marker = chdir_tmp / "ran"
    job = chdir_tmp / "job.toml"
    job.write_text(
        f"""\
version = 1
name = "approved"
[inputs]
items = ["a", "b"]
[task]
command = ["touch", "{marker}-{{{{ unit.id }}}}"]
[runtime]
sandbox = "none"
network = false
"""
    )
    reviewed = cli("plan", str(job), "--hash").out.strip()
    if not matches:
        job.write_text(job.read_text().replace('["a", "b"]', '["a", "b", "c"]'))
    ran = cli("run", str(job), "--expect-plan", reviewed)
    if matches:
        assert ran.code == 0, ran.err
        assert sorted(p.name for p in chdir_tmp.glob("ran-*")) == ["ran-a", "ran-b"]
        return
    assert ran.code == 10
    now = cli("plan", str(job), "--hash").out.strip()
    assert f"the plan changed since it was reviewed: --expect-plan {reviewed}" in ran.err
    assert f"the job's plan hash is now {now}. Nothing ran." in ran.err
    assert not list(chdir_tmp.glob("ran-*"))
    assert not (chdir_tmp / ".fanout").exists()  # no run was recorded
