"""Recording rules: the expensive expressions the dashboards reuse.

Names follow ``level:metric:operations``; the level ``otelprof`` means "per training process"
(the identity labels job_name, rank, local_rank, node are kept). Dashboards take the names
from :func:`recording_names` so they never drift from this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otelprof import semconv as sc
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.gpu_source import GpuReadings
from otelprof.mixin.promql import Q

LEVEL = "otelprof"
GROUP = "otelprof-recording"
"""Per training process: steps, loss, data wait."""
SYSTEM_GROUP = "otelprof-recording-system"
"""Per node and GPU, from the sampler's histograms and counters. A group of its own: Prometheus evaluates groups
concurrently, and at a thousand ranks either half is a large share of an evaluation interval (docs/scale.md)."""


@dataclass(frozen=True)
class Record:
    key: str
    """Stable key the dashboards look names up by."""
    metric: str
    operation: str
    expr: str
    help: str
    group: str = GROUP

    @property
    def name(self) -> str:
        metric = self.metric.removeprefix(LEVEL + "_")
        return f"{LEVEL}:{metric}:{self.operation}"

    def rule(self) -> dict[str, Any]:
        return {"record": self.name, "expr": self.expr}


def recording_rules(c: MixinConfig) -> list[Record]:
    q = Q(c.selector)
    w = c.window
    sw = c.straggler_window
    iw = c.input_bound_window
    ow = c.step_outlier_window
    step = sc.STEP_DURATION.prometheus_name
    loss_count = q.delta(sc.LOSS_RECORDED, c.overtraining_window)
    records = [
        Record("step_p50", step, f"p50_{sw}", q.window_quantile(0.5, sc.STEP_DURATION, sw),
               "Median step time per process and phase."),
        Record("step_p95", step, f"p95_{sw}", q.window_quantile(0.95, sc.STEP_DURATION, sw),
               "95th percentile step time per process and phase."),
        Record("step_mean", step, f"mean_{sw}", q.window_mean(sc.STEP_DURATION, sw),
               "Mean step time per process and phase (exact)."),
        Record("step_compute_mean", "step_compute_seconds", f"mean_{sw}", step_compute(q, sw),
               "Mean step time less exposed collective time, of processes with steps in the window: what the "
               "straggler alert compares across ranks."),
        Record("steps_rate", sc.STEPS.prometheus_name, "rate5m", f"rate({q.sel(sc.STEPS)}[5m])",
               "Steps per second."),
        Record("samples_rate", sc.SAMPLES.prometheus_name, "rate5m", f"rate({q.sel(sc.SAMPLES)}[5m])",
               "Training samples per second (throughput)."),
        Record("tokens_rate", sc.TOKENS.prometheus_name, "rate5m", f"rate({q.sel(sc.TOKENS)}[5m])",
               "Tokens per second (throughput)."),
        Record("step_outliers", sc.STEP_OUTLIERS.prometheus_name, f"increase_{ow}", q.delta(sc.STEP_OUTLIERS, ow),
               "Outlier steps in the window (exact count)."),
        Record("loss_mean", sc.LOSS_SUMMED.prometheus_name.removesuffix("_summed"), f"mean_{c.overtraining_window}",
               f"({q.delta(sc.LOSS_SUMMED, c.overtraining_window)} / {loss_count}) and {loss_count} > 0",
               "Mean recorded loss per step per process and phase (exact; the overtraining alert's minimum and "
               "maximum over its lookback)."),
        Record("dataloader_wait_ratio", sc.DATALOADER_WAIT_RATIO.prometheus_name, f"mean_{iw}",
               q.window_mean(sc.DATALOADER_WAIT_RATIO, iw), "Mean share of each step spent waiting for data."),
    ]
    for key, spec in (("cpu_bottleneck", sc.SAMPLER_CPU_BOTTLENECK), ("io_bottleneck", sc.SAMPLER_IO_BOTTLENECK),
                      ("low_gpu", sc.SAMPLER_LOW_GPU), ("high_cpu", sc.SAMPLER_HIGH_CPU)):
        records.append(Record(
            f"{key}_ratio", spec.prometheus_name, f"ratio_{w}",
            f"{q.delta(spec, w)} / {q.delta(sc.SAMPLER_SAMPLES, w)}",
            f"Share of the node's samples that counted as {key.replace('_', ' ')} (exact).", SYSTEM_GROUP))
    g = GpuReadings(c)
    for key, spec, gauge in (("gpu_utilization", sc.GPU_UTILIZATION_DISTRIBUTION, sc.GPU_UTILIZATION),
                             ("gpu_memory_utilization", sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION,
                              sc.GPU_MEMORY_UTILIZATION)):
        records.append(Record(f"{key}_p95", spec.prometheus_name, f"p95_{w}",
                              g.quantile(0.95, gauge, w), f"95th percentile of the samples of {key}.", SYSTEM_GROUP))
        records.append(Record(f"{key}_p5", spec.prometheus_name, f"p5_{w}",
                              g.quantile(0.05, gauge, w), f"5th percentile of the samples of {key}.", SYSTEM_GROUP))
        records.append(Record(f"{key}_mean", spec.prometheus_name, f"mean_{w}",
                              g.mean(gauge, w), f"Mean of the samples of {key} (exact).", SYSTEM_GROUP))
    for key, spec in (("node_cpu_utilization", sc.NODE_CPU_UTILIZATION),):
        records.append(Record(f"{key}_p95", spec.prometheus_name, f"p95_{w}",
                              q.window_quantile(0.95, spec, w), f"95th percentile of the samples of {key}.",
                              SYSTEM_GROUP))
        records.append(Record(f"{key}_p5", spec.prometheus_name, f"p5_{w}",
                              q.window_quantile(0.05, spec, w), f"5th percentile of the samples of {key}.",
                              SYSTEM_GROUP))
        records.append(Record(f"{key}_mean", spec.prometheus_name, f"mean_{w}",
                              q.window_mean(spec, w), f"Mean of the samples of {key} (exact).", SYSTEM_GROUP))
    return records


def step_compute(q: Q, window: str) -> str:
    """Mean compute time per step over ``window``: step time less the all-reduce time the backward pass did not
    overlap, for each process and phase with steps in the window (no series otherwise, never NaN)."""
    step_sum = q.delta(sc.STEP_DURATION, window, "sum")
    coll_sum = q.delta(sc.COLLECTIVE_EXPOSED, window, "sum")
    step_count = q.delta(sc.STEP_DURATION, window, "count")
    return f"({step_sum} - ({coll_sum} or {step_sum} * 0)) / ({step_count} > 0)"


def reuse(c: MixinConfig, key: str, expr: str) -> str:
    """What an alert reads for ``expr``: the recording rule ``key``'s series where that rule records exactly
    ``expr`` (computed once per evaluation by the recording group, read as of its last evaluation: at most one
    evaluation interval older), else ``expr`` itself, in parentheses."""
    record = next((r for r in recording_rules(c) if r.key == key), None)
    return record.name if record is not None and record.expr == expr else f"({expr})"


def recording_names(c: MixinConfig | None = None) -> dict[str, str]:
    """Recording-rule name by key (for the dashboards)."""
    return {r.key: r.name for r in recording_rules(c or MixinConfig())}

