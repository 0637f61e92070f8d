"""What each command imports before it answers: ``fanout --version`` nothing but the
package, ``fanout validate`` the job language but no run machinery, ``fanout report
--format json`` the journal but not the job language.  Start-up is imports (see
bench/startup.py for the times); these tests hold the import lists, never a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fanout.backlog.units import Unit
from fanout.journal import Journal
from fanout.outcome import RunState

from helpers import cli

ROOT = Path(__file__).resolve().parents[1]

# The console script (pyproject.toml's [project.scripts]) with a hook that writes
# sys.modules, as they are when the command ends, to $MODULES_OUT.
SCRIPT = """
import atexit, json, os, sys

def dump():
    with open(os.environ["MODULES_OUT"], "w") as out:
        json.dump(sorted(sys.modules), out)

atexit.register(dump)
sys.argv[0] = "fanout"
from fanout.__main__ import main
sys.exit(main())
"""

# What no command below may import: the run machinery (asyncio, the SSH client, the
# limiter, the live display).
RUN_MACHINERY = {"asyncio", "asyncssh", "aiolimiter", "rich"}


def fanout(tmp_path: Path, *args: str, cwd: Path = ROOT) -> tuple[str, set[str]]:
    """Run the ``fanout`` console script in a new interpreter: its stdout and the
    top-level names of the modules it had imported when it ended."""
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        cwd=cwd,
        env={**os.environ, "MODULES_OUT": str(out)},
        capture_output=True,
        text=True,
        check=True,
    )
    modules = json.loads(out.read_text())
    return done.stdout, {m.split(".")[0] for m in modules} | set(modules)


def test_version_prints_what_the_app_s_option_prints_and_imports_no_command(
    tmp_path: Path,
) -> None:
    printed, modules = fanout(tmp_path, "--version")
    assert printed == cli("--version").out == "fanout 0.1.0\n"
    assert "fanout.cli" not in modules
    assert not modules & {"typer", "jsonschema", "jinja2", "fanout.spec", *RUN_MACHINERY}


def test_version_among_other_arguments_is_the_app_s_option(tmp_path: Path) -> None:
    printed, modules = fanout(tmp_path, "--version", "--help")
    assert printed == "fanout 0.1.0\n"
    assert "typer" in modules


def test_validate_of_a_valid_job_imports_neither_typer_nor_jsonschema_nor_run_machinery(
    tmp_path: Path,
) -> None:
    printed, modules = fanout(tmp_path, "validate", "fanout.toml.example")
    assert printed == "1 job file(s) valid\n"
    assert {"jinja2", "fanout.spec.conformance"} <= modules
    assert not modules & {"typer", "fanout.cli.app", "jsonschema", *RUN_MACHINERY}


def test_validate_with_an_option_is_the_cli_s(tmp_path: Path) -> None:
    printed, modules = fanout(tmp_path, "validate", "--format", "json", "fanout.toml.example")
    assert json.loads(printed) == []
    assert "typer" in modules


def test_validate_answered_before_the_cli_says_what_the_cli_says(tmp_path: Path) -> None:
    """The same files through __main__'s early answer and through the typer command:
    the same stdout, stderr and exit code, for valid, invalid and unreadable files."""
    good = ROOT / "fanout.toml.example"
    bad = tmp_path / "bad.toml"
    bad.write_text('version = 1\nname = "x"\n[inputs]\nitems = ["a"]\n[task]\ncommand = 1\n')
    for files in ([good], [bad], [good, bad, tmp_path / "missing.toml"]):
        args = ["validate", *map(str, files)]
        early = subprocess.run(
            [sys.executable, "-m", "fanout", *args], capture_output=True, text=True, check=False
        )
        assert "::" not in early.stdout  # it is text, not github annotations
        expected = cli(*args)
        assert (early.returncode, early.stdout, early.stderr) == (
            expected.code,
            expected.out,
            expected.err,
        )


def test_validate_of_a_bad_job_asks_jsonschema_what_is_wrong(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('version = 1\nname = "x"\n[inputs]\nitems = ["a"]\n[task]\ncommand = "true"\n')
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "validate", str(job)],
        env={**os.environ, "MODULES_OUT": str(out)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stderr.splitlines()[-1]) == (2, "1 problem(s) in 1 of 1 file(s)")
    assert "task.command: expected an array, got a string" in done.stderr
    assert "jsonschema" in json.loads(out.read_text())


def test_report_json_reads_the_journal_without_the_job_language(tmp_path: Path) -> None:
    journal = Journal(tmp_path / ".fanout" / "journal.sqlite")
    run = journal.create_run(job="j", job_file="j.toml", apply=False)
    journal.add_units(run, 1, [Unit(id="a", index=0, items=("a",), origin="x:1")])
    journal.finish_run(run, state=RunState.FINISHED, wall=1.0)
    journal.close()
    printed, modules = fanout(tmp_path, "report", run, "--format", "json", cwd=tmp_path)
    assert json.loads(printed)["units"][0]["unit"] == "a"
    assert not modules & {"fanout.spec", "jsonschema", "jinja2", *RUN_MACHINERY}


def test_a_ray_node_imports_its_sandboxes_without_the_job_language_or_the_driver() -> None:
    """What a Ray actor's worker process imports of fanout when it starts (each of a
    run's actors pays it before its first unit): the node's side and the local sandbox,
    never the coordinator's transport, the attempt driver or the job language."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys; import fanout.transports.ray.node;"
            " print(json.dumps(sorted(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    modules = set(json.loads(done.stdout))
    assert {"fanout.transports.ray.node", "fanout.transports.local"} <= modules
    assert not modules & {
        "fanout.transports.ray.transport",
        "fanout.attempt.driver",
        "fanout.spec",
        "jsonschema",
        "jinja2",
    }
