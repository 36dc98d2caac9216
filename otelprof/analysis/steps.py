"""Step duration analysis: per rank and phase, the distribution of step times, the outlier steps
(slower than mean + sigma x standard deviation of all steps of that rank and phase, one-sided, as
in the original, and materially slower than their median, as the recorder and the alert judge), a
histogram of the others, and the throughput from recorded samples/tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import mul, sub

from otelprof import thresholds
from otelprof.analysis.run import RunView
from otelprof.analysis.stats import Bucket, Distribution, Histogram, finite, quantile

MAX_LISTED_OUTLIERS = 50


@dataclass(frozen=True)
class PhaseSteps:
    rank: int
    node: str
    phase: str
    durations: Distribution
    """Seconds."""
    threshold: float
    """Outlier threshold: mean + sigma x std (seconds)."""
    outliers: int
    outlier_steps: tuple[int, ...]
    """Step numbers of the first outliers (at most MAX_LISTED_OUTLIERS)."""
    histogram: Histogram
    """Durations of the steps that are not outliers."""
    samples_per_step: float | None
    """Median of the recorded ``samples`` scalar (the batch size)."""
    samples_per_second: float | None
    """Recorded samples over the time spent in this phase's steps."""
    tokens_per_second: float | None
    min_bucket: Bucket | None = None
    """When only the step-duration histogram is known (Prometheus): the bucket holding the fastest step
    (``durations.min`` is then NaN)."""
    max_bucket: Bucket | None = None
    """Likewise the bucket holding the slowest step."""


@dataclass(frozen=True)
class StepAnalysis:
    sigma: float
    rows: tuple[PhaseSteps, ...]
    throughput: tuple[tuple[str, float], ...]
    """Per phase: samples per second of all ranks together (data parallelism adds them up)."""

    def row(self, rank: int, phase: str) -> PhaseSteps | None:
        return next((r for r in self.rows if r.rank == rank and r.phase == phase), None)


_FLOOR = (thresholds.OUTLIER_MIN_RATIO, thresholds.OUTLIER_MIN_EXCESS)


def outlier_threshold(durations: Sequence[float], sigma: float, floor: tuple[float, float] = _FLOOR) -> float:
    """The least duration of an outlier: above mean + sigma x population std and materially slower than the
    median (``floor``: at least ratio x the median and seconds more than it), the recorder's definition over the
    whole phase; infinity for fewer than two steps."""
    n = len(durations)
    if n < 2:
        return math.inf
    mean = math.fsum(durations) / n
    std = math.sqrt(max(math.fsum(map(mul, deviations := list(map(sub, durations, repeat(mean))), deviations))
                        / n, 0.0))
    ordered = sorted(durations)
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    ratio, excess = floor
    return max(mean + sigma * std, median * ratio, median + excess)


def outlier_flags(view: RunView, index: int) -> list[bool]:
    """Per step of rank ``index`` (file order): is it an outlier of its phase."""
    c = view.ranks[index].step_columns
    limits_by_phase = {name: outlier_threshold(d, view.outlier_sigma, view.outlier_floor)
                       for name, d in view.durations(index).items()}
    limits = [limits_by_phase.get(name, math.inf) * 1e9 for name in c.phase_names]
    return [d > limits[p] for p, d in zip(c.phase, c.duration_ns)]


def _by_phase(phase: Sequence[int], at: Sequence[int], values: Sequence[float]) -> dict[int, list[float]]:
    """A scalar's values (recorded in steps ``at``) per phase code of their step, in one pass."""
    found: dict[int, list[float]] = {}
    for step, value in zip(at, values):
        found.setdefault(phase[step], []).append(value)
    return found


def step_analysis(view: RunView, bins: int = 50) -> StepAnalysis:
    sigma = view.outlier_sigma
    rows = []
    throughput: dict[str, float] = {}
    shown = view.shown_phases()
    for index, info in enumerate(view.info):
        view.say(f"step durations of rank {info.rank}")
        c = view.ranks[index].step_columns
        samples_by_phase = _by_phase(c.phase, *c.scalar("samples"))
        tokens_by_phase = _by_phase(c.phase, *c.scalar("tokens"))
        codes = {name: code for code, name in enumerate(c.phase_names)}
        steps_of = c.phase_steps()
        for phase, durations in view.durations(index).items():
            if phase not in shown:
                continue
            code = codes[phase]
            limit = outlier_threshold(durations, sigma, view.outlier_floor)
            numbers = list(map(c.number.__getitem__, steps_of[phase]))
            numbers = [n for n, d in zip(numbers, durations) if d > limit]
            kept = [d for d in durations if d <= limit]
            busy = math.fsum(durations)
            phase_samples = finite(samples_by_phase.get(code, ()))
            phase_tokens = finite(tokens_by_phase.get(code, ()))
            per_second = math.fsum(phase_samples) / busy if phase_samples and busy > 0 else None
            if per_second is not None:
                throughput[phase] = throughput.get(phase, 0.0) + per_second
            rows.append(PhaseSteps(
                info.rank, info.node, phase, Distribution.of(durations), limit, len(numbers),
                tuple(numbers[:MAX_LISTED_OUTLIERS]), Histogram.of(kept, bins),
                quantile(sorted(phase_samples), 0.5) if phase_samples else None, per_second,
                math.fsum(phase_tokens) / busy if phase_tokens and busy > 0 else None))
    return StepAnalysis(sigma, tuple(rows), tuple(sorted(throughput.items())))
