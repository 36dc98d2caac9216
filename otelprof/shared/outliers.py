"""Per-step judgements the training process makes and the offline checks repeat with the same code.

:class:`StepJudge` decides whether a step is an outlier and what it cost; :class:`LossSpikes` whether a
recorded loss jumped. The recorder feeds them every step as it closes (and counts what they find in
``otelprof_step_outliers_total``, ``otelprof_step_outliers_excess_seconds_total`` and
``otelprof_loss_spikes_total``); :mod:`otelprof.analysis.checks` feeds them a recording's steps in the same
order, so the live rules and their offline twin judge the same steps the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from otelprof import thresholds
from otelprof.shared.sampling import OutlierDetector


class StepJudge:
    """One phase's outlier judge. A step is an outlier when its duration is (mean + sigma x stddev, and
    min_ratio x and min_excess more than the median of the recent steps: :class:`OutlierDetector`) *and*,
    where the step recorded its tokens (else its samples), its time per token is an outlier too: a long batch
    that took as long per token as usual is no outlier. Its cost is the time above the recent median."""

    def __init__(self, sigma: float, min_steps: int, min_ratio: float = thresholds.OUTLIER_MIN_RATIO,
                 min_excess: float = thresholds.OUTLIER_MIN_EXCESS, window: int = thresholds.OUTLIER_WINDOW) -> None:
        self.time = OutlierDetector(sigma, min_steps, window, min_ratio, min_excess)
        self.per_unit = OutlierDetector(sigma, min_steps, window, min_ratio, 0.0)

    def observe(self, duration: float, units: float | None = None) -> float:
        """Judge a step (seconds, its tokens or samples if recorded), then remember it; the seconds it lost
        when it is an outlier, else 0.0."""
        excess = self.time.excess(duration)
        if units is not None and units > 0 and not self.per_unit.excess(duration / units):
            return 0.0
        return excess

    def observe_all(self, durations: Sequence[float], units: Sequence[float | None]) -> list[float]:
        """:meth:`observe` of each step in turn (an offline replay): the same costs, and the judge left as
        after them, in one loop per detector instead of a few calls per step."""
        excess = self.time.excess_all(durations)
        judged = [k for k, u in enumerate(units) if u is not None and u > 0]
        if judged:
            per_unit = self.per_unit.excess_all([durations[k] / units[k] for k in judged])  # type: ignore[operator]
            for k, found in zip(judged, per_unit):
                if not found:
                    excess[k] = 0.0
        return excess


def step_units(tokens: float | None, samples: float | None) -> float | None:
    """What a step's time is judged per: its tokens where recorded, else its samples, else nothing."""
    for units in (tokens, samples):
        if units is not None and 0 < units < math.inf:
            return units
    return None


def in_windows(number: int, windows: Iterable[tuple[int, int]]) -> bool:
    """Whether step ``number`` is one that otelprof slowed: inside a profiling window ``(start, steps)`` or one
    of the :data:`thresholds.AFTER_WINDOW_STEPS` steps after it."""
    return any(start <= number < start + steps + thresholds.AFTER_WINDOW_STEPS for start, steps in windows)


class LossSpikes:
    """One phase's recent finite losses; a loss above ``ratio`` x their (positive) median and their mean +
    ``sigma`` x stddev is a spike."""

    def __init__(self, ratio: float = thresholds.LOSS_SPIKE_RATIO, sigma: float = thresholds.LOSS_SPIKE_SIGMA,
                 min_steps: int = thresholds.LOSS_SPIKE_MIN_STEPS, window: int = thresholds.OUTLIER_WINDOW) -> None:
        self.detector = OutlierDetector(sigma, min_steps, window, ratio, 0.0)

    def observe(self, loss: float) -> bool:
        """Judge a finite loss against the ones before it, then remember it; True for a spike."""
        excess = self.detector.excess(loss)
        return excess > 0 and loss - excess > 0  # the median (loss - excess) is positive: the ratio means something

    def observe_all(self, losses: Sequence[float]) -> list[bool]:
        """:meth:`observe` of each finite loss in turn (an offline replay), in one loop."""
        return [excess > 0 and loss - excess > 0 for loss, excess in zip(losses, self.detector.excess_all(losses))]
