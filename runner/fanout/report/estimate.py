"""The estimate of a job's next run from what its units took before: one model for
``fanout plan`` (from the job's earlier runs) and the report's compute section (from
the run itself).

- A unit that runs is expected to take what a unit of the sample (``journal.past``)
  took on average: attempts, active seconds, GiB-seconds, spend, and each API's
  requests and tokens.  A unit that runs again unchanged after it failed is expected to
  take what a failed unit took: the same inputs most likely fail the same way, through
  the whole ladder, and cost more than the average unit.
- The next run's figures are the sums over the units it runs, each unit priced by its
  group.
- Its spend's p50 and p90 are those of a sum of that many units drawn from the sample,
  by the normal approximation (mean n x m, variance n x s^2 per group): the p50 is then
  the expected spend, and the p90 is 1.28 standard deviations of the sum above it.  A
  sum of a few units is rougher than that, and a sum of many is close to it.
- A unit's own spend p50 and p90 (what one unit spent) are the sample's, nearest-rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist

from ..journal.past import ApiSums, Spread, UnitSums

GIB = 2**30
# How far above the mean of a normal distribution its 90th percentile is, in standard
# deviations (1.2816).
Z90 = NormalDist().inv_cdf(0.90)
# An API's usage fields, by the keys ``pacing.limits.pace_fields`` counts a window in.
USAGE_KEYS = ("requests", "inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens")


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiPerUnit:
    """What one unit takes of an API on average: its usage by ``USAGE_KEYS``, and its
    spend there, with the variance of that spend over the sample."""

    usage: Mapping[str, float]
    spend_usd: float
    spend_variance: float


@dataclass(frozen=True, kw_only=True, slots=True)
class PerUnit:
    """What one unit takes on average, over ``units`` units."""

    units: float
    attempts: float
    seconds: float
    # None: an attempt of the sample ran without a declared memory.
    gib_seconds: float | None
    spend_usd: float
    spend_variance: float
    apis: Mapping[str, ApiPerUnit] = field(default_factory=dict)


def _variance(squares: float, total: float, count: float) -> float:
    mean = total / count
    return max(0.0, squares / count - mean * mean)


def per_unit(sums: UnitSums, apis: Mapping[str, ApiSums] | None = None) -> PerUnit | None:
    """The average unit of a sample summed as ``sums`` (each API's usage as ``apis``,
    summed over the same units); None for a sample of no unit."""
    count = sums.units
    if count == 0:
        return None
    by_api = {
        name: ApiPerUnit(
            usage=dict(
                zip(
                    USAGE_KEYS,
                    (
                        used.requests / count,
                        used.input_tokens / count,
                        used.output_tokens / count,
                        used.cache_read_tokens / count,
                        used.cache_write_tokens / count,
                    ),
                    strict=True,
                )
            ),
            spend_usd=used.cost_usd / count,
            spend_variance=_variance(used.cost_squares, used.cost_usd, count),
        )
        for name, used in (apis or {}).items()
    }
    return PerUnit(
        units=count,
        attempts=sums.attempts / count,
        seconds=sums.seconds / count,
        gib_seconds=None if sums.byte_seconds is None else sums.byte_seconds / GIB / count,
        spend_usd=sums.spend_usd / count,
        spend_variance=_variance(sums.spend_squares, sums.spend_usd, count),
        apis=by_api,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class ApiProjection:
    """What the next run is expected to use of one API: its usage by ``USAGE_KEYS`` and
    its spend's spread."""

    usage: Mapping[str, float]
    spend: Spread


@dataclass(frozen=True, kw_only=True, slots=True)
class Projection:
    """The next run's expected figures over its ``units``."""

    units: int
    attempts: float
    seconds: float
    gib_seconds: float | None
    spend: Spread
    apis: Mapping[str, ApiProjection]

    @property
    def mean_seconds(self) -> float:
        """An attempt's mean duration."""
        return self.seconds / self.attempts if self.attempts else 0.0


def _sum_spread(mean: float, variance: float) -> Spread:
    deviation = math.sqrt(max(0.0, variance))
    return Spread(mean=mean, p50=mean, p90=mean + Z90 * deviation)


def project(groups: Sequence[tuple[int, PerUnit]]) -> Projection:
    """The next run of ``groups``: so many units, each taking what its ``PerUnit`` says
    (see the module docstring)."""
    units = sum(count for count, _ in groups)
    gib: float | None = 0.0
    for count, each in groups:
        if count and each.gib_seconds is None:
            gib = None
        elif gib is not None and each.gib_seconds is not None:
            gib += count * each.gib_seconds
    apis: dict[str, ApiProjection] = {}
    for name in sorted({name for _, each in groups for name in each.apis}):
        usage = dict.fromkeys(USAGE_KEYS, 0.0)
        mean = variance = 0.0
        for count, each in groups:
            used = each.apis.get(name)
            if used is None:
                continue
            for key in USAGE_KEYS:
                usage[key] += count * used.usage[key]
            mean += count * used.spend_usd
            variance += count * used.spend_variance
        apis[name] = ApiProjection(usage=usage, spend=_sum_spread(mean, variance))
    return Projection(
        units=units,
        attempts=sum(count * each.attempts for count, each in groups),
        seconds=sum(count * each.seconds for count, each in groups),
        gib_seconds=gib,
        spend=_sum_spread(
            sum(count * each.spend_usd for count, each in groups),
            sum(count * each.spend_variance for count, each in groups),
        ),
        apis=apis,
    )
