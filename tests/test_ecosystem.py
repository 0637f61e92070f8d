"""fanout in the tools its users already run: taplo (editors), pre-commit, GitHub Actions.

taplo and pre-commit are the real ones, from the dev extra (PyPI's taplo wheel ships the
binary; nothing is downloaded at run time).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fanout.cli.validating import github_annotation
from fanout.errors import Problem

from helpers import cli

TOOLS = Path(sys.executable).parent
README = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "ci.md").read_text()


def taplo(cwd: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLS / "taplo"), "check", "--colors", "never", *files],
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def invalid_files(root: Path, files: list[str]) -> set[str]:
    """Which of ``files`` taplo refuses, one check each: taplo 0.9.3 sometimes exits
    before its last lines reach stderr (about 1 run in 30 here), so only the exit code
    is trusted.  A file the config does not include passes (taplo skips it)."""
    return {file for file in files if taplo(root, file).returncode != 0}


def break_name(path: Path) -> None:
    """A schema error (not a TOML one): a job name the schema's pattern refuses."""
    text = path.read_text()
    broken = re.sub(r'^name = ".*"$', 'name = "Bad Name"', text, count=1, flags=re.M)
    assert broken != text
    path.write_text(broken)


# -- taplo -----------------------------------------------------------------------------


def test_taplo_checks_a_fresh_init_against_the_schema_it_wrote(chdir_tmp: Path) -> None:
    assert cli("init", "jobs/sweep.toml").code == 0
    assert (chdir_tmp / "jobs" / "fanout.schema.json").is_file()
    fresh = taplo(chdir_tmp, "jobs/sweep.toml")
    assert fresh.returncode == 0, fresh.stderr
    assert "failed to load schema" not in fresh.stderr

    shutil.copy(chdir_tmp / "jobs" / "sweep.toml", chdir_tmp / "jobs" / "bad.toml")
    break_name(chdir_tmp / "jobs" / "bad.toml")
    # The schema loaded for sweep.toml beside it, so this refusal is the schema's.
    assert taplo(chdir_tmp, "jobs/bad.toml").returncode == 1


def test_taplo_passes_the_repositorys_job_files(repo: Path) -> None:
    result = taplo(repo)
    assert result.returncode == 0, result.stderr
    assert "failed to load schema" not in result.stderr


def test_the_repositorys_taplo_config_checks_job_files_against_the_schema(
    repo: Path, tmp_path: Path
) -> None:
    # The repository's .taplo.toml on broken copies of its job files, without their
    # #:schema lines: the config alone includes .toml.example (not in taplo's default)
    # and associates the schema; the hosts file is not a job and is not held to it.
    shutil.copy(repo / ".taplo.toml", tmp_path)
    shutil.copytree(repo / "schemas", tmp_path / "schemas")
    shutil.copytree(
        repo / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("lint-*")
    )
    shutil.copy(repo / "fanout.toml.example", tmp_path)
    for job in ("fanout.toml.example", "examples/claude-ssh.toml"):
        path = tmp_path / job
        path.write_text(re.sub(r"^#:schema .*\n", "", path.read_text(), flags=re.M))
        break_name(path)
    assert taplo(tmp_path).returncode == 1
    files = ["fanout.toml.example", "examples/claude-ssh.toml", "examples/hosts.toml"]
    assert invalid_files(tmp_path, files) == {"fanout.toml.example", "examples/claude-ssh.toml"}


def test_the_readmes_taplo_config_covers_the_readmes_layouts(chdir_tmp: Path) -> None:
    (config,) = re.findall(r'```toml title="\.taplo\.toml"\n(.*?)```', README, re.S)
    (chdir_tmp / ".taplo.toml").write_text(config)
    (chdir_tmp / "fanout.schema.json").write_text(cli("schema").out)
    jobs = ["fanout.toml", "jobs/sweep.toml", "jobs/nightly/docs.toml", "ci/x.fanout.toml"]
    jobs.append("fanout.toml.example")
    for job in jobs:
        assert cli("init", job).code == 0
    for schema in chdir_tmp.glob("*/**/fanout.schema.json"):
        schema.unlink()  # the config's association must do it, not the files beside
    for job in jobs:
        path = chdir_tmp / job
        path.write_text(re.sub(r"^#:schema .*\n", "", path.read_text(), flags=re.M))
    # Hosts files are valid TOML that the job schema would refuse: they must not get it.
    others = ["jobs/hosts.toml", "jobs/staging-hosts.toml", "other.toml"]
    for hosts in others[:2]:
        (chdir_tmp / hosts).write_text('[[hosts]]\nname = "a"\naddress = "a.internal"\n')
    (chdir_tmp / "other.toml").write_text("[tool]\nanything = 1\n")
    good = taplo(chdir_tmp)
    assert good.returncode == 0, good.stderr
    for job in jobs:
        break_name(chdir_tmp / job)
    assert taplo(chdir_tmp).returncode == 1
    assert invalid_files(chdir_tmp, jobs + others) == set(jobs)


# -- pre-commit ------------------------------------------------------------------------


def fanout_source(repo: Path, target: Path) -> str:
    """A clone of this repository at HEAD plus the tracked files' uncommitted changes,
    committed: what the hook installs is the code under test, never untracked or
    ignored files of the work tree (.venv, run output).  Returns the commit."""
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@invalid"]
    subprocess.run([*git, "clone", "-q", str(repo), str(target)], check=True)
    diff = subprocess.run(
        ["git", "-C", str(repo), "diff", "HEAD", "--binary"], capture_output=True, check=True
    ).stdout
    if diff:
        subprocess.run([*git, "-C", str(target), "apply"], input=diff, check=True)
        subprocess.run([*git, "-C", str(target), "add", "-A"], check=True)
        subprocess.run([*git, "-C", str(target), "commit", "-q", "-m", "work tree"], check=True)
    head = subprocess.run(
        ["git", "-C", str(target), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    return head.stdout.strip()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_pre_commit_hook_catches_the_readmes_layouts(repo: Path, tmp_path: Path) -> None:
    source = tmp_path / "fanout-src"
    rev = fanout_source(repo, source)
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    # The machine's environment (pip's index settings, proxies) with the test's HOME,
    # without what would steer git or pre-commit elsewhere (a hook running this suite).
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("GIT_", "PRE_COMMIT")) and name != "SKIP"
    }
    env.update(PRE_COMMIT_HOME=str(tmp_path / "cache"), PRE_COMMIT_COLOR="never")

    def pre_commit(config: str, *args: str) -> subprocess.CompletedProcess[str]:
        (project / ".pre-commit-config.yaml").write_text(
            f"repos:\n  - repo: {source}\n    rev: {rev}\n    hooks:\n"
            + textwrap.indent(config, " " * 6)
        )
        subprocess.run(["git", "-C", str(project), "add", "-A"], check=True)
        return subprocess.run(
            [str(TOOLS / "pre-commit"), "run", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        for job in ("fanout.toml", "fanout.toml.example", "jobs/sweep.toml", "ci/x.fanout.toml"):
            assert cli("init", job).code == 0
    bad = (project / "fanout.toml").read_text().replace('name = "my-sweep"', 'name = "Bad Name"')
    (project / "jobs" / "bad.toml").write_text(bad)
    (project / "jobs" / "hosts.toml").write_text('[[hosts]]\nname = "a"\naddress = "a.internal"\n')
    (project / "notes.toml").write_text("this is not toml = [\n")

    everything = pre_commit("- id: fanout-validate\n", "--all-files")
    assert everything.returncode == 1, everything.stdout + everything.stderr
    assert "validate fanout job files" in everything.stdout
    assert "Failed" in everything.stdout
    # One fanout process saw the five job files, not the hosts file or notes.toml.
    assert (
        "jobs/bad.toml:8:8: name: 'Bad Name' is not a job name (at most 64 lowercase "
        "letters, digits, '.', '_' and '-')\n1 problem(s) in 1 of 5 file(s)\n" in everything.stdout
    )

    good = pre_commit("- id: fanout-validate\n", "--files", "jobs/sweep.toml", "fanout.toml")
    assert good.returncode == 0, good.stdout + good.stderr
    assert re.search(r"validate fanout job files\.+Passed", good.stdout)

    # The README's override for another layout.
    (project / "sweeps").mkdir()
    (project / "sweeps" / "nightly.toml").write_text(bad)
    moved = pre_commit(
        "- id: fanout-validate\n  files: ^sweeps/.*\\.toml$\n", "--files", "sweeps/nightly.toml"
    )
    assert moved.returncode == 1, moved.stdout + moved.stderr
    assert "1 problem(s) in 1 of 1 file(s)" in moved.stdout


def test_the_hook_pattern_is_the_one_the_readme_documents(repo: Path) -> None:
    hooks = (repo / ".pre-commit-hooks.yaml").read_text()
    assert "rev: v0.1.0" not in README
    assert "require_serial: true" in hooks
    (files,) = re.findall(r"^  files: (.*)$", hooks, re.M)
    (exclude,) = re.findall(r"^  exclude: (.*)$", hooks, re.M)

    def checked(path: str) -> bool:
        return bool(re.search(files, path)) and not re.search(exclude, path)

    for path in [
        "fanout.toml",
        "fanout.toml.example",
        "nightly.fanout.toml",
        "jobs/sweep.toml",
        "jobs/nightly/docs.toml",
        "ci/jobs/sweep.toml",
        "tools/fanout.toml",
    ]:
        assert checked(path), path
    for path in [
        "jobs/hosts.toml",
        "jobs/staging-hosts.toml",
        "hosts.toml",
        "pyproject.toml",
        "jobs/README.md",
        "myjobs/x.toml",
        "fanout.toml.bak",
    ]:
        assert not checked(path), path


# -- GitHub Actions --------------------------------------------------------------------


def test_github_annotations_escape_data_and_properties() -> None:
    problem = Problem(
        file="jobs/a,b:c%.toml", line=3, col=7, key="task.prompt", message="50% off\r\nnext: x, y"
    )
    assert github_annotation(problem) == (
        "::error file=jobs/a%2Cb%3Ac%25.toml,line=3,col=7,title=fanout"
        "::task.prompt: 50%25 off%0D%0Anext: x, y"
    )
    keyless = Problem(file="x.toml", line=1, col=1, key="", message="cannot read the job file")
    assert github_annotation(keyless) == (
        "::error file=x.toml,line=1,col=1,title=fanout::cannot read the job file"
    )


def test_the_readmes_actions_recipe_uses_github_annotations() -> None:
    assert "fanout validate --format github jobs/sweep.toml" in README
