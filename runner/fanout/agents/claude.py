"""What a Claude Code attempt came to, read from `claude -p --output-format json` (or
stream-json: the last `result` event), as the real CLI 2.1.197 writes it (the golden
files of tests/data/agents/claude/, captured against tests/mockapi.py).

What the CLI says, and how it is read:
- `is_error` false, exit 0: success, unless `permission_denials` lists a tool call it
  refused (the silent denial of `-p` without a permission flag): false success.
- `subtype` `error_max_turns` / `error_max_budget_usd`: turn limit (`errors` says which).
- `api_error_status` and the `result` text ("API Error: Request rejected (429) · ..."):
  429 with a usage window's reset -> usage window; 429 spend limit, 400 credit balance
  or API usage limits -> spend cap; other 429 -> rate limited (the CLI drops the upstream's
  retry-after: it is not in the output; the API's message, which it prints, states the
  limit's window: "of 50 requests per minute"); 529/5xx, or no status at all (a stream that broke,
  retried and broke again) -> overloaded; anything else -> error.
- `is_error` true at exit 0 (not seen from 2.1.197; read so in case) -> false success.
- No JSON result (a job that overrode the command with text output): the exit code and
  the documented usage-limit and credit strings in the text.

Usage comes from `modelUsage` (every model the turn used, summed), not `usage`: when a
retried stream broke, or a budget stopped the turn, `usage` holds only the last request
(or zeros) while `modelUsage` and `total_cost_usd` hold what was billed."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from ..values.safetext import one_line
from . import jsonlines
from .providers import stated_window
from .taxonomy import Kind, Reading
from .usagewindows import find

DETAIL_LIMIT = 300

_SPEND = re.compile(
    r"spend limit|credit balance is too low|specified API usage limits", re.IGNORECASE
)
_OVERLOADED = re.compile(r"\boverloaded\b", re.IGNORECASE)


def read(*, exit_code: int, output: str, now: datetime) -> Reading:
    """Classify one `claude -p` attempt from its exit code and captured output."""
    result = _result(output)
    if result is None:
        return _from_text(exit_code, output, now)
    usage = _usage(result)
    text = one_line(
        str(result.get("result") or "; ".join(map(str, result.get("errors") or []))), DETAIL_LIMIT
    )
    subtype = str(result.get("subtype") or "")
    if subtype in ("error_max_turns", "error_max_budget_usd"):
        return Reading(kind=Kind.TURN_LIMIT, detail=f"{subtype}: {text}", **usage)
    if not result.get("is_error"):
        denied = [str(d.get("tool_name")) for d in result.get("permission_denials") or []]
        if exit_code == 0 and denied:
            detail = (
                f"exit 0, but the CLI denied {len(denied)} tool call(s) ({', '.join(denied)}):"
                " allow them with --allowedTools"
            )
            return Reading(kind=Kind.FALSE_SUCCESS, detail=detail, **usage)
        if exit_code == 0:
            return Reading(kind=Kind.SUCCESS, detail=text, **usage)
        return Reading(kind=Kind.ERROR, detail=f"exit {exit_code}: {text}", **usage)
    status = result.get("api_error_status")
    kind, reset_at = _api_error(status if isinstance(status, int) else None, text, now)
    if kind is Kind.ERROR and exit_code == 0:
        kind = Kind.FALSE_SUCCESS
    window = stated_window(text) if kind is Kind.RATE_LIMITED else None
    return Reading(kind=kind, detail=text, reset_at=reset_at, window=window, **usage)


def _api_error(status: int | None, text: str, now: datetime) -> tuple[Kind, float | None]:
    window = find(text, now=now)
    reset_at = window.reset_at if window else None
    if _SPEND.search(text):
        return Kind.SPEND_CAP, reset_at
    if window is not None:
        return Kind.USAGE_WINDOW, reset_at
    if status == 429:
        return Kind.RATE_LIMITED, None
    if status is not None and (status == 529 or 500 <= status < 600):
        return Kind.OVERLOADED, None
    # No status: the request never got an answer the CLI could read (a broken stream,
    # a dropped connection), after its own retries: the upstream's trouble, not the
    # unit's, so it waits and runs again on the same rung.
    if (status is None and text.startswith("API Error:")) or _OVERLOADED.search(text):
        return Kind.OVERLOADED, None
    return Kind.ERROR, None


def _from_text(exit_code: int, output: str, now: datetime) -> Reading:
    last = next((line for line in reversed(output.splitlines()) if line.strip()), "")
    if exit_code == 0:
        return Reading(kind=Kind.SUCCESS, detail=one_line(last, DETAIL_LIMIT))
    window = find(output, now=now)
    spend = _SPEND.search(output)
    if spend is not None:
        line = next(line for line in output.splitlines() if spend.group(0) in line)
        return Reading(
            kind=Kind.SPEND_CAP,
            detail=one_line(line, DETAIL_LIMIT),
            reset_at=window.reset_at if window else None,
        )
    if window is not None:
        line = next(line for line in output.splitlines() if window.said in line)
        return Reading(
            kind=Kind.USAGE_WINDOW, detail=one_line(line, DETAIL_LIMIT), reset_at=window.reset_at
        )
    return Reading(
        kind=Kind.ERROR, detail=one_line(f"exit {exit_code}: {last}".strip(), DETAIL_LIMIT)
    )


def _result(output: str) -> dict[str, Any] | None:
    """The last `{"type": "result", ...}` object on a line of its own, if any."""
    found = (value for value in jsonlines.objects(output, from_end=True))
    return next((value for value in found if value.get("type") == "result"), None)


def _usage(result: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    cost = result.get("total_cost_usd")
    if isinstance(cost, int | float):
        fields["cost_usd"] = float(cost)
    models = result.get("modelUsage")
    if isinstance(models, dict) and models:
        entries = [m for m in models.values() if isinstance(m, dict)]
        for name, key in (
            ("input_tokens", "inputTokens"),
            ("output_tokens", "outputTokens"),
            ("cache_read_tokens", "cacheReadInputTokens"),
            ("cache_write_tokens", "cacheCreationInputTokens"),
        ):
            fields[name] = sum(int(m.get(key) or 0) for m in entries)
        # The model that cost most: the one the turn ran on (a cheap one may summarise).
        fields["model"] = max(models, key=lambda n: float(models[n].get("costUSD") or 0))
        return fields
    usage = result.get("usage")
    if isinstance(usage, dict):
        for name, key in (
            ("input_tokens", "input_tokens"),
            ("output_tokens", "output_tokens"),
            ("cache_read_tokens", "cache_read_input_tokens"),
            ("cache_write_tokens", "cache_creation_input_tokens"),
        ):
            if isinstance(usage.get(key), int):
                fields[name] = usage[key]
    return fields
