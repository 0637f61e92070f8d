"""What ``fanout plan`` says of the pace and the APIs: the pace the tightest rate limit
allows, and each API's windows as rates, its bottleneck, prices and budget."""

from __future__ import annotations

from collections.abc import Sequence

from ..journal import KeptCeiling
from ..journal.ceilings import label
from ..pacing import limits
from ..spec import Api, Price, Spec, Window
from ..values.quantities import duration_text, format_duration


def pace_lines(spec: Spec, units: int) -> list[str]:
    paces = limits.paces(spec)
    if not paces and spec.apis:
        return [
            "Pace      no [[limits]] declared: fanout learns the pace of starts from throttles,"
            " requests wait in [[apis]]"
        ]
    if not paces:
        return ["Pace      no rate limits declared: fanout learns them from throttles"]
    lines = []
    for n, pace in enumerate(paces):
        limit = pace.limit
        per_minute = pace.tasks_per_second * 60
        mark = "  <- tightest" if n == 0 else ""
        lines.append(
            f"{'Pace' if n == 0 else '':<10}{limit.name}: {per_minute:,.4g} task(s)/min "
            f"({limit.requests} requests per {duration_text(limit.per)}, "
            f"{limit.requests_per_task} per task){mark}"
        )
    wall = limits.minimum_wall_time(spec, units)
    assert wall is not None
    lines.append(
        f"          {units:,} unit(s) x {paces[0].limit.requests_per_task} request(s) at "
        f"{paces[0].limit.requests}/{duration_text(paces[0].limit.per)}: at least "
        f"{format_duration(wall)}, {paces[0].limit.name} is the bottleneck"
        + (
            f" ({paces[0].tasks_per_window} task(s) fit a window)"
            if paces[0].limit.requests_per_task > 1
            else ""
        )
    )
    return lines


def learned_lines(learned: Sequence[KeptCeiling]) -> list[str]:
    """What the job's last runs learned of its limits (``journal.ceilings``): the next
    run starts at these paces and probes upward from them."""
    lines = []
    for n, row in enumerate(learned):
        by = f" (run {row.run})" if row.run else ""
        lines.append(f"{'Learned' if n == 0 else '':<10}{label(row.name)}: {row.text}{by}")
    if lines:
        lines.append("          the next run starts at these paces, then probes upward")
    return lines


def _per_minute(window: Window) -> float:
    return window.limit * 60 / window.per


def _amount(value: float) -> str:
    """30000.0 -> '30,000', 0.8333 -> '0.833': whole where it is, three figures else."""
    if value == int(value) or value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def api_lines(spec: Spec, missing_keys: tuple[str, ...]) -> list[str]:
    """Each API: where it goes, its windows as rates, its bottleneck and its budget.

    The job does not say how many tokens a request holds, so a token window is shown
    as the request size above which it, not the requests window, is the bottleneck:
    the plan states what it knows and the reader supplies their prompt size."""
    lines = []
    for n, api in enumerate(spec.apis):
        if api.key_secret is None:
            key = "no key sent"
        elif api.key_secret in missing_keys:
            key = f"key ${api.key_secret} NOT SET (`fanout run` refuses)"
        else:
            key = f"key ${api.key_secret}"
        lines.append(
            f"{'APIs' if n == 0 else '':<10}{api.name}: {api.upstream} (style {api.style}; "
            f"workers get {api.base_url_env}, {api.token_env}; {key})"
        )
        lines += [f"            {line}" for line in _window_lines(api)]
        lines.append(f"            {'budget':<13}{_budget_text(api)}")
    return lines


def _window_lines(api: Api) -> list[str]:
    lines = []
    requests = api.requests
    for field_name, key in limits.WINDOW_KEYS:
        window: Window | None = getattr(api, field_name)
        if window is None:
            continue
        rate = _per_minute(window)
        text = f"{window.limit:,} per {duration_text(window.per)} ({_amount(rate)}/min)"
        if requests is not None and window is not requests:
            size = _amount(rate / _per_minute(requests))
            text += f": the bottleneck above {size} {limits.WINDOW_WORDS[key]} per request"
        lines.append(f"{key:<13}{text}")
    if api.max_in_flight is not None:
        lines.append(f"{'maxInFlight':<13}{api.max_in_flight} request(s) at once")
    lines.append(f"{'bottleneck':<13}{_bottleneck_text(api)}")
    return lines


def _bottleneck_text(api: Api) -> str:
    """The tightest window by requests per minute.  A token window allows a request rate
    that depends on the size of the requests, which the job does not say: each one is
    given as the size up to which the requests window stays the tightest (input and
    output tokens are not comparable, so neither token window is ranked above the
    other)."""
    tokens = [
        (key, window)
        for field_name, key in limits.WINDOW_KEYS[1:]
        if (window := getattr(api, field_name)) is not None
    ]
    if api.requests is not None:
        rate = _per_minute(api.requests)
        text = f"requests, {_amount(rate)} request(s)/min"
        sizes = [
            f"{_amount(_per_minute(window) / rate)} {limits.WINDOW_WORDS[key]}"
            for key, window in tokens
        ]
        if sizes:
            text += f", while requests average at most {' and '.join(sizes)}"
        return text
    if tokens:
        quotients = " or ".join(
            f"{_amount(_per_minute(window))} / {limits.WINDOW_WORDS[key]} per request"
            for key, window in tokens
        )
        which = ", whichever is less" if len(tokens) > 1 else ""
        return f"tokens: requests/min = {quotients}{which} (no requests window)"
    if api.max_in_flight is not None:
        return f"maxInFlight only: no windows, at most {api.max_in_flight} request(s) at once"
    return "none: no windows and no maxInFlight, requests are only counted"


def _price_text(glob: str, price: Price) -> str:
    text = f"{glob} ${price.input:g} in, ${price.output:g} out"
    cached = [
        f"${value:g} {what}"
        for value, what in ((price.cache_read, "cache read"), (price.cache_write, "cache write"))
        if value is not None
    ]
    return text + (f", {', '.join(cached)}" if cached else "")


def _budget_text(api: Api) -> str:
    budget = f"${api.budget_usd:,.2f} per run" if api.budget_usd is not None else "none"
    if not api.prices:
        return f"{budget}; no prices: cost is not counted"
    prices = "; ".join(_price_text(glob, price) for glob, price in api.prices)
    return f"{budget}; prices per million tokens: {prices}"
