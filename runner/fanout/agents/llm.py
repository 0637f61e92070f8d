"""What an `llm` (simonw/llm) attempt came to.  No llm CLI runs in the tests: this reads
its documented output only.  llm prints the model's answer to stdout and, with `-u`,
`Token usage: 1,234 input, 56 output[, {details}]` to stderr; any failure (the provider
SDK's exception included, e.g. openai's `Error code: 429 - {...}`) is click's
`Error: <message>` on stderr with exit 1.  The message is read by `providers`."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from ..values.safetext import one_line
from .providers import meaning
from .taxonomy import Kind, Reading

DETAIL_LIMIT = 300

_USAGE = re.compile(r"^Token usage: (?P<input>[\d,]+) input, (?P<output>[\d,]+) output", re.M)
_ERROR = re.compile(r"^Error: (?P<message>.*)$", re.M)


def read(*, exit_code: int, output: str, now: datetime) -> Reading:
    """Classify one `llm` attempt from its exit code and captured output."""
    tokens: dict[str, Any] = {}
    usages = list(_USAGE.finditer(output))
    if usages:
        tokens = {
            "input_tokens": sum(int(m["input"].replace(",", "")) for m in usages),
            "output_tokens": sum(int(m["output"].replace(",", "")) for m in usages),
        }
    errors = list(_ERROR.finditer(output))
    if exit_code == 0 and not errors:
        said = [line for line in output.splitlines() if line.strip()]
        last = next((line for line in reversed(said) if not _USAGE.match(line)), "")
        return Reading(kind=Kind.SUCCESS, detail=one_line(last, DETAIL_LIMIT), **tokens)
    if not errors:
        last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
        return Reading(
            kind=Kind.ERROR, detail=one_line(f"exit {exit_code}: {last}", DETAIL_LIMIT), **tokens
        )
    message = errors[-1]["message"]
    found = meaning(message, now=now)
    kind = found.kind
    if kind is Kind.ERROR and exit_code == 0:
        kind = Kind.FALSE_SUCCESS
    return Reading(
        kind=kind,
        detail=one_line(f"Error: {message}", DETAIL_LIMIT),
        retry_after=found.retry_after,
        reset_at=found.reset_at,
        window=found.window,
        **tokens,
    )
