"""What an aider attempt (`aider --message ...`) came to.  No aider CLI runs in the
tests: this reads its documented output only.  aider calls models through litellm and
prints a failed call as the exception's text, `litellm.RateLimitError: AnthropicException
- {...}` (aider/exceptions.py lists the classes), then either `Retrying in 0.5 seconds...`
(it retries the retryable ones, doubling the wait up to 60 s) or gives up on that message,
and in --message mode still exits 0.  After each answer it prints `Tokens: 2.5k sent,
1.2k cache write, 3.4k cache hit, 118 received. Cost: $0.0092 message, $0.0125 session.`

So: the last litellm error (its text up to aider's next line) not followed by a `Tokens:`
line (an answer came after it: the retry worked) decides; none, exit 0: success.  Token
counts are aider's rounded ones ("2.5k" reads as 2500); the cost is the last session
total."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from ..values.safetext import one_line
from .providers import meaning
from .taxonomy import Kind, Reading

DETAIL_LIMIT = 300

_ERROR = re.compile(r"^.*\blitellm\.(?P<name>\w+):.*$", re.M)
_END = re.compile(r"^(?:The API provider|Retrying in|Tokens: |litellm\.)|\n\s*\n", re.M)
_TOKENS = re.compile(
    r"^Tokens: (?P<sent>[\d.,]+k?) sent"
    r"(?:, (?P<write>[\d.,]+k?) cache write)?(?:, (?P<hit>[\d.,]+k?) cache hit)?"
    r", (?P<received>[\d.,]+k?) received\."
    r"(?: Cost: \$[\d.]+ (?:message|request), \$(?P<session>[\d.]+) session\.)?",
    re.M,
)


def read(*, exit_code: int, output: str, now: datetime) -> Reading:
    """Classify one aider attempt from its exit code and captured output."""
    answers = list(_TOKENS.finditer(output))
    usage = _usage(answers)
    errors = list(_ERROR.finditer(output))
    last_answer = answers[-1].start() if answers else -1
    error = errors[-1] if errors and errors[-1].start() > last_answer else None
    if error is None:
        last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
        if exit_code == 0:
            return Reading(kind=Kind.SUCCESS, detail=one_line(last, DETAIL_LIMIT), **usage)
        return Reading(
            kind=Kind.ERROR, detail=one_line(f"exit {exit_code}: {last}", DETAIL_LIMIT), **usage
        )
    # The exception's text runs on over lines when the body is pretty-printed JSON
    # (Gemini's): up to aider's own next line.
    end = _END.search(output, error.end())
    text = output[error.start() : end.start() if end else len(output)]
    found = meaning(text, now=now)
    kind = found.kind
    if kind is Kind.ERROR and exit_code == 0:
        kind = Kind.FALSE_SUCCESS  # aider gave up on the call and still exited 0
    return Reading(
        kind=kind,
        detail=one_line(text, DETAIL_LIMIT),
        retry_after=found.retry_after,
        reset_at=found.reset_at,
        window=found.window,
        **usage,
    )


def _usage(answers: list[re.Match[str]]) -> dict[str, Any]:
    if not answers:
        return {}
    usage: dict[str, Any] = {
        "input_tokens": sum(_count(m["sent"]) for m in answers),
        "output_tokens": sum(_count(m["received"]) for m in answers),
        "cache_write_tokens": sum(_count(m["write"]) for m in answers),
        "cache_read_tokens": sum(_count(m["hit"]) for m in answers),
    }
    sessions = [m["session"] for m in answers if m["session"]]
    if sessions:
        usage["cost_usd"] = float(sessions[-1])
    return usage


def _count(text: str | None) -> int:
    if not text:
        return 0
    text = text.replace(",", "")
    return round(float(text[:-1]) * 1000) if text.endswith("k") else int(float(text))
