"""What a run's units used of the APIs through the gateway, as the report shows it:
the table per API (requests, tokens, cost, time queued, throttles the gateway
absorbed, and how much of the cost is reservations) and the usage columns of the
units table.  The figures come from the
journal's ``usage`` rows; this module only lays them out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..values import safetext
from ..values.quantities import format_duration
from ..values.quantities import usd_text as usd


def markdown(apis: Sequence[dict[str, Any]]) -> list[str]:
    """The report's "API usage" section (nothing for a run without a gateway)."""
    if not apis:
        return []
    md = safetext.for_markdown
    lines = [
        "### API usage",
        "",
        "| api | requests | input tokens | output tokens | cache read / write | cost"
        " | queued | throttles absorbed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for api in apis:
        lines.append(
            f"| {md(api['api'])} | {api['requests']} | {api['inputTokens']:,} "
            f"| {api['outputTokens']:,} | {api['cacheReadTokens']:,} / {api['cacheWriteTokens']:,} "
            f"| {usd(api['costUsd'])} | {format_duration(api['queuedSeconds'])} "
            f"| {api['throttles']} |"
        )
    if len(apis) > 1:
        lines.append(
            f"| **total** | {sum(a['requests'] for a in apis)} "
            f"| {sum(a['inputTokens'] for a in apis):,} | {sum(a['outputTokens'] for a in apis):,} "
            f"| | {usd(sum(a['costUsd'] for a in apis))} | | {sum(a['throttles'] for a in apis)} |"
        )
    # A journal from before reservations has none (its report.json neither).
    reserved = sum(a.get("reservedUsd", 0.0) for a in apis)
    if reserved > 0:
        lines += [
            "",
            f"Of the cost, {usd(reserved)} is the reservation of requests whose answers"
            " fanout never read (its coordinator was killed, or their worker went away, while"
            " they ran): each one's prompt estimate and output cap at the model's price, likely"
            " more than the upstream billed, counted so that a budget errs early.",
        ]
    return [*lines, ""]


def unit_columns() -> tuple[str, str]:
    """The units table's usage columns: their heads and their alignment row."""
    return " requests | tokens in / out | cost |", " ---: | ---: | ---: |"


def unit_cells(usage: Sequence[dict[str, Any]]) -> str:
    """One unit's usage cells, summed over the APIs it called (input counts cached
    tokens too: what the model read)."""
    requests = sum(u["requests"] for u in usage)
    read = sum(u["inputTokens"] + u["cacheReadTokens"] + u["cacheWriteTokens"] for u in usage)
    written = sum(u["outputTokens"] for u in usage)
    cost = sum(u["costUsd"] for u in usage)
    return f" {requests} | {read:,} / {written:,} | {usd(cost)} |"
