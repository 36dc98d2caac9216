"""Which steps become spans: first steps, every K-th, profiling windows, outliers, and a cost budget.

Building a span costs tens of microseconds, so only selected steps get them.
The budget lets span building and encoding use at most ``span_budget`` of step
time: each step earns ``span_budget x duration`` of credit, each traced step
spends its measured cost. Forced reasons (first, every, window, outlier) spend too,
so they pause budget sampling rather than exceed it for long.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from otelprof import thresholds
from otelprof.config import Config

RESUM_STEPS = 4096
"""Every this many values :class:`OutlierDetector` recomputes its running sums exactly."""


class OutlierDetector:
    """One phase's recent step durations (the last ``window``); flags a step that is slower than all of

    * mean + ``sigma`` x stddev (population) of the recent steps: SageMaker's StepOutlier;
    * ``min_ratio`` x their median: materially slower than a typical step. Scheduler jitter on a steady,
      busy machine passes mean + 3 sigma every few dozen steps (63.6 +- 1.9 ms steps: 3 sigma is 70 ms,
      1.1 x the median), and that is no bottleneck;
    * their median + ``min_excess`` seconds: the same for sub-millisecond steps.

    The median is only computed for a step that passes the first test (a few per cent of the steps)."""

    def __init__(self, sigma: float, min_steps: int, window: int = 256,
                 min_ratio: float = thresholds.OUTLIER_MIN_RATIO,
                 min_excess: float = thresholds.OUTLIER_MIN_EXCESS) -> None:
        self.sigma = sigma
        self.min_steps = min_steps
        self.min_ratio = min_ratio
        self.min_excess = min_excess
        self.window: deque[float] = deque(maxlen=window)
        self._sum = 0.0
        self._sumsq = 0.0
        self._since_resum = 0

    @classmethod
    def from_config(cls, config: Config) -> OutlierDetector:
        return cls(config.outlier_sigma, config.outlier_min_steps, min_ratio=config.outlier_min_ratio,
                   min_excess=config.outlier_min_excess)

    def threshold(self) -> float | None:
        """Current outlier threshold in seconds, or None while there are too few steps."""
        n = len(self.window)
        if self.sigma <= 0 or n < self.min_steps:
            return None
        mean = self._sum / n
        variance = max(self._sumsq / n - mean * mean, 0.0)
        return max(mean + self.sigma * math.sqrt(variance), _floor(self.window, self.min_ratio, self.min_excess))

    def observe(self, duration: float) -> bool:
        """Judge ``duration`` against the steps before it, then add it; True if it is an outlier."""
        return self.excess(duration) > 0

    def excess(self, duration: float) -> float:
        """Like :meth:`observe`: by how much an outlier exceeds the median of the steps before it (what it cost),
        0.0 for a step that is no outlier."""
        n = len(self.window)
        excess = 0.0
        if self.sigma > 0 and n >= self.min_steps:
            mean = self._sum / n
            variance = max(self._sumsq / n - mean * mean, 0.0)
            if duration > mean + self.sigma * math.sqrt(variance):
                median = _median(self.window)
                if duration > max(median * self.min_ratio, median + self.min_excess):
                    excess = duration - median
        if n == self.window.maxlen:
            old = self.window[0]
            self._sum -= old
            self._sumsq -= old * old
        self.window.append(duration)
        self._sum += duration
        self._sumsq += duration * duration
        self._since_resum += 1
        if self._since_resum >= RESUM_STEPS:  # bound floating-point drift of the running sums
            self._sum = math.fsum(self.window)
            self._sumsq = math.fsum(d * d for d in self.window)
            self._since_resum = 0
        return excess

    def excess_all(self, values: Iterable[float]) -> list[float]:
        """:meth:`excess` of each value in turn (an offline replay), the detector left as after them: the same
        arithmetic in the same order (the running sums, their periodic exact resum, the median of the recent
        values), with the state in local variables for the loop."""
        sigma, min_steps, min_ratio, min_excess = self.sigma, self.min_steps, self.min_ratio, self.min_excess
        recent = self.window
        size = recent.maxlen
        total, squares, since = self._sum, self._sumsq, self._since_resum
        judging = sigma > 0
        n = len(recent)
        sqrt = math.sqrt
        out: list[float] = []
        for value in values:
            excess = 0.0
            if judging and n >= min_steps:
                mean = total / n
                variance = squares / n - mean * mean
                if variance < 0.0:  # max(variance, 0.0): NaN kept, as max keeps it
                    variance = 0.0
                if value > mean + sigma * sqrt(variance):
                    median = _median(recent)
                    if value > max(median * min_ratio, median + min_excess):
                        excess = value - median
            if n == size:
                old = recent[0]
                total -= old
                squares -= old * old
            else:
                n += 1
            recent.append(value)
            total += value
            squares += value * value
            since += 1
            if since >= RESUM_STEPS:
                total = math.fsum(recent)
                squares = math.fsum(d * d for d in recent)
                since = 0
            out.append(excess)
        self._sum, self._sumsq, self._since_resum = total, squares, since
        return out


def _median(recent: Iterable[float]) -> float:
    ordered = sorted(recent)
    n = len(ordered)
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def _floor(recent: Iterable[float], min_ratio: float, min_excess: float) -> float:
    """The least duration a step must exceed to be materially slower than the median of ``recent``."""
    median = _median(recent)
    return max(median * min_ratio, median + min_excess)


def flag_outliers(durations: Iterable[float], sigma: float, min_steps: int, window: int = 256,
                  min_ratio: float = thresholds.OUTLIER_MIN_RATIO,
                  min_excess: float = thresholds.OUTLIER_MIN_EXCESS) -> bytearray:
    """:meth:`OutlierDetector.observe` over a whole series (same arithmetic, same verdicts), in one loop."""
    flags = bytearray()
    append = flags.append
    recent: deque[float] = deque(maxlen=window)
    total = squares = 0.0
    since = 0
    for duration in durations:
        n = len(recent)
        if sigma > 0 and n >= min_steps:
            mean = total / n
            variance = max(squares / n - mean * mean, 0.0)
            append(duration > mean + sigma * math.sqrt(variance)
                   and duration > _floor(recent, min_ratio, min_excess))
        else:
            append(0)
        if n == window:
            old = recent[0]
            total -= old
            squares -= old * old
        recent.append(duration)
        total += duration
        squares += duration * duration
        since += 1
        if since >= 4096:
            total = math.fsum(recent)
            squares = math.fsum(d * d for d in recent)
            since = 0
    return flags


OUTLIER_DEBT = 0.01
"""Seconds of span-building cost outlier steps may run ahead of the budget: noisy tiny steps can be
"outliers" every few dozen steps, and tracing them all would exceed the budget for good."""


@dataclass
class SpanSelector:
    """Decides, per closed step, whether (and why) it becomes spans."""

    budget: float
    first_steps: int
    every: int
    windows: tuple[tuple[int, int], ...]
    cost_per_span: float = 50e-6  # seconds; replaced by a moving average of measured cost
    credit: float = 0.0
    charged: float = 0.0

    @classmethod
    def from_config(cls, config: Config) -> SpanSelector:
        return cls(config.span_budget, config.span_first_steps, config.span_every, config.span_windows)

    def in_window(self, number: int) -> bool:
        return any(start <= number < start + count for start, count in self.windows)

    def select(self, seen_in_phase: int, number: int, duration: float, outlier: bool, spans: int) -> str | None:
        """The reason to trace this step, or None. ``spans`` = spans the step would produce.

        A selected step is charged its estimated cost at once; :meth:`settle` corrects
        the estimate with the measured cost later."""
        estimate = spans * self.cost_per_span
        self.credit = min(self.credit + self.budget * duration, max(4 * estimate, 1e-3))
        reason: str | None = None
        if seen_in_phase < self.first_steps:
            reason = "first"
        elif outlier and self.credit > -OUTLIER_DEBT:
            reason = "outlier"
        elif self.windows and self.in_window(number):
            reason = "window"
        elif self.every and number % self.every == 0:
            reason = "every"
        elif self.budget > 0 and self.credit >= estimate:
            reason = "budget"
        if reason is not None:
            self.credit -= estimate
            self.charged += estimate
        return reason

    def settle(self, seconds: float, spans: int) -> None:
        """Replace the estimates charged so far with the measured cost of ``spans`` spans."""
        self.credit += self.charged - seconds
        self.charged = 0.0
        if spans:
            self.cost_per_span += 0.2 * (seconds / spans - self.cost_per_span)
