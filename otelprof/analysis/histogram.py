"""Prometheus's ``histogram_quantile`` on explicit bucket counts, so offline and live agree exactly.

Same algorithm as Prometheus 2.x (``promql/quantile.go``): cumulative buckets sorted by upper
bound, linear interpolation inside the bucket holding the rank ``q * count``, 0 as the lower
edge of the first bucket, and the second-highest bound when the rank falls into ``+Inf``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence


def cumulative_counts(values: Iterable[float], bounds: Sequence[float]) -> list[float]:
    """Cumulative counts per upper bound (``le`` semantics), plus the ``+Inf`` bucket last."""
    counts = [0.0] * (len(bounds) + 1)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    total = 0.0
    for i, count in enumerate(counts):
        total += count
        counts[i] = total
    return counts


def bucket_quantile(q: float, bounds: Sequence[float], cumulative: Sequence[float]) -> float:
    """``histogram_quantile(q, ...)`` for ``cumulative`` counts at ``bounds`` (+ a final ``+Inf`` count)."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    counts = list(cumulative)
    for i in range(1, len(counts)):  # ensureMonotonic
        if counts[i] < counts[i - 1]:
            counts[i] = counts[i - 1]
    return monotonic_quantile(q, bounds, counts)


def monotonic_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """:func:`bucket_quantile` for cumulative ``counts`` that never decrease (``ensureMonotonic`` has nothing to
    do) and ``0 <= q <= 1``: what the offline checks ask for every window of every series."""
    observations = counts[-1]
    if not bounds or observations == 0:
        return math.nan
    rank = q * observations
    last = len(counts) - 1
    b = bisect.bisect_left(counts, rank, 0, last)  # the first bucket holding the rank, else +Inf's
    if b == last:
        return bounds[-1]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start, end, count = 0.0, bounds[b], counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    if count == 0:  # q = 0 with an empty first bucket: Prometheus computes 0/0, i.e. NaN
        return math.nan
    return start + (end - start) * (rank / count)
