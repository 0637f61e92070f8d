"""The Codex CLI's attempt (`codex exec --json`) as a Reading.

`codex exec --json` prints one JSON event a line on stdout: thread.started, turn.started,
item.* (commands, messages, and `error` items that are warnings: "Model metadata for
`x` not found" comes on every run against a gateway's model name), then turn.completed
with the turn's usage, or an `error` event and turn.failed with the error's message.
Codex 0.171 exits 1 beside turn.failed, but the issue reports releases that exit 0
there, so the events decide, not the exit code: a turn.failed is the class of its
message whatever the exit code, and an exit 0 beside a failure nothing here recognises
is a false success.  The messages are Codex's own renderings of the API's answer
(captured from the real binary against tests/mockapi.py, tests/data/agents/codex/):

    You've hit your usage limit. ... try again at 5:40 PM.    ChatGPT usage_limit_reached
    Quota exceeded. Check your plan and billing details.     429 insufficient_quota
    exceeded retry limit, last status: 429 Too Many Requests 429 (the retry-after is lost)
    unexpected status 503 Service Unavailable: ...           5xx, "overloaded"
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..values.safetext import one_line
from . import usagewindows
from .providers import stated_window
from .taxonomy import Kind, Reading

# A detail is one line of a report: a message longer than this is cut.
DETAIL_LIMIT = 300

_USAGE_WINDOW = re.compile(r"usage limit|usage_limit_reached", re.IGNORECASE)
_QUOTA = re.compile(r"quota exceeded|insufficient_quota|billing details", re.IGNORECASE)
_RATE = re.compile(r"\b429\b|too many requests|rate.?limit", re.IGNORECASE)
_OVERLOADED = re.compile(r"\b(?:503|529)\b|overloaded|service unavailable", re.IGNORECASE)
# Codex's context-window refusal: a bigger rung (a model with a larger window) may do.
_CONTEXT = re.compile(r"context window|context_length_exceeded", re.IGNORECASE)
# "Please try again in 1.5s" / "in 250ms" (the API's rate-limit message, kept by Codex).
_RETRY_IN = re.compile(r"try again in\s+(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)\b", re.IGNORECASE)


@dataclass(kw_only=True, slots=True)
class _Events:
    completed: bool = False
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    message: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    other: list[str] = field(default_factory=list)


def read(*, exit_code: int, output: str, now: datetime) -> Reading:
    """What a `codex exec --json` attempt came to; `output` is its stdout and stderr."""
    events = _events(output)
    usage = _usage(events.usage)
    failure = events.failures[-1] if events.failures else None
    if failure is None and exit_code == 0 and events.completed:
        return Reading(
            kind=Kind.SUCCESS,
            detail=one_line(events.message or "turn completed", DETAIL_LIMIT),
            **usage,
        )
    if failure is None and exit_code == 0:
        return Reading(
            kind=Kind.FALSE_SUCCESS,
            detail="codex exited 0 without turn.completed",
            **usage,
        )
    said = failure or (events.errors[-1] if events.errors else None)
    if said is None:
        said = _last_words(events.other)
        said = f"codex exited {exit_code}" + (f": {said}" if said else "")
    reading = _classify(said, now=now, usage=usage)
    if exit_code == 0 and reading.kind is Kind.ERROR:
        return Reading(kind=Kind.FALSE_SUCCESS, detail=reading.detail, **usage)
    return reading


def _classify(said: str, *, now: datetime, usage: dict[str, Any]) -> Reading:
    detail = one_line(said, DETAIL_LIMIT)
    if _USAGE_WINDOW.search(said):
        # Codex prints "try again at 5:46 PM" in its own TZ, which the preset pins to
        # UTC: on an SSH host the coordinator's zone would be a guess.
        window = usagewindows.find(said, now=now.astimezone(UTC))
        reset_at = None if window is None else window.reset_at
        return Reading(kind=Kind.USAGE_WINDOW, detail=detail, reset_at=reset_at, **usage)
    if _QUOTA.search(said):
        # OpenAI's insufficient_quota: the account has no credit left, which waiting
        # does not cure: the run stops new starts, resumable once someone pays.
        return Reading(kind=Kind.SPEND_CAP, detail=detail, **usage)
    if _RATE.search(said):
        retry = _RETRY_IN.search(said)
        after = None
        if retry is not None:
            after = float(retry["n"]) / (1000 if retry["unit"].lower() == "ms" else 1)
        return Reading(
            kind=Kind.RATE_LIMITED,
            detail=detail,
            retry_after=after,
            window=stated_window(said),
            **usage,
        )
    if _OVERLOADED.search(said):
        return Reading(kind=Kind.OVERLOADED, detail=detail, **usage)
    if _CONTEXT.search(said):
        return Reading(kind=Kind.TURN_LIMIT, detail=detail, **usage)
    return Reading(kind=Kind.ERROR, detail=detail, **usage)


def _events(output: str) -> _Events:
    found = _Events()
    for line in output.splitlines():
        event = _json(line)
        if event is None:
            found.other.append(line)
            continue
        kind = event.get("type")
        if kind == "turn.completed":
            found.completed = True
            usage = event.get("usage")
            if isinstance(usage, dict):
                for name, value in usage.items():
                    if isinstance(value, int):
                        found.usage[name] = found.usage.get(name, 0) + value
        elif kind == "turn.failed":
            error = event.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            found.failures.append(message if isinstance(message, str) else "turn failed")
        elif kind == "error" and isinstance(event.get("message"), str):
            found.errors.append(event["message"])
        elif kind == "item.completed":
            item = event.get("item")
            if isinstance(item, dict) and item.get("type") == "agent_message":
                text = item.get("text")
                found.message = text if isinstance(text, str) else found.message
    return found


def _json(line: str) -> dict[str, Any] | None:
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) and isinstance(value.get("type"), str) else None


def _usage(usage: dict[str, int]) -> dict[str, Any]:
    """Codex's turn usage as the Reading's fields.  Its `input_tokens` includes the cached
    ones (OpenAI's count); the Reading's is the uncached input, as Anthropic counts it
    and as the gateway records it, so the two sum alike in the report."""
    if not usage:
        return {}
    cached = usage.get("cached_input_tokens", 0)
    return {
        "input_tokens": usage.get("input_tokens", 0) - cached,
        "output_tokens": usage.get("output_tokens", 0),
        "cache_read_tokens": cached,
        "cache_write_tokens": usage.get("cache_write_input_tokens", 0),
    }


def _last_words(lines: list[str]) -> str:
    """What a codex that printed no event said last: its last `error:` line (clap's
    usage errors end in a usage banner), else its last line."""
    said = [line.strip() for line in lines if line.strip()]
    errors = [line for line in said if line.lower().startswith("error")]
    return (errors or said or [""])[-1]
