"""``task.agent``: what each preset fills in, how the job overrides it, what validation
refuses (exact, located messages), and how ``fanout plan`` marks the preset's values."""

from __future__ import annotations

import json
import textwrap
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest
import tomli_w

from fanout import plan, spec
from fanout.errors import JobError
from fanout.spec import presets
from fanout.spec.apis import Style
from fanout.spec.schema import job_schema

from helpers import write_job

NOW = datetime(2026, 1, 1, tzinfo=UTC)

HEAD = """\
version = 1
name = "agents"
[inputs]
items = ["a"]
[task]
prompt = "fix {{ unit.id }}"
"""


def api(style: str, name: str | None = None, extra: str = "") -> str:
    upstream = {
        "anthropic": "https://api.anthropic.com",
        "openai": "https://api.openai.com/v1",
        "gemini": "https://generativelanguage.googleapis.com",
        "plain": "https://search.example",
    }[style]
    plain = 'baseUrlEnv = "SEARCH_URL"\ntokenEnv = "SEARCH_TOKEN"\n' if style == "plain" else ""
    return (
        f'[[apis]]\nname = "{name or style}"\nupstream = "{upstream}"\nstyle = "{style}"\n'
        + plain
        + extra
    )


def job(task: str, *apis: str, tail: str = "", runtime: str = "network = true\n") -> str:
    return HEAD + textwrap.dedent(task) + "[runtime]\n" + runtime + "".join(apis) + tail


def load(tmp_path: Path, text: str) -> spec.Spec:
    return spec.load(write_job(tmp_path, text))


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write_job(tmp_path, text)
    with pytest.raises(JobError) as caught:
        spec.load(path)
    return [str(problem).removeprefix(f"{path}:") for problem in caught.value.problems]


def command(task: spec.Task) -> list[str]:
    return [part.source for part in task.command]


def env(task: spec.Task) -> dict[str, str]:
    return {name: value.source for name, value in task.env.items()}


# -- every preset ----------------------------------------------------------------------


@pytest.mark.parametrize("agent", presets.AGENTS)
def test_every_preset_resolves_and_validates_without_apis(tmp_path: Path, agent: str) -> None:
    task = load(tmp_path, job(f'agent = "{agent}"\n')).task
    preset = presets.PRESETS[agent]
    assert (task.agent, command(task), env(task)) == (agent, list(preset.argv), dict(preset.env))
    assert task.from_agent == {"command", *preset.env}


@pytest.mark.parametrize("agent", presets.AGENTS)
def test_every_preset_resolves_with_an_api_of_its_own_style(tmp_path: Path, agent: str) -> None:
    preset = presets.PRESETS[agent]
    task = load(tmp_path, job(f'agent = "{agent}"\n', api(preset.styles[0]))).task
    assert env(task) == {**preset.env, **preset.gateway_env}


def test_the_agents_are_the_schemas_and_the_taxonomys() -> None:
    agent = job_schema()["definitions"]["task"]["properties"]["agent"]
    assert tuple(agent["enum"]) == presets.AGENTS
    assert presets.AGENTS == ("claude", "codex", "gemini", "aider", "llm")


def test_what_each_preset_fills_in() -> None:
    table = {
        agent: (p.argv, dict(p.env), dict(p.gateway_env), p.config_dir, p.styles)
        for agent, p in presets.PRESETS.items()
    }
    assert table == {
        "claude": (
            ("claude", "-p", "--output-format", "stream-json", "--verbose"),
            {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"},
            {"CLAUDE_CODE_MAX_RETRIES": "0"},
            ".claude",
            (Style.ANTHROPIC,),
        ),
        "codex": (
            (
                "codex",
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox",
                "--color",
                "never",
                "-",
            ),
            {"NO_COLOR": "1", "TZ": "UTC"},
            {},
            ".codex",
            (Style.OPENAI,),
        ),
        "gemini": (
            ("gemini", "-p", "", "--output-format", "stream-json"),
            {"GEMINI_CLI_TRUST_WORKSPACE": "true"},
            {},
            ".gemini",
            (Style.GEMINI,),
        ),
        "aider": (
            (
                "aider",
                "--message-file",
                "/dev/stdin",
                "--yes-always",
                "--no-auto-commits",
                "--no-pretty",
            ),
            {
                "AIDER_CHECK_UPDATE": "false",
                "AIDER_ANALYTICS": "false",
                "AIDER_SHOW_RELEASE_NOTES": "false",
            },
            {},
            ".aider",
            (Style.OPENAI, Style.ANTHROPIC),
        ),
        "llm": (
            ("llm", "prompt", "--no-stream", "--usage"),
            {},
            {},
            ".config/io.datasette.llm",
            (Style.OPENAI,),
        ),
    }


def test_codex_is_pointed_at_the_gateway_by_its_config_file() -> None:
    found = presets.config_file(
        "codex", base_url="http://127.0.0.1:4711/openai", token_env="OPENAI_API_KEY"
    )
    assert found is not None
    path, text = found
    assert (path, tomllib.loads(text)) == (
        ".codex/config.toml",
        {
            "model_provider": "fanout",
            "check_for_update_on_startup": False,
            "analytics": {"enabled": False},
            "otel": {"exporter": "none"},
            "features": {"plugins": False, "unbounded_connection_retries": False},
            "model_providers": {
                "fanout": {
                    "name": "fanout",
                    "base_url": "http://127.0.0.1:4711/openai",
                    "env_key": "OPENAI_API_KEY",
                    "wire_api": "responses",
                    "request_max_retries": 0,
                    "stream_max_retries": 0,
                }
            },
        },
    )


def test_codex_without_a_gateway_keeps_its_own_provider_and_stays_quiet() -> None:
    found = presets.config_file("codex", base_url=None, token_env="OPENAI_API_KEY")
    assert found is not None
    assert tomllib.loads(found[1]) == {
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "otel": {"exporter": "none"},
        "features": {"plugins": False, "unbounded_connection_retries": False},
    }


@pytest.mark.parametrize(
    ("base_url", "attempts"), [("http://127.0.0.1:4711/gemini", 1), (None, None)]
)
def test_gemini_is_kept_quiet_and_its_retries_left_to_a_gateway_by_its_settings(
    base_url: str | None, attempts: int | None
) -> None:
    found = presets.config_file("gemini", base_url=base_url, token_env="GEMINI_API_KEY")
    assert found is not None
    general: dict[str, object] = {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}
    if attempts is not None:
        general["maxAttempts"] = attempts
    assert (found[0], json.loads(found[1])) == (
        ".gemini/settings.json",
        {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": general,
        },
    )


@pytest.mark.parametrize("agent", ["claude", "aider", "llm"])
def test_the_other_agents_need_no_config_file(agent: str) -> None:
    assert presets.config_file(agent, base_url="http://x", token_env="T") is None


# -- claude's environment follows the gateway -----------------------------------------


QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}


def test_claude_keeps_its_own_retries_without_a_gateway(tmp_path: Path) -> None:
    assert env(load(tmp_path, job('agent = "claude"\n')).task) == QUIET


def test_claude_leaves_the_retrying_to_the_gateway(tmp_path: Path) -> None:
    task = load(tmp_path, job('agent = "claude"\n', api("anthropic"))).task
    assert env(task) == {**QUIET, "CLAUDE_CODE_MAX_RETRIES": "0"}


def test_a_plain_api_is_no_gateway_for_claude(tmp_path: Path) -> None:
    assert env(load(tmp_path, job('agent = "claude"\n', api("plain"))).task) == QUIET


@pytest.mark.parametrize(
    ("windows", "cap"),
    [
        # Half the window: two requests under way at once.
        ([8000], "4000"),
        # At most 8192 however large the window.
        ([100_000], "8192"),
        ([16_384], "8192"),
        ([16_383], "8191"),
        # The tightest of the anthropic APIs.
        ([8000, 3000], "1500"),
        ([1], "1"),
    ],
)
def test_claude_output_cap_fits_the_output_window(
    tmp_path: Path, windows: list[int], cap: str
) -> None:
    apis = [
        api(
            "anthropic",
            f"anthropic-{n}",
            f'baseUrlEnv = "URL_{n}"\ntokenEnv = "TOKEN_{n}"\n'
            f'outputTokens = {{ limit = {limit}, per = "1m" }}\n',
        )
        for n, limit in enumerate(windows)
    ]
    task = load(tmp_path, job('agent = "claude"\n', *apis)).task
    assert task.env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"].source == cap
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" in task.from_agent


def test_claude_output_cap_ignores_windows_of_other_styles(tmp_path: Path) -> None:
    other = api("openai", extra='outputTokens = { limit = 1000, per = "1m" }\n')
    task = load(tmp_path, job('agent = "claude"\n', api("anthropic"), other)).task
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in task.env


# -- the job overrides the preset -------------------------------------------------------


def test_a_job_command_is_kept_and_the_preset_still_supplies_the_env(tmp_path: Path) -> None:
    task = load(tmp_path, job('agent = "claude"\ncommand = ["claude", "--print"]\n')).task
    assert (command(task), env(task)) == (["claude", "--print"], QUIET)
    assert task.from_agent == set(QUIET)


def test_task_env_keys_override_the_presets(tmp_path: Path) -> None:
    task = load(
        tmp_path,
        job('agent = "claude"\nenv = { DISABLE_AUTOUPDATER = "0", NO_COLOR = "1" }\n'),
    ).task
    assert env(task) == {
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "0",
        "NO_COLOR": "1",
    }
    assert task.from_agent == {"command", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"}


def test_task_env_overrides_the_gateway_dependent_values_too(tmp_path: Path) -> None:
    task = load(
        tmp_path,
        job(
            'agent = "claude"\nenv = { CLAUDE_CODE_MAX_RETRIES = "2", '
            'CLAUDE_CODE_MAX_OUTPUT_TOKENS = "1024" }\n',
            api("anthropic", extra='outputTokens = { limit = 8000, per = "1m" }\n'),
        ),
    ).task
    assert (env(task)["CLAUDE_CODE_MAX_RETRIES"], env(task)["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == (
        "2",
        "1024",
    )


def test_args_extend_the_presets_command(tmp_path: Path) -> None:
    text = job(
        'agent = "claude"\nargs = ["--model", "{{ rung.vars.model }}", "--allowedTools", '
        '"Read,Edit"]\n',
        tail='[[retry.ladder]]\nname = "standard"\nvars = { model = "sonnet" }\n',
    )
    task = load(tmp_path, text).task
    assert command(task) == [
        "claude",
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "{{ rung.vars.model }}",
        "--allowedTools",
        "Read,Edit",
    ]


LADDER = '[[retry.ladder]]\nname = "standard"\nvars = { model = "sonnet" }\n'


# -- validation -------------------------------------------------------------------------


def test_a_task_needs_a_command_or_an_agent(tmp_path: Path) -> None:
    assert problems(tmp_path, job("")) == ["5:1: task: missing required key 'command' or 'agent'"]


def test_an_unknown_agent_is_refused_with_a_guess(tmp_path: Path) -> None:
    assert problems(tmp_path, job('agent = "claud"\n')) == [
        "7:9: task.agent: must be 'claude', 'codex', 'gemini', 'aider' or 'llm', not 'claud' "
        "(did you mean 'claude'?)"
    ]


def test_args_need_an_agent(tmp_path: Path) -> None:
    assert problems(tmp_path, job('command = ["true"]\nargs = ["-v"]\n')) == [
        "8:1: task.args: only applies together with 'agent'"
    ]


def test_args_beside_a_command_would_be_dropped(tmp_path: Path) -> None:
    assert problems(tmp_path, job('agent = "codex"\ncommand = ["codex"]\nargs = ["-v"]\n')) == [
        "9:1: task.args: task.command replaces the preset's whole command, so these "
        "arguments would be dropped: put them in task.command, or remove task.command to "
        "extend the preset's"
    ]


def test_args_see_only_the_rung_vars_every_rung_sets(tmp_path: Path) -> None:
    text = job(
        'agent = "claude"\nargs = ["--model", "{{ rung.vars.model }}"]\n',
        tail='[[retry.ladder]]\nname = "standard"\n',
    )
    assert problems(tmp_path, text) == [
        "8:20: task.args[1]: 'rung.vars.model' is not set by rung 'standard' (retry.ladder[0])"
    ]


def test_args_are_not_checked_against_a_rung_with_its_own_command(tmp_path: Path) -> None:
    text = job(
        'agent = "claude"\nargs = ["--model", "{{ rung.vars.model }}"]\n',
        tail=LADDER + '[[retry.ladder]]\nname = "own"\ncommand = ["claude", "-p"]\n',
    )
    assert [rung.name for rung in load(tmp_path, text).retry.ladder] == ["standard", "own"]


def test_an_agent_needs_the_network(tmp_path: Path) -> None:
    message = (
        "agent 'llm' calls its model's API, and a sandbox without network cannot reach "
        "it: set `runtime.network = true`"
    )
    assert problems(tmp_path, job('agent = "llm"\n', runtime="")) == [f"7:9: task.agent: {message}"]
    assert problems(tmp_path, job('agent = "llm"\n', runtime="network = false\n")) == [
        f"9:11: runtime.network: {message}"
    ]


def test_a_job_with_apis_is_told_about_the_network_once(tmp_path: Path) -> None:
    found = problems(tmp_path, job('agent = "claude"\n', api("anthropic"), runtime=""))
    assert [p.split(": ")[1] for p in found] == ["apis[0]"]


def test_an_agent_whose_api_no_apis_entry_is_is_refused(tmp_path: Path) -> None:
    text = job('agent = "claude"\n', api("openai"), api("gemini"))
    assert problems(tmp_path, text) == [
        "7:9: task.agent: agent 'claude' calls a style 'anthropic' API and no [[apis]] entry "
        "has that style (apis[0] 'openai' is 'openai', apis[1] 'gemini' is 'gemini'), so its "
        "requests would bypass the gateway: add an [[apis]] entry with style = 'anthropic', "
        "or list its own key ('ANTHROPIC_API_KEY') in task.secrets to let it call its API "
        "directly"
    ]


def test_an_agent_of_two_styles_is_refused_naming_both(tmp_path: Path) -> None:
    assert problems(tmp_path, job('agent = "aider"\n', api("gemini")))[0].startswith(
        "7:9: task.agent: agent 'aider' calls a style 'openai' or 'anthropic' API and no "
        "[[apis]] entry has that style (apis[0] 'gemini' is 'gemini')"
    )


@pytest.mark.parametrize(
    ("agent", "apis", "secrets"),
    [
        # Its own style among others.
        ("claude", ("openai", "anthropic"), ""),
        # Its own key: it calls its API directly, on purpose.
        ("claude", ("openai",), 'secrets = ["CLAUDE_CODE_OAUTH_TOKEN"]\n'),
        ("codex", ("anthropic",), 'secrets = ["CODEX_API_KEY"]\n'),
        # A plain API is a tool's, not a model's.
        ("gemini", ("plain",), ""),
        # Either of aider's.
        ("aider", ("anthropic",), ""),
    ],
)
def test_an_agent_that_can_use_the_apis_is_accepted(
    tmp_path: Path, agent: str, apis: tuple[str, ...], secrets: str
) -> None:
    load(tmp_path, job(f'agent = "{agent}"\n{secrets}', *(api(s) for s in apis)))


# -- fanout plan ------------------------------------------------------------------------


def task_lines(tmp_path: Path, text: str) -> list[str]:
    loaded = load(tmp_path, text)
    lines = plan.render_text(plan.make(loaded, environ={}, now=NOW)).splitlines()
    start = lines.index("First unit's task (a, rung standard, attempt 1):")
    return lines[start + 1 : lines.index("  timeout  10m", start)]


def test_plan_marks_what_the_preset_filled_in(tmp_path: Path) -> None:
    text = job(
        'agent = "claude"\nargs = ["--model", "{{ rung.vars.model }}"]\n'
        'env = { DISABLE_AUTOUPDATER = "0", NO_COLOR = "1" }\n',
        api("anthropic", extra='outputTokens = { limit = 8000, per = "1m" }\n'),
        tail=LADDER,
    )
    assert task_lines(tmp_path, text) == [
        "  agent    claude: its output is read for the attempt's fate, usage and cost",
        "  command  claude -p --output-format stream-json --verbose --model sonnet   "
        '(from task.agent = "claude" and task.args)',
        '  env      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1   (from task.agent = "claude")',
        '           CLAUDE_CODE_MAX_RETRIES=0   (from task.agent = "claude")',
        '           CLAUDE_CODE_MAX_OUTPUT_TOKENS=4000   (from task.agent = "claude")',
        "           DISABLE_AUTOUPDATER=0",
        "           NO_COLOR=1",
    ]


def test_plan_shows_a_job_command_unmarked(tmp_path: Path) -> None:
    text = job('agent = "gemini"\ncommand = ["gemini", "-p", "{{ unit.id }}"]\n', tail=LADDER)
    assert task_lines(tmp_path, text) == [
        "  agent    gemini: its output is read for the attempt's fate, usage and cost",
        "  command  gemini -p a",
        '  env      GEMINI_CLI_TRUST_WORKSPACE=true   (from task.agent = "gemini")',
    ]


def test_plan_does_not_credit_the_preset_with_what_the_first_rung_sets(tmp_path: Path) -> None:
    text = job(
        'agent = "claude"\n',
        tail='[[retry.ladder]]\nname = "standard"\ncommand = ["claude", "-p"]\n'
        'env = { DISABLE_AUTOUPDATER = "0" }\n',
    )
    assert task_lines(tmp_path, text) == [
        "  agent    claude: its output is read for the attempt's fate, usage and cost",
        "  command  claude -p",
        '  env      CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1   (from task.agent = "claude")',
        "           DISABLE_AUTOUPDATER=0",
    ]


def test_plans_resolved_job_loads_to_the_same_task(tmp_path: Path) -> None:
    text = job(
        'agent = "claude"\nargs = ["--model", "{{ rung.vars.model }}"]\n',
        api("anthropic"),
        tail=LADDER,
    )
    first = load(tmp_path, text)
    resolved = plan.to_document(first)
    assert sorted(resolved["task"]) == ["agent", "command", "env", "prompt", "timeout"]
    again = load(tmp_path / "again", tomli_w.dumps(resolved))
    assert (command(again.task), env(again.task)) == (command(first.task), env(first.task))
