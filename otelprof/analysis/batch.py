"""Batch size: the original BatchSize rule's question — are CPUs, GPUs and GPU memory all lightly used
(95th percentiles below their thresholds), so that a larger batch (or a smaller instance) would use
the machine better — with the recorded batch size itself when the loop records ``samples``."""

from __future__ import annotations

from dataclasses import dataclass

from otelprof.analysis.gpu import GpuAnalysis
from otelprof.analysis.stats import BoxPlot
from otelprof.analysis.steps import StepAnalysis
from otelprof.analysis.system import SystemUsage
from otelprof.mixin.config import MixinConfig


@dataclass(frozen=True)
class BatchGpu:
    node: str
    gpu: str
    cpu_p95: float | None
    """Node-mean CPU, 95th percentile."""
    utilization_p95: float
    memory_p95: float
    small: bool
    """All three below their thresholds."""


@dataclass(frozen=True)
class BatchSize:
    cpu_threshold_p95: float
    gpu_threshold_p95: float
    memory_threshold_p95: float
    gpus: tuple[BatchGpu, ...]
    samples_per_step: tuple[tuple[int, str, float], ...]
    """(rank, phase, median recorded samples per step)."""
    node_cpu: tuple[tuple[str, BoxPlot], ...]
    """(node, box plot of the node's mean CPU use over time: the bucket means of its series)."""


def batch_size(system: SystemUsage, gpus: GpuAnalysis, steps: StepAnalysis,
               config: MixinConfig | None = None) -> BatchSize:
    config = config or MixinConfig()
    rows = []
    for g in gpus.gpus:
        cpu = system.row(g.node, "CPU")
        cpu_p95 = cpu.p95 if cpu is not None else None
        small = (g.utilization.count > 0 and g.memory.count > 0 and cpu_p95 is not None
                 and cpu_p95 < config.batch_size_cpu_threshold_p95
                 and g.utilization.p95 < config.batch_size_gpu_threshold_p95
                 and g.memory.p95 < config.batch_size_gpu_memory_threshold_p95)
        rows.append(BatchGpu(g.node, g.gpu, cpu_p95, g.utilization.p95, g.memory.p95, small))
    per_step = tuple((r.rank, r.phase, r.samples_per_step) for r in steps.rows if r.samples_per_step is not None)
    node_cpu = tuple((n.node, BoxPlot.of(n.cpu.mean)) for n in system.nodes)
    return BatchSize(config.batch_size_cpu_threshold_p95, config.batch_size_gpu_threshold_p95,
                     config.batch_size_gpu_memory_threshold_p95, tuple(rows), per_step, node_cpu)
