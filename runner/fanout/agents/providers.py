"""What a model provider's error text means, for the classifiers that see only an SDK's
message (aider's litellm exceptions, llm's `Error: ...` line): the Kind, and the wait or
reset the text states.  Read from the providers' documented error bodies: Anthropic's
error types (`rate_limit_error`, `overloaded_error`, "credit balance is too low"),
OpenAI's (`rate_limit_exceeded` "Please try again in 20s", `insufficient_quota`),
Gemini's (`RESOURCE_EXHAUSTED`, "Please retry in 56.2s", a quota id ending `PerDay`:
Google documents that requests-per-day quotas reset at midnight Pacific time).

Order matters: Gemini says "You exceeded your current quota" for a per-minute or per-day
quota alike, OpenAI for an account without credit; the Gemini words are looked at first."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time
from zoneinfo import ZoneInfo

from .taxonomy import Kind
from .usagewindows import find, next_wall_clock

# Where Gemini's per-day quotas turn over.
PACIFIC = ZoneInfo("America/Los_Angeles")

_SPEND = re.compile(
    r"insufficient_quota|exceeded your current quota|credit balance is too low"
    r"|spend limit|specified API usage limits|billing_hard_limit|BudgetExceededError",
    re.IGNORECASE,
)
_DAILY = re.compile(r"PerDay|requests per day|per-day quota|daily (?:quota|limit)", re.IGNORECASE)
_GEMINI_QUOTA = re.compile(r"RESOURCE_EXHAUSTED|generativelanguage\.googleapis\.com")
# Only a subscription's usage-window words make a reset a window: a plain rate limit's
# "try again in 20s" is a pause, not a window.
_WINDOW = re.compile(r"usage limit reached|hit your (?:session|weekly|usage) limit", re.IGNORECASE)
_RATE = re.compile(
    r"\b429\b|rate[_ ]limit|RateLimitError|RESOURCE_EXHAUSTED|too many requests", re.IGNORECASE
)
_OVERLOADED = re.compile(
    r"\b5(?:29|0[0234])\b|overloaded|InternalServerError|ServiceUnavailable|"
    r"APIConnectionError|Timeout|Connection error",
    re.IGNORECASE,
)
_RETRY = re.compile(
    r"(?:try again|retry) in (?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s)\b"
    r'|"retryDelay":\s*"(?P<delay>\d+(?:\.\d+)?)s"',
    re.IGNORECASE,
)


# A limit a throttle's message states, with its window: Anthropic's "would exceed the
# rate limit for your organization (...) of 50 requests per minute" (or "of 40,000
# input tokens per minute"), OpenAI's "on requests per min (RPM): Limit 3", Gemini's
# quota ids ("GenerateRequestsPerMinutePerProjectPerModel").  The window is what the
# pacing can use: which limit it was matters less than how long it counts.
_STATED = re.compile(
    r"\bof [\d,.]+ (?:input |output )?(?:requests|tokens) per "
    r"(?:(?P<count>\d+(?:\.\d+)?) )?(?P<unit>second|minute|hour)s?\b"
    r"|\b(?:requests|tokens) per (?P<short>sec|min)\b"
    r"|Per(?P<id>Second|Minute|Hour)Per",
    re.IGNORECASE,
)
_SECONDS = {"second": 1.0, "sec": 1.0, "minute": 60.0, "min": 60.0, "hour": 3600.0}


def stated_window(text: str) -> float | None:
    """Seconds of the limit a throttle's message states (None: it states none)."""
    match = _STATED.search(text)
    if match is None:
        return None
    unit = (match["unit"] or match["short"] or match["id"]).lower()
    count = float(match["count"]) if match["count"] else 1.0
    return count * _SECONDS[unit]


@dataclass(frozen=True, kw_only=True, slots=True)
class Meaning:
    kind: Kind
    retry_after: float | None = None
    reset_at: float | None = None
    window: float | None = None


def meaning(text: str, *, now: datetime) -> Meaning:
    """The Kind of one provider error message (ERROR when nothing in it says more)."""
    if _DAILY.search(text):
        midnight = next_wall_clock(time(0, 0), PACIFIC, now)
        return Meaning(kind=Kind.DAILY_QUOTA, reset_at=midnight.timestamp())
    if _GEMINI_QUOTA.search(text):
        return _rate_limited(text)
    if _SPEND.search(text):
        window = find(text, now=now)
        return Meaning(kind=Kind.SPEND_CAP, reset_at=window.reset_at if window else None)
    if _WINDOW.search(text):
        window = find(text, now=now)
        if window is not None:
            return Meaning(kind=Kind.USAGE_WINDOW, reset_at=window.reset_at)
    if _RATE.search(text):
        return _rate_limited(text)
    if _OVERLOADED.search(text):
        return Meaning(kind=Kind.OVERLOADED)
    return Meaning(kind=Kind.ERROR)


def _rate_limited(text: str) -> Meaning:
    return Meaning(
        kind=Kind.RATE_LIMITED, retry_after=_retry_after(text), window=stated_window(text)
    )


def _retry_after(text: str) -> float | None:
    match = _RETRY.search(text)
    if match is None:
        return None
    if match["delay"] is not None:
        return float(match["delay"])
    value = float(match["value"])
    return value / 1000 if match["unit"].lower() == "ms" else value
