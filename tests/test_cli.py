"""The command line: exit codes, output formats, help that teaches."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from fanout import __version__, spec
from fanout.errors import JobError, Problem
from fanout.journal import Journal

from helpers import MINIMAL, cli, write_job


def test_validate_ok_and_bad_files_together(chdir_tmp: Path) -> None:
    write_job(chdir_tmp, MINIMAL, "good.toml")
    write_job(chdir_tmp, MINIMAL.replace('name = "test-job"', 'name = "Bad Name"'), "bad.toml")
    good = cli("validate", "good.toml")
    assert (good.code, good.out, good.err) == (0, "1 job file(s) valid\n", "")
    both = cli("validate", "good.toml", "bad.toml")
    assert both.code == 2
    assert both.err == (
        "bad.toml:2:8: name: 'Bad Name' is not a job name (at most 64 lowercase letters, "
        "digits, '.', '_' and '-')\n1 problem(s) in 1 of 2 file(s)\n"
    )


def test_validate_json_for_ci_annotations(chdir_tmp: Path) -> None:
    write_job(chdir_tmp, MINIMAL.replace("version = 1", "version = 3"), "bad.toml")
    result = cli("validate", "--format", "json", "bad.toml")
    assert result.code == 2
    assert json.loads(result.out) == [
        {"file": "bad.toml", "line": 1, "col": 11, "key": "version", "message": "must be 1, not 3"}
    ]


def test_plan_shows_units_the_first_task_and_the_pace(chdir_tmp: Path) -> None:
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "enrich"
        [inputs]
        items = [{ id = "acme", domain = "acme.example" }, { id = "globex", domain = "globex.example" }]
        [task]
        prompt = "Enrich {{ unit.record.domain }}"
        command = ["enrich", "--domain", "{{ unit.record.domain }}"]
        secrets = ["CRM_TOKEN"]
        [[limits]]
        name = "crm"
        requests = 50
        per = "1m"
        requestsPerTask = 4
        [[limits]]
        name = "search"
        requests = 10
        per = "1s"
        """,
    )
    result = cli("plan", "job.toml")
    assert result.code == 0, result.err
    assert "Units     2 unit(s) from 2 record(s)" in result.out
    assert "  command  enrich --domain acme.example" in result.out
    assert "  secrets  CRM_TOKEN (values come from the environment)" in result.out
    assert "    | Enrich acme.example" in result.out
    assert "crm: 12 task(s)/min (50 requests per 1m, 4 per task)  <- tightest" in result.out
    assert (
        "2 unit(s) x 4 request(s) at 50/1m: at least 10s, crm is the bottleneck"
        " (12 task(s) fit a window)" in result.out
    )


def test_plan_shows_next_cron_fires_in_zone_and_utc(chdir_tmp: Path) -> None:
    write_job(
        chdir_tmp,
        MINIMAL
        + '[[triggers]]\ntype = "cron"\nschedule = "30 1 * * *"\ntimezone = "Europe/Berlin"\n',
    )
    result = cli("plan", "job.toml")
    assert "Trigger   '30 1 * * *' (Europe/Berlin): At 01:30 every day" in result.out
    assert "+01:00  (" in result.out or "+02:00  (" in result.out


def test_plan_of_nothing_exits_3(chdir_tmp: Path) -> None:
    write_job(chdir_tmp, MINIMAL.replace('items = ["a", "b"]', 'files = ["nothing/*.py"]'))
    result = cli("plan", "job.toml")
    assert result.code == 3
    assert result.err == (
        "nothing selected: the inputs of job.toml yield no units"
        f" (inputs.files[0] 'nothing/*.py' matches no file in {chdir_tmp.resolve()})\n"
    )
    assert (
        "Units     0 unit(s) from 0 record(s)\n"
        f"          job.toml:4:10: inputs.files[0]: 'nothing/*.py' matches no file in"
        f" {chdir_tmp.resolve()}\n"
    ) in result.out


def test_a_files_pattern_that_matches_nothing_is_named_by_run_and_plan(chdir_tmp: Path) -> None:
    # src/a.py is matched, then excluded: that pattern matched; lib/ has no file at all.
    (chdir_tmp / "src").mkdir()
    (chdir_tmp / "src" / "a.py").write_text("x = 1\n")
    files = 'files = ["src/**/*.py", "lib/**/*.py"]\nexclude = ["src/a.py"]'
    text = MINIMAL.replace('items = ["a", "b"]', files) + '[runtime]\nsandbox = "none"\n'
    write_job(chdir_tmp, text)
    where = chdir_tmp.resolve()
    located = f"job.toml:4:25: inputs.files[1]: 'lib/**/*.py' matches no file in {where}"
    message = (
        "nothing selected: the inputs of job.toml yield no units"
        f" (inputs.files[1] 'lib/**/*.py' matches no file in {where})"
    )
    ran = cli("run", "job.toml")
    assert ran.code == 3
    lines = [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in ran.err.splitlines()]
    assert located in lines
    assert lines[-1] == message
    plan = cli("plan", "job.toml")
    assert plan.code == 3
    assert plan.err == message + "\n"
    assert f"\n          {located}\n" in plan.out
    # With units selected the run goes on, and still says which pattern found nothing.
    write_job(chdir_tmp, text.replace('exclude = ["src/a.py"]', ""))
    ran = cli("run", "job.toml")
    assert ran.code == 0, ran.err
    assert located in [re.sub(r"^\d\d:\d\d:\d\d ", "", line) for line in ran.err.splitlines()]


def test_init_writes_a_valid_starter_and_refuses_to_overwrite(chdir_tmp: Path) -> None:
    first = cli("init")
    assert first.code == 0
    job = spec.load(chdir_tmp / "fanout.toml")
    assert job.name == "my-sweep"
    second = cli("init")
    assert (second.code, second.err) == (
        2,
        "fanout init: fanout.toml exists; use --force to overwrite it, or name another file\n",
    )


def test_schema_prints_the_schema(repo: Path) -> None:
    result = cli("schema")
    assert result.out == (repo / "schemas" / "fanout.schema.json").read_text()


@pytest.mark.parametrize(
    "command",
    [
        "validate",
        "plan",
        "init",
        "schema",
        "run",
        "retry",
        "status",
        "report",
        "history",
        "release",
    ],
)
def test_every_command_explains_itself(command: str) -> None:
    result = cli(command, "--help")
    assert result.code == 0
    assert "Usage: fanout " + command in result.out


def test_usage_errors_exit_2() -> None:
    assert cli("plan").code == 2
    assert cli("frobnicate").code == 2


def test_retry_has_no_failed_flag(chdir_tmp: Path) -> None:
    # retry re-runs the failed units and nothing else: a flag for the only mode promised
    # modes that do not exist.  A script still passing it is told so, as a usage error.
    assert "--failed" not in cli("retry", "--help").out
    result = cli("retry", "20260301T120000-aaaa", "--failed")
    assert result.code == 2
    assert "No such option: --failed" in result.err


def test_report_has_no_github_format(chdir_tmp: Path) -> None:
    # It was offered and printed the markdown: dropped (see cli/runs.py), and a script
    # still passing it is told what to use instead, before any journal is read.
    shown = cli("report", "--help").out
    assert "<text|json>" in shown
    assert "github" not in shown
    result = cli("report", "20260301T120000-aaaa", "--format", "github")
    assert result.code == 2
    said = " ".join(re.sub(r"[│╭╮╰╯─]", " ", result.err).split())
    assert (
        "Invalid value for '--format': 'github' is not a report format: the report is"
        ' markdown, which GitHub shows as it is (fanout report RUN >> "$GITHUB_STEP_SUMMARY");'
        " annotations on job files are fanout validate --format github"
    ) in said
    assert "Invalid value for '--format': 'yaml' is not one of 'text', 'json'." in " ".join(
        cli("report", "r", "--format", "yaml").err.split()
    )
    assert os.listdir(chdir_tmp) == []


def test_status_of_an_empty_state_directory(chdir_tmp: Path) -> None:
    # A state directory with a journal but no runs (a run was refused before it began).
    Journal(chdir_tmp / ".fanout" / "journal.sqlite").close()
    result = cli("status")
    assert (result.code, result.out) == (0, "no runs yet\n")
    missing = cli("report", "20260101T000000-abcd")
    assert missing.code == 5
    assert "no run '20260101T000000-abcd'" in missing.err


def test_validate_github_annotations(chdir_tmp: Path) -> None:
    write_job(chdir_tmp, MINIMAL, "good.toml")
    write_job(chdir_tmp / "jobs", MINIMAL.replace("version = 1", "version = 3"), "bad.toml")
    result = cli("validate", "--format", "github", "good.toml", "jobs/bad.toml", "gone.toml")
    assert (result.code, result.out, result.err) == (
        2,
        "::error file=jobs/bad.toml,line=1,col=11,title=fanout::version: must be 1, not 3\n"
        "::error file=gone.toml,line=1,col=1,title=fanout::cannot read the job file: "
        "No such file or directory\n",
        "2 problem(s) in 2 of 3 file(s)\n",
    )
    good = cli("validate", "--format", "github", "good.toml")
    assert (good.code, good.out, good.err) == (0, "1 job file(s) valid\n", "")


def test_init_writes_the_schema_its_starter_names(chdir_tmp: Path) -> None:
    result = cli("init", "jobs/sweep.toml")
    assert (result.code, result.out, result.err) == (
        0,
        "wrote jobs/sweep.toml and jobs/fanout.schema.json; "
        "next: fanout validate jobs/sweep.toml && fanout plan jobs/sweep.toml\n",
        "",
    )
    assert (
        (chdir_tmp / "jobs" / "sweep.toml")
        .read_text()
        .startswith("#:schema ./fanout.schema.json\n")
    )
    assert (chdir_tmp / "jobs" / "fanout.schema.json").read_text() == cli("schema").out
    # A second job in the same folder keeps the (identical) schema file quietly.
    again = cli("init", "jobs/docs.toml")
    assert (again.code, again.err) == (0, "")
    assert again.out.startswith("wrote jobs/docs.toml; next:")


def test_a_job_init_writes_into_jobs_selects_the_projects_files(chdir_tmp: Path) -> None:
    # The README's layout: jobs in jobs/, run from the project's root.  The starter's
    # src/**/*.py is the project's src/, not jobs/src/ (0 units before the starter said
    # workspace = "..").
    for name in ("src/a.py", "src/pkg/b.py", "jobs/src/not-this.py"):
        (chdir_tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (chdir_tmp / name).write_text("x = 1\n")
    assert cli("init", "jobs/sweep.toml").code == 0
    plan = cli("plan", "jobs/sweep.toml")
    assert plan.code == 0, plan.err
    assert "Units     2 unit(s) from 2 record(s)\n" in plan.out
    assert cli("init", "jobs/nightly/docs.toml").code == 0
    assert cli("init", "fanout.toml").code == 0
    workspaces = {
        job: spec.load(chdir_tmp / job).runtime.workspace
        for job in ("jobs/sweep.toml", "jobs/nightly/docs.toml", "fanout.toml")
    }
    assert workspaces == dict.fromkeys(workspaces, chdir_tmp.resolve())
    assert 'workspace = ".."\n' in (chdir_tmp / "jobs" / "sweep.toml").read_text()
    assert 'workspace = "../.."\n' in (chdir_tmp / "jobs" / "nightly" / "docs.toml").read_text()
    assert "workspace =" not in (chdir_tmp / "fanout.toml").read_text()
    ran = cli("run", "jobs/sweep.toml")
    assert ran.code == 0, ran.out + ran.err
    (report,) = (chdir_tmp / ".fanout" / "runs").glob("*/report.json")
    units = json.loads(report.read_text())["units"]
    assert sorted((u["unit"], u["state"]) for u in units) == [
        ("src/a.py", "succeeded"),
        ("src/pkg/b.py", "succeeded"),
    ]


def test_a_job_init_writes_outside_the_folder_keeps_the_default_workspace(
    chdir_tmp: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "job.toml"
    assert cli("init", str(elsewhere)).code == 0
    assert "workspace =" not in elsewhere.read_text()
    assert spec.load(elsewhere).runtime.workspace == elsewhere.parent.resolve()


def test_init_keeps_a_schema_file_that_differs_and_says_so(chdir_tmp: Path) -> None:
    (chdir_tmp / "fanout.schema.json").write_text("{}\n")
    kept = cli("init")
    assert (kept.code, kept.err) == (
        0,
        "kept fanout.schema.json, which differs from this fanout's schema; "
        "refresh it with: fanout schema > fanout.schema.json\n",
    )
    assert (chdir_tmp / "fanout.schema.json").read_text() == "{}\n"
    forced = cli("init", "--force")
    assert (forced.code, forced.err) == (0, "")
    assert forced.out.startswith("wrote fanout.toml and fanout.schema.json;")
    assert (chdir_tmp / "fanout.schema.json").read_text() == cli("schema").out


def test_init_into_a_directory_is_a_usage_error(chdir_tmp: Path) -> None:
    (chdir_tmp / "jobs").mkdir()
    result = cli("init", "jobs", "--force")
    assert (result.code, result.err) == (
        2,
        "fanout init: jobs is a directory; name the job file to write\n",
    )


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        ("validate", "fanout validate [OPTIONS] FILE..."),
        ("plan", "fanout plan [OPTIONS] FILE"),
        ("init", "fanout init [OPTIONS] [PATH]"),
        ("run", "fanout run [OPTIONS] FILE"),
        ("retry", "fanout retry [OPTIONS] RUN"),
        ("status", "fanout status [OPTIONS] [RUN]"),
        ("report", "fanout report [OPTIONS] RUN"),
        ("history", "fanout history [OPTIONS] FILE"),
        ("release", "fanout release [OPTIONS] FILE UNIT..."),
        ("triggers", "fanout triggers [OPTIONS] FILE"),
        ("schedule", "fanout schedule [OPTIONS] FILE..."),
        ("hosts check", "fanout hosts check [OPTIONS] FILE"),
        ("hosts trust", "fanout hosts trust [OPTIONS] HOST"),
    ],
)
def test_usage_lines_name_arguments_like_man_pages(command: str, usage: str) -> None:
    result = cli(*command.split(), "--help")
    assert result.code == 0
    assert f"Usage: {usage}" in " ".join(result.out.split())


def test_a_missing_argument_is_named_as_in_the_usage_line() -> None:
    result = cli("run")
    assert result.code == 2
    assert "Usage: fanout run [OPTIONS] FILE" in result.err
    assert "Missing argument 'FILE'." in result.err


def _raising(exc: BaseException) -> Callable[..., NoReturn]:
    def load(*args: object, **kwargs: object) -> NoReturn:
        raise exc

    return load


def test_an_unexpected_error_is_one_line_a_log_and_exit_70(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(chdir_tmp / "cache"))
    monkeypatch.setattr(sys, "argv", ["fanout", "validate", "job.toml"])
    monkeypatch.setattr(spec, "load", _raising(RuntimeError("the scanner\nlost its place")))
    log = chdir_tmp / "cache" / "fanout" / "fanout.log"
    for command in ("validate", "plan"):
        result = cli(command, "job.toml")
        assert (result.code, result.out) == (70, "")
        assert result.err == (
            f"fanout: internal error: RuntimeError: the scanner lost its place; details in {log}\n"
        )
    text = log.read_text()
    assert text.count(f"fanout {__version__} pid ") == 2
    assert "argv: ['fanout', 'validate', 'job.toml']\n" in text
    assert "Traceback (most recent call last):" in text
    assert text.count("RuntimeError: the scanner\nlost its place\n") == 2


def test_an_unwritable_log_puts_the_traceback_on_stderr(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (chdir_tmp / "cache").write_text("a file where the cache directory should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(chdir_tmp / "cache"))
    monkeypatch.setattr(spec, "load", _raising(KeyError("boom")))
    result = cli("validate", "job.toml")
    assert result.code == 70
    first, *rest = result.err.splitlines()
    assert first == (
        "fanout: internal error: KeyError: 'boom'; the log "
        f"{chdir_tmp / 'cache' / 'fanout' / 'fanout.log'} is not writable (Not a directory)"
    )
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "KeyError: 'boom'"


def test_an_exception_group_is_unwrapped(chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(chdir_tmp / "cache"))
    problem = Problem(file="job.toml", line=3, col=1, key="units.id", message="duplicate id 'a'")
    one = ExceptionGroup("tasks", [ExceptionGroup("inner", [JobError([problem])])])
    monkeypatch.setattr(spec, "load", _raising(one))
    result = cli("plan", "job.toml")
    assert (result.code, result.err) == (2, "job.toml:3:1: units.id: duplicate id 'a'\n")
    two = ExceptionGroup("tasks", [ValueError("first"), OSError("second")])
    monkeypatch.setattr(spec, "load", _raising(two))
    result = cli("validate", "job.toml")
    assert result.code == 70
    assert result.err.startswith("fanout: internal error: ValueError: first; details in ")


def test_ctrl_c_and_usage_errors_keep_their_exits(
    chdir_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spec, "load", _raising(KeyboardInterrupt()))
    for command in ("validate", "plan"):  # one handler around every command
        result = cli(command, "job.toml")
        assert (result.code, result.err) == (130, "interrupted\n")
    usage = cli("validate", "--format", "yaml", "job.toml")
    assert usage.code == 2
    assert "Invalid value for '--format'" in usage.err
    assert not (chdir_tmp / "cache").exists()


@pytest.mark.slow
def test_a_stopped_run_says_its_reason_once(chdir_tmp: Path) -> None:
    ids = [f"u{n}" for n in range(1, 301)]
    ids[250] = "u12"  # record 251 repeats record 12: the selection stops the run there
    (chdir_tmp / "data.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in ids))
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "stream"
        [inputs]
        jsonl = "data.jsonl"
        [task]
        command = ["true"]
        [runtime]
        maxConcurrentTasks = 4
        sandbox = "none"
        """,
    )
    result = cli("run", "job.toml")
    assert result.code == 2
    reason = "data.jsonl:251: duplicate unit id 'u12' (first at data.jsonl:12)"
    assert result.err.count(reason) == 1
    lines = result.err.splitlines()
    (notice,) = [line for line in lines if "stopping" in line]
    # The live notice says the run stops and what it waits for; the last lines say why.
    assert notice.split(" ", 1)[1].startswith("stopping on a job error: no new unit starts; ")
    assert notice.endswith(" running attempt(s) finish first, then the reason and how to continue")
    assert lines[-2] == reason
    assert lines[-1].endswith("stopped; `fanout run job.toml` continues it")


def test_logs_are_where_the_readme_says(chdir_tmp: Path, repo: Path) -> None:
    readme = (repo / "docs" / "guides" / "sandboxing.md").read_text()
    assert "`.fanout/runs/<run>/logs/<unit>-<hash>/r<round>-a<attempt>.log`" in readme
    write_job(
        chdir_tmp,
        """
        version = 1
        name = "logs"
        [inputs]
        items = ["src/a.py", "src_a.py"]
        [task]
        command = ["sh", "-c", "echo hello $FANOUT_UNIT_ID"]
        [runtime]
        sandbox = "none"
        """,
    )
    assert cli("run", "job.toml").code == 0
    (run_dir,) = (chdir_tmp / ".fanout" / "runs").iterdir()
    # Made safe for a file name both ids read src_a.py: the hash keeps them apart.
    for unit in ("src/a.py", "src_a.py"):
        digest = hashlib.sha256(unit.encode()).hexdigest()[:8]
        log = run_dir / "logs" / f"src_a.py-{digest}" / "r1-a1.log"
        assert f"hello {unit}\n" in log.read_text()


def test_a_run_reads_its_keys_and_secrets_then_seals_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``fanout run`` and ``fanout schedule`` do once the job is loaded: the keys
    and secrets go into the mapping the library gets, out of the process's environment
    (no child inherits them), and the process becomes non-dumpable (its /proc environ
    and memory, which unsetenv does not clear, are root's to read)."""
    from fanout.cli.app import dumpable, sealed_environ, set_dumpable

    monkeypatch.setenv("REAL_KEY", "sk-real")
    monkeypatch.setenv("CRM_TOKEN", "crm")
    monkeypatch.setenv("UNRELATED", "kept")
    job = spec.load(
        write_job(
            tmp_path,
            MINIMAL + 'secrets = ["CRM_TOKEN"]\n[runtime]\nnetwork = true\n[[apis]]\nname = "a"\n'
            'upstream = "https://api.example.com"\nstyle = "anthropic"\nkeySecret = "REAL_KEY"\n',
        )
    )
    assert dumpable()
    try:
        sealed = sealed_environ([job])
        assert not dumpable()
    finally:
        set_dumpable(True)
    assert (sealed["REAL_KEY"], sealed["CRM_TOKEN"], sealed["UNRELATED"]) == (
        "sk-real",
        "crm",
        "kept",
    )
    assert [name for name in ("REAL_KEY", "CRM_TOKEN", "UNRELATED") if name in os.environ] == [
        "UNRELATED"
    ]
