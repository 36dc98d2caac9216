"""Exact early answers for the offline checks: what a series' values can make of a window decides a condition
before any window is summed or counted.

A window's mean (its values summed in order, divided by their count) lies between the least and the greatest
of the series' values, widened by the most a sum of floats can stray (:func:`extent`): a series whose values
never reach a threshold never fires a check on its means, and its windows need no sum. A window's
``histogram_quantile`` lies inside the bucket that holds its rank; the counts of the window's values at or
below a few bucket bounds (:func:`cut_counts`, from the positions of the series' values at or below the
highest of them: few on a busy GPU) tell which side of a threshold that bucket is, so only the windows whose
quantile may be on the firing side are counted in full. Window means from running totals are within a bound
of the windows' own sums (:func:`approximate_means`), so a spread or a share far from its threshold needs no
exact sum. Every verdict and value stays the one the window's own sums and counts give
(tests/test_check_bounds.py)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from functools import partial
from itertools import accumulate, compress

from otelprof.analysis.check_tables import BUCKETS, Series

CHUNK = 256
"""Values looked at together when finding a series' low values (a chunk whose least value is high is skipped)."""


def extent(series: Series) -> tuple[float, float]:
    """Bounds of every window mean of ``series`` (its values summed in order and divided by their count, or their
    running totals' difference when exact): the least and greatest value, widened by the most the float sum of
    up to ``len(series)`` of them and its division can err. A NaN among the values makes the means of the windows
    that hold it NaN, which fire no check (and is skipped by ``min`` and ``max``, unless first: then the bounds are
    NaN, and decide nothing); an infinity makes them infinite."""
    values = series.values
    if not values:
        return 0.0, 0.0
    low, high = min(values), max(values)
    margin = (len(values) + 4) * 2.0 ** -52 * max(abs(low), abs(high))  # 2 x (n u + u) of the largest value
    return low - margin, high + margin


def never_above(bounds: tuple[float, float], threshold: float) -> bool:
    """No window mean exceeds ``threshold`` (``mean > threshold`` never holds)."""
    return bounds[1] <= threshold


def spread_never_above(bounds: tuple[float, float], threshold: float) -> bool:
    """No difference of two window means exceeds ``threshold`` (the difference rounds no higher than the widest)."""
    return bounds[1] - bounds[0] <= threshold


def threshold_cuts(below: Sequence[float] = (), above: Sequence[float] = ()) -> tuple[int, ...]:
    """The bucket indexes whose counts decide ``quantile < t`` for each t of ``below`` and ``quantile > t`` for each
    of ``above`` where the quantile's bucket is clear of t, and the first bucket's (a window of only first-bucket
    values may be an idle device's)."""
    last = len(BUCKETS)
    cuts = {0}
    cuts.update(bisect.bisect_left(BUCKETS, t) for t in below)
    cuts.update(bisect.bisect_left(BUCKETS, t) - 1 for t in above)
    return tuple(sorted(c for c in cuts if 0 <= c < last))


def quantile_range(q: float, n: int, counts: Sequence[int], cuts: Sequence[int]) -> tuple[float, float]:
    """Bounds of ``histogram_quantile(q)`` of a window of ``n`` values (``0 < q <= 1``) of which ``counts[c]`` are in
    the buckets up to ``cuts[c]``: the lower bound of the first bucket its rank may fall in, the upper bound of
    the last (widened by what the interpolation can round)."""
    rank = q * n
    first, last = 0, len(BUCKETS)
    for cut, count in zip(cuts, counts):
        if count >= rank:
            last = cut
            break
        first = cut + 1
    lower = BUCKETS[first - 1] if first else min(0.0, BUCKETS[0])
    upper = BUCKETS[min(last, len(BUCKETS) - 1)]
    return lower, upper + abs(upper) * 2.0 ** -40


def cut_counts(series: Series, cuts: Sequence[int], lo: Sequence[int], hi: Sequence[int],
               least: float | None = None) -> list[tuple[int, ...]] | None:
    """Per window ``[lo[k], hi[k])`` of ``series``, how many of its values are in the buckets up to each of ``cuts``
    (ascending bucket indexes, ``le`` semantics: NaN in the first); None when no value is in them (every count 0).
    Only the values at or below the highest cut are bucketed, found a chunk at a time (``least``: the least value,
    when known)."""
    values = series.values
    n = len(values)
    top = BUCKETS[cuts[-1]]
    if not n:
        return None
    least = min(values) if least is None else least
    clean = math.isfinite(sum(values)) or not any(map(math.isnan, values))  # the NaN test only past an infinity
    if least > top and clean:
        return None
    find = partial(bisect.bisect_left, BUCKETS)
    if clean:
        listed = values.tolist()
        positions: list[int] = []
        for k in range(0, n, CHUNK):
            chunk = listed[k:k + CHUNK]
            if min(chunk) <= top:
                positions.extend(compress(range(k, k + len(chunk)), map(top.__ge__, chunk)))
        buckets = bytes(map(find, map(listed.__getitem__, positions)))
    else:
        every = series.buckets()
        positions = list(compress(range(n), map(cuts[-1].__ge__, every)))
        buckets = bytes(map(every.__getitem__, positions))
    if not positions:
        return None
    running = [list(accumulate(map(cut.__ge__, buckets), initial=0)) for cut in cuts]
    where = partial(bisect.bisect_left, positions)
    out = []
    for i, j in zip(lo, hi):
        a, b = where(i), where(j)
        out.append(tuple(r[b] - r[a] for r in running))
    return out


def approximate_means(series: Series, lo: Sequence[int], hi: Sequence[int],
                      least: float | None = None) -> tuple[list[float], list[float]] | None:
    """Per window ``[lo[k], hi[k])``: its mean from running totals of the series' values (up to each window's ends,
    a stretch between two ends summed at a time) and the most that can differ from its values summed in order and
    divided by their count (NaN for an empty window); None with a NaN or an infinity among the values (no bound
    holds). ``least``: at most the least value, when known."""
    values = series.values
    n = len(values)
    totals, total, start = {0: 0.0}, 0.0, 0
    for end in sorted({*lo, *hi, n}):
        if end > start:
            total += sum(values[start:end])
            totals[end], start = total, end
    if not n or not math.isfinite(total):
        return None
    if least is None:
        least = min(values)  # no NaN among them: their sum is finite
    absolute = total if least >= 0.0 else sum(map(abs, values))
    # Both sums of a window (its running totals' difference, its values in order) are within about n u of the
    # absolute sum of the values from the real one (u = 2**-53), whatever the order of the additions: they
    # differ by less than twice that (and the divisions round by u of the means).
    differ = (4 * n + 8) * 2.0 ** -52 * absolute
    nan = math.nan
    means = [(totals[j] - totals[i]) / (j - i) if j > i else nan for i, j in zip(lo, hi)]
    errors = [differ / (j - i) + 2.0 ** -48 * abs(m) if j > i else 0.0 for i, j, m in zip(lo, hi, means)]
    return means, errors
