"""Data loading: how long steps wait for their next batch (the ``dataloader`` region), which share of
each step that is, how many steps are input-bound, and the loader's worker count and ``pin_memory``
against the CPUs the container may use (the original Dataloader rule's 70 % .. 200 % band)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otelprof import semconv as sc
from otelprof.analysis.ranksummary import RankSummary, many, summarize
from otelprof.analysis.run import RunView, last_values, per_rank
from otelprof.analysis.stats import Bucket, Distribution, Histogram, quantile
from otelprof.mixin.config import MixinConfig
from otelprof.recording.columns import StepColumns

WAIT_SHARE_WARN = 0.2
"""A rank whose steps wait for data more than this share of their time is limited by its input pipeline."""


@dataclass(frozen=True)
class LoaderPhase:
    rank: int
    phase: str
    steps: int
    steps_waiting: int
    """Steps with a dataloader region."""
    wait: Distribution
    """Seconds per step (steps with a dataloader region)."""
    wait_p25: float
    wait_ratio: Distribution
    """Share of each step spent waiting."""
    input_bound_steps: int
    """Steps waiting more than the input-bound threshold of their duration."""
    wait_share: float
    """Total wait over total step time."""
    histogram: Histogram
    max_bucket: Bucket | None = None
    """When only the wait histogram is known (Prometheus): the bucket holding the longest wait
    (``wait.max`` is then NaN)."""
    histogram_clipped: int = 0
    """Waits longer than the histogram's range (a few stalls far beyond the rest), counted in its last bin."""


@dataclass(frozen=True)
class LoaderConfig:
    rank: int
    workers: int | None
    pin_memory: bool | None
    cpus_available: float | None
    """CPUs the container may use (cgroup quota or affinity), else the node's logical CPUs."""
    too_few_workers: bool
    """Fewer workers than ``dataloader_min_threshold`` of the CPUs: more would load batches in parallel."""
    too_many_workers: bool
    """More workers than ``dataloader_max_threshold`` of the CPUs: they compete for cores."""


def loader_config(rank: int, workers: int | None, pin_memory: bool | None, cpus_available: float | None,
                  config: MixinConfig) -> LoaderConfig:
    """A rank's data-loader settings, its worker count judged against the CPUs it may use (when both are known)."""
    few = many = False
    if workers is not None and cpus_available:
        few = workers < config.dataloader_min_threshold * cpus_available
        many = not few and workers > config.dataloader_max_threshold * cpus_available
    return LoaderConfig(rank, workers, pin_memory, cpus_available, few, many)


@dataclass(frozen=True)
class DataLoaderAnalysis:
    region: str
    input_bound_threshold: float
    min_workers_share: float
    max_workers_share: float
    phases: tuple[LoaderPhase, ...]
    loaders: tuple[LoaderConfig, ...]
    most_waiting: LoaderPhase | None = field(init=False)
    """The rank and phase whose steps waited the largest share of their time, when that share is above
    WAIT_SHARE_WARN (the input pipeline limits training); None otherwise."""
    summaries: tuple[RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD ranks, per phase: wait share and p95 wait (else empty)."""

    def __post_init__(self) -> None:
        out: list[RankSummary] = []
        if many(len({x.rank for x in self.phases})):
            for phase in dict.fromkeys(x.phase for x in self.phases):
                rows = [x for x in self.phases if x.phase == phase]
                out += [summarize(((f"rank {x.rank}", x.wait_share) for x in rows), "wait share", "ratio", phase),
                        summarize(((f"rank {x.rank}", x.wait.p95) for x in rows), "wait p95", "seconds", phase)]
        object.__setattr__(self, "summaries", tuple(out))
        worst = max(self.phases, key=lambda x: x.wait_share, default=None)
        object.__setattr__(self, "most_waiting",
                           worst if worst is not None and worst.wait_share > WAIT_SHARE_WARN else None)


def dataloader_analysis(view: RunView, config: MixinConfig | None = None,
                        region: str = sc.REGION_DATALOADER) -> DataLoaderAnalysis:
    config = config or MixinConfig()
    phases = []
    loaders = []
    nodes = view.nodes()
    for index, info in enumerate(view.info):
        c = view.ranks[index].step_columns
        if len(c) and region in c.ann_names:
            shown = view.shown_phases()
            phases += [LoaderPhase(info.rank, phase, *figures)
                       for phase, figures in loader_phases(c, region, config.input_bound_threshold).items()
                       if phase in shown]
        gauges = last_values(view.ranks[index])
        workers = _value(gauges, sc.DATALOADER_WORKERS.name)
        pin = _value(gauges, sc.DATALOADER_PIN_MEMORY.name)
        cpus = _value(gauges, sc.CPU_AVAILABLE.name)
        if cpus is None and info.node in nodes:
            cpus = float(nodes[info.node][1].cores) or None
        if workers is not None or pin is not None or region in c.ann_names:
            loaders.append(loader_config(info.rank, int(workers) if workers is not None else None,
                                         bool(pin) if pin is not None else None, cpus, config))
    return DataLoaderAnalysis(region, config.input_bound_threshold, config.dataloader_min_threshold,
                              config.dataloader_max_threshold, tuple(phases), tuple(loaders))


LoaderFigures = tuple[int, int, Distribution, float, Distribution, int, float, Histogram, None, int]
"""A :class:`LoaderPhase`'s fields after its rank and phase."""


def loader_phases(c: StepColumns, region: str, input_bound: float) -> dict[str, LoaderFigures]:
    """Per phase of one rank's steps (that has a ``region``): the figures of its :class:`LoaderPhase`, steps
    waiting more than ``input_bound`` of their duration counted as input-bound (kept with the step columns:
    :func:`~otelprof.analysis.run.per_rank`)."""
    def compute() -> dict[str, LoaderFigures]:
        out: dict[str, LoaderFigures] = {}
        sums = c.annotation_sums(region)
        for phase, mask in c.phase_steps().items():  # mask: the phase's steps
            waits_ns = list(map(sums.__getitem__, mask))
            durations_ns = list(map(c.duration_ns.__getitem__, mask))
            steps = len(durations_ns)
            if not steps:
                continue
            pairs = [(w, d) for w, d in zip(waits_ns, durations_ns) if w]
            waits = sorted(w / 1e9 for w, _ in pairs)  # in order: what follows sorts it again at no cost
            ratios = [min(w / d, 1.0) if d > 0 else 1.0 for w, d in pairs]
            total_time = sum(durations_ns)
            histogram, clipped = wait_histogram(waits)
            out[phase] = (steps, len(waits), Distribution.of(waits), quantile(waits, 0.25),
                          Distribution.of(ratios), sum(1 for r in ratios if r > input_bound),
                          sum(waits_ns) / total_time if total_time else 0.0, histogram, None, clipped)
        return out

    return per_rank(c, ("loader", region, input_bound), compute)


TAIL_QUANTILE = 0.99
TAIL_FACTOR = 3.0


def wait_histogram(waits: list[float], bins: int = 50) -> tuple[Histogram, int]:
    """The waits' histogram and how many waits it clips: when the longest waits lie far beyond the rest (the
    maximum above TAIL_FACTOR times the 99th percentile: a few stalls), the bins span up to that percentile
    and the longer waits count in the last bin, so that the bulk does not collapse into one bar."""
    ordered = sorted(w for w in waits if math.isfinite(w))
    if not ordered:
        return Histogram.of((), bins), 0
    high = quantile(ordered, TAIL_QUANTILE)
    if high > 0 and ordered[-1] > TAIL_FACTOR * high:
        clipped = sum(1 for w in ordered if w > high)
        return Histogram.of_sorted([min(w, high) for w in ordered], bins, ordered[0], high), clipped
    return Histogram.of_sorted(ordered, bins), 0


def _value(gauges: dict[str, list[tuple[dict[str, object], float]]], name: str) -> float | None:
    points = gauges.get(name)
    if not points:
        return None
    value = points[-1][1]
    return value if not math.isnan(value) else None
