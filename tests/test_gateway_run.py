"""Whole runs through the API gateway: ``fanout run`` of a job with ``[[apis]]``, its
workers real programs in real sandboxes (bwrap where the machine has it), the upstream
the mock API of tests/mockapi.py on loopback with a limit of its own.

What the issue's "done when" asks, each against the upstream's own record: it never
receives more than its limit in a window, no 429 reaches a worker, each unit's reported
requests and tokens add up to what the upstream answered, the upstream sees only the
real key and nothing fanout or a worker wrote holds it, a token used after its attempt
ended gets 401, a budget stops new starts and the run resumes when given more.  The real
Claude Code CLI runs the same locally and over SSH in test_gateway_claude.py."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from fanout.isolation import hidden

from helpers import cli, places, write_job
from mockapi import MockApi, Usage

pytestmark = pytest.mark.slow

KEY = "sk-ant-real-4d9f2c7e1b8a6f3d0c5e9a2b"
# A worker making N requests (argv[1]) to the gateway as an Anthropic SDK would, then
# writing what it was given into its work directory: its environment and its argv.
WORKER = r"""
import json, os, sys, urllib.request
base, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
for _ in range(int(sys.argv[1])):
    body = json.dumps({"model": "claude-test-1", "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(base + "/v1/messages", data=body, headers={
        "x-api-key": token, "content-type": "application/json",
        "anthropic-version": "2023-06-01"})
    with urllib.request.urlopen(request) as answer:
        json.load(answer)
with open("seen.txt", "w") as out:
    out.write(json.dumps(dict(os.environ)) + "\n" + open("/proc/self/cmdline").read())
"""


def _job(
    directory: Path,
    units: int,
    *,
    requests: int,
    per: str,
    api_more: str = "",
    runtime_more: str = "",
    command: str | None = None,
    upstream: str,
) -> Path:
    items = ", ".join(f'"u{n}"' for n in range(units))
    command = command or json.dumps(["python3", "-c", WORKER, "2"])
    return write_job(
        directory,
        f"""
        version = 1
        name = "through-gateway"
        [inputs]
        items = [{items}]
        [units]
        collect = ["seen.txt"]
        [task]
        command = {command}
        timeout = "60s"
        [runtime]
        maxConcurrentTasks = 4
        network = true
        {runtime_more}
        [[apis]]
        name = "anthropic"
        upstream = "{upstream}"
        style = "anthropic"
        keySecret = "FANOUT_TEST_ANTHROPIC_KEY"
        requests = {{ limit = {requests}, per = "{per}" }}
        {api_more}
        """,
    )


def _report(directory: Path) -> dict[str, Any]:
    (path,) = (directory / ".fanout" / "runs").glob("*/report.json")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _files_holding(root: Path, needle: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes():
            found.append(str(path.relative_to(root)))
    return found


@pytest.fixture
def keyed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real key, exported in the coordinator's environment as a user does."""
    monkeypatch.setenv("FANOUT_TEST_ANTHROPIC_KEY", KEY)


def _on_a_host(ssh_pool: Any, directory: Path) -> tuple[str, Path]:
    """The runtime line that puts a job on one real sshd host, and the host's disk."""
    ssh_pool.inventory(directory, ssh_pool.add("h1"))
    return 'hosts = "hosts.toml"', ssh_pool.base


@pytest.mark.parametrize("where", places("local", "ssh"))
def test_a_paced_run_stays_under_the_upstreams_limit_and_reports_its_tally(
    mock_api: MockApi, tmp_path: Path, keyed: None, where: str, request: pytest.FixtureRequest
) -> None:
    # 8 units of 2 requests under 4 requests a second: the gateway paces the requests,
    # not the tasks.  The mock's own window is 0.9 s where the gateway's is 1 s: the
    # tenth covers the time from admission to arrival on a loaded machine (the gateway
    # allows 100 ms for it), so a 429 here is the gateway's fault, not the scheduler's.
    mock_api.configure(limit=4, window=0.9, require_key=KEY, usage=Usage(input_tokens=30))
    runtime, host_disk = "", None
    if where == "ssh":
        runtime, host_disk = _on_a_host(request.getfixturevalue("ssh_pool"), tmp_path)
    job = _job(tmp_path, 8, requests=4, per="1s", upstream=mock_api.url, runtime_more=runtime)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    if host_disk is not None:  # the key is not on the host's disk either
        assert _files_holding(host_disk, KEY) == []
        assert sorted((host_disk / "sandboxes").iterdir()) == []
    posts = mock_api.posts()
    assert [p.status for p in posts] == [200] * 16  # no 429 was ever answered
    assert mock_api.max_in_window(0.9) <= 4
    assert {p.key for p in posts} == {KEY}
    # The run's gateway was a member of the pacing ledger beside the state-dir
    # registry, and left it: its file stays, saying so and what the upstream still
    # counts of it (``gateway.shares``: a job starting soon on the key waits for them),
    # without the key.
    shares = hidden.registry(os.environ).parent / "shares"
    assert stat.S_IMODE(shares.stat().st_mode) == 0o700
    members = [path for path in shares.rglob("*") if path.is_file()]
    assert [json.loads(path.read_text())["left"] for path in members] == [True]
    assert [stat.S_IMODE(path.stat().st_mode) for path in members] == [0o600]
    assert _files_holding(shares, KEY) == []
    report = _report(tmp_path)
    assert report["totals"] == {"succeeded": 8}
    assert [h["host"] for h in report["hosts"]] == (["h1"] if where == "ssh" else [])
    (api,) = report["apis"]
    tally = mock_api.tally()
    assert (api["requests"], api["inputTokens"], api["outputTokens"]) == (
        16,
        tally.input_tokens,
        tally.output_tokens,
    )
    assert api["throttles"] == 0
    assert [u["usage"][0]["requests"] for u in report["units"]] == [2] * 8
    # What a reviewer reads: the API's line, and each unit's share in the units table.
    (markdown,) = (tmp_path / ".fanout" / "runs").glob("*/report.md")
    lines = markdown.read_text().splitlines()
    at = lines.index("### API usage")
    assert lines[at + 2 : at + 5] == [
        "| api | requests | input tokens | output tokens | cache read / write | cost"
        " | queued | throttles absorbed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| anthropic | 16 | 480 | 80 | 0 / 0 | $0.0000 | {lines[at + 4].split(' | ')[6]} | 0 |",
    ]
    assert [line.split(" | ")[-3:] for line in lines if line.startswith("| <code>u")] == [
        ["2", "60 / 10", "$0.0000 |"]
    ] * 8
    assert [u["usage"][0]["inputTokens"] for u in report["units"]] == [60] * 8
    # The key: the upstream saw it, nothing a worker got or fanout wrote holds it.
    runs = tmp_path / ".fanout"
    assert _files_holding(tmp_path, KEY) == []
    for unit in (runs / "runs").glob("*/units/*/seen.txt"):
        environment, cmdline = unit.read_text().split("\n", 1)
        given = json.loads(environment)
        assert KEY not in environment
        assert KEY not in cmdline
        assert given["ANTHROPIC_BASE_URL"].endswith("/anthropic")
        assert len(given["ANTHROPIC_API_KEY"]) >= 40  # a token, not the key
    assert KEY not in ran.out + ran.err


def test_a_token_used_after_its_attempt_ended_gets_401(
    mock_api: MockApi, tmp_path: Path, keyed: None
) -> None:
    # One at a time, without a sandbox: unit u0 leaves its token where u1 finds it.
    shared = tmp_path / "shared"
    shared.mkdir()
    worker = (
        "import os, urllib.request, urllib.error, pathlib\n"
        f"shared = pathlib.Path({str(shared)!r})\n"
        "unit, token = os.environ['FANOUT_UNIT_ID'], os.environ['ANTHROPIC_API_KEY']\n"
        "if unit == 'u0':\n"
        "    (shared / 'token').write_text(token)\n"
        "else:\n"
        "    old = (shared / 'token').read_text()\n"
        "    request = urllib.request.Request(os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages',"
        " data=b'{}', headers={'x-api-key': old, 'content-type': 'application/json'})\n"
        "    try:\n"
        "        urllib.request.urlopen(request)\n"
        "    except urllib.error.HTTPError as error:\n"
        "        (shared / 'answer').write_text(f'{error.code} ' + error.read().decode())\n"
        "open('seen.txt', 'w').write('ok')\n"
    )
    job = _job(
        tmp_path,
        2,
        requests=100,
        per="1m",
        upstream=mock_api.url,
        command=json.dumps(["python3", "-c", worker]),
        # The point: under plain directories, what one unit leaves another can read.
        runtime_more='sandbox = "none"\nunsandboxedSecrets = true\nmaxConcurrentTasks = 1',
    )
    text = job.read_text().replace("maxConcurrentTasks = 4\n", "")
    job.write_text(text)
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    status, body = (shared / "answer").read_text().split(" ", 1)
    assert status == "401"
    assert json.loads(body)["error"]["type"] == "authentication_error"
    assert mock_api.posts() == []  # the gateway refused it; the upstream never saw it


def test_a_budget_stops_new_starts_and_the_run_resumes_when_given_more(
    mock_api: MockApi, tmp_path: Path, keyed: None
) -> None:
    # Every request costs (12 + 5) tokens at $1,000 per million: $0.017.  A unit makes
    # two ($0.034), so a $0.05 budget is spent by the first request of the second unit.
    mock_api.configure(usage=Usage(input_tokens=12, output_tokens=5))
    prices = 'prices = { "*" = { input = 1000.0, output = 1000.0 } }'
    job = _job(
        tmp_path,
        4,
        requests=100,
        per="1m",
        upstream=mock_api.url,
        api_more=prices + "\nbudget = { usd = 0.05 }",
        runtime_more='sandbox = "none"\nunsandboxedSecrets = true\nmaxConcurrentTasks = 1',
    )
    job.write_text(job.read_text().replace("maxConcurrentTasks = 4\n", ""))
    ran = cli("run", str(job))
    assert ran.code == 7, ran.out + ran.err
    assert ran.err.splitlines()[-2:] == [
        "api anthropic: the run's budget of $0.0500 is spent ($0.0510 used); raise [[apis]]"
        " budget and `fanout run` continues",
        f"run {_report(tmp_path)['run']} stopped; `fanout run {job}` continues it",
    ]
    assert len(mock_api.posts()) == 3  # u0's two, u1's first; its second was refused
    report = _report(tmp_path)
    assert report["state"] == "stopped"
    assert report["totals"] == {"interrupted": 1, "pending": 2, "succeeded": 1}
    # More money: the same run continues, counting what it spent before.
    job.write_text(job.read_text().replace("usd = 0.05", "usd = 1.0"))
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    report = _report(tmp_path)
    assert report["totals"] == {"succeeded": 4}
    (api,) = report["apis"]
    assert api["requests"] == len(mock_api.posts()) == 9
    assert api["costUsd"] == pytest.approx(9 * 0.017)


def test_an_openai_sdk_worker_streams_through_the_gateway(
    mock_api: MockApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, repo: Path
) -> None:
    monkeypatch.setenv("FANOUT_TEST_OPENAI_KEY", KEY)
    mock_api.configure(require_key=KEY, usage=Usage(input_tokens=20, output_tokens=7))
    worker = repo / "tests" / "workers" / "openai_worker.py"
    job = write_job(
        tmp_path,
        f"""
        version = 1
        name = "openai-through-gateway"
        [inputs]
        items = ["a", "b", "c"]
        [units]
        collect = ["answer.txt"]
        [task]
        prompt = "Say {{{{ unit.id }}}}."
        command = [{json.dumps(sys.executable)}, "{worker}"]
        env = {{ OPENAI_MAX_RETRIES = "0" }}
        [runtime]
        network = true
        # The SDK lives in this checkout's venv, which bwrap would hide when the checkout
        # is under /tmp (as CI's may be): the point here is the SDK's stream, not bwrap.
        sandbox = "none"
        unsandboxedSecrets = true
        [[apis]]
        name = "openai"
        upstream = "{mock_api.url}/v1"
        style = "openai"
        keySecret = "FANOUT_TEST_OPENAI_KEY"
        requests = {{ limit = 2, per = "1s" }}
        """,
    )
    ran = cli("run", str(job))
    assert ran.code == 0, ran.out + ran.err
    posts = mock_api.posts()
    assert [p.status for p in posts] == [200] * 3
    # The worker asked for no usage chunk: the gateway asked for it, and read it.
    assert all(p.json()["stream_options"] == {"include_usage": True} for p in posts)
    (api,) = _report(tmp_path)["apis"]
    assert (api["requests"], api["inputTokens"], api["outputTokens"]) == (3, 60, 21)
