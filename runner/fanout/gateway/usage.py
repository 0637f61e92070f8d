"""What requests through the gateway used and cost: prices by model glob, and the
ledgers (per attempt, per run) that add up ``ApiUsage``."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from ..outcome import ApiUsage
from ..spec.model import Api, Price
from .styles import TokenCounts


def price_for(prices: Sequence[tuple[str, Price]], model: str | None) -> Price | None:
    """The price of the first glob (in job-file order) that matches ``model`` whole and
    case-sensitively (``claude-sonnet-*``; ``*`` also crosses a ``/``, as in
    ``openrouter/anthropic/...``).  None: the model is not priced."""
    if model is None:
        return None
    return next((price for glob, price in prices if fnmatchcase(model, glob)), None)


def cost_usd(price: Price, counts: TokenCounts) -> float:
    """USD for ``counts`` at ``price`` (per million tokens); cached reads and writes at
    their own prices, which default to the input price."""
    read = price.input if price.cache_read is None else price.cache_read
    write = price.input if price.cache_write is None else price.cache_write
    return (
        counts.input_tokens * price.input
        + counts.output_tokens * price.output
        + counts.cache_read_tokens * read
        + counts.cache_write_tokens * write
    ) / 1_000_000


def charge(
    api: Api,
    counts: TokenCounts | None,
    *,
    requests: int,
    queued_seconds: float,
    throttles: int,
) -> ApiUsage:
    """One request's ``ApiUsage`` (with its retries: ``requests`` sent upstream).  No
    counts (the answer reported no usage, or an error) costs nothing: fanout bills only
    what the API said it used."""
    price = price_for(api.prices, counts.model) if counts is not None else None
    return ApiUsage(
        api=api.name,
        requests=requests,
        input_tokens=counts.input_tokens if counts else 0,
        output_tokens=counts.output_tokens if counts else 0,
        cache_read_tokens=counts.cache_read_tokens if counts else 0,
        cache_write_tokens=counts.cache_write_tokens if counts else 0,
        cost_usd=cost_usd(price, counts) if price is not None and counts is not None else 0.0,
        queued_seconds=queued_seconds,
        throttles=throttles,
    )


class Ledger:
    """Running ``ApiUsage`` per API, in the job's order of APIs."""

    def __init__(self, apis: Sequence[str]) -> None:
        self._usage = {name: ApiUsage(api=name) for name in apis}

    def add(self, usage: ApiUsage) -> None:
        self._usage[usage.api] = self._usage[usage.api].plus(usage)

    def of(self, api: str) -> ApiUsage:
        return self._usage[api]

    def all(self) -> tuple[ApiUsage, ...]:
        return tuple(self._usage.values())

    def used(self) -> tuple[ApiUsage, ...]:
        """The APIs that were called (requests > 0)."""
        return tuple(u for u in self._usage.values() if u.requests > 0)
