"""What an upstream's answer says it used, read as its bytes pass by on their way to
the worker: a JSON body, or a server-sent-event stream event by event.

Anthropic: ``message_start.message.usage`` (input, cache creation, cache read), then
``message_delta.usage`` whose counts are cumulative (they replace, not add).  OpenAI:
the last ``usage`` (chat completions: the final chunk with empty ``choices``, sent when
``stream_options.include_usage`` is set; the Responses API: ``response.usage``).
Gemini: the last ``usageMetadata``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..spec.apis import Style
from .styles import count_or_none, json_or_none


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
                self._take(json_or_none(b"\n".join(self._data)))
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
            data = json_or_none(bytes(self._buffer))
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
        elif count_or_none(value) is not None:
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
