"""What requests through the gateway used and cost: prices by model glob, the ledgers
(per attempt, per run) that add up ``ApiUsage``, and the run's budgets."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase

from ..errors import SpendStopped
from ..events import Events
from ..outcome import ApiUsage
from ..quantities import usd_text
from ..spec.model import Api, Price
from .answers import TokenCounts
from .styles import error_of


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

    def cost_usd(self) -> float:
        """USD over every API."""
        return sum(u.cost_usd for u in self._usage.values())

    def all(self) -> tuple[ApiUsage, ...]:
        return tuple(self._usage.values())

    def used(self) -> tuple[ApiUsage, ...]:
        """The APIs that were called (requests > 0)."""
        return tuple(u for u in self._usage.values() if u.requests > 0)


class Accounts:
    """The run's side of the books: its ledger, the USD restored from before a resume,
    and each API's budget.  Money stopping the run is said once per API as an
    ``api.spend`` event and passed to ``stop`` (which the gateway calls once)."""

    def __init__(
        self, apis: Sequence[Api], *, events: Events, stop: Callable[[SpendStopped], None]
    ) -> None:
        self.apis = {api.name: api for api in apis}
        self.ledger = Ledger(list(self.apis))
        self.restored: dict[str, float] = {}
        self.events = events
        self.stop = stop
        # Per API whose budget is spent: what every further request of it is told.
        self.refused: dict[str, str] = {}
        self.unpriced: set[tuple[str, str | None]] = set()

    def restore(self, spent: Mapping[str, float]) -> None:
        self.restored = {name: spent.get(name, 0.0) for name in self.apis}
        for name in self.apis:
            self._check(name)

    def add(
        self,
        name: str,
        counts: TokenCounts | None,
        grant: Ledger,
        *,
        requests: int,
        queued_seconds: float,
        throttles: int,
    ) -> None:
        """One request's usage, to the attempt's ledger and the run's."""
        api = self.apis[name]
        usage = charge(
            api, counts, requests=requests, queued_seconds=queued_seconds, throttles=throttles
        )
        grant.add(usage)
        self.ledger.add(usage)
        # Tokens counted, cost not: said once per model, since a budget cannot protect
        # against what it does not price.
        model = counts.model if counts is not None else None
        if (
            counts is not None
            and (api.prices or api.budget_usd is not None)
            and price_for(api.prices, model) is None
            and (name, model) not in self.unpriced
        ):
            self.unpriced.add((name, model))
            self.events.emit("api.unpriced", api=name, model=model)
        self._check(name)

    def _check(self, name: str) -> None:
        budget = self.apis[name].budget_usd
        if budget is None or name in self.refused:
            return
        spent = self.restored.get(name, 0.0) + self.ledger.of(name).cost_usd
        if spent >= budget:
            self.refused[name] = (
                f"api {name}: the run's budget of {usd_text(budget)} is spent"
                f" ({usd_text(spent)} used);"
                " raise [[apis]] budget and `fanout run` continues"
            )
            self._stopped(name, self.refused[name])

    def upstream_refused(self, name: str, status: int, body: bytes) -> None:
        """The upstream said no for money (see ``styles.classify``): stop new starts."""
        kind, code, message = error_of(body)
        said = ", ".join(x for x in (str(status), kind, code) if x)
        self._stopped(
            name,
            f"api {name}: the upstream refused for spend, credit or quota"
            f" ({said}: {message[:300] or 'no message'}); once it accepts again,"
            " `fanout run` continues",
        )

    def _stopped(self, name: str, reason: str) -> None:
        self.events.emit("api.spend", api=name, reason=reason)
        self.stop(SpendStopped(reason))
