"""The rate-limit headers of an upstream's answer: how long it asks us to wait
(``retry-after``, ``retry-after-ms``), how much of each limit it says remains
(``anthropic-ratelimit-*``, ``x-ratelimit-*``), and its requests limit itself
(``anthropic-ratelimit-requests-limit``, ``x-ratelimit-limit-requests``), as the
limiter's ``Remaining``.

The styles write resets three ways: Anthropic an RFC 3339 time
(``2026-12-01T14:40:59Z``), OpenAI a Go duration (``6m0s``, ``12ms``, ``1h2m3.5s``),
and some OpenAI-compatible servers plain seconds.  Every form is read whatever the
style, since gateways in front of gateways mix them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime

from ..pacing.signals import parse_retry_after
from .limiter import Remaining

_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNIT = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# The limiter's names, and the header words each style uses for them.
_KINDS = (
    ("requests", "requests"),
    ("tokens", "tokens"),
    ("input_tokens", "input-tokens"),
    ("output_tokens", "output-tokens"),
)


def go_duration(text: str) -> float | None:
    """Seconds in a Go duration (``time.Duration.String()``), or None if it is not one."""
    text = text.strip()
    parts = list(_GO_PART.finditer(text))
    if not parts or "".join(p.group(0) for p in parts) != text:
        return None
    return sum(float(p.group(1)) * _GO_UNIT[p.group(2)] for p in parts)


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value >= 0 and value == value and value != float("inf") else None


def reset_seconds(text: str, now: datetime) -> float | None:
    """Seconds from ``now`` until a ``*-reset`` value: an RFC 3339 time, a Go duration
    or plain seconds (never negative; None if unreadable)."""
    text = text.strip()
    seconds = _number(text)
    if seconds is not None:
        return seconds
    seconds = go_duration(text)
    if seconds is not None:
        return seconds
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def retry_after(headers: Mapping[str, str], now: datetime) -> float | None:
    """Seconds the upstream asks us to wait: ``retry-after-ms`` (the finer one, sent by
    OpenAI and Anthropic beside ``retry-after``) or ``retry-after`` in seconds (a
    fraction allowed) or as an HTTP date."""
    millis = headers.get("retry-after-ms")
    if millis is not None and (value := _number(millis)) is not None:
        return value / 1000
    text = headers.get("retry-after")
    if text is None:
        return None
    value = _number(text)
    return value if value is not None else parse_retry_after(text, now)


def _count(text: str | None) -> int | None:
    if text is None:
        return None
    value = _number(text)
    return int(value) if value is not None else None


def remaining(headers: Mapping[str, str], now: datetime) -> Remaining | None:
    """What the answer says is left of each limit and when it resets, and its requests
    limit, or None if it says nothing.  Anthropic's headers are read first; OpenAI's
    fill what they lack."""
    found: dict[str, tuple[int, float | None]] = {}
    for name, word in _KINDS:
        left = _count(headers.get(f"anthropic-ratelimit-{word}-remaining"))
        reset = headers.get(f"anthropic-ratelimit-{word}-reset")
        if left is None:
            left = _count(headers.get(f"x-ratelimit-remaining-{word}"))
            reset = headers.get(f"x-ratelimit-reset-{word}")
        if left is not None:
            found[name] = (left, reset_seconds(reset, now) if reset is not None else None)
    limit = _count(headers.get("anthropic-ratelimit-requests-limit"))
    if limit is None:
        limit = _count(headers.get("x-ratelimit-limit-requests"))
    if not found and limit is None:
        return None
    none: tuple[int | None, float | None] = (None, None)
    requests, tokens = found.get("requests", none), found.get("tokens", none)
    inputs, outputs = found.get("input_tokens", none), found.get("output_tokens", none)
    return Remaining(
        requests=requests[0],
        requests_reset=requests[1],
        tokens=tokens[0],
        tokens_reset=tokens[1],
        input_tokens=inputs[0],
        input_tokens_reset=inputs[1],
        output_tokens=outputs[0],
        output_tokens_reset=outputs[1],
        requests_limit=limit,
    )
