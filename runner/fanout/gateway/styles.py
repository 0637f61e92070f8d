"""What the gateway reads from, and says in, each API style: a request's estimate, the
one change it makes to a body, which errors are worth a retry, and the error body the
style's clients print.  (An answer's usage is read by ``answers``, its rate-limit
headers by ``ratelimits``.)

Classification reads the body, not only the status, because the status lies both ways:
Anthropic's monthly spend cap is a 429 ``rate_limit_error`` that no retry fixes
(``error.details.error_code`` = ``enforced_spend_limit_reached``), OpenAI's exhausted
quota is a 429 ``insufficient_quota``, and a 400 may mean "no credit left".
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..spec.apis import Style


class Verdict(StrEnum):
    FORWARD = "forward"  # the worker gets the answer as it is
    RETRY = "retry"  # the API is busy or throttling: wait, send the same request again
    SPEND = "spend"  # money or quota ran out: pass it on and stop new starts


@dataclass(frozen=True, slots=True)
class Estimate:
    """What a request will likely use, known before it is sent."""

    model: str | None
    input_tokens: int
    # The output the request may produce at most (max_tokens); None: a request for
    # generated text that names no cap.
    output_tokens: int | None
    stream: bool


# The parts of a request body that are its prompt, per the styles' request shapes.
_PROMPT_KEYS = ("system", "messages", "tools", "input", "prompt", "contents", "systemInstruction")
# OpenAI: max_completion_tokens replaced max_tokens, and governs when both are sent.
_OUTPUT_KEYS = ("max_completion_tokens", "max_output_tokens", "max_tokens")
_GEMINI_MODEL = re.compile(r"/models/([^/:?]+)")


def json_or_none(body: bytes) -> Any:
    """The JSON in ``body``, or None if there is none."""
    try:
        return json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None


def count_or_none(value: Any) -> int | None:
    """``value`` if it is a count (an int >= 0, not a bool)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def estimate(style: Style, body: bytes, path: str) -> Estimate:
    """The request's model, input tokens (its prompt's JSON text / 4, rounded up: the
    usual rule of thumb for English and code) and output cap.  What is not a request
    for generated text estimates nothing: a body that is not a JSON object with a
    prompt (a GET, a model list), a token count (it produces nothing and has limits of
    its own), any request of the ``plain`` style."""
    data = json_or_none(body)
    route = path.split("?")[0]
    if (
        style is Style.PLAIN
        or route.endswith(("/count_tokens", ":countTokens"))
        or not isinstance(data, dict)
        or not any(key in data for key in _PROMPT_KEYS)
    ):
        return Estimate(model=None, input_tokens=0, output_tokens=0, stream=False)
    chars = sum(
        len(json.dumps(data[key], ensure_ascii=False, separators=(",", ":")))
        for key in _PROMPT_KEYS
        if key in data
    )
    config = data.get("generationConfig")
    caps = [data.get(key) for key in _OUTPUT_KEYS]
    caps.append(config.get("maxOutputTokens") if isinstance(config, dict) else None)
    output = next((cap for cap in map(count_or_none, caps) if cap is not None), None)
    if route.endswith(("/embeddings", ":embedContent", ":batchEmbedContents")):
        output = 0  # an embedding's input is billed, nothing comes out
    model = data.get("model")
    if style is Style.GEMINI and not isinstance(model, str):
        found = _GEMINI_MODEL.search(route)
        model = found.group(1) if found else None
    stream = data.get("stream") is True or route.endswith(":streamGenerateContent")
    return Estimate(
        model=model if isinstance(model, str) else None,
        input_tokens=math.ceil(chars / 4),
        output_tokens=output,
        stream=stream,
    )


def prepared(style: Style, path: str, body: bytes) -> bytes:
    """The body to send upstream.  The one change the gateway ever makes: an OpenAI
    chat or completions request that streams without ``stream_options.include_usage``
    gets it, since only then does the stream report usage (one last chunk with empty
    ``choices``, which clients skip).  The Responses API reports usage unasked."""
    if style is not Style.OPENAI or not path.split("?")[0].endswith("/completions"):
        return body
    data = json_or_none(body)
    if not isinstance(data, dict) or data.get("stream") is not True:
        return body
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body
    kept = options if isinstance(options, dict) else {}
    data["stream_options"] = {**kept, "include_usage": True}
    return json.dumps(data, ensure_ascii=False).encode()


# OpenAI's 429 codes that mean money, not speed (its spend-limits guide and the
# insufficient_quota family): retrying cannot help before someone pays.
_OPENAI_SPEND = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "organization_usage_limit_exceeded",
    }
)
# Anthropic's 400 messages for a spend limit the organization set, and for no credit.
_ANTHROPIC_SPEND = ("you have reached your specified api usage limits", "credit balance is too low")


def error_of(body: bytes) -> tuple[str, str, str]:
    """(type, code, message) of an error body in any style's shape ("" where absent)."""
    data = json_or_none(body)
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return "", "", ""
    details = error.get("details")
    code = error.get("code")
    if isinstance(details, dict) and isinstance(details.get("error_code"), str):
        code = details["error_code"]  # Anthropic's spend cap says it here
    kind = error.get("type", error.get("status"))
    message = error.get("message")
    return (
        kind if isinstance(kind, str) else "",
        code if isinstance(code, str) else "",
        message if isinstance(message, str) else "",
    )


def classify(style: Style, status: int, body: bytes) -> Verdict:
    """Whether an error answer is retried by the gateway, stops the run's spending, or
    goes to the worker as it is (401, 403, 404, other 400s and 5xx: retrying cannot fix
    them, or the worker's own client knows better)."""
    kind, code, message = error_of(body)
    if style is Style.ANTHROPIC:
        if (status == 429 and code == "enforced_spend_limit_reached") or (
            status == 402 and kind == "billing_error"
        ):
            return Verdict.SPEND
        if status == 400 and kind == "invalid_request_error":
            lowered = message.lower()
            if any(text in lowered for text in _ANTHROPIC_SPEND):
                return Verdict.SPEND
    if style is Style.OPENAI and status == 429 and (kind in _OPENAI_SPEND or code in _OPENAI_SPEND):
        return Verdict.SPEND
    # 429 (too many requests) and 529 (Anthropic's "overloaded", for everyone) pass.
    return Verdict.RETRY if status in (429, 529) else Verdict.FORWARD


MIB = 1024 * 1024
# The largest request body the gateway passes, per style: the API's own documented
# limit (Anthropic's Messages API 32 MB, OpenAI's 50 MB a request, Gemini's 100 MB of
# inline data), in MiB so that it errs on the side of passing; a plain API's is not
# known, and agents' requests are conversations far below it.  A larger body is
# refused with 413 before it is read (or as soon as it passes the cap, when its
# length was not declared): the upstream would refuse it anyway.
MAX_BODY: dict[Style, int] = {
    Style.ANTHROPIC: 32 * MIB,
    Style.OPENAI: 50 * MIB,
    Style.GEMINI: 100 * MIB,
    Style.PLAIN: 32 * MIB,
}

# The error shape each style's clients parse and print, by the gateway's own kinds.
_KINDS: dict[str, tuple[str, str]] = {
    # kind: (Anthropic/OpenAI error type, Gemini status)
    "auth": ("authentication_error", "UNAUTHENTICATED"),
    "invalid": ("invalid_request_error", "INVALID_ARGUMENT"),
    "not_found": ("not_found_error", "NOT_FOUND"),
    "upstream": ("api_error", "UNAVAILABLE"),
    "too_large": ("request_too_large", "INVALID_ARGUMENT"),
    "timeout": ("invalid_request_error", "DEADLINE_EXCEEDED"),
    "busy": ("rate_limit_error", "RESOURCE_EXHAUSTED"),
}
# OpenAI's error code for each kind that has one.
_OPENAI_CODES = {"auth": "invalid_api_key", "busy": "rate_limit_exceeded"}


def error_body(style: Style, status: int, kind: str, message: str) -> bytes:
    """An error the gateway itself answers, shaped as the style's API shapes its own
    (so the agent prints ``message`` instead of a parse failure)."""
    name, gemini = _KINDS[kind]
    data: dict[str, Any]
    if style is Style.ANTHROPIC:
        data = {"type": "error", "error": {"type": name, "message": message}}
    elif style is Style.GEMINI:
        data = {"error": {"code": status, "message": message, "status": gemini}}
    else:
        openai = "server_error" if kind == "upstream" else "invalid_request_error"
        code = _OPENAI_CODES.get(kind)
        data = {"error": {"message": message, "type": openai, "param": None, "code": code}}
    return json.dumps(data).encode()
