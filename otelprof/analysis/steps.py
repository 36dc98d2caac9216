"""Step duration analysis: per rank and phase, the distribution of step times, the outlier steps
(slower than mean + sigma x standard deviation of all steps of that rank and phase, one-sided, as
in the original, and materially slower than their median, as the recorder and the alert judge), a
histogram of the others, and the throughput from recorded samples/tokens."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import mul, not_, sub

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
    outlier_excess: float = math.nan
    """Seconds the outlier steps took beyond the median step, all of them (NaN when the steps are not known)."""
    outlier_regions: tuple[tuple[str, float], ...] = ()
    """The regions that grew most in the outlier steps: (name, mean seconds per outlier step more than in the
    other steps), largest first, at most three."""


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


def _grown_regions(view: RunView, index: int, phase: str, flags: list[bool]) -> tuple[tuple[str, float], ...]:
    """Per region of rank ``index``'s ``phase`` steps: its mean time in the outlier steps (``flags``) minus its
    mean in the others, seconds; the three that grew most."""
    outliers = sum(flags)
    others = len(flags) - outliers
    if not outliers or not others:
        return ()
    c = view.ranks[index].step_columns
    grown = []
    for name in c.ann_names:
        per_step = list(compress(view.region_sums(index, name), c.phase_mask(phase)))
        more = (sum(compress(per_step, flags)) / outliers
                - sum(compress(per_step, map(not_, flags))) / others) / 1e9
        if more > 0:
            grown.append((name, more))
    return tuple(sorted(grown, key=lambda kv: -kv[1])[:3])


def step_analysis(view: RunView, bins: int = 50) -> StepAnalysis:
    sigma = view.outlier_sigma
    rows = []
    throughput: dict[str, float] = {}
    for index, info in enumerate(view.info):
        view.say(f"step durations of rank {info.rank}")
        c = view.ranks[index].step_columns
        samples_at, samples = c.scalar("samples")
        tokens_at, tokens = c.scalar("tokens")
        for phase, durations in view.durations(index).items():
            code = c.phase_names.index(phase)
            limit = outlier_threshold(durations, sigma, view.outlier_floor)
            numbers = list(compress(c.number, c.phase_mask(phase)))
            numbers = [n for n, d in zip(numbers, durations) if d > limit]
            kept = [d for d in durations if d <= limit]
            median = quantile(sorted(durations), 0.5) if durations else math.nan
            excess = math.fsum(d - median for d in durations if d > limit)
            busy = math.fsum(durations)
            phase_samples = finite(compress(samples, map(code.__eq__, map(c.phase.__getitem__, samples_at))))
            phase_tokens = finite(compress(tokens, map(code.__eq__, map(c.phase.__getitem__, tokens_at))))
            per_second = math.fsum(phase_samples) / busy if phase_samples and busy > 0 else None
            if per_second is not None:
                throughput[phase] = throughput.get(phase, 0.0) + per_second
            rows.append(PhaseSteps(
                info.rank, info.node, phase, Distribution.of(durations), limit, len(numbers),
                tuple(numbers[:MAX_LISTED_OUTLIERS]), Histogram.of(kept, bins),
                quantile(sorted(phase_samples), 0.5) if phase_samples else None, per_second,
                math.fsum(phase_tokens) / busy if phase_tokens and busy > 0 else None, outlier_excess=excess,
                outlier_regions=_grown_regions(view, index, phase, [d > limit for d in durations])))
    return StepAnalysis(sigma, tuple(rows), tuple(sorted(throughput.items())))
