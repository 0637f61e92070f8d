"""Loading a job file into frozen values: defaults, hosts files, and the resolved job."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
import tomli_w

from fanout import plan, spec
from fanout.backlog import units
from fanout.errors import InputFailed, JobError
from fanout.spec.schema import job_schema

from helpers import MINIMAL, write_job


def test_defaults_of_a_minimal_job(tmp_path: Path) -> None:
    job = spec.load(write_job(tmp_path, MINIMAL))
    assert job.inputs.source == "items"
    assert job.task.timeout == 600
    assert job.runtime.max_concurrent_tasks == 4
    assert job.runtime.workspace == tmp_path.resolve()
    assert job.runtime.state_dir == tmp_path.resolve() / ".fanout"
    assert [r.name for r in job.retry.ladder] == ["default"]
    assert job.retry.backoff == spec.Backoff(initial=10, max=600, jitter="full")
    assert job.rounds.max == 1
    assert job.collect.apply is False


def test_spec_is_deeply_frozen(tmp_path: Path) -> None:
    job = spec.load(
        write_job(
            tmp_path,
            MINIMAL + 'env = { A = "1" }\n[[retry.ladder]]\nname = "r"\nvars = { m = "x" }\n',
        )
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.name = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.task.env["A"] = job.task.env["A"]  # type: ignore[index]
    with pytest.raises(TypeError):
        job.retry.ladder[0].vars["m"] = "y"  # type: ignore[index]


def test_hosts_file_is_loaded_and_checked_with_its_own_positions(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, MINIMAL + '[runtime]\nhosts = "hosts.toml"\n')
    (tmp_path / "hosts.toml").write_text(
        '[[hosts]]\naddress = "w1"\nslots = 8\n[[hosts]]\naddress = "w2"\nport = 2222\nlabels = ["gpu"]\n'
    )
    job = spec.load(job_file)
    assert [(h.name, h.slots, h.port, h.labels) for h in job.runtime.hosts] == [
        ("w1", 8, None, ()),
        ("w2", 4, 2222, ("gpu",)),
    ]
    (tmp_path / "hosts.toml").write_text('[[hosts]]\naddress = "w1"\nslotz = 8\n')
    with pytest.raises(JobError) as caught:
        spec.load(job_file)
    assert (
        str(caught.value)
        == f"{tmp_path / 'hosts.toml'}:3:1: hosts[0].slotz: unknown key (did you mean 'slots'?)"
    )


def test_missing_hosts_file_is_an_error_only_when_hosts_are_needed(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, MINIMAL + '[runtime]\nhosts = "hosts.toml"\n')
    assert spec.load(job_file, require_hosts=False).runtime.hosts == ()
    with pytest.raises(JobError, match=r"runtime\.hosts: hosts file .* does not exist"):
        spec.load(job_file)


def test_a_hosts_file_name_the_file_system_refuses_is_a_job_error(tmp_path: Path) -> None:
    # Found by test_fuzz: is_file() raised "File name too long" out of spec.load.
    job_file = write_job(tmp_path, MINIMAL + f'[runtime]\nhosts = "{"h" * 300}.toml"\n')
    assert spec.load(job_file, require_hosts=False).runtime.hosts == ()
    with pytest.raises(JobError) as caught:
        spec.load(job_file)
    assert str(caught.value).endswith(".toml' cannot be read: file name too long")


def test_hosts_option_replaces_the_job_hosts(tmp_path: Path) -> None:
    job_file = write_job(tmp_path, MINIMAL + '[[runtime.hosts]]\naddress = "inline"\n')
    other = tmp_path / "staging.toml"
    other.write_text('[[hosts]]\naddress = "staging-1"\n')
    assert [h.address for h in spec.load(job_file, hosts_file=other).runtime.hosts] == ["staging-1"]


def test_resolved_document_is_a_valid_job_that_loads_to_the_same_spec(
    repo: Path, tmp_path: Path
) -> None:
    original = spec.load(repo / "fanout.toml.example")
    document = plan.to_document(original)
    import jsonschema

    jsonschema.validate(document, job_schema())
    copy = tmp_path / "resolved.toml"
    copy.write_text(tomli_w.dumps(document))
    again = spec.load(copy)
    assert plan.to_document(again) == document
    assert tomllib.loads(copy.read_text())["runtime"]["maxConcurrentTasks"] == 4


def test_unreadable_job_file(tmp_path: Path) -> None:
    with pytest.raises(JobError) as caught:
        spec.load(tmp_path / "missing.toml")
    assert (
        str(caught.value)
        == f"{tmp_path / 'missing.toml'}:1:1: cannot read the job file: No such file or directory"
    )


def test_a_byte_order_mark_is_accepted_and_lines_stay_true(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text("\ufeff" + MINIMAL, encoding="utf-8")
    assert spec.load(path).name == "test-job"
    path.write_text("\ufeff" + MINIMAL.replace("[task]", "[task]\ntimeut = 1"), encoding="utf-8")
    with pytest.raises(JobError) as caught:
        spec.load(path)
    assert str(caught.value) == f"{path}:6:1: task.timeut: unknown key (did you mean 'timeout'?)"


def test_a_device_or_a_huge_file_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    with pytest.raises(JobError) as caught:
        spec.load("/dev/zero")
    assert str(caught.value) == "/dev/zero:1:1: is a device (/dev/zero), not a job file"
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as stream:
        stream.truncate(spec.MAX_FILE_BYTES + 1)
    with pytest.raises(JobError) as caught:
        spec.load(huge)
    assert str(caught.value) == f"{huge}:1:1: the job file is larger than 16 MiB"


def test_bytes_that_are_not_utf8_are_located(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_bytes(MINIMAL.replace("test-job", "t\xe9st").encode("latin-1"))
    with pytest.raises(JobError) as caught:
        spec.load(path)
    assert str(caught.value) == (
        f"{path}:2:10: not UTF-8 text (invalid continuation byte at byte 21)"
    )


def test_sizes_beyond_a_petabyte_are_refused(tmp_path: Path) -> None:
    path = write_job(tmp_path, MINIMAL + '[runtime]\nlogLimit = "' + "9" * 30 + 'GiB"\n')
    with pytest.raises(JobError) as caught:
        spec.load(path)
    assert str(caught.value) == (
        f"{path}:8:12: runtime.logLimit: '{'9' * 30}GiB' is larger than 1PiB, the largest size "
        "fanout accepts"
    )


def test_the_resolved_job_keeps_numbers_in_vars_as_numbers(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        MINIMAL + '[[retry.ladder]]\nname = "a"\nvars = { temperature = 0.7, n = 2 }\n',
    )
    resolved = plan.to_document(spec.load(path))
    assert resolved["retry"]["ladder"][0]["vars"] == {"temperature": 0.7, "n": 2}


# A job whose text moves every line down when it is edited: the loaded spec must keep
# pointing into the text it was built from.
DUPLICATE_IDS = """\
version = 1
name = "sweep"
[inputs]
items = ["acme", "globex", "acme"]
[task]
command = ["true"]
"""


@pytest.mark.parametrize("change", ["edited", "deleted"])
def test_a_runtime_message_is_located_in_the_text_that_was_loaded(
    tmp_path: Path, change: str
) -> None:
    path = write_job(tmp_path, DUPLICATE_IDS)
    job = spec.load(path)
    if change == "edited":
        path.write_text("# moved\n" * 5 + DUPLICATE_IDS.replace("items = ", "items  =  "))
    else:
        path.unlink()
    with pytest.raises(JobError) as caught:
        list(units.select(job, environ={}))
    assert str(caught.value) == (
        f"{path}:4:28: inputs.items[2]: duplicate unit id 'acme' "
        "(from inputs.items[0] and inputs.items[2])"
    )


@pytest.mark.parametrize("change", ["edited", "deleted"])
def test_a_failed_input_command_is_located_in_the_text_that_was_loaded(
    tmp_path: Path, change: str
) -> None:
    text = MINIMAL.replace(
        'items = ["a", "b"]', 'command = ["sh", "-c", "exit 3"]\nformat = "lines"'
    )
    path = write_job(tmp_path, text)
    job = spec.load(path)
    if change == "edited":
        path.write_text("\n\n" + text)
    else:
        path.unlink()
    with pytest.raises(InputFailed) as caught:
        list(units.select(job, environ={}))
    assert str(caught.value).startswith(
        f"{path}:4:1: inputs.command: input command exited with status 3: sh -c 'exit 3'"
    )


def test_a_skipped_input_file_is_located_in_the_text_that_was_loaded(tmp_path: Path) -> None:
    path = write_job(tmp_path, MINIMAL.replace('items = ["a", "b"]', 'files = ["*.txt"]'))
    (tmp_path / "bad\nname.txt").write_text("x")
    job = spec.load(path)
    path.unlink()
    selection = units.select(job, environ={})
    assert list(selection) == []
    assert selection.warnings == [
        f"{path}:4:1: inputs.files: skipped 'bad\\nname.txt': "
        "its name holds a line break or another control character"
    ]


def test_throttle_patterns_are_compiled_once_when_the_job_is_loaded(tmp_path: Path) -> None:
    path = write_job(tmp_path, MINIMAL + 'throttlePatterns = ["rate.limit", "(?i)slow down"]\n')
    patterns = spec.load(path).task.throttle_patterns
    assert patterns == (re.compile("rate.limit"), re.compile("(?i)slow down"))
    assert patterns[1].search("SLOW DOWN please")
    assert plan.to_document(spec.load(path))["task"]["throttlePatterns"] == [
        "rate.limit",
        "(?i)slow down",
    ]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("CRM_API_TOKEN", True),
        ("GITHUB_TOKEN", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("APIKEY", True),
        ("DB_PASSWORD", True),
        ("GOOGLE_CREDENTIALS", True),
        # Words inside words are not the words: what agent CLIs read as plain settings.
        ("CLAUDE_CODE_MAX_OUTPUT_TOKENS", False),
        ("MAX_THINKING_TOKENS", False),
        ("SECRETARY_NAME", False),
    ],
)
def test_an_env_value_is_refused_only_under_a_name_whose_words_say_secret(
    tmp_path: Path, name: str, secret: bool
) -> None:
    job_file = write_job(tmp_path, MINIMAL + f'env = {{ {name} = "4096" }}\n')
    if not secret:
        assert dict(spec.load(job_file).task.env).keys() == {name}
        return
    with pytest.raises(JobError) as caught:
        spec.load(job_file)
    assert f"task.env.{name}: {name!r} looks like a secret" in str(caught.value)


def test_a_limit_name_declared_twice_is_located_at_the_second(tmp_path: Path) -> None:
    limits = '[[limits]]\nname = "api"\nrequests = 5\nper = "1m"\n'
    job_file = write_job(tmp_path, MINIMAL + limits + limits)
    with pytest.raises(JobError) as caught:
        spec.load(job_file)
    assert str(caught.value) == (
        f"{job_file}:12:8: limits[1].name: limit 'api' is already declared by limits[0]"
    )
