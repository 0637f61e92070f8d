"""Reading a Gemini CLI attempt (`gemini -p --output-format stream-json`, the preset's,
or `--output-format json`; gemini-cli 0.61).

What the real CLI does with `json` (captured against tests/mockapi.py,
tests/data/agents/gemini/):
- A finished turn: exit 0 and one JSON object on stdout, `{session_id, response, stats}`;
  `stats.models.<model>.tokens` counts `input` (uncached), `prompt` (input + cached),
  `candidates`, `cached`, `thoughts`, per model (the main model and any router/utility
  model it called).
- A turn that ended without an answer (an empty reply, a safety block, ...): exit 0 and
  the same object with an `error` beside the stats (`type: INVALID_STREAM`): the false
  success.
- An API failure: the object `{session_id, error: {type, message, code}}` on stderr, with
  `code` the HTTP status, and the process exits with that status (so 429 exits 173, 503
  exits 247, 400 exits 144: the status modulo 256), not 1 as the docs say.  The CLI has
  reworded Google's error by then: a per-day quota reads "You have exhausted your daily
  quota on this model.", a rate limit ends "Suggested retry after 7s.".
- The turn limit (`model.maxSessionTurns`): exit 53, error type FatalTurnLimitedError.

With `stream-json` (tests/data/agents/gemini/stream-json/) the exit codes are the same,
stdout is one JSON event a line (`init`, `message`, `tool_use`, `tool_result`, `error`,
`result`), and the last word is the `result` event, `{status, error?, stats}`:
- A finished turn: `status: success`; the answer is the assistant's `message` deltas
  after the last `tool_use` (what `json` calls `response`).
- The false success: exit 0, an `error` event (severity `error`) with the message `json`
  puts in its `error`, then `status: error` with no `error` of its own.
- An API failure: `status: error` and `error: {type, message}` without the HTTP status
  (the exit code still holds it), the message wrapped as "[API Error: <json's
  message>]", and a 429's followed by a line of advice ("Please wait and try again
  later. ...").  The stats are there, all zero when no request was answered.
- `stats` sums per model `input` (uncached), `input_tokens` (input + cached), `cached`,
  `output_tokens` (candidates only: thoughts are not in it) and `total_tokens` (every
  token, thoughts included), and names no model's role.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, time
from typing import Any
from zoneinfo import ZoneInfo

from ..values.safetext import one_line
from . import jsonlines, usagewindows
from .providers import stated_window
from .taxonomy import Kind, Reading

TURN_LIMIT_EXIT = 53
# Google's per-day quotas reset at midnight Pacific time (ai.google.dev, "Rate limits").
QUOTA_DAY_ZONE = ZoneInfo("America/Los_Angeles")
# A detail is one line; a Google error can run to kilobytes.
DETAIL_LIMIT = 400

_RETRY = re.compile(r"(?:Suggested retry after|Please retry in) ([0-9.]+)(ms|s)\b")
_DAILY = re.compile(r"exhausted your daily quota|PerDay|per day", re.IGNORECASE)
_CAPACITY = re.compile(r"exhausted your capacity|capacity exceeded|MODEL_CAPACITY_EXHAUSTED", re.I)
_OVERLOADED = re.compile(r"overloaded", re.IGNORECASE)
# Code Assist's prepaid credits, and fanout's gateway stopping an API for money (its 400s:
# a 429 would be retried by the agent).
_CREDITS = re.compile(
    r"INSUFFICIENT_G1_CREDITS_BALANCE|credit balance|budget of \S+ is spent"
    r"|refused for spend, credit or quota",
    re.IGNORECASE,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_QUOTA = re.compile(r"RESOURCE_EXHAUSTED|exceeded your current quota|Resource has been exhausted")
# stream-json's wrapping of an API error (gemini-cli's parseAndFormatApiError): the
# message json gives, then for a 429 a line of advice (which holds no `]`).
_WRAPPED = re.compile(r"\A\[API Error: (.*)\](?:\n[^\]]*)?\Z", re.DOTALL)
STREAM_EVENTS = frozenset({"init", "message", "tool_use", "tool_result", "error", "result"})


@dataclass(frozen=True, kw_only=True, slots=True)
class _Said:
    """What an attempt's output says, in either format: the answer (None: no finished
    turn in it), the error object, the usage fields of its Reading."""

    answer: str | None
    error: dict[str, Any] | None
    usage: dict[str, Any]


def read(*, exit_code: int, output: str, now: datetime) -> Reading:
    """The Reading of one attempt from its exit code and captured stdout + stderr, in
    either output format."""
    events = [e for e in jsonlines.objects(output) if e.get("type") in STREAM_EVENTS]
    said = _stream(events) if events else _json(output)
    usage, error = said.usage, said.error
    if exit_code == 0:
        if error is not None:
            return Reading(kind=Kind.FALSE_SUCCESS, detail=_message(error), **usage)
        if said.answer is None:
            return Reading(kind=Kind.SUCCESS, detail="exit 0, no JSON result", **usage)
        detail = _line(said.answer)
        return Reading(kind=Kind.SUCCESS, detail=detail or "exit 0, empty response", **usage)
    message = _message(error) if error is not None else _last_line(output)
    status = _status(error, exit_code)
    if exit_code == TURN_LIMIT_EXIT or (error or {}).get("type") == "FatalTurnLimitedError":
        return Reading(kind=Kind.TURN_LIMIT, detail=message, **usage)
    if _CREDITS.search(message):
        return Reading(kind=Kind.SPEND_CAP, detail=message, **usage)
    if _CAPACITY.search(message) or status in (503, 529) or _OVERLOADED.search(message):
        return Reading(kind=Kind.OVERLOADED, detail=message, **usage)
    if status == 429 or _QUOTA.search(message):
        if _DAILY.search(message):
            midnight = usagewindows.next_wall_clock(time(0, 0), QUOTA_DAY_ZONE, now)
            return Reading(
                kind=Kind.DAILY_QUOTA, detail=message, reset_at=midnight.timestamp(), **usage
            )
        return Reading(
            kind=Kind.RATE_LIMITED,
            detail=message,
            retry_after=_retry_after(message),
            window=stated_window(message),
            **usage,
        )
    return Reading(kind=Kind.ERROR, detail=message, **usage)


def _json(output: str) -> _Said:
    results = _results(output)
    error = next((r["error"] for r in results if isinstance(r.get("error"), dict)), None)
    answered = next((r for r in results if "response" in r), None)
    answer = str(answered["response"]) if answered else None
    return _Said(answer=answer, error=error, usage=_usage(results))


def _stream(events: list[dict[str, Any]]) -> _Said:
    result = next((e for e in reversed(events) if e["type"] == "result"), None)
    words: list[str] = []
    for event in events:
        if event["type"] == "tool_use":
            words = []  # as json's `response`: the words after the last tool call
        elif event["type"] == "message" and event.get("role") == "assistant":
            words.append(str(event.get("content") or ""))
    if result is None:
        return _Said(answer=None, error=None, usage={})
    init = next((e for e in events if e["type"] == "init"), {})
    usage = _stream_usage(result.get("stats"), init.get("model"))
    error = result.get("error")
    if isinstance(error, dict):
        return _Said(answer=None, error=error, usage=usage)
    if result.get("status") == "error":
        # The false success: its message is in the `error` event before the result.
        said = [e for e in events if e["type"] == "error" and e.get("severity") == "error"]
        message = str(said[-1].get("message") or "") if said else ""
        return _Said(answer=None, error={"message": message or "status error"}, usage=usage)
    return _Said(answer="".join(words), error=None, usage=usage)


def _stream_usage(stats: object, main: object) -> dict[str, Any]:
    """Tokens summed over every model in a stream-json result's stats; {} when none was
    counted (a failure before any answer).  Output is total minus input, which counts
    the thoughts (billed as output) that `output_tokens` leaves out.  The model is the
    one the CLI started with, if it answered, else the last one (a router's calls come
    before the main model's)."""
    models = stats.get("models") if isinstance(stats, dict) else None
    if not isinstance(models, dict) or not models:
        return {}
    totals = {"input": 0, "output": 0, "cached": 0}
    for model in models.values():
        counts = model if isinstance(model, dict) else {}
        totals["input"] += _count(counts, "input")
        totals["cached"] += _count(counts, "cached")
        total, prompt = _count(counts, "total_tokens"), _count(counts, "input_tokens")
        totals["output"] += max(_count(counts, "output_tokens"), total - prompt)
    if not any(totals.values()):
        return {}
    return {
        "input_tokens": totals["input"],
        "output_tokens": totals["output"],
        "cache_read_tokens": totals["cached"],
        "model": main if isinstance(main, str) and main in models else list(models)[-1],
    }


def _count(counts: dict[str, Any], key: str) -> int:
    value = counts.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _results(output: str) -> list[dict[str, Any]]:
    """The CLI's JSON objects in the output, in order: each starts a line with `{` (the
    CLI pretty-prints them); anything that does not parse (a log cut short) is skipped."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    for match in re.finditer(r"^\{", output, re.MULTILINE):
        try:
            value, _ = decoder.raw_decode(output, match.start())
        except ValueError:
            continue
        if isinstance(value, dict) and ({"session_id", "response", "error"} & value.keys()):
            found.append(value)
    return found


def _usage(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens summed over every model the attempt called (a router's calls are billed
    too), from the last result with stats; the model is the one in the `main` role."""
    stats = next((r["stats"] for r in reversed(results) if isinstance(r.get("stats"), dict)), None)
    models = stats.get("models") if stats else None
    if not isinstance(models, dict) or not models:
        return {}
    totals = {"input": 0, "candidates": 0, "thoughts": 0, "cached": 0}
    main: str | None = None
    for name, model in models.items():
        tokens = model.get("tokens") if isinstance(model, dict) else None
        if not isinstance(tokens, dict):
            continue
        for key in totals:
            count = tokens.get(key)
            totals[key] += count if isinstance(count, int) else 0
        roles = model.get("roles")
        if main is None or (isinstance(roles, dict) and "main" in roles):
            main = name
    return {
        "input_tokens": totals["input"],
        # Thinking tokens are billed as output.
        "output_tokens": totals["candidates"] + totals["thoughts"],
        "cache_read_tokens": totals["cached"],
        "model": main,
    }


def _message(error: dict[str, Any]) -> str:
    message = str(error.get("message") or error.get("type") or "error")
    wrapped = _WRAPPED.match(message)
    if wrapped is not None:
        message = wrapped[1]
    # A refusal the CLI did not recognise is passed on as Google's raw JSON body.
    try:
        inner = json.loads(message)
    except ValueError:
        inner = None
    if isinstance(inner, dict) and isinstance(inner.get("error"), dict):
        message = str(inner["error"].get("message") or message)
    return _line(message)


def _status(error: dict[str, Any] | None, exit_code: int) -> int | None:
    code = (error or {}).get("code")
    if isinstance(code, int) and code >= 100:
        return code
    # No JSON (cut from the log): the CLI exits with the HTTP status modulo 256.
    return {429 % 256: 429, 503 % 256: 503, 529 % 256: 529}.get(exit_code)


def _retry_after(message: str) -> float | None:
    found = _RETRY.findall(message)
    if not found:
        return None
    number, unit = found[-1]
    try:
        seconds = float(number)
    except ValueError:
        return None
    return seconds / 1000 if unit == "ms" else seconds


def _line(text: str) -> str:
    # The CLI colours some refusals (an untrusted folder) even when not on a terminal.
    return one_line(_ANSI.sub("", text), DETAIL_LIMIT, ellipsis="...")


def _last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return _line(lines[-1]) if lines else "no output"
