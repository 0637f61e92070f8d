"""[publish]: a run's applied changes committed to a branch of a real repository, pushed
to a real bare repository as ``origin``, and the pull request's command (a stand-in for
``gh`` that records its argv and the body file) run to open it, then to update it on a
re-run; the refusals (a work tree with someone else's changes, before and after the
run), nothing changed, and failures that leave the run's results alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from helpers import Ran, cli, write_job

# A unit per .txt file: its worker turns BAD into GOOD, and the file is applied back.
JOB = """\
version = 1
name = "fix"
[inputs]
files = ["*.txt"]
[units]
stage = ["{{ unit.id }}"]
collect = ["{{ unit.id }}"]
[task]
command = ["sh", "-c", "sed -i s/BAD/GOOD/ \\"$1\\"%(extra)s", "sh", "{{ unit.id }}"]
[runtime]
sandbox = "none"
[collect]
apply = true
[publish]
%(publish)s
"""

GH = f"""\
#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
body = open(argv[argv.index("--body-file") + 1]).read()
with open(os.environ["GH_LOG"], "a") as log:
    log.write(json.dumps({{"argv": argv, "body": body, "cwd": os.getcwd()}}) + "\\n")
sys.exit(int(os.environ.get("GH_EXIT", "0")))
"""


def git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=where, check=True, capture_output=True, text=True, env=_git_env()
    )
    return done.stdout


def _git_env() -> dict[str, str]:
    return {
        **os.environ,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "LC_ALL": "C",
    }


class Repo:
    """A work tree on main with the job committed, and ``origin``, a bare repository."""

    def __init__(self, tmp_path: Path, publish: str, extra: str = "") -> None:
        self.origin = tmp_path / "origin.git"
        self.work = tmp_path / "work"
        self.bin = tmp_path / "bin"
        self.log = tmp_path / "gh.jsonl"
        git(tmp_path, "init", "--quiet", "--bare", "-b", "main", str(self.origin))
        git(tmp_path, "init", "--quiet", "-b", "main", str(self.work))
        git(self.work, "config", "user.name", "Fanout Test")
        git(self.work, "config", "user.email", "fanout@example.invalid")
        git(self.work, "remote", "add", "origin", str(self.origin))
        self.job = write_job(self.work, JOB % {"publish": publish, "extra": extra})
        (self.work / "a.txt").write_text("a BAD\n")
        (self.work / "b.txt").write_text("b BAD\n")
        (self.work / "README.md").write_text("readme\n")
        self.commit("start")
        git(self.work, "push", "--quiet", "origin", "main")
        self.bin.mkdir()
        (self.bin / "gh").write_text(GH)
        (self.bin / "gh").chmod(0o755)

    def commit(self, message: str, *paths: str) -> None:
        git(self.work, "add", *(paths or ["-A"]))
        git(self.work, "commit", "--quiet", "-m", message)

    def run(self) -> Ran:
        return cli("run", str(self.job))

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def branches(self) -> str:
        return git(self.origin, "branch", "--format=%(refname:short)")

    def log_of(self, branch: str) -> list[str]:
        """The messages of ``branch``'s commits in origin, newest first."""
        shas = git(self.origin, "rev-list", branch).split()
        return [git(self.origin, "cat-file", "commit", sha).split("\n\n", 1)[1] for sha in shas]

    def files_of(self, branch: str) -> dict[str, str]:
        names = git(self.origin, "ls-tree", "-r", "--name-only", branch).split()
        return {n: git(self.origin, "show", f"{branch}:{n}") for n in names if n.endswith(".txt")}

    def report(self) -> Path:
        runs = sorted((self.work / ".fanout" / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
        return runs[-1] / "report.md"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GH_LOG", str(tmp_path / "gh.jsonl"))
    for name, value in _git_env().items():
        if name.startswith(("GIT_", "LC_ALL")):
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("GH_EXIT", raising=False)


pytestmark = pytest.mark.usefixtures("env")


def test_a_run_commits_to_the_branch_pushes_it_and_opens_the_pull_request(tmp_path: Path) -> None:
    repo = Repo(
        tmp_path,
        'branch = "bot/{{ job.name }}"\n'
        'message = "Fix {{ run.files }} file(s) in {{ run.units }} unit(s)"\n'
        'title = "{{ job.name }}: {{ run.files }} fixes into {{ base }}"',
    )
    ran = repo.run()
    assert ran.code == 0, ran.err
    assert "published 2 file(s) in 1 commit(s) to bot/fix on origin; pull request opened" in ran.err
    assert repo.branches() == "bot/fix\nmain\n"
    assert repo.log_of("bot/fix") == ["Fix 2 file(s) in 2 unit(s)", "start\n"]
    assert repo.files_of("bot/fix") == {"a.txt": "a GOOD\n", "b.txt": "b GOOD\n"}
    body = repo.report()
    [call] = repo.calls()
    assert call["argv"] == [
        "pr", "create", "--head", "bot/fix", "--base", "main",
        "--title", "fix: 2 fixes into main", "--body-file", str(body),
    ]  # fmt: skip
    assert call["body"] == body.read_text()
    assert Path(call["cwd"]) == repo.work.resolve()
    # The checkout is as it was: main, the applied files changed in the work tree only.
    assert git(repo.work, "rev-parse", "--abbrev-ref", "HEAD") == "main\n"
    assert git(repo.work, "status", "--porcelain") == " M a.txt\n M b.txt\n"
    published = json.loads((body.parent / "publish.json").read_text())
    assert published == {
        "outcome": "published",
        "branch": "bot/fix",
        "remote": "origin",
        "commits": 1,
        "files": 2,
        "pr": "opened",
    }


def test_a_second_run_adds_a_commit_to_the_branch_and_updates_the_pull_request(
    tmp_path: Path,
) -> None:
    repo = Repo(tmp_path, 'message = "run {{ run.files }}"')
    assert repo.run().code == 0
    first = git(repo.origin, "rev-parse", "fanout/fix").strip()
    (repo.work / "c.txt").write_text("c BAD\n")
    repo.commit("add c", "c.txt")
    ran = repo.run()
    assert ran.code == 0, ran.err
    assert (
        "published 1 file(s) in 1 commit(s) to fanout/fix on origin; pull request updated"
        in ran.err
    )
    # A fast-forward: the first run's commit is the parent of the second's.
    assert git(repo.origin, "rev-parse", "fanout/fix~1").strip() == first
    assert repo.log_of("fanout/fix") == ["run 1", "run 2", "start\n"]
    assert repo.files_of("fanout/fix") == {
        "a.txt": "a GOOD\n",
        "b.txt": "b GOOD\n",
        "c.txt": "c GOOD\n",
    }
    create, edit = repo.calls()
    assert create["argv"][:2] == ["pr", "create"]
    assert edit["argv"] == [
        "pr", "edit", "fanout/fix", "--title", "fanout: fix", "--body-file", str(repo.report()),
    ]  # fmt: skip


def test_one_commit_per_unit_each_with_its_message(tmp_path: Path) -> None:
    repo = Repo(
        tmp_path,
        'commits = "unit"\nunitMessage = "fix {{ unit.id }} ({{ unit.files | join(\',\') }})"',
    )
    ran = repo.run()
    assert ran.code == 0, ran.err
    assert repo.log_of("fanout/fix") == ["fix b.txt (b.txt)", "fix a.txt (a.txt)", "start\n"]
    assert git(repo.origin, "show", "--format=", "--name-only", "fanout/fix") == "b.txt\n"
    assert git(repo.origin, "show", "--format=", "--name-only", "fanout/fix~1") == "a.txt\n"


def test_a_dirty_work_tree_is_refused_before_the_run_with_its_files(tmp_path: Path) -> None:
    repo = Repo(tmp_path, "")
    (repo.work / "README.md").write_text("my own edit\n")
    (repo.work / "notes.txt").write_text("mine\n")
    ran = repo.run()
    assert ran.code == 4
    assert (
        "publish: the work tree has changes fanout did not make: README.md, notes.txt; commit"
        " or stash them, so that what is published is the run's alone"
    ) in " ".join(ran.err.split())
    assert not (repo.work / ".fanout" / "runs").exists()
    assert (repo.work / "a.txt").read_text() == "a BAD\n"
    assert repo.branches() == "main\n"
    assert repo.calls() == []


def test_a_run_that_applies_nothing_runs_in_a_dirty_tree_and_publishes_nothing(
    tmp_path: Path,
) -> None:
    repo = Repo(tmp_path, "")
    (repo.work / "README.md").write_text("my own edit\n")
    ran = cli("run", "--no-apply", str(repo.job))
    assert ran.code == 0, ran.err
    assert (repo.work / "a.txt").read_text() == "a BAD\n"  # kept, not applied
    assert (repo.work / "README.md").read_text() == "my own edit\n"
    assert repo.branches() == "main\n"
    assert repo.calls() == []


def test_a_branch_that_moved_on_the_remote_is_not_forced_and_the_results_stand(
    tmp_path: Path,
) -> None:
    repo = Repo(tmp_path, "")
    assert repo.run().code == 0
    # Someone pushes to the publish branch from elsewhere; the local branch is behind.
    other = tmp_path / "other"
    git(tmp_path, "clone", "--quiet", "-b", "fanout/fix", str(repo.origin), str(other))
    (other / "c.txt").write_text("theirs\n")
    git(other, "add", "c.txt")
    git(other, "-c", "user.name=O", "-c", "user.email=o@example.invalid", "commit", "-qm", "theirs")
    git(other, "push", "--quiet", "origin", "fanout/fix")
    theirs = git(repo.origin, "rev-parse", "fanout/fix")
    (repo.work / "b.txt").write_text("b BAD\n")  # as committed: the work tree is clean
    (repo.work / "a.txt").write_text("a BAD again\n")
    repo.commit("a is bad again")
    ran = repo.run()
    assert ran.code == 0, ran.err
    # The run's commit goes on top of what the remote holds: theirs is kept.
    assert git(repo.origin, "rev-parse", "fanout/fix^") == theirs
    assert repo.files_of("fanout/fix")["c.txt"] == "theirs\n"
    assert repo.files_of("fanout/fix")["a.txt"] == "a GOOD again\n"
    assert (repo.work / "a.txt").read_text() == "a GOOD again\n"


def test_a_file_changed_during_the_run_that_the_run_did_not_write_is_refused(
    tmp_path: Path,
) -> None:
    # The worker writes to the work tree behind fanout's back, as a person might.
    repo = Repo(tmp_path, "", extra=f"; echo late >> {tmp_path / 'work' / 'README.md'}")
    ran = repo.run()
    assert ran.code == 0, ran.err
    assert (
        "publish refused: the work tree has changes the run did not make: README.md; nothing"
        " was committed or pushed (the run's result stands)"
    ) in " ".join(ran.err.split())
    assert repo.branches() == "main\n"
    assert repo.calls() == []
    assert (repo.work / "a.txt").read_text() == "a GOOD\n"
    published = json.loads((repo.report().parent / "publish.json").read_text())
    assert published["outcome"] == "refused"
    assert published["files"] == ["README.md"]


def test_nothing_changed_pushes_nothing_and_runs_no_command(tmp_path: Path) -> None:
    repo = Repo(tmp_path, "")
    (repo.work / "a.txt").write_text("a GOOD\n")
    (repo.work / "b.txt").write_text("b GOOD\n")
    repo.commit("already good")
    ran = repo.run()
    assert ran.code == 0, ran.err
    assert "not published: nothing changed: no commit, no push, no pull request" in ran.err
    assert repo.branches() == "main\n"
    assert git(repo.work, "branch", "--format=%(refname:short)") == "main\n"
    assert repo.calls() == []


def test_a_push_that_fails_is_reported_and_the_runs_results_stand(tmp_path: Path) -> None:
    repo = Repo(tmp_path, 'remote = "nowhere"')
    ran = repo.run()
    assert ran.code == 0
    said = " ".join(ran.err.split())
    assert (
        "could not publish: git ls-remote: fatal: 'nowhere' does not appear to be a git repository (the run's result stands)"
        in said
    )
    assert repo.calls() == []
    assert (repo.work / "a.txt").read_text() == "a GOOD\n"
    assert repo.report().is_file()
    assert json.loads((repo.report().parent / "publish.json").read_text())["outcome"] == "failed"


def test_a_pull_request_command_that_fails_is_reported_after_the_push(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Repo(tmp_path, "")
    monkeypatch.setenv("GH_EXIT", "3")
    ran = repo.run()
    assert ran.code == 0
    assert "could not publish: publish.pr gh exited 3 (the run's result stands)" in " ".join(
        ran.err.split()
    )
    assert repo.branches() == "fanout/fix\nmain\n"
    assert len(repo.calls()) == 1


def test_a_pull_request_that_failed_to_open_is_opened_by_the_next_run_not_updated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = Repo(tmp_path, "")
    monkeypatch.setenv("GH_EXIT", "3")
    assert repo.run().code == 0  # pushed; the pull request not opened
    monkeypatch.setenv("GH_EXIT", "0")
    (repo.work / "c.txt").write_text("c BAD\n")
    repo.commit("add c", "c.txt")
    ran = repo.run()
    assert ran.code == 0, ran.err
    assert "pull request opened" in ran.err
    assert [call["argv"][:2] for call in repo.calls()] == [["pr", "create"], ["pr", "create"]]
    (repo.work / "d.txt").write_text("d BAD\n")
    repo.commit("add d", "d.txt")
    assert repo.run().code == 0
    assert repo.calls()[-1]["argv"][:2] == ["pr", "edit"]  # opened once: updated since


def test_the_schemas_default_templates_use_only_the_variables_they_are_given() -> None:
    # Validation checks what a job file writes; the defaults are written in the schema.
    from fanout.spec import schema
    from fanout.spec.checks import publish
    from fanout.spec.templates import JOB_SHAPE, TRIGGER_SHAPE, Templates

    templates = Templates(Path("."))
    checked = []
    for key in ("branch", "message", "unitMessage", "title", "pr", "update"):
        default = schema.default("/properties/publish", key)
        roots = {"job": JOB_SHAPE, "trigger": TRIGGER_SHAPE, **publish.roots(("publish", key))}
        for source in default if isinstance(default, list) else [default]:
            assert templates.check(source, roots) == [], (key, source)
            checked.append(source)
    assert len(checked) == 23
