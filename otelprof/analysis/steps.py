"""Step duration analysis: per rank and phase, the distribution of step times, the outlier steps
(slower than mean + sigma x standard deviation of all steps of that rank and phase, one-sided, as
in the original, and materially slower than their median, as the recorder and the alert judge; never
the steps of an operator-profiling window or the few after it, which otelprof itself slowed), a
histogram of the others, and the throughput from recorded samples/tokens."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat
from operator import mul, not_, sub

from otelprof import semconv as sc
from otelprof import thresholds
from otelprof.analysis.ranksummary import RankSummary, many, summarize
from otelprof.analysis.run import RunView, per_rank, phase_durations, phase_totals
from otelprof.analysis.stats import Bucket, Distribution, Histogram, finite, quantile
from otelprof.recording.columns import StepColumns
from otelprof.recording.ranks import RankRecording
from otelprof.shared.outliers import in_windows

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
    summaries: tuple[RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD ranks, per phase: median and p95 step, outliers (else empty)."""

    def __post_init__(self) -> None:
        out: list[RankSummary] = []
        if many(len({r.rank for r in self.rows})):
            for phase in dict.fromkeys(r.phase for r in self.rows):
                rows = [r for r in self.rows if r.phase == phase]
                out += [summarize(((f"rank {r.rank}", r.durations.p50) for r in rows), "median step", "seconds", phase),
                        summarize(((f"rank {r.rank}", r.durations.p95) for r in rows), "p95 step", "seconds", phase),
                        summarize(((f"rank {r.rank}", r.outliers) for r in rows), "outlier steps", "count", phase)]
        object.__setattr__(self, "summaries", tuple(out))

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


def profiled_windows(rank: RankRecording) -> dict[str, list[tuple[int, int]]]:
    """Per phase, the operator-profiling windows (first step, steps) of a rank: steps otelprof slowed."""
    windows: dict[str, list[tuple[int, int]]] = {}
    for record in rank.profiles():
        phase = record.get("phase")
        if isinstance(phase, str):
            windows.setdefault(phase, []).append((int(record["start_step"]), int(record["num_steps"])))
    return windows


def slowed_steps(rank: RankRecording) -> list[bool]:
    """Per step (file order): did otelprof slow it (in a profiling window, or one of the steps after), or did
    torch.compile compile during it (a ``compile`` region)."""
    c = rank.step_columns
    windows = profiled_windows(rank)
    compiled = compiled_steps(c)
    if not windows:
        return compiled if compiled is not None else [False] * len(c.phase)
    by_code = [windows.get(name) for name in c.phase_names]
    slowed = [w is not None and in_windows(n, w) for p, n in zip(c.phase, c.number) for w in (by_code[p],)]
    return slowed if compiled is None else [a or b for a, b in zip(slowed, compiled)]


def compiled_steps(c: StepColumns) -> list[bool] | None:
    """Per step: holds a ``compile`` region (None: no step does)."""
    if sc.REGION_COMPILE not in c.ann_names:
        return None
    code = c.ann_names.index(sc.REGION_COMPILE)
    names, index = c.ann_name, c.ann_index
    return [code in names[index[i]:index[i + 1]] for i in range(len(c))]


def outlier_flags(view: RunView, index: int) -> list[bool]:
    """Per step of rank ``index`` (file order): is it an outlier of its phase (never a step otelprof slowed)."""
    c = view.ranks[index].step_columns
    slowed = slowed_steps(view.ranks[index])
    steps_of = c.phase_steps()
    limits_by_phase = {name: outlier_threshold(_kept(d, slowed, steps_of[name]), view.outlier_sigma,
                                               view.outlier_floor)
                       for name, d in view.durations(index).items()}
    limits = [limits_by_phase.get(name, math.inf) * 1e9 for name in c.phase_names]
    return [d > limits[p] and not s for p, d, s in zip(c.phase, c.duration_ns, slowed)]


def _kept(durations: list[float], slowed: list[bool], steps: Sequence[int]) -> list[float]:
    """A phase's durations without the steps otelprof slowed (``steps``: the phase's step indexes, its
    :meth:`~otelprof.recording.columns.StepColumns.phase_steps`)."""
    if not any(map(slowed.__getitem__, steps)):  # the phase's own steps only: all phases cost one pass
        return durations
    return [d for d, i in zip(durations, steps) if not slowed[i]]


def _grown_regions(c: StepColumns, phase: str, flags: list[bool]) -> tuple[tuple[str, float], ...]:
    """Per region of a rank's ``phase`` steps: its mean time in the outlier steps (``flags``) minus its mean in
    the others, seconds; the three that grew most."""
    outliers = sum(flags)
    others = len(flags) - outliers
    if not outliers or not others:
        return ()
    mine = c.phase_steps()[phase]
    grown = []
    for name in c.ann_names:
        per_step = list(map(c.annotation_sums(name).__getitem__, mine))
        more = (sum(compress(per_step, flags)) / outliers
                - sum(compress(per_step, map(not_, flags))) / others) / 1e9
        if more > 0:
            grown.append((name, more))
    return tuple(sorted(grown, key=lambda kv: -kv[1])[:3])


def _by_phase(phase: Sequence[int], at: Sequence[int], values: Sequence[float]) -> dict[int, list[float]]:
    """A scalar's values (recorded in steps ``at``) per phase code of their step, in one pass."""
    found: dict[int, list[float]] = {}
    for step, value in zip(at, values):
        found.setdefault(phase[step], []).append(value)
    return found


StepFigures = tuple[Distribution, float, int, tuple[int, ...], Histogram, float | None, float | None, float | None,
                    float, tuple[tuple[str, float], ...]]
"""A :class:`PhaseSteps`'s figures: durations, threshold, outliers, outlier_steps, histogram, samples_per_step,
samples_per_second, tokens_per_second, outlier_excess, outlier_regions."""


def step_figures(rank: RankRecording, phases: Iterable[str], sigma: float, floor: tuple[float, float],
                 bins: int = 50, scalars: Mapping[str, tuple[array[int], array[float]]] | None = None
                 ) -> dict[str, StepFigures]:
    """Per phase of ``phases`` the rank has steps of: its :class:`PhaseSteps` figures, each kept with the rank's
    step columns (:func:`~otelprof.analysis.run.per_rank`; ``scalars``: the samples and tokens scalars'
    columns when already read)."""
    c = rank.step_columns
    context: list[tuple[list[bool], dict[int, list[float]], dict[int, list[float]], dict[str, list[float]]]] = []

    def compute(phase: str) -> StepFigures:
        if not context:  # what every phase needs, worked out once
            read = scalars or {name: c.scalar(name) for name in (sc.SCALAR_SAMPLES, sc.SCALAR_TOKENS)}
            context.append((slowed_steps(rank), _by_phase(c.phase, *read[sc.SCALAR_SAMPLES]),
                            _by_phase(c.phase, *read[sc.SCALAR_TOKENS]), phase_durations(c)))
        slowed, samples_by_phase, tokens_by_phase, durations_of = context[0]
        durations = durations_of[phase]
        code = c.phase_names.index(phase)
        mine = c.phase_steps()[phase]
        limit = outlier_threshold(_kept(durations, slowed, mine), sigma, floor)
        flags = [d > limit and not slowed[i] for d, i in zip(durations, mine)]  # a step otelprof or compiling
        numbers = [n for n, flagged in zip(map(c.number.__getitem__, mine), flags) if flagged]  # slowed: none
        kept = [d for d in durations if d <= limit]
        distribution = Distribution.of(durations)
        median = distribution.p50  # durations are numbers: the median of them all
        excess = math.fsum(d - median for d, flagged in zip(durations, flags) if flagged)
        busy = math.fsum(durations)
        phase_samples = finite(samples_by_phase.get(code, ()))
        phase_tokens = finite(tokens_by_phase.get(code, ()))
        per_second = math.fsum(phase_samples) / busy if phase_samples and busy > 0 else None
        return (distribution, limit, len(numbers), tuple(numbers[:MAX_LISTED_OUTLIERS]),
                Histogram.of(kept, bins), quantile(sorted(phase_samples), 0.5) if phase_samples else None,
                per_second, math.fsum(phase_tokens) / busy if phase_tokens and busy > 0 else None, excess,
                _grown_regions(c, phase, flags))

    totals = phase_totals(c)
    return {phase: per_rank(c, ("steps", phase, sigma, floor, bins), partial(compute, phase))
            for phase in phases if phase in totals}


def step_analysis(view: RunView, bins: int = 50) -> StepAnalysis:
    sigma = view.outlier_sigma
    rows = []
    throughput: dict[str, float] = {}
    shown = view.shown_phases()
    for index, info in enumerate(view.info):
        view.say_rank("step durations", index)
        rank = view.ranks[index]
        found = step_figures(rank, shown, sigma, view.outlier_floor, bins)
        for phase in view.phase_totals(index):
            figures = found.get(phase)
            if figures is None:
                continue
            (durations, limit, outliers, listed, histogram, per_step, per_second, tokens, excess,
             regions) = figures
            if per_second is not None:
                throughput[phase] = throughput.get(phase, 0.0) + per_second
            rows.append(PhaseSteps(info.rank, info.node, phase, durations, limit, outliers, listed, histogram,
                                   per_step, per_second, tokens, outlier_excess=excess, outlier_regions=regions))
    return StepAnalysis(sigma, tuple(rows), tuple(sorted(throughput.items())))
