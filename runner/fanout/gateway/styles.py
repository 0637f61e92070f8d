"""What the gateway reads from, and says in, each API style: a request's estimate, the
usage in an answer (a JSON body or a server-sent-event stream), the rate-limit headers,
which errors are worth a retry, and the error body the style's clients print.

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

from ..apistyles import Style


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


@dataclass(frozen=True, slots=True)
class TokenCounts:
    """The usage an answer reported.  ``input_tokens`` are the uncached ones."""

    model: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    # The input tokens the API's own input limit counts: Anthropic leaves cache reads
    # out of its input-tokens-per-minute limit; OpenAI and Gemini count the whole prompt.
    paced_input_tokens: int = 0


# The parts of a request body that are its prompt, per the styles' request shapes.
_PROMPT_KEYS = ("system", "messages", "tools", "input", "prompt", "contents", "systemInstruction")
# OpenAI: max_completion_tokens replaced max_tokens, and governs when both are sent.
_OUTPUT_KEYS = ("max_completion_tokens", "max_output_tokens", "max_tokens")
_GEMINI_MODEL = re.compile(r"/models/([^/:?]+)")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def estimate(style: Style, body: bytes, path: str) -> Estimate:
    """The request's model, input tokens (its prompt's JSON text / 4, rounded up: the
    usual rule of thumb for English and code) and output cap.  What is not a request
    for generated text estimates nothing: a body that is not a JSON object with a
    prompt (a GET, a model list), a token count (it produces nothing and has limits of
    its own), any request of the ``plain`` style."""
    data = _json(body)
    counting = path.split("?")[0].endswith(("/count_tokens", ":countTokens"))
    if (
        style is Style.PLAIN
        or counting
        or not isinstance(data, dict)
        or not any(key in data for key in _PROMPT_KEYS)
    ):
        return Estimate(model=None, input_tokens=0, output_tokens=0, stream=False)
    chars = sum(
        len(json.dumps(data[key], ensure_ascii=False, separators=(",", ":")))
        for key in _PROMPT_KEYS
        if key in data
    )
    output = next((_int(data.get(k)) for k in _OUTPUT_KEYS if _int(data.get(k)) is not None), None)
    if path.split("?")[0].endswith(("/embeddings", ":embedContent", ":batchEmbedContents")):
        output = 0  # an embedding's input is billed, nothing comes out
    config = data.get("generationConfig")
    if output is None and isinstance(config, dict):
        output = _int(config.get("maxOutputTokens"))
    model = data.get("model")
    if style is Style.GEMINI and not isinstance(model, str):
        found = _GEMINI_MODEL.search(path)
        model = found.group(1) if found else None
    stream = data.get("stream") is True or path.split("?")[0].endswith(":streamGenerateContent")
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
    data = _json(body)
    if not isinstance(data, dict) or data.get("stream") is not True:
        return body
    options = data.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body
    kept = options if isinstance(options, dict) else {}
    data["stream_options"] = {**kept, "include_usage": True}
    return json.dumps(data, ensure_ascii=False).encode()


class UsageReader:
    """Reads the usage of one answer as its bytes pass by: a JSON body (buffered up to
    ``LIMIT``) or an SSE stream (read event by event, nothing kept but the last line).
    ``result`` is None when the answer reported no usage."""

    LIMIT = 32 * 1024 * 1024

    def __init__(self, style: Style, *, sse: bool, model: str | None) -> None:
        self.style = style
        self.sse = sse
        self.model = model
        self._buffer = bytearray()
        self._data: list[bytes] = []
        self._fields: dict[str, int] = {}
        self._overflow = False

    def feed(self, chunk: bytes) -> None:
        if self.style is Style.PLAIN or self._overflow:
            return
        self._buffer += chunk
        if not self.sse:
            self._overflow = len(self._buffer) > self.LIMIT
            return
        *lines, rest = self._buffer.split(b"\n")
        self._buffer = bytearray(rest)
        for line in lines:
            self._line(bytes(line.rstrip(b"\r")))
        self._overflow = len(self._buffer) > self.LIMIT

    def _line(self, line: bytes) -> None:
        if not line:  # an event ends at a blank line
            if self._data:
                self._take(_json(b"\n".join(self._data)))
            self._data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(b" ") else value)

    def result(self) -> TokenCounts | None:
        if self.style is Style.PLAIN or self._overflow:
            return None
        if self.sse:
            self._line(b"")  # a stream cut before its last blank line
        else:
            data = _json(bytes(self._buffer))
            # Gemini's streamGenerateContent without alt=sse is one JSON array.
            for item in data if isinstance(data, list) else [data]:
                self._take(item)
        return _counts(self.style, self._fields, self.model) if self._fields else None

    def _take(self, event: Any) -> None:
        if not isinstance(event, dict):
            return
        if self.style is Style.ANTHROPIC:
            self._anthropic(event)
        elif self.style is Style.OPENAI:
            # The Responses API nests its answer (and usage) in ``response``.
            inner = event.get("response")
            self._usage(inner if isinstance(inner, dict) else event, "usage", replace=True)
        else:
            self._usage(event, "usageMetadata", replace=True)
            if isinstance(event.get("modelVersion"), str):
                self.model = event["modelVersion"]

    def _anthropic(self, event: Any) -> None:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            self._usage(event["message"], "usage", replace=True)
        elif kind == "message_delta":
            # Counts in message_delta are cumulative: they replace the start's.
            self._usage(event, "usage", replace=False)
        elif kind == "message":  # a JSON (not streamed) answer
            self._usage(event, "usage", replace=True)

    def _usage(self, holder: dict[str, Any], key: str, *, replace: bool) -> None:
        usage = holder.get(key)
        if not isinstance(usage, dict):
            return
        if isinstance(holder.get("model"), str):
            self.model = holder["model"]
        found = dict(_flat(usage))
        if replace:
            self._fields = found
        else:
            self._fields.update(found)


def _flat(usage: dict[str, Any], prefix: str = "") -> list[tuple[str, int]]:
    """Usage fields as ``name`` / ``details.name`` -> count."""
    pairs: list[tuple[str, int]] = []
    for name, value in usage.items():
        if isinstance(value, dict):
            pairs += _flat(value, f"{prefix}{name}.")
        elif _int(value) is not None:
            pairs.append((prefix + name, value))
    return pairs


def _counts(style: Style, f: dict[str, int], model: str | None) -> TokenCounts:
    if style is Style.ANTHROPIC:
        fresh = f.get("input_tokens", 0)
        written = f.get("cache_creation_input_tokens", 0)
        return TokenCounts(
            model=model,
            input_tokens=fresh,
            output_tokens=f.get("output_tokens", 0),
            cache_read_tokens=f.get("cache_read_input_tokens", 0),
            cache_write_tokens=written,
            paced_input_tokens=fresh + written,
        )
    if style is Style.OPENAI:
        # Chat completions say prompt/completion, the Responses API input/output; both
        # count cached tokens inside the prompt.
        prompt = f.get("prompt_tokens", f.get("input_tokens", 0))
        cached = f.get("prompt_tokens_details.cached_tokens", 0) or f.get(
            "input_tokens_details.cached_tokens", 0
        )
        output = f.get("completion_tokens", f.get("output_tokens", 0))
    else:
        prompt = f.get("promptTokenCount", 0)
        cached = f.get("cachedContentTokenCount", 0)
        # Thinking tokens are billed as output.
        output = f.get("candidatesTokenCount", 0) + f.get("thoughtsTokenCount", 0)
    cached = min(cached, prompt)
    return TokenCounts(
        model=model,
        input_tokens=prompt - cached,
        output_tokens=output,
        cache_read_tokens=cached,
        paced_input_tokens=prompt,
    )


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
    data = _json(body)
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


# The error shape each style's clients parse and print, by the gateway's own kinds.
_KINDS: dict[str, tuple[str, str]] = {
    # kind: (Anthropic/OpenAI error type, Gemini status)
    "auth": ("authentication_error", "UNAUTHENTICATED"),
    "invalid": ("invalid_request_error", "INVALID_ARGUMENT"),
    "not_found": ("not_found_error", "NOT_FOUND"),
    "upstream": ("api_error", "UNAVAILABLE"),
}


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
        code = "invalid_api_key" if kind == "auth" else None
        data = {"error": {"message": message, "type": openai, "param": None, "code": code}}
    return json.dumps(data).encode()
