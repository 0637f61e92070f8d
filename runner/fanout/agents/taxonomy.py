"""What an agent CLI's attempt came to, one vocabulary for every agent: the Kind (each
mapped by `verdict` to what the dispatcher does) and the Reading a classifier returns."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """The class of one attempt, with the dispatcher's action for it."""

    SUCCESS = "success"  # -> succeeded
    FALSE_SUCCESS = "false-success"  # exit 0 with an error in the result -> failed, climbs
    OVERLOADED = "overloaded"  # 529 / "overloaded" -> throttled, same rung, backoff only
    RATE_LIMITED = "rate-limited"  # 429 -> throttled, pause (retry_after if said)
    USAGE_WINDOW = "usage-window"  # "resets 3:45pm (...)" -> parked until reset_at + jitter
    DAILY_QUOTA = "daily-quota"  # that API stops for the run, resumable
    SPEND_CAP = "spend-cap"  # spend cap / no credit -> no new starts (SpendStopped)
    TURN_LIMIT = "turn-limit"  # error_max_turns, error_max_budget_usd -> failed, climbs
    ERROR = "error"  # anything else -> failed


@dataclass(frozen=True, kw_only=True, slots=True)
class Reading:
    """One attempt as its agent reported it.  `detail` is one line, in the agent's words;
    `retry_after` is seconds (rate limits), `reset_at` epoch seconds (usage windows,
    quotas), `window` the seconds of the limit a rate limit's message states ("of 50
    requests per minute": 60, see `providers.stated_window`).  The usage fields are
    what the agent said it used, None where it did not."""

    kind: Kind
    detail: str
    retry_after: float | None = None
    reset_at: float | None = None
    window: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cost_usd: float | None = None
    model: str | None = None
