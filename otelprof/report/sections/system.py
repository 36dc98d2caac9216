"""The nodes: system usage (CPUs, memory, disks, network, GPUs; the training processes) and the CPU and
I/O bottleneck sections.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from otelprof.analysis import system as sysmod
from otelprof.analysis.prometheus import RATE_WINDOW
from otelprof.analysis.report import Report
from otelprof.report import svg
from otelprof.report.blocks import charts, figure, from_prometheus, note, p, section, table
from otelprof.report.formatting import elapsed, extreme, finite, num, pct, pct0, rate, secs, size
from otelprof.report.sections.ranks import summaries


def _unit_fmt(unit: str) -> Callable[[float], str]:
    return {sysmod.UNIT_RATIO: pct, sysmod.UNIT_BYTES: size, sysmod.UNIT_RATE: rate}.get(unit, num)


def usage(r: Report) -> str:
    """System usage statistics per node, and of the training processes."""
    u = r.system
    if not u.nodes:
        body = p("No node samples were recorded. otelprof samples the node's CPUs, memory, disks, network and "
                 "GPUs every 500 ms in one process per node (local rank 0 by default) unless "
                 "OTELPROF_SYSTEM_METRICS is off.")
        return section("system", "System usage statistics", body + _process_rows(r))
    if from_prometheus(r):
        out = [p("From Prometheus, each row says where its figures come from. A per-sample histogram counts every "
                 "sample: CPU is the mean busy share of the logical CPUs in each sample; GPU and GPU memory pool "
                 "the samples of all the node's GPUs (Prometheus keeps a histogram per GPU, not the per-sample "
                 "mean). Its percentiles are interpolated within buckets, and its max and min are the bucket that "
                 "holds them (“> 95.0 %, ≤ 100.0 %”). A gauge as scraped gives exact values, but only at the "
                 "scrapes: samples between scrapes are not seen. Rows “evaluated every …” are expressions over "
                 "several series — the busiest logical CPU, the mean I/O wait over CPUs, network and disk traffic "
                 f"as {RATE_WINDOW:g}-second rates — computed at those times over the range, exact there. "
                 "Datapoints are the samples of a histogram, the scrapes of the series otherwise.")]
        out.append(table(("Node", "Metric", "Unit", "max", "p99", "p95", "p50", "min", "Datapoints", "Source"),
                         [(row.subject, row.metric, row.unit, extreme(row.max, row.max_bucket, _unit_fmt(row.unit)),
                           *(_unit_fmt(row.unit)(v) for v in (row.p99, row.p95, row.p50)),
                           extreme(row.min, row.min_bucket, _unit_fmt(row.unit)), f"{row.datapoints:,}",
                           _usage_source(row)) for row in u.rows], 3))
    else:
        out = [p("Each figure is first averaged over the node's devices in every sample (the mean busy share of the "
                 "logical CPUs, the mean utilization of the GPUs), then summarized over the whole run. “Busiest "
                 "core” is the most loaded logical CPU of each sample, the one the CPU-bottleneck check looks at.")]
        out.append(summaries(u.summaries, "nodes") if u.summaries else table(
                         ("Node", "Metric", "Unit", "max", "p99", "p95", "p50", "min", "Samples"),
                         [(row.subject, row.metric, row.unit, *(_unit_fmt(row.unit)(v) for v in
                                                               (row.max, row.p99, row.p95, row.p50, row.min)),
                           f"{row.datapoints:,}") for row in u.rows], 3))
    nodes = u.nodes
    if u.summaries:  # the nodes named most often among the worst
        nodes = tuple(n for n in u.nodes if n.node in u.detailed)
        out.append(p(f"Details of the {len(nodes)} nodes named most often among the worst above; the other "
                     f"{len(u.nodes) - len(nodes):,} are folded (the JSON output has every node)."))
    for n in nodes:
        cpu = u.row(n.node, "CPU")
        gpu = u.row(n.node, "GPU")
        text = {
            sysmod.VERDICT_UNDERUSED: f"Node {n.node} is lightly used: at the 95th percentile its GPUs reach "
                                      f"{pct(gpu.p95 if gpu else None)} and its CPUs {pct(cpu.p95 if cpu else None)}. "
                                      "A smaller instance, or more work per device (a larger batch), would use "
                                      "what you pay for.",
            sysmod.VERDICT_CPU_BOUND: f"The GPUs of node {n.node} are lightly used ({pct(gpu.p95 if gpu else None)} "
                                      f"at the 95th percentile) while its CPUs are busy "
                                      f"({pct(cpu.p95 if cpu else None)}): "
                                      "the GPUs probably wait for work done on the CPUs (see CPU bottlenecks).",
            sysmod.VERDICT_GOOD: f"The GPUs of node {n.node} are well used: median utilization "
                                 f"{pct(gpu.p50 if gpu else None)}.",
            sysmod.VERDICT_MIXED: f"Node {n.node}: median GPU utilization {pct(gpu.p50 if gpu else None)}, median CPU "
                                  f"{pct(cpu.p50 if cpu else None)}.",
            sysmod.VERDICT_NO_GPU: f"Node {n.node} reported no GPU; its median CPU utilization was "
                                   f"{pct(cpu.p50 if cpu else None)} (busiest core: see the table).",
        }[n.verdict]
        kind = "good" if n.verdict == sysmod.VERDICT_GOOD else "warn" if n.verdict in (
            sysmod.VERDICT_UNDERUSED, sysmod.VERDICT_CPU_BOUND) else ""
        out.append(f"<h3>Node {escape(n.node)}</h3>")
        out.append(note(text, kind))
        out.append(p(_node_facts(n)))
        series = [("CPU mean", n.cpu), ("busiest core", n.cpu_max), ("I/O wait", n.iowait), ("memory", n.memory)]
        if n.gpus:
            series += [("GPU mean", n.gpu), ("GPU memory", n.gpu_memory)]
        figures = [figure(svg.lines(series, f"Utilization on {n.node}", pct0, 0.0, 1.0, width=760,
                                    x_fmt=elapsed), "Utilization over time (bucket means), since the job started.")]
        if n.core_mean:
            figures.append(figure(svg.columns(n.core_mean, "Mean busy share per CPU", pct0, lambda i: f"cpu{i}",
                                              width=760),
                                  "Mean busy share of each logical CPU over the run: one tall bar alone points at "
                                  "a single-threaded stage."))
        out.append(charts(*figures))
    return section("system", "System usage statistics", "".join(out) + _process_rows(r))


def _usage_source(row: sysmod.UsageRow) -> str:
    if row.source == sysmod.SOURCE_HISTOGRAM:
        return "per-sample histogram"
    if row.source == sysmod.SOURCE_SCRAPES:
        return "gauge, as scraped"
    if row.source == sysmod.SOURCE_EVALUATED:
        return f"evaluated every {secs(row.resolution)}"
    return "every sample"


def _node_facts(n: sysmod.NodeUsage) -> str:
    """One line of what is known about how the node was sampled; unknown parts are left out."""
    facts = [f"{n.samples:,} samples" + (f" about every {secs(n.interval)}" if finite(n.interval) else "")]
    if n.cores:
        facts.append(f"{n.cores} logical CPUs")
    facts.append(f"{len(n.gpus)} GPU(s)" + (f" ({', '.join(n.gpus)})" if n.gpus else ""))
    by = f"; sampled by rank {n.sampled_by_rank}" if n.sampled_by_rank >= 0 else ""
    return ", ".join(facts) + by + "."


def _process_rows(r: Report) -> str:
    rows = r.system.process_rows
    if not rows:
        return ""
    if r.system.process_summaries:
        return "<h3>Training processes</h3>" + summaries(r.system.process_summaries)
    if from_prometheus(r):
        return "<h3>Training processes</h3>" + p(
            "Each rank's own CPU use (a share of the CPUs the container may use) and resident memory, from the "
            "gauges as scraped over the range: max and min are exact at the scrapes, the percentiles are over "
            "the scraped values; samples between scrapes are not seen.") + table(
            ("Rank", "Metric", "max", "p99", "p95", "p50", "min", "Datapoints", "Source"),
            [(row.subject, row.metric, *(_unit_fmt(row.unit)(v) for v in (row.max, row.p99, row.p95, row.p50,
                                                                          row.min)),
              f"{row.datapoints:,}", _usage_source(row)) for row in rows], 2)
    return "<h3>Training processes</h3>" + p(
        "Each rank's own CPU use (a share of the CPUs the container may use) and resident memory.") + table(
        ("Rank", "Metric", "max", "p99", "p95", "p50", "min", "Samples"),
        [(row.subject, row.metric, *(_unit_fmt(row.unit)(v) for v in (row.max, row.p99, row.p95, row.p50, row.min)),
          f"{row.datapoints:,}") for row in rows], 2)


def bottleneck(r: Report, io: bool) -> str:
    """The CPU (or, with ``io``, I/O) bottleneck section: GPUs waiting while CPUs are busy."""
    b = r.io_bottleneck if io else r.cpu_bottleneck
    anchor, title = ("io-bottleneck", "I/O bottlenecks") if io else ("cpu-bottleneck", "CPU bottlenecks")
    what = "I/O wait" if io else "busy"
    out = [p(f"A sample counts when some logical CPU was above {pct(b.busy_threshold, 0)} {what} while some GPU was "
             f"below {pct(b.gpu_threshold, 0)} utilization. The check fires when more than {pct(b.threshold, 0)} "
             "of the samples in its window count.")]
    if not b.nodes:
        out.append(p("No node samples were recorded."))
        return section(anchor, title, "".join(out))
    nodes = b.nodes
    if b.summary is not None:  # many nodes: the distribution, and the details of the worst
        out.append(summaries((b.summary,), "nodes"))
        named = {x.subject for x in b.summary.worst}
        nodes = tuple(n for n in b.nodes if n.node in named)
    for n in nodes:
        out.append(f"<h3>Node {escape(n.node)}</h3>")
        if n.low_gpu == 0 and not r.gpus.gpus:
            out.append(p(f"{n.datapoints:,} samples, {n.busy:,} with a CPU above the threshold; no GPU was sampled, "
                         "so no sample can show GPUs waiting."))
            continue
        kind = "warn" if n.fraction > b.threshold else ""
        out.append(note(f"{n.coincidences:,} of {n.datapoints:,} samples ({pct(n.fraction)}) had a GPU waiting while "
                        f"a CPU was {what}; {n.low_gpu:,} samples had a GPU below the threshold in all.", kind))
        figures = [figure(svg.pie([("GPUs above the threshold", n.datapoints - n.low_gpu),
                                   ("GPU low, CPUs not", n.low_gpu - n.coincidences),
                                   (f"GPU low while a CPU {what}", n.coincidences)], "Samples", num),
                          "All samples of the node, by what the GPUs and CPUs did.")]
        if n.regions:
            figures.append(figure(svg.bars([(name, count) for name, count in n.regions[:12]],
                                           "Regions during the coincidences", num, width=460),
                                  "What the node's ranks were doing in those samples (rank-samples per region)."))
        out.append(charts(*figures))
    return section(anchor, title, "".join(out))
