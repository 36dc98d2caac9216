"""The GPUs: utilization, load balancing between GPUs and ranks, room for a larger batch, GPU memory.
"""

from __future__ import annotations

from otelprof.analysis import system as sysmod
from otelprof.analysis.gpu import GpuUsage
from otelprof.analysis.ranksummary import TOP, RankSummary, many
from otelprof.analysis.report import Report
from otelprof.report import svg
from otelprof.report.blocks import charts, figure, from_prometheus, note, p, section, table
from otelprof.report.formatting import DASH, elapsed, extreme, finite, num, pct, pct0, secs, size
from otelprof.report.sections.ranks import summaries


def utilization(r: Report) -> str:
    """The GPU utilization analysis, per GPU."""
    g = r.gpus
    if not g.gpus:
        return section("gpu", "GPU utilization analysis",
                       p("No GPU was sampled (no NVIDIA GPU, or the NVML library was not visible in the container)."))
    out = [p(f"Per GPU over the whole run: the box spans the 25th to 75th percentile with the median, whiskers reach "
             f"1.5 interquartile ranges (clipped to the data), the dot is the mean. A GPU whose 95th percentile stays "
             f"below {pct(g.threshold_p95, 0)} is under-used; one whose 5th percentile is below "
             f"{pct(g.threshold_p5, 0)} while its 95th is above {pct(g.threshold_p95, 0)} swings between busy "
             "and idle, typically waiting for input or for other ranks.")]
    texts = []
    for x in g.gpus:
        label = f"GPU {x.gpu} on {x.node}"
        if x.idle:
            texts.append(f"{label} never ran a kernel: an unused device (check CUDA_VISIBLE_DEVICES and the ranks "
                         "per node).")
        elif x.underused:
            texts.append(f"{label}: the 95th percentile of utilization was only {pct(x.utilization.p95)} "
                         f"(max {extreme(x.utilization.max, x.utilization.max_bucket, pct)}).")
        elif x.fluctuating:
            texts.append(f"{label} fluctuates: 5th percentile {pct(x.utilization.p5)}, 95th {pct(x.utilization.p95)}.")
    for t in _capped(texts, g.summaries, "GPUs"):
        out.append(note(t, "warn"))
    if not texts:
        out.append(note("Every GPU was busy most of the time.", "good"))
    shown = _extremes(g.gpus, g.summaries[0]) if g.summaries else g.gpus
    out.append(charts(figure(svg.boxplots([(f"{x.node} GPU {x.gpu}", x.utilization) for x in shown],
                                          "GPU utilization", pct0, 0.0, 1.0, width=760),
                             f"Utilization of the {TOP} GPUs with the lowest and the {TOP} with the highest median."
                             if g.summaries else "Utilization per GPU.")))
    if from_prometheus(r):
        out.append(p("From Prometheus: per-sample histograms per GPU. The mean is exact (sum over count), the "
                     "percentiles are interpolated within buckets, and min and max are the bucket that holds them; "
                     "power and temperature are medians of the gauges as scraped."))
    u = [x.utilization for x in g.gpus]
    out.append(summaries(g.summaries[:2], "GPUs") if g.summaries else table(
                     ("Node", "GPU", "min", "p5", "p25", "p50", "p75", "p95", "max", "mean", "Power (median)",
                      "Temperature (median)"),
                     [(x.node, x.gpu, extreme(b.min, b.min_bucket, pct),
                       *(pct(v) for v in (b.p5, b.q1, b.median, b.q3, b.p95)), extreme(b.max, b.max_bucket, pct),
                       pct(b.mean),
                       f"{x.power:.0f} W" if x.power is not None else DASH,
                       f"{x.temperature:.0f} °C" if x.temperature is not None else DASH) for x, b in zip(g.gpus, u)],
                     2))
    return section("gpu", "GPU utilization analysis", "".join(out))


def balance(r: Report) -> str:
    """Workload balancing: how alike the GPUs worked, and straggling ranks."""
    b = r.load
    out = []
    if b.gpus:
        bins = "its histogram buckets" if from_prometheus(r) else "2 % bins"
        out.append(p(f"How alike the GPUs worked: the distribution of each GPU's utilization ({bins}), the "
                     "Jensen-Shannon distance between those distributions (0 identical, 0.83 disjoint), and the "
                     "spread between the busiest and the least busy GPU's mean utilization."))
        if len(b.gpus) == 1:
            out.append(note("The job used a single GPU: there is nothing to balance."))
        else:
            out.append(note(f"Mean utilization spreads over {pct(b.spread or 0.0)} between GPUs (the alert's "
                            f"threshold is {pct(b.threshold, 0)}); {b.far_pairs} pair(s) are farther apart than "
                            f"{b.distance_threshold:g}.", "warn" if b.uneven else "good"))
        first = b.gpus[0].histogram
        out.append(charts(figure(svg.overlaid(first.edges, [(f"{g.node}/{g.gpu}", g.histogram.counts)
                                                           for g in b.gpus[:10]], "GPU utilization distributions",
                                              pct0, width=760),
                                 "Samples per utilization bin, one line per GPU (first 10).")))
        if b.farthest:
            out.append(table(("GPU", "Compared with", "Distance"),
                             [(d.a, d.b, f"{d.distance:.3f}") for d in b.farthest], 2))
    else:
        out.append(p("No GPU was sampled, so GPU load balance cannot be judged."))
    if b.ranks:
        out.append("<h3>Ranks</h3>")
        out.append(p("Per phase, each rank's mean compute time per step (step time minus data-loader wait and "
                     "exposed communication) against the median of the other ranks'. Collective time is the time "
                     "at least one all-reduce was in flight (gradient buckets reduced at once count once); "
                     "exposed, the part of it after the backward pass launched its last bucket, when the rank "
                     "only waited. A straggler makes every other rank wait in its collectives, so it shows as "
                     "the one rank with more compute and less exposed time."))
        stragglers = [x for x in b.ranks if x.straggler]
        if stragglers:
            out.append(note("Straggler(s): " + ", ".join(f"rank {x.rank} ({x.phase}, {x.ratio:.2f} times its peers' "
                                                         "median)" for x in stragglers) + ".", "warn"))
        out.append(summaries(b.summaries) if b.summaries else table(
                         ("Phase", "Rank", "Median step", "Mean compute", "Mean collective", "Mean exposed",
                          "Compute / peers' median"),
                         [(x.phase, x.rank, secs(x.median_step), secs(x.mean_compute), secs(x.mean_collective),
                           secs(x.mean_exposed) if finite(x.mean_exposed) else DASH,
                           f"{x.ratio:.2f}" if finite(x.ratio) else DASH) for x in b.ranks], 2,
                         ["fired" if x.straggler else "" for x in b.ranks]))
        phases = sorted({x.phase for x in b.ranks})
        if len({x.rank for x in b.ranks}) > 1:
            listed = {(x.subject, s.group) for s in b.summaries if s.figure == "mean compute" for x in s.worst + s.best}
            out.append(charts(*(figure(svg.bars([(f"rank {x.rank}", x.mean_compute) for x in b.ranks
                                                 if x.phase == phase and (not listed or (f"rank {x.rank}", phase)
                                                                          in listed)],
                                                f"Compute per step, {phase}", secs, width=460),
                                       f"Mean compute time per step, {phase}"
                                       + (f": the {TOP} ranks computing longest and the {TOP} shortest." if listed
                                          else ".")) for phase in phases[:4])))
    return section("balance", "Workload balancing", "".join(out))


def batch(r: Report) -> str:
    """Batch size: whether the devices have room for more work per step."""
    b = r.batch
    out = [p(f"When CPUs, GPUs and GPU memory all stay below their thresholds at the 95th percentile (CPU "
             f"{pct(b.cpu_threshold_p95, 0)}, GPU {pct(b.gpu_threshold_p95, 0)}, GPU memory "
             f"{pct(b.memory_threshold_p95, 0)}), the devices have room for more work per step: a larger batch, "
             "or a smaller instance.")]
    if b.gpus:
        small = [g for g in b.gpus if g.small]
        crowded = many(len(b.gpus))
        if small:
            out.append(note("Room for a larger batch on: " + ", ".join(f"{g.node} GPU {g.gpu}" for g in small[
                :TOP if crowded else len(small)]) + (f" and {len(small) - TOP:,} more GPUs" if crowded and
                                                     len(small) > TOP else "") + ".", "warn"))
        rows = [g for g in b.gpus if g.small][:TOP] if crowded else list(b.gpus)
        if crowded:
            out.append(p(f"{len(small):,} of {len(b.gpus):,} GPUs have room for a larger batch"
                         + (f"; the first {len(rows)}:" if rows else ".")))
        if rows:
            out.append(table(("Node", "GPU", "CPU p95 (node mean)", "GPU p95", "GPU memory p95", "All below"),
                             [(g.node, g.gpu, pct(g.cpu_p95), pct(g.utilization_p95), pct(g.memory_p95),
                               "yes" if g.small else "no") for g in rows], 2, ["fired" if g.small else ""
                                                                               for g in rows]))
    else:
        out.append(p("No GPU was sampled, so the batch size cannot be judged against GPU use."))
    shown = _extremes(r.gpus.gpus, r.gpus.summaries[0]) if r.gpus.summaries else r.gpus.gpus
    boxes = [(f"{node} CPU", box) for node, box in b.node_cpu[:TOP * 2 if r.gpus.summaries else len(b.node_cpu)]]
    boxes += [(f"{g.node} GPU {g.gpu}", g.utilization) for g in shown]
    boxes += [(f"{g.node} GPU {g.gpu} memory", g.memory) for g in shown]
    if boxes:
        out.append(charts(figure(svg.boxplots(boxes, "Use of CPUs, GPUs and GPU memory", pct0, 0.0, 1.0, width=760),
                                 "Node CPU (bucket means over time), GPU utilization and GPU memory per GPU.")))
    if b.samples_per_step:
        out.append(p("Recorded batch size (samples per step, median): " + ", ".join(
            f"rank {rank} {phase}: {num(v)}" for rank, phase, v in b.samples_per_step[:16]) + "."))
    return section("batch", "Batch size", "".join(out))


def memory(r: Report) -> str:
    """GPU memory per GPU, and the training processes' host memory."""
    g = r.gpus
    out = []
    if g.gpus:
        out.append(p("GPU memory in use as a share of each device's memory. Memory that keeps growing over the run "
                     "ends in an out-of-memory error; memory that stays low leaves room for a larger batch."))
        flagged = []
        for x in g.gpus:
            flags = x.memory_flags
            msgs = []
            if flags.low:
                msgs.append(f"its 95th percentile is only {pct(x.memory.p95)}")
            if flags.swinging:
                msgs.append(f"it swings from {pct(x.memory.p5)} (p5) to {pct(x.memory.p95)} (p95)")
            if flags.growing:
                msgs.append(f"it grew by {pct(x.memory_growth)} of the device between the first and last tenth of "
                            "the run")
            if flags.full:
                msgs.append(f"it peaked at {extreme(x.memory.max, x.memory.max_bucket, pct)}, close to capacity")
            if msgs:
                flagged.append((f"GPU {x.gpu} on {x.node}: " + "; ".join(msgs) + ".",
                                "warn" if flags.growing or flags.full else ""))
        for text, kind in flagged[:TOP] if g.summaries else flagged:
            out.append(note(text, kind))
        if g.summaries and len(flagged) > TOP:
            out.append(p(f"{len(flagged) - TOP:,} more GPUs' memory stands out likewise (the JSON output lists them)."))
        out.append(summaries(g.summaries[2:], "GPUs") if g.summaries else table(
                         ("Node", "GPU", "Memory", "max", "p95", "p50", "p5", "Growth"),
                         [(x.node, x.gpu, size(x.memory_total), extreme(x.memory.max, x.memory.max_bucket, pct),
                           pct(x.memory.p95), pct(x.memory.median), pct(x.memory.p5), pct(x.memory_growth))
                          for x in g.gpus], 2))
        if from_prometheus(r):
            out.append(p("From Prometheus: max is the histogram bucket holding the largest sample, the percentiles "
                         "are interpolated within buckets; growth is the scraped gauge's mean over the last tenth "
                         "of the range minus over the first tenth (“-” when a tenth holds no scrape)."))
        out.append(charts(
            figure(svg.boxplots([(f"{x.node} GPU {x.gpu}", x.memory) for x in (
                _extremes(g.gpus, g.summaries[2]) if g.summaries else g.gpus)], "GPU memory", pct0, 0.0, 1.0,
                                width=760), f"Memory in use of the {TOP} GPUs using the most and the {TOP} the least."
                   if g.summaries else "Memory in use per GPU."),
            figure(svg.lines([(f"GPU {x.gpu}", x.memory_series) for x in g.gpus[:10]], "GPU memory over time", pct0,
                             0.0, 1.0, width=760, x_fmt=elapsed), "GPU memory over time (bucket means).")))
    else:
        out.append(p("No GPU was sampled."))
    rss = [row for row in r.system.process_rows if row.unit == sysmod.UNIT_BYTES]
    if rss and r.system.process_summaries:
        out.append("<h3>Host memory of the training processes</h3>")
        out.append(summaries([s for s in r.system.process_summaries if s.unit == sysmod.UNIT_BYTES]))
    elif rss:
        out.append("<h3>Host memory of the training processes</h3>")
        out.append(table(("Rank", "RSS max", "p50", "min"), [(row.subject, size(row.max), size(row.p50),
                                                                 size(row.min)) for row in rss]))
    return section("gpu-memory", "GPU memory", "".join(out))


def _capped(texts: list[str], crowded: object, noun: str) -> list[str]:
    """``texts``, the first ranksummary.TOP of them and a count of the rest when there are many GPUs."""
    if not crowded or len(texts) <= TOP:
        return texts
    return [*texts[:TOP], f"... and {len(texts) - TOP:,} more {noun} alike (the JSON output lists them)."]


def _extremes(gpus: tuple[GpuUsage, ...], summary: RankSummary) -> list[GpuUsage]:
    """The GPUs a summary names as worst and best, in its order."""
    by_name = {f"{x.node} GPU {x.gpu}": x for x in gpus}
    return [by_name[x.subject] for x in (*summary.worst, *summary.best) if x.subject in by_name]
