"""What ``task.agent`` fills in: for each agent CLI, the headless command line with
machine-readable output, the environment that keeps it quiet and lets fanout (or the
gateway) do the retrying, the agent's config directory under the worker's HOME, and
the ``[[apis]]`` styles it speaks.

A preset is data, frozen here once; ``spec.build`` resolves it into ``Task.command`` and
``Task.env`` (the job's own values win), ``checks`` refuses a job whose ``[[apis]]``
the agent cannot use, and ``agents.read(<agent>, ...)`` reads the result.  The prompt
always goes on stdin, fanout's rule: every CLI here takes it from there.

The gateway sets each API's base-URL and token variables (``apistyles.FACTS``); those
are the variables these agents read, so a preset names none of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .apis import Style


@dataclass(frozen=True, kw_only=True, slots=True)
class Preset:
    agent: str
    # Headless, machine-readable output, the prompt read from stdin.
    argv: tuple[str, ...]
    # Always set: no telemetry, no update checks (a sandbox's network reaches only the
    # APIs, and a worker that phones home leaks what it works on).
    env: Mapping[str, str]
    # Set only when the job has an ``[[apis]]`` entry of one of ``styles``: the gateway
    # absorbs 429s and 529s itself, so the agent's own retries would only multiply them.
    gateway_env: Mapping[str, str]
    # The agent's config directory, relative to the worker's HOME (which is per unit).
    config_dir: str
    # The ``[[apis]]`` styles the agent can be pointed at; the first is its own.
    styles: tuple[Style, ...]
    # The variables the agent reads its own key from, for a job without a gateway
    # (listed in ``task.secrets``); the first is the usual one.
    key_envs: tuple[str, ...]


def _frozen(values: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(values))


PRESETS: Mapping[str, Preset] = MappingProxyType(
    {
        "claude": Preset(
            agent="claude",
            # Checked against the real CLI by tests/test_claude_cli.py and
            # tests/test_gateway_claude.py.  --allowedTools only when the job says
            # (task.args): which tools a unit may use is the job's decision.
            # stream-json (which -p accepts only with --verbose): every response and tool
            # result for the attempt's transcript (agents.transcript), and the same
            # `result` event as json at its end for agents.claude.
            argv=("claude", "-p", "--output-format", "stream-json", "--verbose"),
            env=_frozen(
                {
                    # Without it the CLI looks up some 40 names in DNS (measured in
                    # tests/test_claude_cli.py): telemetry, error reports, update checks.
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                    "DISABLE_AUTOUPDATER": "1",
                }
            ),
            # Without a gateway the CLI's own retries are all there is: kept.
            gateway_env=_frozen({"CLAUDE_CODE_MAX_RETRIES": "0"}),
            config_dir=".claude",
            styles=(Style.ANTHROPIC,),
            # A subscription's OAuth token (`claude setup-token`) or an API key.
            key_envs=("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"),
        ),
        "codex": Preset(
            agent="codex",
            # Checked against the real CLI by tests/test_agents_codex.py (the argv of
            # tests/codexrun.py).  "-": the prompt from stdin; --skip-git-repo-check: a
            # sandbox is no git checkout; fanout's sandbox is the one around it, and
            # codex's own (landlock, seccomp) cannot start inside bwrap.
            argv=(
                "codex",
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--color",
                "never",
                "-",
            ),
            # No update check, analytics or telemetry: in its config file (config_file).
            # TZ=UTC: codex states a usage window's reset as a wall-clock time ("try
            # again at 5:46 PM") in its own zone, which agents.codex then reads as UTC.
            env=_frozen({"NO_COLOR": "1", "TZ": "UTC"}),
            gateway_env=_frozen({}),
            config_dir=".codex",
            styles=(Style.OPENAI,),
            key_envs=("OPENAI_API_KEY", "CODEX_API_KEY"),
        ),
        "gemini": Preset(
            agent="gemini",
            # Checked against the real CLI by tests/test_agents_gemini.py (the argv of
            # its goldens).  -p "" runs headless with the prompt read from stdin (-p is
            # appended to it).  stream-json, not json: only it holds the tool calls, for
            # the transcript, and its result event says all that json's object does.
            # --yolo (tools without asking) only when the job says (task.args), as
            # claude's --allowedTools.
            argv=("gemini", "-p", "", "--output-format", "stream-json"),
            # A sandbox's work directory is no folder the user trusted; headless gemini
            # refuses an untrusted one.  Telemetry, usage statistics and the update
            # check are off in its settings file (config_file).
            env=_frozen({"GEMINI_CLI_TRUST_WORKSPACE": "true"}),
            gateway_env=_frozen({}),
            config_dir=".gemini",
            styles=(Style.GEMINI,),
            key_envs=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        ),
        "aider": Preset(
            agent="aider",
            # No aider CLI runs in the tests (docs/guides/agents.md): its documented flags.
            # It has no machine-readable output; --no-pretty keeps the log plain text.
            # --no-auto-commits: fanout collects the files, a sandbox is no repository.
            argv=(
                "aider",
                "--message-file",
                "/dev/stdin",
                "--yes-always",
                "--no-auto-commits",
                "--no-pretty",
            ),
            env=_frozen(
                {
                    "AIDER_CHECK_UPDATE": "false",
                    "AIDER_ANALYTICS": "false",
                    "AIDER_SHOW_RELEASE_NOTES": "false",
                }
            ),
            gateway_env=_frozen({}),
            config_dir=".aider",
            # litellm underneath reads either family's variables.
            styles=(Style.OPENAI, Style.ANTHROPIC),
            key_envs=("OPENAI_API_KEY", "ANTHROPIC_API_KEY"),
        ),
        "llm": Preset(
            agent="llm",
            # No CLI in the tests: llm's documented flags.  The prompt from stdin;
            # --usage prints the tokens used to stderr, where the reader finds them.
            argv=("llm", "prompt", "--no-stream", "--usage"),
            env=_frozen({}),
            gateway_env=_frozen({}),
            config_dir=".config/io.datasette.llm",
            styles=(Style.OPENAI,),
            key_envs=("OPENAI_API_KEY",),
        ),
    }
)

AGENTS: tuple[str, ...] = tuple(PRESETS)

# Claude Code's default output cap (64,000) would not fit in any sensible outputTokens
# window, and the gateway reserves a request's whole cap until its answer: half the
# window lets two requests be under way at once; 8192 is enough for any one turn.
MAX_OUTPUT_TOKENS = 8192


def environment(
    agent: str, *, styles: Iterable[Style], output_tokens: int | None
) -> dict[str, str]:
    """The preset's environment for a job whose ``[[apis]]`` have ``styles``, the
    smallest outputTokens window limit among the agent's style's APIs being
    ``output_tokens`` (None: no such window)."""
    preset = PRESETS[agent]
    env = dict(preset.env)
    if set(styles) & set(preset.styles):
        env.update(preset.gateway_env)
    if agent == "claude" and output_tokens is not None:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(
            max(1, min(MAX_OUTPUT_TOKENS, output_tokens // 2))
        )
    return env


def config_file(agent: str, *, base_url: str | None, token_env: str) -> tuple[str, str] | None:
    """The file the agent must find in its config directory, as (path under HOME,
    text), for a worker whose gateway URL for the agent's API is ``base_url`` (None:
    no gateway, the agent calls its API with its own key) and whose token is in
    ``token_env``; None when the agent needs none.  The attempt writes it into the
    unit's HOME: it holds the gateway's URL, which is known only where the attempt runs.

    codex reads its provider, retries, update check and analytics from config.toml
    only (tests/codexrun.py found this out against the real CLI): a provider of its own
    points it at the gateway, without retries of its own (the gateway retries).
    gemini reads its auth type, telemetry, usage statistics, update check and retries
    from settings.json only (tests/test_agents_gemini.py)."""
    if agent == "gemini":
        return _gemini_settings(gateway=base_url is not None)
    if agent != "codex":
        return None
    lines = [
        "check_for_update_on_startup = false",
        "[analytics]",
        "enabled = false",
        "[otel]",
        'exporter = "none"',
        # Else codex git-clones github.com/openai/plugins at start, and retries a refused
        # connection forever (tests/test_agents_codex.py's goldens, codex 0.171.0).
        "[features]",
        "plugins = false",
        "unbounded_connection_retries = false",
    ]
    if base_url is not None:
        # A JSON string is a TOML basic string.
        lines[:0] = ['model_provider = "fanout"']
        lines += [
            "[model_providers.fanout]",
            'name = "fanout"',
            f"base_url = {json.dumps(base_url)}",
            f"env_key = {json.dumps(token_env)}",
            'wire_api = "responses"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
        ]
    return f"{PRESETS[agent].config_dir}/config.toml", "\n".join(lines) + "\n"


def _gemini_settings(*, gateway: bool) -> tuple[str, str]:
    general: dict[str, object] = {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}
    if gateway:
        general["maxAttempts"] = 1  # the gateway retries
    settings = {
        # Headless, with the key (or the gateway's token) in GEMINI_API_KEY: no login.
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": general,
    }
    return f"{PRESETS['gemini'].config_dir}/settings.json", json.dumps(settings, indent=2) + "\n"


def api_of(agent: str | None, apis: Iterable[tuple[str, Style]]) -> str | None:
    """The first of ``apis`` (name, style) whose style the agent speaks: the API it
    calls through the gateway; None without one."""
    if agent is None:
        return None
    styles = PRESETS[agent].styles
    return next((name for name, style in apis if style in styles), None)
