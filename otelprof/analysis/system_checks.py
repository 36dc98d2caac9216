"""The system alerts' offline twins: CPU and I/O bottlenecks, GPU utilization quantiles and memory, host
memory, load balance across the job's GPUs; judged on the node samples."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import partial

from otelprof.analysis.check_context import CheckContext, CheckGroup, Condition, Conditions, Firing, by_job
from otelprof.analysis.check_tables import BUCKETS, Series
from otelprof.analysis.window_bounds import (
    approximate_means,
    never_above,
    quantile_range,
    spread_never_above,
    threshold_cuts,
)
from otelprof.mixin.alert_model import OFFLINE_SYSTEM
from otelprof.mixin.config import seconds


def bottleneck(ctx: CheckContext, io: bool) -> Condition:
    threshold = ctx.c.io_bottleneck_threshold if io else ctx.c.cpu_bottleneck_threshold
    name = "IOBottleneck" if io else "CPUBottleneck"

    def condition(times: Sequence[float]) -> list[list[Firing]]:
        out: list[list[Firing]] = [[] for _ in times]
        for r in ctx.ranks:
            table = ctx.samples[id(r)]
            lo, hi = ctx.spans(table.times, times, ctx.w)
            hits = table.io_hits if io else table.cpu_hits
            for k in ctx.live(r, times, warm=True):
                i, j = lo[k], hi[k]
                if j > i:
                    ctx.judged.add(name)
                    fraction = (hits[j] - hits[i]) / (j - i)
                    if fraction > threshold:
                        out[k].append(Firing(r.subject, fraction))
        return out
    return condition


def gpu_quantiles(ctx: CheckContext, kind: str) -> Condition:
    c = ctx.c
    name = {"under": "GPUUnderutilized", "fluctuating": "GPUUtilizationFluctuating",
            "batch": "BatchSizeTooSmall"}[kind]
    cuts = gpu_cuts(ctx)
    above_first = BUCKETS[0] >= 0
    # a window with no value at or below the highest cut is busy, and its quantiles are past that cut's bound
    quiet = above_first and BUCKETS[cuts[-1]] >= {"under": c.low_gpu_threshold_p95,
                                                   "fluctuating": c.low_gpu_threshold_p5,
                                                   "batch": c.batch_size_gpu_threshold_p95}[kind]

    def condition(times: Sequence[float]) -> list[list[Firing]]:
        out: list[list[Firing]] = [[] for _ in times]
        for r in ctx.ranks:
            live = ctx.live(r, times, warm=True)
            if not live:
                continue
            table = ctx.samples[id(r)]
            cpu_lo, cpu_hi = ctx.spans(table.cpu_mean.times, times, ctx.w)
            for gpu, values in sorted(table.util.items()):
                lo, hi = ctx.spans(values.times, times, ctx.w)
                counts = ctx.cut_counts(values, times, ctx.w, cuts)  # 3 checks' own
                memory = table.memory.get(gpu)
                mem_lo, mem_hi = ctx.spans(memory.times, times, ctx.w) if memory is not None else ([], [])
                if counts is None and quiet:  # busy wherever it has values, and never firing
                    if name not in ctx.judged and any(hi[k] > lo[k] for k in live):
                        ctx.judged.add(name)
                    continue
                subject = f"{r.subject} gpu {gpu}"
                for k in live:
                    i, j = lo[k], hi[k]
                    if j <= i:
                        continue
                    n = j - i
                    at = counts[k] if counts is not None else (0,) * len(cuts)
                    if not ((above_first and at[0] < n) or values.any_positive(i, j)):
                        continue  # never busy: an unused device
                    ctx.judged.add(name)
                    if kind == "under":
                        if quantile_range(0.95, n, at, cuts)[0] >= c.low_gpu_threshold_p95:
                            continue  # its p95 is at or above the threshold, whatever it is
                        p95 = values.quantile(0.95, i, j)
                        if p95 < c.low_gpu_threshold_p95:
                            out[k].append(Firing(subject, p95))
                    elif kind == "fluctuating":
                        if (quantile_range(0.05, n, at, cuts)[0] >= c.low_gpu_threshold_p5
                                or quantile_range(0.95, n, at, cuts)[1] <= c.low_gpu_threshold_p95):
                            continue
                        p95, p5 = values.quantile(0.95, i, j), values.quantile(0.05, i, j)
                        if p5 < c.low_gpu_threshold_p5 and p95 > c.low_gpu_threshold_p95:
                            out[k].append(Firing(subject, p5))
                    elif kind == "batch":
                        if quantile_range(0.95, n, at, cuts)[0] >= c.batch_size_gpu_threshold_p95:
                            continue
                        p95 = values.quantile(0.95, i, j)
                        if (p95 < c.batch_size_gpu_threshold_p95 and memory is not None
                                and mem_hi[k] > mem_lo[k]
                                and memory.quantile(0.95, mem_lo[k], mem_hi[k]) < c.batch_size_gpu_memory_threshold_p95
                                and cpu_hi[k] > cpu_lo[k]
                                and table.cpu_mean.quantile(0.95, cpu_lo[k], cpu_hi[k])
                                < c.batch_size_cpu_threshold_p95):
                            out[k].append(Firing(subject, p95))
        return out
    return condition


def gpu_cuts(ctx: CheckContext) -> tuple[int, ...]:
    """The bucket counts the three GPU quantile checks decide on (their thresholds' buckets)."""
    c = ctx.c
    return threshold_cuts(below=(c.low_gpu_threshold_p95, c.low_gpu_threshold_p5, c.batch_size_gpu_threshold_p95),
                          above=(c.low_gpu_threshold_p95,))


def memory_increase(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    m = seconds(ctx.c.gpu_memory_increase_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        live = ctx.live(r, times, warm=True)
        if not live:
            continue
        for gpu, memory in sorted(ctx.samples[id(r)].memory.items()):
            if spread_never_above(ctx.extent(memory), ctx.c.gpu_memory_increase):
                judge_windows(ctx, "GPUMemoryIncrease", memory, times, live, (m, 0.0), (2 * m, m))
                continue  # no window's mean can exceed another's by the threshold: none summed
            now, before = ctx.means(memory, times, m), ctx.means(memory, times, 2 * m, m)
            for k in live:
                mean_now, mean_before = now[k], before[k]
                if mean_now is not None and mean_before is not None:
                    ctx.judged.add("GPUMemoryIncrease")
                    increase = mean_now - mean_before
                    if increase > ctx.c.gpu_memory_increase:
                        out[k].append(Firing(f"{r.subject} gpu {gpu}", increase))
    return out


def memory_capacity(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.gpu_memory_capacity_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        live = ctx.live(r, times)
        if not live:
            continue
        for gpu, memory in sorted(ctx.samples[id(r)].memory.items()):
            if never_above(ctx.extent(memory), ctx.c.gpu_memory_capacity_threshold):
                judge_windows(ctx, "GPUMemoryNearCapacity", memory, times, live, (width, 0.0))
                continue
            means = ctx.means(memory, times, width)
            for k in live:
                mean = means[k]
                if mean is not None:
                    ctx.judged.add("GPUMemoryNearCapacity")
                    if mean > ctx.c.gpu_memory_capacity_threshold:
                        out[k].append(Firing(f"{r.subject} gpu {gpu}", mean))
    return out


def host_memory_increase(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    c = ctx.c
    width = seconds(c.host_memory_increase_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        first = ctx.first_steps[id(r)]
        if first is None:
            continue
        live = [k for k in ctx.live(r, times) if times[k] - first > ctx.patience + 2 * width]
        if not live:
            continue
        rss = ctx.samples[id(r)].rss
        if spread_never_above(ctx.extent(rss), c.host_memory_increase_min_bytes):
            judge_windows(ctx, "HostMemoryIncrease", rss, times, live, (width, 0.0), (2 * width, width))
            continue  # it never grew by the least growth that fires
        now, before = ctx.means(rss, times, width), ctx.means(rss, times, 2 * width, width)
        for k in live:
            mean_now, mean_before = now[k], before[k]
            if mean_now is not None and mean_before is not None:
                ctx.judged.add("HostMemoryIncrease")
                growth = mean_now - mean_before
                if growth > c.host_memory_increase * mean_before and growth > c.host_memory_increase_min_bytes:
                    out[k].append(Firing(r.subject, growth))
    return out


def host_memory_near_limit(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.host_memory_limit_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        live = ctx.live(r, times)
        if not live:
            continue
        table = ctx.samples[id(r)]
        used_lo, used_hi = ctx.spans(table.container_memory.times, times, width)
        limit_lo, limit_hi = ctx.spans(table.container_limit.times, times, width)
        host = ctx.means(table.host_memory, times, width)
        for k in live:
            i, j, k0, m = used_lo[k], used_hi[k], limit_lo[k], limit_hi[k]
            used: float | None
            if m > k0:  # a memory limit: the container's working set against it
                if j <= i:
                    continue
                used = table.container_memory.mean(i, j) / max(table.container_limit.values[k0:m])
            else:  # no limit: the host's memory
                used = host[k]
                if used is None:
                    continue
            ctx.judged.add("HostMemoryNearLimit")
            if used > ctx.c.host_memory_limit_threshold:
                out[k].append(Firing(r.subject, used))
    return out


def judge_windows(ctx: CheckContext, name: str, series: Series, times: Sequence[float], live: Sequence[int],
                  *windows: tuple[float, float]) -> None:
    """Mark the check judged, as its loop over the windows' means would, when some live time has a value in each of
    its windows ``(t - back, t - until]`` (a series whose means cannot fire is not summed)."""
    if name in ctx.judged:
        return
    spans = [ctx.spans(series.times, times, back, until) for back, until in windows]
    if any(all(hi[k] > lo[k] for lo, hi in spans) for k in live):
        ctx.judged.add(name)


def load_imbalance(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    out: list[list[Firing]] = [[] for _ in times]
    threshold = ctx.c.load_balancing_threshold
    for job, ranks in by_job(ctx.ranks).items():
        lives = [(set(ctx.live(r, times)), set(ctx.live(r, times, warm=True)), list(ctx.samples[id(r)].util.values()))
                 for r in ranks]
        spreads = _spread_bounds(ctx, times, lives)
        for k in range(len(times)):
            live = [(warm, gpus) for alive, warm, gpus in lives if k in alive]
            if not live or not all(k in warm for warm, _ in live):
                continue
            if spreads is not None:
                count, widest = spreads[k]
                if count > 1:
                    ctx.judged.add("GPULoadImbalance")
                if count < 2 or widest <= threshold:
                    continue  # the window means' spread is below the threshold, however they round
            found = [mean for _, gpus in live for mean in (ctx.mean_at(gpu, times, k) for gpu in gpus)
                     if mean is not None]
            if len(found) > 1:
                ctx.judged.add("GPULoadImbalance")
            if len(found) > 1 and max(found) - min(found) > threshold:
                out[k].append(Firing(f"job {job}", max(found) - min(found)))
    return out


def _spread_bounds(ctx: CheckContext, times: Sequence[float],
                   lives: list[tuple[set[int], set[int], list[Series]]]) -> list[tuple[int, float]] | None:
    """Per time: how many of the job's GPUs of ranks alive then have a value in their window, and the most their
    window means can spread (from running totals and what the sums can err); None when some series has no bound."""
    highs, lows, counts = [], [], []
    for alive, _, gpus in lives:
        for gpu in gpus:
            found = approximate_means(gpu, *ctx.spans(gpu.times, times, ctx.w), ctx.least(gpu))
            if found is None:
                return None
            means, errors = found
            if len(alive) < len(times):
                means = [m if k in alive else math.nan for k, m in enumerate(means)]
            highs.append([m + e if m == m else -math.inf for m, e in zip(means, errors)])  # NaN: no value
            lows.append([m - e if m == m else math.inf for m, e in zip(means, errors)])
            counts.append([m == m for m in means])
    if not counts:
        return [(0, 0.0)] * len(times)
    out = []
    for count, high, low in zip(map(sum, zip(*counts)), map(max, zip(*highs)), map(min, zip(*lows))):
        out.append((count, (high - low) + 2.0 ** -44 * (abs(high) + abs(low)) if count > 1 else 0.0))
    return out


def conditions(ctx: CheckContext) -> Conditions:
    """The group's conditions and datapoints: the GPU, memory and node samples they read."""
    tables = list(ctx.samples.values())

    def union(series: Iterable[Series]) -> int:
        """Samples with a reading of some GPU (a node's GPUs are read in the same samples)."""
        return max(map(len, series), default=0)

    gpu_samples = sum(union(t.util.values()) for t in tables)
    gpu_memory = sum(union(t.memory.values()) for t in tables)
    gpus_per_job: dict[str, int] = {}
    for r in ctx.ranks:
        gpus_per_job[r.job] = gpus_per_job.get(r.job, 0) + len(ctx.samples[id(r)].util)
    balanced = sum(union(ctx.samples[id(r)].util.values()) for r in ctx.ranks if gpus_per_job[r.job] > 1)
    limits = sum(len(t.container_memory) if len(t.container_limit) else len(t.host_memory) for t in tables)
    return {
        "CPUBottleneck": (bottleneck(ctx, io=False), gpu_samples),
        "IOBottleneck": (bottleneck(ctx, io=True), gpu_samples),
        "GPUUnderutilized": (gpu_quantiles(ctx, "under"), gpu_samples),
        "GPUUtilizationFluctuating": (gpu_quantiles(ctx, "fluctuating"), gpu_samples),
        "BatchSizeTooSmall": (gpu_quantiles(ctx, "batch"), gpu_samples),
        "GPUMemoryIncrease": (partial(memory_increase, ctx), gpu_memory),
        "GPUMemoryNearCapacity": (partial(memory_capacity, ctx), gpu_memory),
        "HostMemoryIncrease": (partial(host_memory_increase, ctx), sum(len(t.rss) for t in tables)),
        "HostMemoryNearLimit": (partial(host_memory_near_limit, ctx), limits),
        "GPULoadImbalance": (partial(load_imbalance, ctx), balanced),
    }


GROUP = CheckGroup(OFFLINE_SYSTEM, conditions)
"""The twins of the alerts declared with ``offline=OFFLINE_SYSTEM``, keyed by their short names in runbook order."""
