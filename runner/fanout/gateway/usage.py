"""What requests through the gateway used and cost: prices by model glob, the ledgers
(per attempt, per run) that add up ``ApiUsage``, each request's hold on its attempt's
ledger while it runs (its reservation, in the journal before it is sent: ``books``),
and the run's budgets."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatchcase

from ..errors import SpendStopped
from ..events import Events
from ..outcome import ApiUsage
from ..spec.model import Api, Price
from ..values.quantities import usd_text
from .answers import TokenCounts
from .books import Books, Whose
from .styles import Estimate, error_of


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


def reservation_usd(price: Price, estimate: Estimate, uncapped_output: int) -> float:
    """What a request may cost before it is answered: its estimated prompt at the
    dearest of the input prices (it may all be written to the cache) and its output cap
    (``uncapped_output`` for one that names none) at the output price."""
    read = price.input if price.cache_read is None else price.cache_read
    write = price.input if price.cache_write is None else price.cache_write
    output = uncapped_output if estimate.output_tokens is None else estimate.output_tokens
    return (
        estimate.input_tokens * max(price.input, read, write) + output * price.output
    ) / 1_000_000


class Ledger:
    """Running ``ApiUsage`` per API, in the job's order of APIs, and the requests in
    flight with what they reserved.  ``whose``: the attempt it is the ledger of, in
    the journal's terms (None: the run's)."""

    def __init__(self, apis: Sequence[str], *, whose: Whose | None = None) -> None:
        self.whose = whose
        self._usage = {name: ApiUsage(api=name) for name in apis}
        # Per API with requests in flight: how many, and the USD they reserved.
        self._held: dict[str, tuple[int, float]] = {}

    def add(self, usage: ApiUsage) -> None:
        self._usage[usage.api] = self._usage[usage.api].plus(usage)

    def hold(self, api: str, usd: float) -> None:
        count, reserved = self._held.get(api, (0, 0.0))
        self._held[api] = (count + 1, reserved + usd)

    def unhold(self, api: str, usd: float) -> None:
        count, reserved = self._held[api]
        if count == 1:  # exactly nothing left, whatever the float sums came to
            del self._held[api]
        else:
            self._held[api] = (count - 1, max(0.0, reserved - usd))

    def of(self, api: str) -> ApiUsage:
        return self._usage[api]

    def cost_usd(self) -> float:
        """USD over every API, of the requests that ended (a budget stops on what was
        spent: those in flight count once they end)."""
        return sum(u.cost_usd for u in self._usage.values())

    def all(self) -> tuple[ApiUsage, ...]:
        return tuple(self._usage.values())

    def used(self) -> tuple[ApiUsage, ...]:
        """The APIs that were called (requests > 0), each request in flight counted
        as one request at its reservation (``reserved_usd``, in ``cost_usd``): what the
        journal holds for an attempt, so a kill loses none of it."""
        found = []
        for name, usage in self._usage.items():
            if name in self._held:
                count, reserved = self._held[name]
                usage = usage.plus(
                    ApiUsage(api=name, requests=count, cost_usd=reserved, reserved_usd=reserved)
                )
            if usage.requests > 0:
                found.append(usage)
        return tuple(found)


class Hold:
    """One request's place in its attempt's books, from the gateway's first look at it
    until it is accounted: ``reserve`` before each time it is sent, then ``settle``
    with its answer's usage, or ``close`` if it ended otherwise (cancelled: its worker
    went away, or the gateway closed)."""

    def __init__(self, accounts: Accounts, name: str, ledger: Ledger) -> None:
        self._accounts = accounts
        self._name = name
        self._ledger = ledger
        self._reserved: float | None = None  # USD, once reserved
        self._sent = False
        self._done = False

    async def reserve(self, estimate: Estimate, uncapped_output: int) -> None:
        """Before the request is sent: its reservation in the ledger, and in the
        journal when this returns.  Once: sent again (after a 429), it keeps it."""
        if self._reserved is None:
            price = price_for(self._accounts.apis[self._name].prices, estimate.model)
            usd = 0.0 if price is None else reservation_usd(price, estimate, uncapped_output)
            self._reserved = usd
            self._ledger.hold(self._name, usd)
            await self._accounts.books.written(self._ledger)
        self._sent = True

    def answered(self) -> None:
        """Its answer was read (a 429 or 529 to be sent again): it is not out now."""
        self._sent = False

    def settle(
        self,
        counts: TokenCounts | None,
        *,
        requests: int,
        queued_seconds: float,
        throttles: int,
    ) -> None:
        """Its usage, as its answer reported it, replaces its reservation."""
        self._release()
        self._accounts.add(
            self._name,
            counts,
            self._ledger,
            requests=requests,
            queued_seconds=queued_seconds,
            throttles=throttles,
        )

    def close(self) -> None:
        """The request ended without ``settle``.  Sent and never answered, it counts as
        one request at its reservation (the upstream may have billed it); not sent
        (cancelled while it waited), as nothing."""
        if self._done:
            return
        sent, reserved = self._sent, self._reserved
        self._release()
        if reserved is None:
            return
        if sent:
            usage = ApiUsage(api=self._name, requests=1, cost_usd=reserved, reserved_usd=reserved)
            self._accounts.book(usage, self._ledger)
        else:  # its reservation was written: out of the journal again
            self._accounts.books.changed(self._ledger)

    def _release(self) -> None:
        assert not self._done, "a request is accounted once"
        self._done = True
        if self._reserved is not None:
            self._ledger.unhold(self._name, self._reserved)


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
        self.books = Books()

    def restore(self, spent: Mapping[str, float]) -> None:
        self.restored = {name: spent.get(name, 0.0) for name in self.apis}
        for name in self.apis:
            self._check(name)

    def hold(self, name: str, ledger: Ledger) -> Hold:
        """A request to API ``name`` for the attempt of ``ledger``, not yet sent."""
        return Hold(self, name, ledger)

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
        """One request's usage, to the attempt's ledger (and its books) and the run's."""
        api = self.apis[name]
        usage = charge(
            api, counts, requests=requests, queued_seconds=queued_seconds, throttles=throttles
        )
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
        self.book(usage, grant)

    def book(self, usage: ApiUsage, grant: Ledger) -> None:
        """``usage`` to the attempt's ledger (and its books) and the run's."""
        grant.add(usage)
        self.ledger.add(usage)
        self.books.changed(grant)
        self._check(usage.api)

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
