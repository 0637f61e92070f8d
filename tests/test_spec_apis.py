"""``[[apis]]`` in the job file: what it builds to, what validation refuses (with the
exact, located message), and the real keys ``fanout run`` reads for the gateway."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import tomli_w

from fanout import plan, spec
from fanout.cli import starter
from fanout.errors import EnvironmentProblem, JobError
from fanout.spec.apikeys import api_keys
from fanout.spec.apis import FACTS, Style
from fanout.spec.schema import job_schema

from helpers import MINIMAL, write_job

# MINIMAL ends in [task] (lines 5-6): task keys go right after it, then [runtime].
ANTHROPIC = """\
[[apis]]
name = "anthropic"
upstream = "https://api.anthropic.com"
style = "anthropic"
"""


def job(*, task: str = "", runtime: str = "network = true\n", apis: str = ANTHROPIC) -> str:
    return MINIMAL + task + "[runtime]\n" + runtime + apis


def load(tmp_path: Path, text: str) -> spec.Spec:
    return spec.load(write_job(tmp_path, text))


def problems(tmp_path: Path, text: str) -> list[str]:
    path = write_job(tmp_path, text)
    with pytest.raises(JobError) as caught:
        spec.load(path)
    return [str(problem).removeprefix(f"{path}:") for problem in caught.value.problems]


def test_every_key_builds_into_the_api(tmp_path: Path) -> None:
    loaded = load(
        tmp_path,
        job(
            apis=textwrap.dedent("""\
            [[apis]]
            name = "anthropic"
            upstream = "https://api.anthropic.com/"
            style = "anthropic"
            baseUrlEnv = "CLAUDE_URL"
            tokenEnv = "ANTHROPIC_AUTH_TOKEN"
            keySecret = "REAL_ANTHROPIC_KEY"
            requests = { limit = 50, per = "1m" }
            inputTokens = { limit = 30000, per = "1m" }
            outputTokens = { limit = 8000, per = "90s" }
            maxInFlight = 10
            budget = { usd = 20 }
            [apis.prices]
            "claude-sonnet-*" = { input = 3, output = 15.0, cacheRead = 0.3, cacheWrite = 3.75 }
            "claude-*" = { input = 1, output = 5 }
            """)
        ),
    )
    assert loaded.apis == (
        spec.Api(
            name="anthropic",
            # The trailing "/" is dropped: the worker's "/v1/messages" is appended.
            upstream="https://api.anthropic.com",
            style=Style.ANTHROPIC,
            base_url_env="CLAUDE_URL",
            token_env="ANTHROPIC_AUTH_TOKEN",
            key_secret="REAL_ANTHROPIC_KEY",
            requests=spec.Window(limit=50, per=60.0),
            input_tokens=spec.Window(limit=30000, per=60.0),
            output_tokens=spec.Window(limit=8000, per=90.0),
            max_in_flight=10,
            # In file order: the first glob that matches prices a request.
            prices=(
                (
                    "claude-sonnet-*",
                    spec.Price(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75),
                ),
                ("claude-*", spec.Price(input=1.0, output=5.0)),
            ),
            budget_usd=20.0,
        ),
    )
    api = loaded.apis[0]
    assert type(api.budget_usd) is float
    assert type(api.prices[0][1].input) is float


def test_a_minimal_api_takes_its_styles_variables(tmp_path: Path) -> None:
    apis = "".join(
        f'[[apis]]\nname = "{style}"\nupstream = "http://127.0.0.1:9"\nstyle = "{style}"\n'
        for style in ("anthropic", "openai", "gemini")
    )
    loaded = load(tmp_path, job(apis=apis))
    assert loaded.apis == tuple(
        spec.Api(
            name=str(style),
            upstream="http://127.0.0.1:9",
            style=style,
            base_url_env=str(FACTS[style].base_url_env),
            token_env=str(FACTS[style].token_env),
        )
        for style in (Style.ANTHROPIC, Style.OPENAI, Style.GEMINI)
    )
    assert [(a.base_url_env, a.token_env) for a in loaded.apis] == [
        ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY"),
        ("OPENAI_BASE_URL", "OPENAI_API_KEY"),
        ("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY"),
    ]


def test_plain_takes_the_variables_it_names(tmp_path: Path) -> None:
    apis = (
        '[[apis]]\nname = "search"\nupstream = "https://search.example/api"\nstyle = "plain"\n'
        'baseUrlEnv = "SEARCH_URL"\ntokenEnv = "SEARCH_TOKEN"\nkeySecret = "SEARCH_KEY"\n'
        'requests = { limit = 5, per = "10s" }\n'
    )
    assert load(tmp_path, job(apis=apis)).apis == (
        spec.Api(
            name="search",
            upstream="https://search.example/api",
            style=Style.PLAIN,
            base_url_env="SEARCH_URL",
            token_env="SEARCH_TOKEN",
            key_secret="SEARCH_KEY",
            requests=spec.Window(limit=5, per=10.0),
        ),
    )


def test_no_apis_is_an_empty_tuple(tmp_path: Path) -> None:
    assert load(tmp_path, MINIMAL).apis == ()


def test_the_schemas_styles_are_the_styles_fanout_knows() -> None:
    styles = job_schema()["definitions"]["api"]["properties"]["style"]["enum"]
    assert styles == [str(style) for style in Style]
    assert set(FACTS) == set(Style)


NETWORK = (
    'a job with [[apis]] needs runtime.network = true or "apis": its workers reach the '
    "gateway over the network, and a sandbox without network cannot reach even the "
    'coordinator\'s loopback; set `runtime.network = "apis"` (only the gateway is '
    "reachable) or `runtime.network = true`"
)


def test_apis_need_the_network_when_it_is_left_out(tmp_path: Path) -> None:
    assert problems(tmp_path, job(runtime="")) == [f"8:1: apis[0]: {NETWORK}"]


def test_apis_need_the_network_when_it_is_turned_off(tmp_path: Path) -> None:
    text = job(runtime="network = false\n")
    assert problems(tmp_path, text) == [f"8:11: runtime.network: {NETWORK}"]


def test_the_key_secret_is_not_a_task_secret(tmp_path: Path) -> None:
    text = job(
        task='secrets = ["GH_TOKEN", "ANTHROPIC_API_KEY"]\n',
        apis=ANTHROPIC + 'keySecret = "ANTHROPIC_API_KEY"\n',
    )
    assert problems(tmp_path, text) == [
        "7:24: task.secrets[1]: 'ANTHROPIC_API_KEY' is apis[0].keySecret: the real key stays "
        "with the gateway, and listing it here would put it in every sandbox; remove it "
        "(the worker gets a per-attempt token instead)"
    ]


def test_a_task_secret_may_not_replace_the_gateways_variables(tmp_path: Path) -> None:
    # The secret is another variable's value here, but the worker would get it in the
    # variable its client reads the token from: secrets are set last, so it would win.
    text = job(
        task='secrets = ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]\n',
        apis=ANTHROPIC + 'keySecret = "REAL_KEY"\n',
    )
    assert problems(tmp_path, text) == [
        "7:12: task.secrets[0]: 'ANTHROPIC_API_KEY' is set by the gateway to a per-attempt "
        "token (apis[0].tokenEnv), which this secret would replace; remove it here",
        "7:33: task.secrets[1]: 'ANTHROPIC_BASE_URL' is set by the gateway to its URL "
        "(apis[0].baseUrlEnv), which this secret would replace; remove it here",
    ]


def test_task_and_rung_env_may_not_set_the_gateways_variables(tmp_path: Path) -> None:
    text = (
        job(task='env = { ANTHROPIC_BASE_URL = "http://localhost:1", OTHER = "x" }\n')
        + '[[retry.ladder]]\nname = "first"\n'
        + '[[retry.ladder]]\nname = "second"\nenv = { ANTHROPIC_API_KEY = "{{ unit.id }}" }\n'
    )
    assert problems(tmp_path, text) == [
        "7:9: task.env.ANTHROPIC_BASE_URL: 'ANTHROPIC_BASE_URL' is set by the gateway to its "
        "URL (apis[0].baseUrlEnv); remove it here",
        "18:9: retry.ladder[1].env.ANTHROPIC_API_KEY: 'ANTHROPIC_API_KEY' is set by the "
        "gateway to a per-attempt token (apis[0].tokenEnv); remove it here",
    ]


def test_api_names_are_unique(tmp_path: Path) -> None:
    second = ANTHROPIC.replace('"anthropic"\n', '"openai"\n', 1).replace(
        'style = "anthropic"', 'style = "openai"'
    )
    second = second.replace('name = "openai"', 'name = "anthropic"')
    text = job(apis=ANTHROPIC + second)
    assert problems(tmp_path, text) == [
        "14:8: apis[1].name: api 'anthropic' is already declared by apis[0]"
    ]


def test_two_apis_of_one_style_cannot_share_its_default_variables(tmp_path: Path) -> None:
    text = job(apis=ANTHROPIC + ANTHROPIC.replace('name = "anthropic"', 'name = "backup"'))
    assert problems(tmp_path, text) == [
        "16:9: apis[1].style: 'ANTHROPIC_BASE_URL' (the default of style 'anthropic') is "
        "already apis[0].baseUrlEnv; a worker has one value per variable: set baseUrlEnv "
        "to another name",
        "16:9: apis[1].style: 'ANTHROPIC_API_KEY' (the default of style 'anthropic') is "
        "already apis[0].tokenEnv; a worker has one value per variable: set tokenEnv to "
        "another name",
    ]
    # Naming other variables is the way out.
    renamed = ANTHROPIC.replace('name = "anthropic"', 'name = "backup"') + (
        'baseUrlEnv = "BACKUP_URL"\ntokenEnv = "BACKUP_KEY"\n'
    )
    assert [api.name for api in load(tmp_path, job(apis=ANTHROPIC + renamed)).apis] == [
        "anthropic",
        "backup",
    ]


def test_no_variable_is_both_a_url_and_a_token(tmp_path: Path) -> None:
    text = job(
        apis=ANTHROPIC
        + '[[apis]]\nname = "o"\nupstream = "http://127.0.0.1:9/v1"\nstyle = "openai"\n'
        + 'baseUrlEnv = "ANTHROPIC_API_KEY"\ntokenEnv = "O_URL"\n'
        + '[[apis]]\nname = "p"\nupstream = "http://127.0.0.1:9"\nstyle = "plain"\n'
        + 'baseUrlEnv = "P"\ntokenEnv = "P"\n'
    )
    assert problems(tmp_path, text) == [
        "17:14: apis[1].baseUrlEnv: 'ANTHROPIC_API_KEY' is already apis[0].tokenEnv; a worker "
        "has one value per variable: set baseUrlEnv to another name",
        "24:12: apis[2].tokenEnv: 'P' is already apis[2].baseUrlEnv; a worker has one value "
        "per variable: set tokenEnv to another name",
    ]


def test_the_gateway_leaves_fanouts_own_variables_alone(tmp_path: Path) -> None:
    text = job(apis=ANTHROPIC + 'baseUrlEnv = "PATH"\ntokenEnv = "FANOUT_TOKEN"\n')
    assert problems(tmp_path, text) == [
        "13:14: apis[0].baseUrlEnv: 'PATH' is a variable fanout sets for every worker; "
        "choose another name",
        "14:12: apis[0].tokenEnv: 'FANOUT_TOKEN' is a variable fanout sets for every worker; "
        "choose another name",
    ]


SHAPE = "write it as http(s)://host[:port][/path]"


@pytest.mark.parametrize(
    ("upstream", "reason"),
    [
        ("ftp://files.example", f"'ftp://files.example' is not an http(s) URL; {SHAPE}"),
        ("api.anthropic.com", f"'api.anthropic.com' is not an http(s) URL; {SHAPE}"),
        ("http://", f"'http://' is not an http(s) URL; {SHAPE}"),
        ("https://h:port", f"'https://h:port' is not a URL; {SHAPE}"),
        ("https://h:99999", f"'https://h:99999' is not a URL; {SHAPE}"),
        (
            "https://user:sk@api.example",
            "'https://user:sk@api.example' holds credentials; put the key in keySecret's "
            "variable instead",
        ),
        ("https://h/v1?key=1", f"'https://h/v1?key=1' has a query or fragment; {SHAPE}"),
        ("https://h/#top", f"'https://h/#top' has a query or fragment; {SHAPE}"),
        ("https://h/?", f"'https://h/?' has a query or fragment; {SHAPE}"),
    ],
)
def test_upstream_is_an_http_url_without_credentials_or_query(
    tmp_path: Path, upstream: str, reason: str
) -> None:
    text = job(apis=ANTHROPIC.replace("https://api.anthropic.com", upstream))
    assert problems(tmp_path, text) == [f"11:12: apis[0].upstream: {reason}"]


@pytest.mark.parametrize(
    "upstream", ["http://127.0.0.1:8080", "https://api.openai.com/v1", "http://[::1]:9/x/"]
)
def test_upstreams_that_are_fine(tmp_path: Path, upstream: str) -> None:
    text = job(apis=ANTHROPIC.replace("https://api.anthropic.com", upstream))
    assert load(tmp_path, text).apis[0].upstream == upstream.rstrip("/")


def test_limits_are_positive_and_prices_not_negative(tmp_path: Path) -> None:
    text = job(
        apis=ANTHROPIC
        + 'requests = { limit = 0, per = "1m" }\n'
        + 'inputTokens = { limit = 10, per = "0s" }\n'
        + 'outputTokens = { limit = -5, per = "1m" }\n'
        + "maxInFlight = 0\n"
        + 'prices = { "m" = { input = -1, output = 1, cacheRead = -0.5, cacheWrite = 0 } }\n'
        + "budget = { usd = 0 }\n"
    )
    assert problems(tmp_path, text) == [
        "13:22: apis[0].requests.limit: must be at least 1, not 0",
        "14:35: apis[0].inputTokens.per: '0s' is zero; a duration must be positive",
        "15:26: apis[0].outputTokens.limit: must be at least 1, not -5",
        "16:15: apis[0].maxInFlight: must be at least 1, not 0",
        "17:28: apis[0].prices.m.input: must be at least 0, not -1",
        "17:56: apis[0].prices.m.cacheRead: must be at least 0, not -0.5",
        "18:18: apis[0].budget.usd: must be more than 0, not 0",
    ]


def test_a_window_needs_both_its_limit_and_its_period(tmp_path: Path) -> None:
    text = job(apis=ANTHROPIC + "requests = { limit = 5 }\n")
    assert problems(tmp_path, text) == ["13:1: apis[0].requests: missing required key 'per'"]


def test_plain_names_its_variables_and_keeps_no_usage(tmp_path: Path) -> None:
    text = job(
        apis='[[apis]]\nname = "p"\nupstream = "https://h"\nstyle = "plain"\n'
        'requests = { limit = 5, per = "1s" }\n'
        'inputTokens = { limit = 10, per = "1m" }\n'
        'prices = { "m" = { input = 1, output = 1 } }\n'
        "budget = { usd = 1 }\n"
    )
    usage = (
        "style 'plain' reads no usage, so token limits, prices and a budget cannot be "
        "kept; use the API's own style, or pace it by requests"
    )
    assert problems(tmp_path, text) == [
        "12:9: apis[0].style: style 'plain' has no usual variables: name the worker's "
        "variable for the gateway's URL in baseUrlEnv",
        "12:9: apis[0].style: style 'plain' has no usual variables: name the worker's "
        "variable for its token in tokenEnv",
        f"14:1: apis[0].inputTokens: {usage}",
        f"15:1: apis[0].prices: {usage}",
        f"16:1: apis[0].budget: {usage}",
    ]


def test_a_budget_needs_prices(tmp_path: Path) -> None:
    text = job(apis=ANTHROPIC + "budget = { usd = 5 }\n")
    assert problems(tmp_path, text) == [
        "13:1: apis[0].budget: a budget needs prices: without them every request costs $0 "
        "and the budget never stops anything"
    ]


def test_names_and_keys_are_checked_by_the_schema(tmp_path: Path) -> None:
    text = job(
        apis=ANTHROPIC.replace('name = "anthropic"', 'name = "Claude_1"')
        + "maxInflight = 3\n"
        + 'style2 = "x"\n'
    )
    assert problems(tmp_path, text) == [
        "10:8: apis[0].name: 'Claude_1' is not an API name (at most 63 lowercase letters, "
        "digits and '-', starting with a letter)",
        "13:1: apis[0].maxInflight: unknown key (did you mean 'maxInFlight'?)",
        "14:1: apis[0].style2: unknown key (did you mean 'style'?)",
    ]
    bad_style = job(apis=ANTHROPIC.replace('style = "anthropic"', 'style = "antropic"'))
    assert problems(tmp_path, bad_style) == [
        "12:9: apis[0].style: must be 'anthropic', 'openai', 'gemini' or 'plain', not "
        "'antropic' (did you mean 'anthropic'?)"
    ]


def test_the_resolved_job_loads_back_to_the_same_apis(tmp_path: Path) -> None:
    text = job(
        apis=ANTHROPIC
        + 'keySecret = "K"\nrequests = { limit = 50, per = "1m" }\nmaxInFlight = 2\n'
        + 'prices = { "claude-*" = { input = 3, output = 15, cacheRead = 0.3 } }\n'
        + "budget = { usd = 12.5 }\n"
    )
    loaded = load(tmp_path, text)
    resolved = tomli_w.dumps(plan.to_document(loaded))
    again = spec.load(write_job(tmp_path, resolved, "resolved.toml"))
    assert again.apis == loaded.apis


# api_keys: the real keys the gateway gets at run time.

TWO_KEYS = job(
    apis=ANTHROPIC
    + 'keySecret = "ANTHROPIC_API_KEY"\n'
    + '[[apis]]\nname = "openai"\nupstream = "https://api.openai.com/v1"\nstyle = "openai"\n'
    + 'keySecret = "OPENAI_KEY"\n'
    + '[[apis]]\nname = "open"\nupstream = "http://127.0.0.1:9"\nstyle = "plain"\n'
    + 'baseUrlEnv = "OPEN_URL"\ntokenEnv = "OPEN_TOKEN"\n'
)


def test_api_keys_are_read_from_the_environment_by_api(tmp_path: Path) -> None:
    loaded = load(tmp_path, TWO_KEYS)
    environ = {"ANTHROPIC_API_KEY": "sk-a", "OPENAI_KEY": "sk-o", "OTHER": "x"}
    # An API without keySecret is absent: the gateway sends it no key.
    assert api_keys(loaded, environ) == {"anthropic": "sk-a", "openai": "sk-o"}


def test_a_missing_api_key_is_an_environment_problem_naming_it(tmp_path: Path) -> None:
    loaded = load(tmp_path, TWO_KEYS)
    with pytest.raises(EnvironmentProblem) as caught:
        api_keys(loaded, {"OPENAI_KEY": "sk-o"})
    assert str(caught.value) == (
        "API key(s) ANTHROPIC_API_KEY not set: export them in the environment fanout runs "
        "in ([[apis]] keySecret names them)"
    )
    with pytest.raises(EnvironmentProblem) as caught:
        api_keys(loaded, {})
    assert str(caught.value) == (
        "API key(s) ANTHROPIC_API_KEY, OPENAI_KEY not set: export them in the environment "
        "fanout runs in ([[apis]] keySecret names them)"
    )
    assert caught.value.exit_code == 4


def test_a_key_two_apis_share_is_named_once(tmp_path: Path) -> None:
    shared = job(
        apis=ANTHROPIC
        + 'keySecret = "K"\n'
        + ANTHROPIC.replace('name = "anthropic"', 'name = "backup"')
        + 'keySecret = "K"\nbaseUrlEnv = "B_URL"\ntokenEnv = "B_KEY"\n'
    )
    loaded = load(tmp_path, shared)
    with pytest.raises(EnvironmentProblem, match=r"^API key\(s\) K not set: "):
        api_keys(loaded, {})
    assert api_keys(loaded, {"K": "sk"}) == {"anthropic": "sk", "backup": "sk"}


def test_the_starters_apis_example_is_a_valid_api(tmp_path: Path) -> None:
    lines = starter.text().splitlines()
    start = lines.index("# [[apis]]")
    block = []
    for line in lines[start:]:
        if not line.startswith("# "):
            break
        block.append(line.removeprefix("# "))
    loaded = load(tmp_path, job(apis="\n".join(block) + "\n"))
    assert loaded.apis[0].name == "anthropic"
    assert loaded.apis[0].budget_usd == 20.0
    assert (loaded.apis[0].base_url_env, loaded.apis[0].token_env) == (
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
    )


def test_a_wrong_type_is_reported_once_by_the_schema(tmp_path: Path) -> None:
    # network = "yes" is no boolean; baseUrlEnv = 1 is no name, and claims no default.
    text = job(
        runtime='network = "yes"\n',
        apis=ANTHROPIC
        + "baseUrlEnv = 1\n"
        + ANTHROPIC.replace('"anthropic"\nupstream', '"b"\nupstream')
        + 'tokenEnv = "B_KEY"\n',
    )
    assert problems(tmp_path, text) == [
        "8:11: runtime.network: must be true, false or 'apis', not 'yes'",
        "13:14: apis[0].baseUrlEnv: expected a string, got an integer",
    ]
