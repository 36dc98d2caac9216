"""Descriptive statistics shared by the report's sections: quantiles, box plots, histograms, series.

Quantiles interpolate linearly between closest ranks (rank ``q * (n - 1)``), numpy's default and
what the original profiling report used, so figures can be checked by hand.
"""

from __future__ import annotations

import bisect
import math
import operator
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import mul, sub


def finite(values: Iterable[float]) -> list[float]:
    """The values that are numbers (NaN marks "not sampled" in the recording's columns)."""
    data: Sequence[float] = values if isinstance(values, (list, tuple)) else list(values)
    if math.isfinite(sum(data)):  # NaN and infinities carry into the sum: all are numbers (most columns)
        return list(data) if data is values or not isinstance(data, list) else data
    return list(compress(data, map(math.isfinite, data)))


def sorted_finite(values: Iterable[float]) -> list[float]:
    """``sorted(finite(values))`` with one copy fewer."""
    data = values if isinstance(values, (list, tuple, array)) else list(values)
    if math.isfinite(sum(data)):
        return sorted(data)
    return sorted(compress(data, map(math.isfinite, data)))


def quantile(ordered: Sequence[float], q: float) -> float:
    """Quantile ``q`` (0..1) of sorted values, linear interpolation; NaN when empty."""
    n = len(ordered)
    if n == 0:
        return math.nan
    h = (n - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])


@dataclass(frozen=True)
class Distribution:
    """Summary of a set of values (NaN fields when there are none)."""

    count: int
    mean: float
    std: float
    """Population standard deviation."""
    min: float
    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        ordered = sorted_finite(values)
        n = len(ordered)
        if n == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan)
        mean = math.fsum(ordered) / n
        deviations = list(map(sub, ordered, repeat(mean)))
        std = math.sqrt(max(math.fsum(map(mul, deviations, deviations)) / n, 0.0))
        return cls(n, mean, std, ordered[0], quantile(ordered, 0.5), quantile(ordered, 0.95),
                   quantile(ordered, 0.99), ordered[-1])


@dataclass(frozen=True)
class Bucket:
    """A value known only to lie in one histogram bucket: ``low < value <= high``.

    What a Prometheus histogram tells about a minimum or a maximum; ``low`` is 0 for the first bucket
    and ``high`` infinite for the ``+Inf`` bucket."""

    low: float
    high: float


@dataclass(frozen=True)
class BoxPlot:
    """Box (quartiles), Tukey whiskers (1.5 IQR, clipped to the data) and the 5th/95th percentiles."""

    count: int
    min: float
    p5: float
    q1: float
    median: float
    q3: float
    p95: float
    max: float
    mean: float
    whisker_low: float
    whisker_high: float
    min_bucket: Bucket | None = None
    max_bucket: Bucket | None = None
    """When only a histogram is known (Prometheus): the buckets holding the smallest and the largest value
    (``min`` and ``max`` are then NaN; the whiskers stop at those buckets' outer edges)."""

    @classmethod
    def of(cls, values: Iterable[float]) -> BoxPlot:
        return cls.of_sorted(sorted_finite(values))

    @classmethod
    def of_sorted(cls, ordered: Sequence[float]) -> BoxPlot:
        """:meth:`of` of numbers already in ascending order (``sorted_finite(values)``)."""
        n = len(ordered)
        if n == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)
        q1, q3 = quantile(ordered, 0.25), quantile(ordered, 0.75)
        iqr = q3 - q1
        return cls(n, ordered[0], quantile(ordered, 0.05), q1, quantile(ordered, 0.5), q3, quantile(ordered, 0.95),
                   ordered[-1], math.fsum(ordered) / n, max(ordered[0], q1 - 1.5 * iqr),
                   min(ordered[-1], q3 + 1.5 * iqr))


_NARROWEST = 1e-300
"""The narrowest bin: a range narrower (subnormal: values of ~1e-310) would make a bin's reciprocal infinite."""


@dataclass(frozen=True)
class Histogram:
    """Counts per bin; bin ``i`` is ``[edges[i], edges[i + 1])``, the last bin includes its upper edge."""

    edges: tuple[float, ...]
    counts: tuple[int, ...]

    @classmethod
    def of(cls, values: Iterable[float], bins: int = 50, low: float | None = None,
           high: float | None = None) -> Histogram:
        data = finite(values)
        if not data:
            return cls((), ())
        lo = min(data) if low is None else low
        hi = max(data) if high is None else high
        if hi <= lo:
            hi = lo + (abs(lo) * 1e-6 or 1e-9)
        width = max((hi - lo) / bins, _NARROWEST)
        inside = (data if (low is None and high is None) or (lo <= min(data) and max(data) <= hi)
                  else [v for v in data if lo <= v <= hi])
        # the nudge keeps a value on an edge (0.3 with bins of 0.02) in the bin it starts
        shifted = inside if lo == 0 else map(sub, inside, repeat(lo))  # v - 0 is v (int() drops a zero's sign)
        found = Counter(map(int, map(mul, shifted, repeat((1 + 1e-12) / width))))
        counts = [0] * bins
        for index, n in found.items():
            counts[min(max(index, 0), bins - 1)] += n
        return cls(tuple(lo + i * width for i in range(bins + 1)), tuple(counts))

    @classmethod
    def of_sorted(cls, ordered: Sequence[float], bins: int = 50, low: float | None = None,
                  high: float | None = None) -> Histogram:
        """:meth:`of` of numbers in ascending order (``sorted(finite(values))``): the bin of a value never falls
        as the value rises, so each bin's count is found by bisection instead of value by value."""
        if not ordered:
            return cls((), ())
        lo = ordered[0] if low is None else low
        hi = ordered[-1] if high is None else high
        if hi <= lo:
            hi = lo + (abs(lo) * 1e-6 or 1e-9)
        width = max((hi - lo) / bins, _NARROWEST)
        first, last = 0, len(ordered)
        if low is not None or high is not None:
            first, last = bisect.bisect_left(ordered, lo), bisect.bisect_right(ordered, hi)
        scale = (1 + 1e-12) / width

        def bin_of(value: float) -> int:
            return min(max(int((value - lo) * scale), 0), bins - 1)

        counts = []
        start = first
        for index in range(1, bins):
            end = bisect.bisect_left(ordered, index, start, last, key=bin_of)  # the first value of a later bin
            counts.append(end - start)
            start = end
        counts.append(last - start)
        return cls(tuple(lo + i * width for i in range(bins + 1)), tuple(counts))

    @property
    def total(self) -> int:
        return sum(self.counts)


@dataclass(frozen=True)
class Series:
    """A time series for plotting: bucket means (and maxima) of at most a few hundred buckets.

    ``t`` are seconds since the run's start."""

    t: tuple[float, ...]
    mean: tuple[float, ...]
    max: tuple[float, ...]

    @classmethod
    def of(cls, times: Sequence[float], values: Sequence[float], origin: float, buckets: int = 400) -> Series:
        """Split the samples into at most ``buckets`` runs of equal length (samples come at a steady
        interval) and keep each run's mean and maximum, at the run's middle time."""
        return Chunks.of(values, buckets).series(times, origin)


@dataclass(frozen=True)
class Chunks:
    """A :class:`Series` before its times: per run of samples, the position of its middle sample, its mean and
    its maximum (what a rank's parsing process can compute without the run's origin)."""

    at: array[int]
    mean: tuple[float, ...]
    max: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float], buckets: int = 400) -> Chunks:
        n = len(values)
        at = array("q")
        if n == 0:
            return cls(at, (), ())
        size = max(1, -(-n // buckets))
        chunks = list(map(values.__getitem__, map(slice, range(0, n, size), range(size, n + size, size))))
        totals = list(map(sum, chunks))
        if math.isfinite(sum(totals)):  # every value a number (most columns): each run's mean and max at once
            return cls(array("q", [min(i + size // 2, n - 1) for i in range(0, n, size)]),
                       tuple(map(operator.truediv, totals, map(len, chunks))), tuple(map(max, chunks)))
        mean_out, max_out = [], []
        for i in range(0, n, size):
            chunk = values[i:i + size]
            total = sum(chunk)
            if total != total or total in (math.inf, -math.inf):
                chunk = finite(chunk)
                if not chunk:
                    continue
                total = sum(chunk)
            at.append(min(i + size // 2, n - 1))
            mean_out.append(total / len(chunk))
            max_out.append(max(chunk))
        return cls(at, tuple(mean_out), tuple(max_out))

    def series(self, times: Sequence[float], origin: float) -> Series:
        """The series at ``times`` (seconds, one per sample) since ``origin``."""
        return Series(tuple(times[i] - origin for i in self.at), self.mean, self.max)

    def series_ns(self, times_ns: Sequence[int], origin: float) -> Series:
        """The series at ``times_ns`` (Unix nanoseconds, one per sample) since ``origin`` (seconds)."""
        return Series(tuple(times_ns[i] / 1e9 - origin for i in self.at), self.mean, self.max)


def share(part: float, whole: float) -> float:
    """``part / whole``, 0 when the whole is 0."""
    return part / whole if whole else 0.0
