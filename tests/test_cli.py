"""The command line: exit codes, output formats, help that teaches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fanout import spec

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
    assert result.err == "nothing selected: the inputs of job.toml yield no units\n"


def test_init_writes_a_valid_starter_and_refuses_to_overwrite(chdir_tmp: Path) -> None:
    first = cli("init")
    assert first.code == 0
    job = spec.load(chdir_tmp / "fanout.toml")
    assert job.name == "my-sweep"
    second = cli("init")
    assert (second.code, second.err) == (1, "fanout.toml exists; use --force to overwrite it\n")


def test_schema_prints_the_schema(repo: Path) -> None:
    result = cli("schema")
    assert result.out == (repo / "schemas" / "fanout.schema.json").read_text()


@pytest.mark.parametrize(
    "command", ["validate", "plan", "init", "schema", "run", "retry", "status", "report"]
)
def test_every_command_explains_itself(command: str) -> None:
    result = cli(command, "--help")
    assert result.code == 0
    assert "Usage: fanout " + command in result.out


def test_usage_errors_exit_2() -> None:
    assert cli("plan").code == 2
    assert cli("frobnicate").code == 2


def test_status_of_an_empty_state_directory(chdir_tmp: Path) -> None:
    result = cli("status")
    assert (result.code, result.out) == (0, "no runs yet\n")
    missing = cli("report", "20260101T000000-abcd")
    assert missing.code == 5
    assert "no run '20260101T000000-abcd'" in missing.err
