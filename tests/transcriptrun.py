"""Run each agent CLI once against tests/mockapi.py in its tool mode (a shell command
with output, then "All done."), in the output format its transcript is read from, as
tests/data/transcripts/ was captured:

    PYTHONPATH=runner:tests .venv/bin/python tests/transcriptrun.py

rewrites those files (review the diff: ids, timestamps and durations change)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import codexrun

from helpers import run_agent
from mockapi import MockApi, Usage

GOLDEN = Path(__file__).parent / "data" / "transcripts"
PROMPT = "Write done to out.txt."
# A command whose output the transcript must carry as the call's result.
COMMAND = "echo done | tee out.txt"
USAGE = Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4, cache_write_tokens=2)
# The claude preset's format (spec/presets.py) and gemini's richer one.
CLAUDE_ARGS = ["-p", "--output-format", "stream-json", "--verbose", "--allowedTools", "Bash"]
GEMINI_ARGS = ["-p", "", "--output-format", "stream-json", "-m", "gemini-2.5-flash", "--yolo"]
GEMINI_SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "maxAttempts": 1},
}


def capture(agent: str, tools: Path, base: Path) -> tuple[int, str]:
    """`agent` run once in bwrap at `base`; its exit code and stdout then stderr."""
    with MockApi().in_thread() as api:
        api.configure(tool=True, command=COMMAND, usage=USAGE)
        home = base / "home"
        home.mkdir(parents=True)
        if agent == "codex":
            ran = codexrun.run(tools / "codex", api.url + "/v1", base)
            return ran.exit_code, ran.stdout + ran.stderr
        if agent == "claude":
            env = {
                "HOME": str(home),
                "ANTHROPIC_BASE_URL": api.url,
                "ANTHROPIC_API_KEY": "tok-transcript-claude",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
                "CLAUDE_CODE_MAX_RETRIES": "0",
            }
            done = run_agent(tools / "claude", CLAUDE_ARGS, base, env, stdin=PROMPT)
        else:
            (home / ".gemini").mkdir()
            (home / ".gemini" / "settings.json").write_text(json.dumps(GEMINI_SETTINGS))
            env = {
                "HOME": str(home),
                "GOOGLE_GEMINI_BASE_URL": api.url,
                "GEMINI_API_KEY": "tok-transcript-gemini",
                "GEMINI_CLI_TRUST_WORKSPACE": "true",
            }
            done = run_agent(tools / "gemini", GEMINI_ARGS, base, env, stdin=PROMPT)
    return done.returncode, done.stdout + done.stderr


FILES = {
    "claude": "claude-stream-json.out",
    "codex": "codex-exec-json.out",
    "gemini": "gemini-stream-json.out",
}


def main() -> None:
    tools = Path(os.environ.get("FANOUT_TEST_TOOLS", "/opt/fanout-test-tools"))
    tools = tools / "node_modules" / ".bin"
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for agent, name in FILES.items():
        with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
            code, output = capture(agent, tools, Path(scratch))
        (GOLDEN / name).write_text(output)
        print(agent, code)


if __name__ == "__main__":
    main()
