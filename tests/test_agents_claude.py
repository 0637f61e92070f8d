"""fanout.agents.claude against golden files: what the real Claude Code CLI (2.1.197)
printed, run in bwrap against tests/mockapi.py with one scripted fault per case
(tests/data/agents/claude/<case>.out, byte-exact; <case>.json says how it was captured,
the exit code, the `now` it is read at and the expected Reading, checked by hand).

A live test captures two cases again from the installed CLI, so the goldens cannot drift
from the binary unnoticed.  To capture them all again (then review every .json diff):

    PYTHONPATH=tests .venv/bin/python tests/test_agents_claude.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fanout import agents
from fanout.agents import Kind, Reading

from helpers import run_agent
from mockapi import Fault, MockApi, Usage, rate_limit_words

GOLDEN = Path(__file__).parent / "data" / "agents" / "claude"
NOW = "2026-12-01T16:00:00+00:00"
TOKEN = "tok-agents-claude-golden"
PROMPT = "Write done to out.txt."
USAGE = Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4, cache_write_tokens=2)
# What every capture has in its environment beyond PATH, HOME and the mock's URL and token.
BASE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
}


@dataclass(frozen=True, kw_only=True)
class Capture:
    """How one golden is made: the mock's fault (answering `times` requests), the CLI's
    extra arguments and environment."""

    fault: Fault | None = None
    times: int = 1
    message: str | None = None
    args: tuple[str, ...] = ("--allowedTools", "Bash")
    env: dict[str, str] = field(default_factory=lambda: {"CLAUDE_CODE_MAX_RETRIES": "0"})


CAPTURES = {
    "success": Capture(),
    # Without a permission flag -p denies the Bash call and still exits 0.
    "permission_denied": Capture(args=()),
    "rate_limit_429": Capture(fault=Fault.RATE_LIMIT),
    # The API's own words state the limit's window, which the CLI prints.
    "rate_limit_stated_429": Capture(fault=Fault.RATE_LIMIT, message=rate_limit_words(50, 60)),
    "overloaded_529": Capture(fault=Fault.OVERLOADED),
    # A stream that breaks mid-way is retried whatever CLAUDE_CODE_MAX_RETRIES says: it
    # gives up after four.
    "stream_broken": Capture(fault=Fault.STREAM_ERROR, times=10),
    "credit_400": Capture(fault=Fault.CREDIT),
    "spend_limit_429": Capture(fault=Fault.SPEND_LIMIT),
    "api_usage_limit_400": Capture(fault=Fault.USAGE_LIMIT),
    "usage_window": Capture(fault=Fault.USAGE_WINDOW),
    "usage_window_epoch": Capture(
        fault=Fault.USAGE_WINDOW, message="Claude AI usage limit reached|1796140800"
    ),
    "unauthorized_401": Capture(fault=Fault.UNAUTHORIZED),
    "max_turns": Capture(args=("--allowedTools", "Bash", "--max-turns", "1")),
    "max_budget": Capture(args=("--allowedTools", "Bash", "--max-budget-usd", "0.000001")),
}


def capture(claude: Path, case: Capture, work: Path) -> tuple[int, str]:
    """Run `claude -p` once, as tests/test_claude_cli.py does, against a fresh mock
    scripted for `case`; returns the exit code and stdout followed by stderr."""
    with MockApi().in_thread() as api:
        api.configure(tool=True, usage=USAGE)
        if case.fault is not None:
            api.script(case.fault, case.times, message=case.message)
        base = work / "sandbox"
        (base / "home").mkdir(parents=True)
        environment = {
            "HOME": str(base / "home"),
            "ANTHROPIC_BASE_URL": api.url,
            "ANTHROPIC_API_KEY": TOKEN,
            **BASE_ENV,
            **case.env,
        }
        args = ["-p", "--output-format", "json", *case.args]
        done = run_agent(claude, args, base, environment, stdin=PROMPT)
    return done.returncode, done.stdout + done.stderr


def _how(case: Capture) -> dict[str, Any]:
    return {
        "cli": "@anthropic-ai/claude-code 2.1.197",
        "argv": ["claude", "-p", "--output-format", "json", *case.args],
        "stdin": PROMPT,
        "env": {"ANTHROPIC_BASE_URL": "<the mock's URL>", **BASE_ENV, **case.env},
        "mock": {
            "tool": True,
            "usage": asdict(USAGE),
            "fault": case.fault.name if case.fault else None,
            "times": case.times if case.fault else 0,
            "message": case.message,
        },
        "sandbox": "bwrap with network (tests/test_claude_cli.py's _claude)",
    }


def _expected(spec: dict[str, Any]) -> Reading:
    fields = dict(spec["reading"])
    return Reading(**{**fields, "kind": Kind(fields["kind"])})


def _golden_cases() -> list[str]:
    return sorted(p.stem for p in GOLDEN.glob("*.json"))


def test_every_capture_has_its_golden_and_every_golden_says_how_it_was_made() -> None:
    specs = {name: json.loads((GOLDEN / f"{name}.json").read_text()) for name in _golden_cases()}
    captured = {name for name, spec in specs.items() if spec["captured"] is not None}
    assert sorted(captured) == sorted(CAPTURES)
    for name in captured:
        assert specs[name]["captured"] == _how(CAPTURES[name]), name
    for name in set(specs) - captured:
        assert specs[name]["source"], name  # a documented string says where it is documented


@pytest.mark.parametrize("case", _golden_cases())
def test_the_golden_reads_as_its_expected_reading(case: str) -> None:
    spec = json.loads((GOLDEN / f"{case}.json").read_text())
    output = (GOLDEN / f"{case}.out").read_bytes().decode()
    reading = agents.read(
        "claude",
        exit_code=spec["exit_code"],
        output=output,
        now=datetime.fromisoformat(spec["now"]),
    )
    assert reading == _expected(spec)


def test_exit_0_with_is_error_is_a_false_success() -> None:
    # Not seen from 2.1.197 (every is_error came with exit 1), read so should a version
    # print it: an error no other class claims, under an exit code that says success.
    line = json.dumps(
        {"type": "result", "subtype": "success", "is_error": True, "result": "Something broke"}
    )
    reading = agents.read(
        "claude", exit_code=0, output=line + "\n", now=datetime.now().astimezone()
    )
    assert reading == Reading(kind=Kind.FALSE_SUCCESS, detail="Something broke")


def test_stream_json_is_read_from_its_last_result_event() -> None:
    success = (GOLDEN / "success.out").read_text()
    # Events after the result (a hook's, a status line) and lines that are not JSON.
    stream = (
        '{"type":"system","subtype":"init"}\n'
        + success
        + '\n{"type":"system","subtype":"status"}\nnot json\n'
    )
    assert agents.read(
        "claude", exit_code=0, output=stream, now=datetime.fromisoformat(NOW)
    ) == _expected(json.loads((GOLDEN / "success.json").read_text()))


def test_the_presets_stream_json_reads_as_its_json_does() -> None:
    # The real CLI's stream-json of the same tool loop (tests/transcriptrun.py): the
    # preset's format, whose last event is the json format's result.
    stream = (GOLDEN.parent.parent / "transcripts" / "claude-stream-json.out").read_text()
    assert agents.read(
        "claude", exit_code=0, output=stream, now=datetime.fromisoformat(NOW)
    ) == _expected(json.loads((GOLDEN / "success.json").read_text()))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["success", "usage_window"])
def test_the_installed_cli_still_prints_what_the_golden_holds(
    claude_cli: Path, tmp_path: Path, case: str
) -> None:
    spec = json.loads((GOLDEN / f"{case}.json").read_text())
    exit_code, output = capture(claude_cli, CAPTURES[case], tmp_path)
    golden = json.loads((GOLDEN / f"{case}.out").read_text())
    live = json.loads(output)
    # The same fields (ids and durations differ run to run), the same Reading.
    assert (exit_code, sorted(live)) == (spec["exit_code"], sorted(golden))
    reading = agents.read(
        "claude", exit_code=exit_code, output=output, now=datetime.fromisoformat(spec["now"])
    )
    assert reading == _expected(spec)


def main() -> None:
    """Capture every golden again; a new case's expected Reading is what the classifier
    reads today, to be checked by hand before it is committed."""
    claude = Path(os.environ.get("FANOUT_TEST_TOOLS", "/opt/fanout-test-tools"))
    claude = claude / "node_modules" / ".bin" / "claude"
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, case in CAPTURES.items():
        work = Path(tempfile.mkdtemp(prefix=f"golden-{name}-"))
        try:
            exit_code, output = capture(claude, case, work)
        finally:
            shutil.rmtree(work)
        (GOLDEN / f"{name}.out").write_bytes(output.encode())
        spec_path = GOLDEN / f"{name}.json"
        old = json.loads(spec_path.read_text()) if spec_path.exists() else {}
        reading = agents.read(
            "claude", exit_code=exit_code, output=output, now=datetime.fromisoformat(NOW)
        )
        fresh = {k: v for k, v in asdict(reading).items() if v is not None}
        spec = {
            "captured": _how(case),
            "source": None,
            "exit_code": exit_code,
            "now": old.get("now", NOW),
            "reading": old.get("reading", {**fresh, "kind": str(reading.kind)}),
        }
        spec_path.write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n")
        print(name, exit_code, reading, file=sys.stderr)


if __name__ == "__main__":
    main()
