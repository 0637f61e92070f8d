"""Unit selection from every source: grouping, ids, limits, streaming and failures."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fanout import spec
from fanout.backlog.units import select, state_dir_drops
from fanout.errors import InputFailed, JobError
from fanout.isolation import removal

from helpers import cli, write_job

ENV = {"PATH": os.environ["PATH"]}


def _job(tmp_path: Path, inputs: str, units: str = "") -> spec.Spec:
    return spec.load(
        write_job(
            tmp_path,
            f'version = 1\nname = "t"\n[inputs]\n{inputs}\n[units]\n{units}\n[task]\ncommand = ["true"]\n',
        )
    )


def _ids(job: spec.Spec) -> list[str]:
    return [unit.id for unit in select(job, environ=ENV)]


def test_files_honour_gitignore_exclude_and_the_state_dir(tmp_path: Path) -> None:
    for name in ["src/a.py", "src/pkg/b.py", "src/vendor/c.py", "src/gen/d.py", "src/e.txt"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / ".fanout" / "runs").mkdir(parents=True)
    (tmp_path / ".fanout" / "runs" / "f.py").write_text("")
    (tmp_path / ".gitignore").write_text("src/gen/\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    job = _job(tmp_path, 'files = ["**/*.py"]\nexclude = ["**/vendor/**"]')
    assert _ids(job) == ["src/a.py", "src/pkg/b.py"]
    unit = next(iter(select(job, environ=ENV)))
    assert unit.record == {
        "path": "src/a.py",
        "name": "a.py",
        "stem": "a",
        "suffix": ".py",
        "dir": "src",
    }


def test_gitignore_false_and_no_git_repository_walk_the_tree(tmp_path: Path) -> None:
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "d.py").write_text("")
    (tmp_path / ".gitignore").write_text("gen/\n")
    assert _ids(_job(tmp_path, 'files = ["**/*.py"]')) == ["gen/d.py"]


@pytest.mark.slow
def test_a_workspace_deeper_than_the_recursion_limit_is_walked(tmp_path: Path) -> None:
    """Outside a git repository the workspace is walked; os.walk recurses on Python 3.11,
    so a tree 1,200 deep (a worker's write-back can make one) stopped the selection
    with a RecursionError.  Symlinks to folders are not followed, as os.walk's are not."""
    deep = tmp_path
    for _ in range(1200):  # os.makedirs recurses too
        deep /= "d"
        deep.mkdir()
    (deep / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    (tmp_path / "loop").symlink_to(tmp_path)
    (tmp_path / "c.py").symlink_to(tmp_path / "b.py")
    try:
        ids = _ids(_job(tmp_path, 'files = ["**/*.py"]\ngitignore = false'))
    finally:  # pytest's own clean-up (shutil.rmtree) recurses
        removal.remove(tmp_path / "d", deadline=time.monotonic() + 60)
    assert ids == ["b.py", "c.py", "/".join(["d"] * 1200) + "/a.py"]


def test_group_by_a_nested_field_keeps_first_seen_order(tmp_path: Path) -> None:
    records = [
        {"location": {"file": "b.py"}, "code": "E1"},
        {"location": {"file": "a.py"}, "code": "E2"},
        {"location": {"file": "b.py"}, "code": "E3"},
    ]
    (tmp_path / "f.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    job = _job(tmp_path, 'jsonl = "f.jsonl"', 'groupBy = "location.file"')
    selection = select(job, environ=ENV)
    units = list(selection)
    assert [(u.id, [i["code"] for i in u.items]) for u in units] == [
        ("b.py", ["E1", "E3"]),
        ("a.py", ["E2"]),
    ]
    assert (selection.records, selection.selected) == (3, 2)


def test_missing_group_field_names_the_record(tmp_path: Path) -> None:
    (tmp_path / "f.jsonl").write_text('{"file": "a"}\n{"path": "b"}\n')
    job = _job(tmp_path, 'jsonl = "f.jsonl"', 'groupBy = "file"')
    with pytest.raises(JobError) as caught:
        list(select(job, environ=ENV))
    assert str(caught.value) == (
        f"{tmp_path / 'job.toml'}:6:1: units.groupBy: record f.jsonl:2 has no field 'file' to group by"
    )


def test_records_without_an_id_need_an_id_template(tmp_path: Path) -> None:
    (tmp_path / "c.csv").write_text("email,name\nada@example.com,Ada\n")
    with pytest.raises(JobError) as caught:
        _ids(_job(tmp_path, 'csv = "c.csv"'))
    assert str(caught.value) == (
        "c.csv:2: the record has no 'id' field; set units.id, e.g. id = \"{{ unit.record.email }}\""
    )
    assert _ids(_job(tmp_path, 'csv = "c.csv"', 'id = "{{ unit.record.email }}"')) == [
        "ada@example.com"
    ]


def test_an_id_that_spans_lines_is_located_at_what_made_it(tmp_path: Path) -> None:
    # The record's own id: its line in the input (the job file has no units.id to
    # point at, and its first line is not where the problem is).
    (tmp_path / "f.jsonl").write_text('{"id": "a"}\n{"id": "b\\nc"}\n')
    job = spec.load(
        write_job(
            tmp_path,
            'version = 1\nname = "t"\n[inputs]\njsonl = "f.jsonl"\n[task]\ncommand = ["true"]\n',
        )
    )
    with pytest.raises(JobError) as caught:
        _ids(job)
    assert str(caught.value) == "f.jsonl:2: the unit id spans lines"
    # A units.id template that renders a line break: the template.
    with pytest.raises(JobError) as caught:
        _ids(_job(tmp_path, 'jsonl = "f.jsonl"', 'id = "x{{ unit.record.id }}"'))
    assert str(caught.value) == (
        f"{tmp_path / 'job.toml'}:6:1: units.id: the unit id for f.jsonl:2 spans lines"
    )


def test_limit_stops_reading_unless_counting_all(tmp_path: Path) -> None:
    job = _job(tmp_path, 'items = ["a", "b", "c", "d"]', "limit = 2")
    selection = select(job, environ=ENV)
    assert [u.id for u in selection] == ["a", "b"]
    assert (selection.records, selection.truncated) == (3, True)
    counted = select(job, environ=ENV, count_all=True)
    assert [u.id for u in counted] == ["a", "b"]
    assert (counted.records, counted.selected, counted.truncated) == (4, 2, True)


def test_json_pointer_and_errors(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps({"results": [{"id": 1}, {"id": 2}]}))
    assert _ids(_job(tmp_path, 'json = "r.json"\npointer = "/results"')) == ["1", "2"]
    with pytest.raises(InputFailed, match=r"r\.json: JSON Pointer '/nope' finds nothing at 'nope'"):
        _ids(_job(tmp_path, 'json = "r.json"\npointer = "/nope"'))
    with pytest.raises(
        InputFailed, match="expected an array of records at the top level, found dict"
    ):
        _ids(_job(tmp_path, 'json = "r.json"'))


def test_bad_jsonl_line_is_located(tmp_path: Path) -> None:
    (tmp_path / "f.jsonl").write_text('{"id": 1}\n{"id": 2\n')
    with pytest.raises(InputFailed, match=r"^f.jsonl:2: not a JSON line: Expecting ',' delimiter$"):
        _ids(_job(tmp_path, 'jsonl = "f.jsonl"'))


def test_missing_input_file(tmp_path: Path) -> None:
    with pytest.raises(
        InputFailed, match=r"cannot read input nope\.jsonl: No such file or directory"
    ):
        _ids(_job(tmp_path, 'jsonl = "nope.jsonl"'))


def test_lint_lines_from_a_command_grouped_by_path(tmp_path: Path) -> None:
    output = (
        "src/a.py:3:1: F401 `os` imported but unused\n"
        "src/b.py:10: error: Name 'x' is not defined  [name-defined]\n"
        "src/a.py:9:80: E501 Line too long (88 > 79)\n"
        "Found 3 errors.\n"
    )
    (tmp_path / "out.txt").write_text(output)
    job = _job(tmp_path, 'command = ["cat", "out.txt"]\nformat = "lint"', 'groupBy = "path"')
    units = list(select(job, environ=ENV))
    assert [(u.id, [(i["line"], i["col"], i["code"]) for i in u.items]) for u in units] == [
        ("src/a.py", [(3, 1, "F401"), (9, 80, "E501")]),
        ("src/b.py", [(10, None, "name-defined")]),
    ]


def test_command_failure_shows_stderr(tmp_path: Path) -> None:
    job = _job(tmp_path, 'command = ["sh", "-c", "echo boom >&2; exit 3"]\nformat = "lines"')
    with pytest.raises(InputFailed) as caught:
        _ids(job)
    assert str(caught.value) == (
        f"{tmp_path / 'job.toml'}:4:1: inputs.command: "
        "input command exited with status 3: sh -c 'echo boom >&2; exit 3':\nboom\n"
        "status 3 is not in inputs.okExitCodes [0, 1]; if it means the command worked "
        "(linters exit non-zero when they find something), this line under [inputs] "
        "accepts it:\n"
        "    okExitCodes = [0, 1, 3]"
    )


def test_command_failure_redacts_task_secrets_but_the_command_sees_them(tmp_path: Path) -> None:
    """The input command runs with fanout's environment (it may need a token), but what
    it prints on stderr is quoted with the values of task.secrets redacted."""
    token = "ghp_s3cr3tTOKENvalue"
    path = write_job(
        tmp_path,
        'version = 1\nname = "t"\n[inputs]\n'
        'command = ["sh", "-c", "echo \\"$GH_TOKEN\\" > seen; echo \\"bad credentials: $GH_TOKEN\\" >&2; exit 2"]\n'
        'format = "lines"\n[task]\ncommand = ["true"]\nsecrets = ["GH_TOKEN"]\n',
    )
    with pytest.raises(InputFailed) as caught:
        list(select(spec.load(path), environ={**ENV, "GH_TOKEN": token}))
    message = str(caught.value)
    assert token not in message
    assert message.splitlines()[1] == "bad credentials: [secret]"
    assert (tmp_path / "seen").read_text() == f"{token}\n"


def test_a_long_stderr_is_quoted_by_its_first_line_and_its_tail(tmp_path: Path) -> None:
    script = "echo 'usage: lister [options]' >&2; seq 1 2000 >&2; exit 2"
    job = _job(tmp_path, f'command = {json.dumps(["sh", "-c", script])}\nformat = "lines"')
    with pytest.raises(InputFailed) as caught:
        _ids(job)
    lines = str(caught.value).splitlines()
    # 8,917 bytes of stderr: the first line, and the last 4,000 bytes (lines 1201-2000).
    assert lines[1:3] == ["usage: lister [options]", "[... 4893 bytes ...]"]
    assert (lines[3], lines[-3]) == ("1201", "2000")


def test_a_command_killed_by_a_signal_says_so(tmp_path: Path) -> None:
    job = _job(tmp_path, 'command = ["sh", "-c", "kill -TERM $$"]\nformat = "lines"')
    with pytest.raises(InputFailed) as caught:
        _ids(job)
    assert str(caught.value) == (
        f"{tmp_path / 'job.toml'}:4:1: inputs.command: input command was killed by "
        "signal 15 (SIGTERM): sh -c 'kill -TERM $$' (it printed nothing on stderr)"
    )


def test_command_timeout_kills_its_process_group(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    job = _job(
        tmp_path,
        f'command = ["sh", "-c", "sleep 30 & echo $! > {marker}; wait"]\nformat = "lines"\ntimeout = "500ms"',
    )
    with pytest.raises(
        InputFailed, match=r"job.toml:6:1: inputs.timeout: input command timed out after 0.5s: "
    ):
        _ids(job)
    child = int(marker.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_jsonl_selection_streams_before_the_file_is_complete(tmp_path: Path) -> None:
    """The first unit is known after one line: the rest of the FIFO is not even written yet."""
    fifo = tmp_path / "records.jsonl"
    os.mkfifo(fifo)
    job = _job(tmp_path, 'jsonl = "records.jsonl"')
    release = threading.Event()

    def writer() -> None:
        with fifo.open("w") as stream:
            stream.write('{"id": "first"}\n')
            stream.flush()
            release.wait(10)
            for n in range(100_000):
                stream.write(f'{{"id": "r{n}"}}\n')

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        units = iter(select(job, environ=ENV))
        assert next(units).id == "first"
        assert not release.is_set()
        release.set()
        assert sum(1 for _ in units) == 100_000
    finally:
        release.set()
        thread.join()


# units.where: one filter on records, before grouping (issue 10 defect 7)

ESLINT = Path(__file__).parent / "data" / "eslint"


def _eslint_workspace(tmp_path: Path) -> None:
    """ESLint 9's real ``-f json`` output (tests/data/eslint: captured from bad.js,
    clean.js, tidy.js and warn.js with eslint.config.mjs, paths rewritten to /project),
    with its absolute paths pointing into this workspace, as a fresh run would print."""
    text = (ESLINT / "eslint.json").read_text(encoding="utf-8")
    (tmp_path / "eslint.json").write_text(text.replace("/project", str(tmp_path)))


def test_where_drops_eslint_records_of_clean_files(tmp_path: Path) -> None:
    _eslint_workspace(tmp_path)
    job = _job(
        tmp_path,
        'json = "eslint.json"',
        'where = "record.errorCount + record.warningCount > 0"\n'
        'id = "{{ unit.record.filePath | relpath }}"',
    )
    selection = select(job, environ=ENV)
    assert [(u.id, u.record["errorCount"], u.record["warningCount"]) for u in selection] == [
        ("bad.js", 2, 0),
        ("warn.js", 0, 1),
    ]
    assert (selection.records, selection.dropped, selection.selected) == (4, 2, 2)


def test_where_filters_jsonl_records_before_grouping_and_the_limit(tmp_path: Path) -> None:
    records = [
        {"path": "a.py", "severity": "warning", "line": 1},
        {"path": "b.py", "severity": "error", "line": 2},
        {"path": "a.py", "severity": "warning", "line": 3},
        {"path": "c.py", "severity": "error", "line": 4},
        {"path": "b.py", "severity": "error", "line": 5},
    ]
    (tmp_path / "f.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    job = _job(
        tmp_path,
        'jsonl = "f.jsonl"',
        'where = "record.severity == \'error\'"\ngroupBy = "path"\nlimit = 1',
    )
    selection = select(job, environ=ENV, count_all=True)
    # a.py holds only warnings: no unit at all, and the limit's one unit is b.py.
    assert [(u.id, [i["line"] for i in u.items]) for u in selection] == [("b.py", [2, 5])]
    assert (selection.records, selection.dropped, selection.selected) == (5, 2, 1)
    assert selection.truncated


def test_where_sees_job_and_trigger(tmp_path: Path) -> None:
    job = _job(
        tmp_path,
        'items = ["a", "b"]',
        "where = \"record != 'a' or trigger.vars.mode | default('') == 'all'\"",
    )
    assert [u.id for u in select(job, environ=ENV)] == ["b"]
    every = select(job, environ=ENV, trigger={"name": "t", "vars": {"mode": "all"}})
    assert [u.id for u in every] == ["a", "b"]


def test_where_giving_a_non_boolean_stops_the_selection_located(tmp_path: Path) -> None:
    (tmp_path / "f.jsonl").write_text('{"id": 1, "messages": []}\n')
    job = _job(tmp_path, 'jsonl = "f.jsonl"', 'where = "record.messages"')
    with pytest.raises(JobError) as caught:
        list(select(job, environ=ENV))
    assert str(caught.value) == (
        f"{tmp_path / 'job.toml'}:6:9: units.where: gave the array [] for f.jsonl:1, not true or "
        "false; compare the value, e.g. 'record.errorCount > 0' or "
        "'record.messages | length > 0'"
    )


def test_where_raising_for_one_record_names_the_record(tmp_path: Path) -> None:
    (tmp_path / "f.jsonl").write_text('{"id": 1, "n": 2}\n{"id": 2}\n')
    job = _job(tmp_path, 'jsonl = "f.jsonl"', 'where = "record.n > 1"')
    with pytest.raises(JobError) as caught:
        list(select(job, environ=ENV))
    assert str(caught.value) == (
        f"{tmp_path / 'job.toml'}:6:9: units.where: the value has no attribute 'n' "
        "(evaluating for f.jsonl:2)"
    )


def test_plan_counts_what_where_dropped_and_refuses_an_absolute_stage_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ESLint prints absolute paths: staging them as they are would fail every attempt
    of every unit at run time; plan says so once, with the filter that fixes it."""
    _eslint_workspace(tmp_path)
    job = _job(
        tmp_path,
        'json = "eslint.json"',
        'where = "record.errorCount + record.warningCount > 0"\n'
        'id = "{{ unit.record.filePath | relpath }}"\n'
        'stage = ["{{ unit.record.filePath }}"]\n'
        'collect = ["{{ unit.id }}"]',
    )
    monkeypatch.chdir(tmp_path)
    result = cli("plan", "job.toml")
    refused = (
        "job.toml:8:10: units.stage[0]: "
        f"'{tmp_path}/bad.js' is absolute; stage paths are relative to the workspace: "
        "write \"{{ unit.record.filePath | relpath }}\" (rendered for unit 'bad.js')"
    )
    assert (result.code, result.err) == (2, refused + "\n")
    assert "Units     2 unit(s) from 4 record(s), 2 dropped by units.where\n" in result.out
    assert f"First unit's files would be refused by every attempt:\n  {refused}\n" in result.out
    fixed = job.file.read_text().replace('filePath }}"]', 'filePath | relpath }}"]')
    job.file.write_text(fixed)
    result = cli("plan", "job.toml")
    assert (result.code, result.err) == (0, "")
    assert "  stage    bad.js\n" in result.out


@pytest.mark.slow
def test_where_failing_mid_backlog_stops_the_run_resumably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record the expression cannot read (the 230th lacks the field) stops the run as
    any selection error does; with the data fixed the same run continues."""
    monkeypatch.chdir(tmp_path)
    records: list[dict[str, Any]] = [{"id": f"u{n}", "errors": n % 2} for n in range(1, 251)]
    del records[229]["errors"]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "done.txt"
    write_job(
        tmp_path,
        f"""
        version = 1
        name = "filtered"
        [inputs]
        jsonl = "data.jsonl"
        [units]
        where = "record.errors > 0"
        [task]
        command = ["sh", "-c", "echo $FANOUT_UNIT_ID >> {out}"]
        [runtime]
        sandbox = "none"
        """,
    )
    first = cli("run", "job.toml")
    assert first.code == 2
    with sqlite3.connect(tmp_path / ".fanout" / "journal.sqlite") as conn:
        ((run_id, state),) = conn.execute("SELECT id, state FROM runs").fetchall()
    assert state == "stopped"
    assert first.err.rstrip("\n").split("\n")[-2:] == [
        "job.toml:7:9: units.where: the value has no attribute 'errors' "
        "(evaluating for data.jsonl:230)",
        f"run {run_id} stopped; `fanout run job.toml` continues it",
    ]
    records[229]["errors"] = 1
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    fixed = cli("run", "job.toml")
    assert fixed.code == 0, fixed.err
    done = out.read_text().split()
    assert sorted(done) == sorted(r["id"] for r in records if r["errors"] > 0)
    assert len(done) == 126


_TOOLS = Path(sys.executable).parent


def _linted_workspace(directory: Path, command: str, fmt: str) -> None:
    """Three files with unused imports (not a git repository: an unpacked sdist), and a
    job that lints the whole workspace and touches each file without fixing it, so the
    copies a run collects keep the findings."""
    for name in ("a.py", "b.py", "c.py"):
        (directory / "src" / name).parent.mkdir(exist_ok=True)
        (directory / "src" / name).write_text("import os\nimport sys\n")
    write_job(
        directory,
        f"""
        version = 1
        name = "sweep"
        [inputs]
        command = {command}
        format = "{fmt}"
        [units]
        groupBy = "{"filename" if fmt == "json" else "path"}"
        id = "{{{{ unit.group | relpath }}}}"
        stage = ["{{{{ unit.id }}}}"]
        collect = ["{{{{ unit.id }}}}"]
        [task]
        command = ["sh", "-c", "echo '# seen' >> \\"$1\\"", "sh", "{{{{ unit.id }}}}"]
        [runtime]
        sandbox = "none"
        """,
    )


def test_ruff_over_the_workspace_skips_the_copies_a_run_collected(chdir_tmp: Path) -> None:
    """The state directory is born with ignore files: ruff outside a git repository reads
    ``.ignore`` (and ``.gitignore`` inside one, as git does), so the next run selects the
    workspace's three files and not the three copies under ``.fanout/runs/*/units/``."""
    ruff = [str(_TOOLS / "ruff"), "check", "--isolated", "--no-cache", "--select=F401"]
    _linted_workspace(chdir_tmp, json.dumps([*ruff, "--output-format=json", "."]), "json")
    first = cli("run", "job.toml")
    assert first.code == 0, first.err
    assert len(list(chdir_tmp.glob(".fanout/runs/*/units/*/src/*.py"))) == 3
    for name in (".gitignore", ".ignore"):
        assert (chdir_tmp / ".fanout" / name).read_text() == (
            "# Created by fanout: its state directory (journal, logs, copies of files).\n*\n"
        )
    listed = subprocess.run([*ruff, "--output-format=concise", "."], capture_output=True, text=True)
    assert sorted({line.split(":")[0] for line in listed.stdout.splitlines() if ":" in line}) == [
        "src/a.py",
        "src/b.py",
        "src/c.py",
    ]
    subprocess.run(["git", "init", "-q"], check=True)
    (chdir_tmp / ".fanout" / ".ignore").unlink()  # git's own file alone, in a repository
    in_git = subprocess.run([*ruff, "--output-format=concise", "."], capture_output=True, text=True)
    assert in_git.stdout == listed.stdout
    again = cli("run", "job.toml", "--no-reuse")
    assert again.code == 0, again.err
    assert "round 1: 3 unit(s) from 6 record(s)\n" in again.err
    assert "dropped" not in again.err
    assert "finished: 3 succeeded\n" in again.err


def test_a_unit_inside_a_state_directory_is_dropped_with_one_warning(chdir_tmp: Path) -> None:
    """flake8 reads no ignore file and lists the copies of the first run too: those
    units are dropped, said once with how many and where, and the run succeeds."""
    flake8 = [str(_TOOLS / "flake8"), "--isolated", "--select=F401", str(chdir_tmp)]
    _linted_workspace(chdir_tmp, json.dumps(flake8), "lint")
    assert cli("run", "job.toml").code == 0
    plan = cli("plan", "job.toml")
    assert plan.code == 0, plan.err
    assert (
        "Units     3 unit(s) from 12 record(s), dropped 3 unit(s) inside '.fanout', "
        "a fanout state directory, grouped by path\n"
    ) in plan.out
    again = cli("run", "job.toml", "--no-reuse")
    assert again.code == 0, again.err
    warning = (
        "job.toml:5:1: inputs.command: dropped 3 unit(s) inside '.fanout', a fanout state "
        "directory: what they stage is fanout's own (copies and logs of earlier runs), "
        "which no worker sees"
    )
    assert [line[9:] for line in again.err.splitlines() if "dropped" in line] == [warning]
    assert "FAILED" not in again.err
    assert "finished: 3 succeeded\n" in again.err


def test_units_dropped_inside_several_state_directories_are_counted_by_each() -> None:
    counts = {".fanout": 43, "jobs/state": 2}
    assert state_dir_drops(counts) == (
        "45 unit(s): 43 inside '.fanout' and 2 inside 'jobs/state', fanout state directories"
    )
    assert state_dir_drops({".fanout": 1, "a": 2, "b": 3}) == (
        "6 unit(s): 1 inside '.fanout', 2 inside 'a' and 3 inside 'b', fanout state directories"
    )
