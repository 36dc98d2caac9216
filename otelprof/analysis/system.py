"""System usage statistics: max, p99, p95, p50 and min per node and metric, over every sample.

As in the original report, a node-wide figure is first averaged over the node's devices in each
sample (mean busy share over logical CPUs, mean utilization over GPUs) and the percentiles are then
taken over time. Ratios stay ratios (0..1); rates are bytes per second from the sampled counters.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import compress, repeat

from otelprof.analysis.ranksummary import TOP, RankSummary, many, summarize
from otelprof.analysis.run import RunView, across, gpu_memory_ratio, per_rank
from otelprof.analysis.stats import Bucket, Chunks, Series, quantile, sorted_finite
from otelprof.recording.columns import SampleColumns

UNIT_RATIO = "ratio"
UNIT_BYTES = "bytes"
UNIT_RATE = "bytes/s"

SOURCE_SAMPLES = "samples"
"""Every sample of the recording: all figures exact."""
SOURCE_HISTOGRAM = "histogram"
"""Prometheus, a per-sample histogram: every sample counted, quantiles interpolated within buckets, max and
min known only as the bucket that holds them (``max_bucket`` / ``min_bucket``; ``max`` and ``min`` NaN)."""
SOURCE_SCRAPES = "scrapes"
"""Prometheus, a gauge as scraped: exact over the scraped values; samples between scrapes are not seen."""
SOURCE_EVALUATED = "evaluated"
"""Prometheus, an expression over gauges or counters (a mean or maximum over CPUs, a rate) evaluated every
``resolution`` seconds over the range: exact at those points only."""

VERDICT_UNDERUSED = "underutilized"
"""GPU p95 and CPU p95 both below the busy threshold: a smaller instance would do."""
VERDICT_CPU_BOUND = "cpu_bound"
"""GPU p95 below, CPU p95 above the busy threshold: the GPUs likely wait for the CPUs."""
VERDICT_GOOD = "well_utilized"
"""GPU median above the busy threshold."""
VERDICT_MIXED = "mixed"
VERDICT_NO_GPU = "no_gpu"
BUSY = 0.7
"""The busy threshold of the verdicts (the original report's 70 %)."""


@dataclass(frozen=True)
class UsageRow:
    subject: str
    """Node name, or ``rank N`` for a process's own figures."""
    metric: str
    unit: str
    max: float
    p99: float
    p95: float
    p50: float
    min: float
    datapoints: int
    """Samples; for SOURCE_SCRAPES and SOURCE_EVALUATED the scrapes of the underlying series."""
    source: str = SOURCE_SAMPLES
    resolution: float | None = None
    """SOURCE_EVALUATED: seconds between the evaluations."""
    max_bucket: Bucket | None = None
    min_bucket: Bucket | None = None


@dataclass(frozen=True)
class NodeUsage:
    node: str
    sampled_by_rank: int
    """-1 when unknown."""
    samples: int
    interval: float
    """Median seconds between samples (from Prometheus: the sample counter's slope; NaN when unknown)."""
    cores: int
    """Logical CPUs; 0 when unknown."""
    gpus: tuple[str, ...]
    verdict: str
    core_mean: tuple[float, ...]
    """Mean busy share of each logical CPU over the run."""
    cpu: Series
    cpu_max: Series
    iowait: Series
    memory: Series
    gpu: Series
    gpu_memory: Series


@dataclass(frozen=True)
class SystemUsage:
    rows: tuple[UsageRow, ...]
    process_rows: tuple[UsageRow, ...]
    nodes: tuple[NodeUsage, ...]
    summaries: tuple[RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD nodes: per metric, each node's p50 and p95 over them (GPU: the
    least used are the worst) (else empty)."""
    process_summaries: tuple[RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD ranks: each process's p95 CPU and peak memory (else empty)."""
    detailed: tuple[str, ...] = field(init=False)
    """The nodes whose details the report shows: every node, or with many the ranksummary.TOP named most often
    among the worst of the summaries."""

    def __post_init__(self) -> None:
        out: list[RankSummary] = []
        if many(len({r.subject for r in self.rows})):
            for metric in dict.fromkeys(r.metric for r in self.rows):
                rows = [r for r in self.rows if r.metric == metric]
                for name in ("p50", "p95"):
                    out.append(summarize(((r.subject, getattr(r, name)) for r in rows), f"{metric} {name}",
                                         rows[0].unit, higher_is_worse=metric != "GPU"))
        processes: list[RankSummary] = []
        if many(len({r.subject for r in self.process_rows})):
            for metric in dict.fromkeys(r.metric for r in self.process_rows):
                rows = [r for r in self.process_rows if r.metric == metric]
                bytes_ = rows[0].unit == UNIT_BYTES
                processes.append(summarize(((r.subject, r.max if bytes_ else r.p95) for r in rows),
                                           f"{metric} {'max' if bytes_ else 'p95'}", rows[0].unit))
        object.__setattr__(self, "summaries", tuple(out))
        object.__setattr__(self, "process_summaries", tuple(processes))
        named = Counter(x.subject for s in out for x in s.worst)
        order = {n.node: i for i, n in enumerate(self.nodes)}
        object.__setattr__(self, "detailed", tuple(sorted(
            sorted(named, key=lambda node: (-named[node], order.get(node, 0)))[:TOP], key=lambda n: order.get(n, 0)))
            if out else tuple(n.node for n in self.nodes))

    def row(self, subject: str, metric: str) -> UsageRow | None:
        return next((r for r in self.rows if r.subject == subject and r.metric == metric), None)


Usage = tuple[float, float, float, float, float, int]
"""max, p99, p95, p50, min and count of a metric's finite values."""


def _usage(values: Sequence[float]) -> Usage | None:
    ordered = sorted_finite(values)
    if not ordered:
        return None
    top, p99, p95, p50, low = (max(quantile(ordered, p), 0.0) for p in (1.0, 0.99, 0.95, 0.5, 0.0))
    return top, p99, p95, p50, low, len(ordered)


def _row(subject: str, metric: str, unit: str, values: Sequence[float]) -> UsageRow | None:
    usage = _usage(values)
    return None if usage is None else UsageRow(subject, metric, unit, *usage)


def _rates(times: array[int], *counters: array[float]) -> tuple[list[float], list[float]]:
    """Per interval: (time, sum of the counters' increase per second); resets are skipped."""
    totals = list(map(sum, zip(*counters)))
    if math.isfinite(sum(totals)):  # every sample has the counters: each interval is from the sample before
        dt = list(map(operator.sub, times[1:], times[:-1]))
        dv = list(map(operator.sub, totals[1:], totals[:-1]))
        keep = [a > 0 and b >= 0 for a, b in zip(dt, dv)]
        return ([t / 1e9 for t in compress(times[1:], keep)],
                list(map(operator.truediv, compress(dv, keep), map(operator.truediv, compress(dt, keep),
                                                                    repeat(1e9)))))
    out_t, out_v = [], []
    previous_t, previous = 0, 0.0
    first = True
    for t, total in zip(times, totals):
        if total != total:
            continue
        if not first and t > previous_t and total >= previous:
            out_t.append(t / 1e9)
            out_v.append((total - previous) / ((t - previous_t) / 1e9))
        previous_t, previous, first = t, total, False
    return out_t, out_v


def _rate_values(times: array[int], seconds: list[float] | None, *counters: array[float]) -> list[float]:
    """``_rates(times, *counters)[1]``; ``seconds``: :func:`_intervals` of the times. When every sample has the
    counters, time runs forward and no counter is reset (the usual node): the same quotients at once."""
    totals = map((0.0).__add__, counters[0])  # as sum() adds: 0.0 first (a -0.0 count sums to 0.0)
    for counter in counters[1:]:
        totals = map(operator.add, totals, counter)
    kept = list(totals)
    if seconds is not None and len(kept) == len(times) and math.isfinite(sum(kept)):
        dv = list(map(operator.sub, kept[1:], kept[:-1]))
        if min(dv) >= 0:
            return list(map(operator.truediv, dv, seconds))
    return _rates(times, *counters)[1]


def _intervals(times: array[int]) -> list[float] | None:
    """Seconds from each sample to the next (``dt / 1e9``), or None when time does not always run forward."""
    dt = list(map(operator.sub, times[1:], times[:-1]))
    return list(map((1e9).__rtruediv__, dt)) if dt and min(dt) > 0 else None


@dataclass(frozen=True)
class NodeFigures:
    """What :func:`system_usage` finds in one node's samples alone: computed once per sample columns
    (:func:`~otelprof.analysis.run.per_rank`, beside the parsing)."""

    rows: tuple[tuple[str, str, Usage], ...]
    """(metric, unit, usage) of the metrics sampled."""
    samples: int
    interval: float
    series: tuple[Chunks, ...]
    """CPU, busiest core, I/O wait, memory, GPU, GPU memory."""


def node_figures(c: SampleColumns, memory: dict[str, list[float]] | None = None,
                 gpu_mean: list[float] | None = None) -> NodeFigures:
    """``memory``: :func:`gpu_memory_ratios`, ``gpu_mean``: :func:`per_sample_gpu_mean`, when already known."""
    return per_rank(c, "system node", partial(_node_figures, c, memory, gpu_mean))


def _node_figures(c: SampleColumns, memory: dict[str, list[float]] | None,
                  gpu_mean: list[float] | None = None) -> NodeFigures:
    gpu_mean = per_sample_gpu_mean(c) if gpu_mean is None else gpu_mean
    gpu_mem = per_sample_gpu_memory(c, memory)
    seconds = _intervals(c.t_ns)
    net_v = _rate_values(c.t_ns, seconds, c.net_rx, c.net_tx)
    disk_v = _rate_values(c.t_ns, seconds, c.disk_read, c.disk_write)
    rows = []
    for metric, unit, values in (("CPU", UNIT_RATIO, c.cpu_mean), ("CPU, busiest core", UNIT_RATIO, c.cpu_max),
                                 ("I/O wait", UNIT_RATIO, c.iow_mean), ("CPU memory", UNIT_RATIO, c.mem),
                                 ("GPU", UNIT_RATIO, gpu_mean), ("GPU memory", UNIT_RATIO, gpu_mem),
                                 ("Network", UNIT_RATE, net_v), ("Disk", UNIT_RATE, disk_v)):
        usage = _usage(values)
        if usage is not None:
            rows.append((metric, unit, usage))
    times = list(map((1e9).__rtruediv__, c.t_ns))  # t / 1e9
    gaps = sorted(compress(map(operator.sub, times[1:], times[:-1]), map(operator.lt, times, times[1:])))
    middle = len(gaps) // 2  # statistics.median's
    interval = (gaps[middle] if len(gaps) % 2 else (gaps[middle - 1] + gaps[middle]) / 2) if gaps else math.nan
    return NodeFigures(tuple(rows), sum(map(operator.eq, c.cpu_mean, c.cpu_mean)), interval,
                       tuple(Chunks.of(v) for v in (c.cpu_mean, c.cpu_max, c.iow_mean, c.mem, gpu_mean, gpu_mem)))


def process_figures(c: SampleColumns) -> tuple[Usage | None, Usage | None]:
    """A process's CPU and resident memory (any rank's samples)."""
    return per_rank(c, "system process", lambda: (_usage(c.pcpu), _usage(c.rss)))


def per_sample_gpu_mean(columns: SampleColumns, key: str = "u") -> list[float]:
    """Per sample: the mean of one GPU key over the GPUs that reported it (NaN when none did)."""
    series = [g[key] for g in columns.gpus.values() if key in g]
    return across(series, "mean") if series else [math.nan] * len(columns)


def gpu_memory_ratios(columns: SampleColumns) -> dict[str, list[float]]:
    """Per GPU index that reported its memory: per sample, used / total."""
    return {index: gpu_memory_ratio(g["mu"], g["mt"]) for index, g in columns.gpus.items() if "mu" in g and "mt" in g}


def per_sample_gpu_memory(columns: SampleColumns, memory: dict[str, list[float]] | None = None) -> list[float]:
    ratios = list((gpu_memory_ratios(columns) if memory is None else memory).values())
    return across(ratios, "mean") if ratios else [math.nan] * len(columns)


def verdict(cpu: UsageRow | None, gpu: UsageRow | None) -> str:
    if gpu is None:
        return VERDICT_NO_GPU
    if cpu is not None and gpu.p95 < BUSY and cpu.p95 < BUSY:
        return VERDICT_UNDERUSED
    if cpu is not None and gpu.p95 < BUSY and cpu.p95 > BUSY:
        return VERDICT_CPU_BOUND
    if gpu.p50 > BUSY:
        return VERDICT_GOOD
    return VERDICT_MIXED


def system_usage(view: RunView) -> SystemUsage:
    rows: list[UsageRow] = []
    nodes = []
    origin = view.origin
    for node, (info, c) in view.nodes().items():
        view.say(f"system usage of node {node}")
        figures = node_figures(c)
        node_usage = [UsageRow(node, metric, unit, *usage) for metric, unit, usage in figures.rows]
        rows.extend(node_usage)
        cpu_row = next((r for r in node_usage if r.metric == "CPU"), None)
        gpu_row = next((r for r in node_usage if r.metric == "GPU"), None)
        nodes.append(NodeUsage(
            node, info.rank, figures.samples, figures.interval, c.cores,
            tuple(sorted(c.gpus, key=gpu_order)), verdict(cpu_row, gpu_row),
            tuple(s / c.node_samples for s in c.core_busy_sum) if c.node_samples else (),
            *(chunks.series_ns(c.t_ns, origin) for chunks in figures.series)))
    process_rows: list[UsageRow] = []
    for index, info in enumerate(view.info):
        for metric, unit, usage in zip(("Process CPU", "Process memory (RSS)"), (UNIT_RATIO, UNIT_BYTES),
                                       process_figures(view.samples(index))):
            if usage is not None:
                process_rows.append(UsageRow(f"rank {info.rank}", metric, unit, *usage))
    return SystemUsage(tuple(rows), tuple(process_rows), tuple(nodes))


def gpu_order(index: str) -> tuple[int, str]:
    return (int(index), index) if index.isdigit() else (1 << 30, index)
