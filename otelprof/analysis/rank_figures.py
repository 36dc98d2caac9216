"""What the report's sections compute from one rank alone, computed where the rank is parsed: the reader calls
:func:`prepare_figures` in its parsing processes (through
:func:`~otelprof.analysis.check_recording.prepare_sections`), so these figures are computed on every core while the
recording is read, and come back kept with the rank's columns (:func:`~otelprof.analysis.run.per_rank`). The
sections then find them there, computed with the same functions; settings other than those assumed here (a
config given to the report, another rank's outlier settings) are computed when asked."""

from __future__ import annotations

from dataclasses import dataclass

from otelprof import semconv as sc
from otelprof.analysis.bottlenecks import coincidences
from otelprof.analysis.dataloader import loader_phases
from otelprof.analysis.framework import rank_breakdown, rank_regions
from otelprof.analysis.gpu import gpu_figures
from otelprof.analysis.loadbalance import gpu_loads, ordered_utilization, rank_loads
from otelprof.analysis.progress import MAIN_PHASE, rank_throughput
from otelprof.analysis.run import MAX_PHASES, gpu_utilization, outlier_settings, phase_totals
from otelprof.analysis.steps import step_figures
from otelprof.analysis.system import gpu_memory_ratios, node_figures, process_figures
from otelprof.mixin.config import MixinConfig
from otelprof.recording.ranks import RankRecording


@dataclass(frozen=True)
class NodeColumns:
    """Per-sample columns the figures derive from a node's samples and the checks' sample table reads too: handed
    on by :func:`prepare_figures`, not kept (each is as large as the samples)."""

    memory: dict[str, list[float]]
    """:func:`~otelprof.analysis.system.gpu_memory_ratios`."""
    lowest: list[float]
    """:func:`~otelprof.analysis.run.gpu_min`."""


def prepare_figures(rank: RankRecording, config: MixinConfig | None = None) -> NodeColumns | None:
    """Compute and keep one rank's figures, with ``config`` (default: the mixin's defaults, as the report's)
    and the outlier settings the rank recorded; a node rank's derived columns are returned."""
    config = config or MixinConfig()
    samples = rank.sample_columns()
    process_figures(samples)
    node = None
    if samples.node_samples:
        memory = gpu_memory_ratios(samples)
        ordered = ordered_utilization(samples)
        mean, lowest = gpu_utilization(samples)
        node_figures(samples, memory, mean)
        gpu_figures(samples, memory, ordered)
        gpu_loads(samples, ordered)
        coincidences(samples, False, config.cpu_threshold, config.gpu_threshold, lowest)
        coincidences(samples, True, config.io_threshold, config.gpu_threshold, lowest)
        node = NodeColumns(memory, lowest)
    c = rank.step_columns
    if not len(c):
        return node
    phase_totals(c)
    rank_regions(c)
    rank_breakdown(c)
    rank_loads(c)
    if sc.REGION_DATALOADER in c.ann_names:
        loader_phases(c, sc.REGION_DATALOADER, config.input_bound_threshold)
    scalars = {name: c.scalar(name) for name in (sc.SCALAR_SAMPLES, sc.SCALAR_TOKENS)}  # read once for both
    if len(c.phase_names) <= MAX_PHASES:  # else the report lists only some of them: it computes those
        sigma, floor = outlier_settings(rank.manifest.get("config") or {})
        step_figures(rank, c.phase_names, sigma, floor, scalars=scalars)
    if MAIN_PHASE in c.phase_names:
        for name, read in scalars.items():
            rank_throughput(c, MAIN_PHASE, name, read)
    return node
