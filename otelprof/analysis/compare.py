"""Before/after comparison of runs: did a change (more loader workers, a larger batch, ...) help?

Per run: job and training-loop duration, steps of the compared phase, step time p50/p95 (all
ranks' steps pooled), throughput (recorded samples per second of step time, all ranks added),
mean GPU and node CPU utilization, and with a price per node-hour the cost of the run and of a
million samples. Each later run is compared with the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from otelprof.analysis.run import RunView
from otelprof.analysis.stats import finite, quantile
from otelprof.analysis.summary import job_summary
from otelprof.analysis.system import per_sample_gpu_mean
from otelprof.recording.ranks import Recording


@dataclass(frozen=True)
class RunFigures:
    name: str
    run_id: str
    ranks: int
    nodes: int
    duration: float | None
    training_duration: float | None
    steps: int
    step_p50: float | None
    step_p95: float | None
    throughput: float | None
    """Samples per second (all ranks), or None when the loop did not record ``samples``."""
    gpu_utilization: float | None
    cpu_utilization: float | None
    cost: float | None
    cost_per_million_samples: float | None


@dataclass(frozen=True)
class Comparison:
    phase: str
    price_per_hour: float | None
    runs: tuple[RunFigures, ...]


METRICS: tuple[tuple[str, str, str, bool], ...] = (
    ("duration", "Job duration", "seconds", False),
    ("training_duration", "Training loop", "seconds", False),
    ("steps", "Steps", "count", True),
    ("step_p50", "Step time p50", "seconds", False),
    ("step_p95", "Step time p95", "seconds", False),
    ("throughput", "Throughput", "samples/s", True),
    ("gpu_utilization", "GPU utilization (mean)", "ratio", True),
    ("cpu_utilization", "CPU utilization (mean)", "ratio", True),
    ("cost", "Cost", "currency", False),
    ("cost_per_million_samples", "Cost per million samples", "currency", False),
)
"""(field, label, unit, higher is better) of the comparison table."""


def _mean(values: list[float]) -> float | None:
    data = finite(values)
    return math.fsum(data) / len(data) if data else None


def run_figures(name: str, recording: Recording, phase: str = "train",
                price_per_hour: float | None = None) -> RunFigures:
    view = RunView(recording)
    summary = job_summary(view)
    durations: list[float] = []
    samples = 0.0
    busy = 0.0
    throughput: float | None = None
    for index, rank in enumerate(view.ranks):
        mine = view.durations(index).get(phase, [])
        durations += mine
        c = rank.step_columns
        if phase in c.phase_names:
            code = c.phase_names.index(phase)
            at, values = c.scalar("samples")
            got = math.fsum(v for i, v in zip(at, values) if c.phase[i] == code and v == v)
            if got and mine:
                samples += got
                busy += math.fsum(mine)
                throughput = (throughput or 0.0) + got / math.fsum(mine)
    ordered = sorted(durations)
    gpu: list[float] = []
    cpu: list[float] = []
    for _, columns in view.nodes().values():
        gpu += per_sample_gpu_mean(columns)
        cpu += list(columns.cpu_mean)
    nodes = max(len(summary.nodes), 1)
    cost = (price_per_hour * nodes * summary.duration / 3600
            if price_per_hour is not None and summary.duration is not None else None)
    per_million = cost / samples * 1e6 if cost is not None and samples else None
    return RunFigures(name, summary.run_id, len(summary.ranks), len(summary.nodes), summary.duration,
                      summary.training_duration, len(ordered), quantile(ordered, 0.5) if ordered else None,
                      quantile(ordered, 0.95) if ordered else None, throughput, _mean(gpu), _mean(cpu), cost,
                      per_million)


def compare(runs: list[tuple[str, Recording]], phase: str = "train",
            price_per_hour: float | None = None) -> Comparison:
    return Comparison(phase, price_per_hour, tuple(run_figures(name, rec, phase, price_per_hour)
                                                   for name, rec in runs))


def change(before: float | None, after: float | None) -> float | None:
    """Relative change after / before - 1 (None when either is missing or before is 0)."""
    if before is None or after is None or not before or math.isnan(before) or math.isnan(after):
        return None
    return after / before - 1
