"""The system alerts' offline twins: CPU and I/O bottlenecks, GPU utilization quantiles and memory, host
memory, load balance across the job's GPUs; judged on the node samples."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from otelprof.analysis.check_context import CheckContext, CheckGroup, Condition, Conditions, Firing, by_job
from otelprof.analysis.check_tables import Series
from otelprof.mixin.config import seconds


def bottleneck(ctx: CheckContext, io: bool) -> Condition:
    threshold = ctx.c.io_bottleneck_threshold if io else ctx.c.cpu_bottleneck_threshold
    name = "IOBottleneck" if io else "CPUBottleneck"

    def condition(t: float) -> list[Firing]:
        out = []
        for r in ctx.ranks:
            table = ctx.samples[id(r)]
            i, j = table.span(t - ctx.w, t)
            if j > i and ctx.warm(r, t) and ctx.alive(r, t):
                ctx.judged.add(name)
                hits = table.io_hits if io else table.cpu_hits
                fraction = (hits[j] - hits[i]) / (j - i)
                if fraction > threshold:
                    out.append(Firing(r.subject, fraction))
        return out
    return condition


def gpu_quantiles(ctx: CheckContext, kind: str) -> Condition:
    c = ctx.c
    name = {"under": "GPUUnderutilized", "fluctuating": "GPUUtilizationFluctuating",
            "batch": "BatchSizeTooSmall"}[kind]

    def condition(t: float) -> list[Firing]:
        out = []
        for r in ctx.ranks:
            if not (ctx.warm(r, t) and ctx.alive(r, t)):
                continue
            table = ctx.samples[id(r)]
            util = ctx.gpu_windows(table.util, t - ctx.w, t)
            mem = ctx.gpu_windows(table.memory, t - ctx.w, t)
            cpu_i, cpu_j = table.cpu_mean.span(t - ctx.w, t)
            for gpu, (values, i, j) in sorted(util.items()):
                if not values.any_positive(i, j):
                    continue  # never busy: an unused device
                ctx.judged.add(name)
                p95, p5 = ctx.quantile(values, 0.95, i, j, t), ctx.quantile(values, 0.05, i, j, t)  # 3 checks' own
                subject = f"{r.subject} gpu {gpu}"
                if kind == "under" and p95 < c.low_gpu_threshold_p95:
                    out.append(Firing(subject, p95))
                elif kind == "fluctuating" and p5 < c.low_gpu_threshold_p5 and p95 > c.low_gpu_threshold_p95:
                    out.append(Firing(subject, p5))
                elif (kind == "batch" and p95 < c.batch_size_gpu_threshold_p95 and gpu in mem
                      and mem[gpu][0].quantile(0.95, *mem[gpu][1:]) < c.batch_size_gpu_memory_threshold_p95
                      and cpu_j > cpu_i
                      and table.cpu_mean.quantile(0.95, cpu_i, cpu_j) < c.batch_size_cpu_threshold_p95):
                    out.append(Firing(subject, p95))
        return out
    return condition


def memory_increase(ctx: CheckContext, t: float) -> list[Firing]:
    m = seconds(ctx.c.gpu_memory_increase_window)
    out = []
    for r in ctx.ranks:
        if not (ctx.warm(r, t) and ctx.alive(r, t)):
            continue
        memory = ctx.samples[id(r)].memory
        now, before = ctx.gpu_windows(memory, t - m, t), ctx.gpu_windows(memory, t - 2 * m, t - m)
        for gpu in sorted(now):
            if gpu in before:
                ctx.judged.add("GPUMemoryIncrease")
                increase = now[gpu][0].mean(*now[gpu][1:]) - before[gpu][0].mean(*before[gpu][1:])
                if increase > ctx.c.gpu_memory_increase:
                    out.append(Firing(f"{r.subject} gpu {gpu}", increase))
    return out


def memory_capacity(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.gpu_memory_capacity_window)
    out = []
    for r in ctx.ranks:
        if ctx.alive(r, t):
            for gpu, (values, i, j) in sorted(ctx.gpu_windows(ctx.samples[id(r)].memory, t - width, t).items()):
                mean = values.mean(i, j)
                ctx.judged.add("GPUMemoryNearCapacity")
                if mean > ctx.c.gpu_memory_capacity_threshold:
                    out.append(Firing(f"{r.subject} gpu {gpu}", mean))
    return out


def host_memory_increase(ctx: CheckContext, t: float) -> list[Firing]:
    c = ctx.c
    width = seconds(c.host_memory_increase_window)
    out = []
    for r in ctx.ranks:
        first = ctx.first_steps[id(r)]
        if not ctx.alive(r, t) or first is None or t - first <= ctx.patience + 2 * width:
            continue
        rss = ctx.samples[id(r)].rss
        (i, j), (k, m) = rss.span(t - width, t), rss.span(t - 2 * width, t - width)
        if j > i and m > k:
            ctx.judged.add("HostMemoryIncrease")
            now, before = rss.mean(i, j), rss.mean(k, m)
            growth = now - before
            if growth > c.host_memory_increase * before and growth > c.host_memory_increase_min_bytes:
                out.append(Firing(r.subject, growth))
    return out


def host_memory_near_limit(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.host_memory_limit_window)
    out = []
    for r in ctx.ranks:
        if not ctx.alive(r, t):
            continue
        table = ctx.samples[id(r)]
        (i, j), (k, m) = table.container_memory.span(t - width, t), table.container_limit.span(t - width, t)
        if m > k:  # a memory limit: the container's working set against it
            if j <= i:
                continue
            used = table.container_memory.mean(i, j) / max(table.container_limit.values[k:m])
        else:  # no limit: the host's memory
            i, j = table.host_memory.span(t - width, t)
            if j <= i:
                continue
            used = table.host_memory.mean(i, j)
        ctx.judged.add("HostMemoryNearLimit")
        if used > ctx.c.host_memory_limit_threshold:
            out.append(Firing(r.subject, used))
    return out


def load_imbalance(ctx: CheckContext, t: float) -> list[Firing]:
    out = []
    for job, ranks in by_job(ctx.ranks).items():
        live = [r for r in ranks if ctx.alive(r, t)]
        if not live or not all(ctx.warm(r, t) for r in live):
            continue
        means = [values.mean(i, j) for r in live
                 for values, i, j in ctx.gpu_windows(ctx.samples[id(r)].util, t - ctx.w, t).values()]
        if len(means) > 1:
            ctx.judged.add("GPULoadImbalance")
        if len(means) > 1 and max(means) - min(means) > ctx.c.load_balancing_threshold:
            out.append(Firing(f"job {job}", max(means) - min(means)))
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


GROUP = CheckGroup(("CPUBottleneck", "IOBottleneck", "GPUUnderutilized", "GPUUtilizationFluctuating",
                    "BatchSizeTooSmall", "GPUMemoryIncrease", "GPUMemoryNearCapacity", "HostMemoryIncrease",
                    "HostMemoryNearLimit", "GPULoadImbalance"), conditions)
