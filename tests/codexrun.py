"""Run the real Codex CLI once against the mock API (tests/mockapi.py's Responses route),
inside bwrap as fanout's sandboxes run it, with the environment and config.toml a codex
preset gives it: what tests/test_agents_codex.py's live test does, and how the golden
files of tests/data/agents/codex/ were captured (`python tests/codexrun.py` rewrites
them and their headers' `captured`, `now` and `exit_code`, keeping each `reading`: a
reading the new capture no longer matches fails tests/test_agents_codex.py until
someone reviews it).

The config is the whole trick of running codex offline: a custom model provider whose
`base_url` is the mock (or fanout's gateway), `env_key` naming the variable that holds
the token, no retries of its own (the gateway retries; a test wants one request per
fault), no update check, no analytics.  Inside bwrap codex's own sandbox (landlock +
seccomp) is not used: `--dangerously-bypass-approvals-and-sandbox`, since fanout's
sandbox is the one around it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fanout.spec.presets import PRESETS

from helpers import run_agent
from mockapi import Fault, MockApi, Usage

TOKEN = "tok-codex-cli-test-5b21e0"
PROMPT = "Write done to out.txt."
MODEL = "gpt-5-codex"
# The codex preset's own argv (without the program): the goldens are what the preset
# makes codex print.
ARGV = PRESETS["codex"].argv[1:]


def config_toml(base_url: str) -> str:
    """The config.toml of a headless codex against an OpenAI-style `base_url` (ending
    in /v1), its token in $OPENAI_API_KEY."""
    return (
        f'model = "{MODEL}"\n'
        'model_provider = "fanout"\n'
        "check_for_update_on_startup = false\n"
        "[analytics]\n"
        "enabled = false\n"
        "[otel]\n"
        'exporter = "none"\n'
        # plugins: without this codex runs `git clone https://github.com/openai/plugins.git`
        # at start (strace: DNS for github.com).  unbounded_connection_retries: without
        # this a gateway that refuses connections is retried forever ("Reconnecting...
        # waiting for network"); with it the turn fails at once.
        "[features]\n"
        "plugins = false\n"
        "unbounded_connection_retries = false\n"
        "[model_providers.fanout]\n"
        'name = "fanout"\n'
        f'base_url = "{base_url}"\n'
        'env_key = "OPENAI_API_KEY"\n'
        'wire_api = "responses"\n'
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str
    work: Path


def run(codex: Path, base_url: str, base: Path) -> Ran:
    """`codex exec --json -` once in a bwrap sandbox at `base` (network on: the mock is
    on the host's loopback), the prompt on stdin, nothing in its environment but what is
    named here."""
    home = base / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(config_toml(base_url))
    environment = {
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "OPENAI_API_KEY": TOKEN,
        "TZ": "UTC",
        "NO_COLOR": "1",
    }
    done = run_agent(codex, list(ARGV), base, environment, stdin=PROMPT)
    return Ran(
        exit_code=done.returncode, stdout=done.stdout, stderr=done.stderr, work=base / "work"
    )


# case -> the mock's fault (None: a clean two-turn tool loop), as captured.
CASES: dict[str, Fault | None] = {
    "success": None,
    "rate-limit": Fault.RATE_LIMIT,
    "overloaded": Fault.OVERLOADED,
    "quota": Fault.SPEND_LIMIT,
    "usage-window": Fault.USAGE_WINDOW,
    "unauthorized": Fault.UNAUTHORIZED,
    "stream-error": Fault.STREAM_ERROR,
    # No fault: the mock is gone (its port refuses connections), a gateway that is down.
    "unreachable": None,
}
USAGE = Usage(input_tokens=30, output_tokens=7, cache_read_tokens=4)


def capture(codex: Path, case: str, base: Path) -> Ran:
    """Drive codex into `case` against a fresh mock."""
    with MockApi().in_thread() as api:
        api.configure(tool=True, usage=USAGE)
        fault = CASES[case]
        if fault is not None:
            api.script(fault, 5)
        if case != "unreachable":
            return run(codex, api.url + "/v1", base)
        url = api.url
    return run(codex, url + "/v1", base)


def main() -> None:
    import json
    import tempfile
    from datetime import UTC, datetime

    codex = Path(os.environ.get("FANOUT_TEST_TOOLS", "/opt/fanout-test-tools"))
    codex = codex / "node_modules" / ".bin" / "codex"
    out = Path(__file__).parent / "data" / "agents" / "codex"
    out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run(
        [str(codex), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    for case, fault in CASES.items():
        with tempfile.TemporaryDirectory(dir="/var/tmp") as scratch:
            now = datetime.now(UTC).replace(microsecond=0)
            ran = capture(codex, case, Path(scratch))
        (out / f"{case}.out").write_text(ran.stdout + ran.stderr)
        header = out / f"{case}.json"
        old = json.loads(header.read_text()) if header.exists() else {}
        old.update(
            {
                "captured": (
                    f"{version}, `codex {' '.join(ARGV)}` in bwrap against tests/mockapi.py "
                    f"(Responses API, tool mode), fault {fault.name if fault else 'none'}{' (the mock stopped)' if case == 'unreachable' else ''}; "
                    "stdout then stderr; tests/codexrun.py"
                ),
                "now": now.isoformat(),
                "exit_code": ran.exit_code,
            }
        )
        old.setdefault("reading", {})
        header.write_text(json.dumps(old, indent=2) + "\n")
        print(case, ran.exit_code)


if __name__ == "__main__":
    main()
