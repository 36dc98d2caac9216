"""Per-GPU utilization and memory: box-plot statistics over every sample of the run, and the flags
the original report raised (95th percentile low, 5th percentile low while the 95th is high:
fluctuating; memory low, swinging, growing or near capacity)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from otelprof.analysis.ranksummary import RankSummary, many, summarize
from otelprof.analysis.run import RunView, per_rank
from otelprof.analysis.stats import BoxPlot, Chunks, Series, finite, sorted_finite
from otelprof.analysis.system import gpu_memory_ratios, gpu_order
from otelprof.mixin.config import MixinConfig
from otelprof.recording.columns import SampleColumns

MEMORY_LOW_P95 = 0.5
"""GPU memory whose 95th percentile stays below this share of the device leaves room for a larger batch."""
MEMORY_SWING = 0.5
"""GPU memory whose 5th and 95th percentiles lie more than this share of the device apart swings."""


@dataclass(frozen=True)
class MemoryFlags:
    """What stands out in one GPU's memory use."""

    low: bool
    """The 95th percentile stays below MEMORY_LOW_P95."""
    swinging: bool
    """The 5th and 95th percentiles lie more than MEMORY_SWING apart."""
    growing: bool
    """Memory grew by more than the GPUMemoryIncrease threshold (``gpu_memory_increase``) of the device between
    the first and last tenth of the run."""
    full: bool
    """Memory peaked above the near-capacity threshold (``gpu_memory_capacity_threshold``), or in a histogram
    bucket from it up."""

    @classmethod
    def of(cls, memory: BoxPlot, growth: float, config: MixinConfig) -> MemoryFlags:
        """Judge a GPU's memory (ratios of the device) and its growth over the run."""
        capacity = config.gpu_memory_capacity_threshold
        return cls(memory.p95 < MEMORY_LOW_P95, memory.p95 - memory.p5 > MEMORY_SWING,
                   growth > config.gpu_memory_increase,
                   memory.max > capacity or (memory.max_bucket is not None and memory.max_bucket.low >= capacity))


@dataclass(frozen=True)
class GpuUsage:
    node: str
    gpu: str
    utilization: BoxPlot
    """Ratio 0..1."""
    memory: BoxPlot
    """Memory used / total, ratio."""
    memory_total: float | None
    """Bytes."""
    power: float | None
    """Median watts."""
    temperature: float | None
    """Median degrees Celsius."""
    underused: bool
    """p95 utilization below the threshold."""
    fluctuating: bool
    """p5 below, p95 above their thresholds."""
    idle: bool
    """Never busy: an unused device."""
    memory_growth: float
    """Mean memory ratio of the last tenth of the run minus the first tenth (from Prometheus: of the scraped
    gauge over the range; NaN when a tenth holds no scrape)."""
    utilization_series: Series
    memory_series: Series
    memory_flags: MemoryFlags


@dataclass(frozen=True)
class GpuAnalysis:
    threshold_p95: float
    threshold_p5: float
    gpus: tuple[GpuUsage, ...]
    summaries: tuple[RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD GPUs: median and p95 utilization (the lowest are the worst), p95
    and peak memory (else empty)."""

    def __post_init__(self) -> None:
        out: list[RankSummary] = []
        if many(len(self.gpus)):
            names = [f"{x.node} GPU {x.gpu}" for x in self.gpus]
            out += [summarize(zip(names, (x.utilization.median for x in self.gpus)), "median utilization", "ratio",
                              higher_is_worse=False),
                    summarize(zip(names, (x.utilization.p95 for x in self.gpus)), "p95 utilization", "ratio",
                              higher_is_worse=False),
                    summarize(zip(names, (x.memory.p95 for x in self.gpus)), "p95 memory", "ratio"),
                    summarize(zip(names, (x.memory.max for x in self.gpus)), "peak memory", "ratio")]
        object.__setattr__(self, "summaries", tuple(out))


def _median(values: Sequence[float]) -> float | None:
    data = sorted_finite(values)
    return data[len(data) // 2] if data else None


def _growth(values: list[float]) -> float:
    data = finite(values)
    if len(data) < 20:
        return 0.0
    tenth = len(data) // 10
    return math.fsum(data[-tenth:]) / tenth - math.fsum(data[:tenth]) / tenth


@dataclass(frozen=True)
class GpuFigures:
    """What :func:`gpu_analysis` finds in one GPU's samples alone (kept with the node's sample columns:
    :func:`~otelprof.analysis.run.per_rank`)."""

    utilization: BoxPlot
    memory: BoxPlot
    memory_total: float | None
    power: float | None
    temperature: float | None
    memory_growth: float
    utilization_chunks: Chunks
    memory_chunks: Chunks | None


def gpu_figures(c: SampleColumns, memory: dict[str, list[float]] | None = None,
                ordered: dict[str, list[float]] | None = None) -> dict[str, GpuFigures]:
    """Per GPU index of a node's samples, in :func:`~otelprof.analysis.system.gpu_order` (``memory``:
    :func:`~otelprof.analysis.system.gpu_memory_ratios`, ``ordered``: the utilization values in ascending order,
    when already known)."""
    return per_rank(c, "gpu", partial(_gpu_figures, c, memory, ordered))


def _gpu_figures(c: SampleColumns, ratios: dict[str, list[float]] | None,
                 ordered: dict[str, list[float]] | None) -> dict[str, GpuFigures]:
    ratios = gpu_memory_ratios(c) if ratios is None else ratios
    out = {}
    for index in sorted(c.gpus, key=gpu_order):
        g = c.gpus[index]
        util = g.get("u", ())
        memory = ratios.get(index, [])
        totals: Sequence[float] = g.get("mt", ())
        if not math.isfinite(sum(totals)):  # NaN where a sample lacks it
            totals = finite(totals)
        # the box plot sorts its values: the same numbers in order make the same box (its mean is an fsum)
        box = BoxPlot.of(util) if ordered is None else BoxPlot.of_sorted(ordered[index])
        out[index] = GpuFigures(box, BoxPlot.of(memory), max(totals) if totals else None,
                                _median(g.get("p", ())), _median(g.get("t", ())), _growth(memory), Chunks.of(util),
                                Chunks.of(memory) if memory else None)
    return out


def gpu_analysis(view: RunView, config: MixinConfig | None = None) -> GpuAnalysis:
    config = config or MixinConfig()
    rows = []
    origin = view.origin
    for node, (_, c) in view.nodes().items():
        for index, f in gpu_figures(c).items():
            ubox, mbox, growth = f.utilization, f.memory, f.memory_growth
            rows.append(GpuUsage(
                node, index, ubox, mbox, f.memory_total, f.power, f.temperature,
                ubox.count > 0 and ubox.p95 < config.low_gpu_threshold_p95 and ubox.max > 0,
                ubox.count > 0 and ubox.p5 < config.low_gpu_threshold_p5 and ubox.p95 > config.low_gpu_threshold_p95,
                ubox.count > 0 and ubox.max <= 0, growth, f.utilization_chunks.series_ns(c.t_ns, origin),
                f.memory_chunks.series_ns(c.t_ns, origin) if f.memory_chunks is not None else Series((), (), ()),
                MemoryFlags.of(mbox, growth, config)))
    return GpuAnalysis(config.low_gpu_threshold_p95, config.low_gpu_threshold_p5, tuple(rows))
