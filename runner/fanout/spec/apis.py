"""The API styles a gateway speaks (``[[apis]] style``), and the facts of each that the
job file's defaults and the worker's environment depend on.

A style says how a request authenticates and where its usage is read; the gateway's
``gateway.styles`` reads usage, limits and errors per style.  The facts here are the
ones the job language needs without the gateway: which variables a worker of that style
reads its base URL and its key from (so ``baseUrlEnv`` and ``tokenEnv`` default to
them), and which header carries the real key upstream.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Style(StrEnum):
    ANTHROPIC = "anthropic"
    OPENAI = "openai"
    GEMINI = "gemini"
    # Any HTTP API: requests are paced and keys swapped, usage is not read.
    PLAIN = "plain"


@dataclass(frozen=True, slots=True)
class StyleFacts:
    # The variables the usual clients of this style read (None: the job must name one).
    base_url_env: str | None
    token_env: str | None
    # The header the real key goes upstream in, and its prefix ("Bearer ").
    key_header: str
    key_prefix: str = ""
    # Whether the API's input-tokens limit counts cached reads (Anthropic's leaves them
    # out; OpenAI's and Gemini's count the whole prompt): what an attempt takes of an
    # [[apis]] inputTokens window (``limits.pace_fields``; the gateway's own reading is
    # ``gateway.answers``).
    input_limit_counts_cache_reads: bool = True


FACTS: dict[Style, StyleFacts] = {
    # Claude Code and the Anthropic SDKs: ANTHROPIC_API_KEY is sent as x-api-key.
    # (ANTHROPIC_AUTH_TOKEN would be sent as a Bearer token; Claude Code sends both
    # headers when both are set, so a worker is given exactly one.)
    Style.ANTHROPIC: StyleFacts(
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "x-api-key",
        input_limit_counts_cache_reads=False,
    ),
    # The OpenAI SDKs, codex, llm: OPENAI_BASE_URL includes the /v1 path.
    Style.OPENAI: StyleFacts("OPENAI_BASE_URL", "OPENAI_API_KEY", "authorization", "Bearer "),
    # gemini-cli reads GOOGLE_GEMINI_BASE_URL and GEMINI_API_KEY.
    Style.GEMINI: StyleFacts("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_KEY", "x-goog-api-key"),
    Style.PLAIN: StyleFacts(None, None, "authorization", "Bearer "),
}
