"""The steps: step durations (statistics, time over the run, histograms, outliers, throughput) and the
data-loading wait inside them.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.analysis import progress as prog
from otelprof.analysis.ranksummary import TOP, many
from otelprof.analysis.report import Report
from otelprof.report import svg
from otelprof.report.blocks import IN_RECORDING, charts, figure, from_prometheus, note, p, section, table
from otelprof.report.formatting import elapsed, extreme, num, pct, secs
from otelprof.report.sections.ranks import summaries

MAX_HISTOGRAMS = 16


def durations(r: Report) -> str:
    """The step duration analysis: statistics, time over the run, histograms, outliers, throughput."""
    a = r.steps
    if not a.rows:
        return section("steps", "Step duration analysis",
                       p("No steps were recorded: there are no step durations to analyze."))
    live = from_prometheus(r)
    if live:
        out = [p("Per rank and phase, from the step-duration histogram over the range: the mean is exact (sum over "
                 "count), percentiles are interpolated within buckets, and min and max are the bucket that holds "
                 "them (“> 25 ms, ≤ 50 ms”). Outliers are counted live by each process "
                 f"({sc.STEP_OUTLIERS.name}): steps slower than the mean plus OTELPROF_OUTLIER_SIGMA standard "
                 "deviations of the recent steps of their phase, so the threshold moves. The standard deviation "
                 f"and exact min and max need the individual steps: {IN_RECORDING}.")]
    else:
        out = [p(f"Per rank and phase, over every recorded step. An outlier is a step slower than the mean plus "
                 f"{a.sigma:g} standard deviations of all steps of its rank and phase; the histograms leave "
                 "outliers out so that the bulk of the distribution stays visible.")]
    out.append(summaries(a.summaries) if a.summaries else table(
                     ("Rank", "Node", "Phase", "Steps", "mean", "max", "p99", "p95", "p50", "min", "std",
                      "Outliers", "Threshold"),
                     [(x.rank, x.node, x.phase, f"{x.durations.count:,}", secs(x.durations.mean),
                       extreme(x.durations.max, x.max_bucket),
                       *(secs(v) for v in (x.durations.p99, x.durations.p95, x.durations.p50)),
                       extreme(x.durations.min, x.min_bucket), secs(x.durations.std), f"{x.outliers:,}",
                       "rolling, per process" if live else secs(x.threshold)) for x in a.rows], 3))
    out.append(_step_timelines(r))
    figures = []
    for x in a.rows[:MAX_HISTOGRAMS]:
        if x.histogram.counts:
            figures.append(figure(svg.histogram(x.histogram.edges, x.histogram.counts,
                                                f"Step durations, rank {x.rank} {x.phase}", secs, width=460,
                                                markers=[("p50", x.durations.p50), ("p95", x.durations.p95)]),
                                  f"Rank {x.rank}, {x.phase}: {x.histogram.total:,} steps per histogram bucket, "
                                  "outliers included." if live else
                                  f"Rank {x.rank}, {x.phase}: {x.histogram.total:,} steps without outliers."))
    out.append(charts(*figures))
    if len(a.rows) > MAX_HISTOGRAMS:
        out.append(p(f"Histograms of the first {MAX_HISTOGRAMS} rank/phase pairs are shown; the JSON output has all."))
    outliers = [x for x in a.rows if x.outliers]
    if a.summaries:  # the ranks with the most outliers, per phase
        worst = {(x.subject, s.group) for s in a.summaries if s.figure == "outlier steps" for x in s.worst if x.value}
        outliers = [x for x in outliers if (f"rank {x.rank}", x.phase) in worst]
    if outliers:
        out.append("<h3>Outlier steps</h3>")
        where = (f"not in Prometheus: {sc.SPAN_STEP} spans with {sc.ATTR_STEP_OUTLIER} = true (Tempo), or "
                 f"{IN_RECORDING}")
        out.append(table(("Rank", "Phase", "Outliers", "Step numbers (first ones)"),
                         [(x.rank, x.phase, f"{x.outliers:,}", where if live else ", ".join(map(str, x.outlier_steps))
                           + (" …" if x.outliers > len(x.outlier_steps) else "")) for x in outliers], 2))
        out.append(p(("Open these steps in Tempo, or on the recording's timeline (otelprof timeline RUN_DIR), "
                      if live else "Open these steps on the timeline (otelprof timeline) ")
                     + "to see which region grew; the CPU/I/O bottleneck sections show whether the node was starved "
                     "at the time."))
    throughput = [x for x in a.rows if x.samples_per_second is not None or x.tokens_per_second is not None]
    if throughput:
        out.append("<h3>Throughput</h3>")
        out.append("" if a.summaries else table(("Rank", "Phase", "Samples per step (median)", "Samples/s", "Tokens/s"),
                         [(x.rank, x.phase, num(x.samples_per_step), num(x.samples_per_second),
                           num(x.tokens_per_second)) for x in throughput], 2))
        if a.throughput:
            out.append(p("All ranks together: " + ", ".join(f"{phase} {num(v)} samples/s" for phase, v in a.throughput)
                         + " (time inside steps; time between steps is not counted)."))
    return section("steps", "Step duration analysis", "".join(out))


def _step_timelines(r: Report) -> str:
    g = r.progress
    if not g.timelines:
        return ""
    live = from_prometheus(r)
    figures = []
    for phase in dict.fromkeys(t.phase for t in g.timelines):
        lines = [t for t in g.timelines if t.phase == phase]
        series = [(f"rank {t.rank}", t.series.t, t.series.mean, t.series.mean, t.series.max) for t in lines]
        markers = [(x, d, f"rank {t.rank} step {n}: {secs(d)}" if n >= 0 else
                    f"rank {t.rank}: outlier steps counted in the window ending {elapsed(x)} after the start")
                   for t in lines for x, d, n in t.outliers]
        if live:
            caption = (f"{phase}: mean step time per evaluation window against the time since the job started, the "
                       "band up to the 99th percentile of the window's step-duration histogram; red circles: windows "
                       "in which the process counted outlier steps.")
        else:
            per_point = max(t.per_point for t in lines)
            shown = sum(len(t.outliers) for t in lines)
            total = sum(t.outlier_count for t in lines)
            caption = (f"{phase}: each step's duration against its start, since the job started"
                       + (f"; each point the mean of {per_point:,} consecutive steps, the band up to their slowest"
                          if per_point > 1 else "")
                       + (f"; red circles: outlier steps ({shown:,} slowest of {total:,})" if total > shown else
                          "; red circles: outlier steps" if total else "; no outlier step") + ".")
        figures.append(figure(svg.xy(series, f"Step time over the run, {phase}", secs, elapsed, width=760,
                                     markers=markers, zero=True), caption))
    out = ["<h3>Step time over the run</h3>", charts(*figures)]
    if g.timelines_left_out:
        out.append(p(f"Step times of {g.timelines_left_out} more rank/phase pair(s) are not drawn: each chart shows "
                     f"the lowest rank and the slowest others (at most {prog.MAX_TIMELINE_RANKS} per phase)."))
    return "".join(out)


def dataloader(r: Report) -> str:
    """The data loading analysis: the wait for each batch, and the loaders' settings."""
    d = r.dataloader
    out = []
    if not d.phases:
        out.append(p(f"No step recorded a “{d.region}” region, so input waits are unknown. "
                     "otelprof.torch.instrument(dataloader=...) (or otelprof run) measures the wait for every "
                     f"batch; without PyTorch wrap the fetch in otelprof.annotate(\"{d.region}\")."))
    else:
        out.append(p(f"The “{d.region}” region is the time from asking for the next batch to getting it. A step "
                     f"counts as input-bound when it waits more than {pct(d.input_bound_threshold, 0)} of its time."
                     + (" From Prometheus: steps are counted by the step-duration histogram, steps waiting (those "
                        f"with a “{d.region}” region) by the wait histogram, whose buckets give the percentiles and "
                        "the bucket holding the longest wait." if from_prometheus(r) else "")))
        worst = d.most_waiting
        if worst is not None:
            out.append(note(f"Rank {worst.rank} ({worst.phase}) spent {pct(worst.wait_share)} of its step time "
                            "waiting for data: the input pipeline limits training. More loader workers, "
                            "prefetching, faster storage or cheaper preprocessing shorten the wait.", "warn"))
        out.append(summaries(d.summaries) if d.summaries else table(
                         ("Rank", "Phase", "Steps", "Steps waiting", "Wait p25", "Wait p50", "Wait p95", "Wait max",
                          "Wait share", "Input-bound steps"),
                         [(x.rank, x.phase, f"{x.steps:,}", f"{x.steps_waiting:,}", secs(x.wait_p25),
                           secs(x.wait.p50), secs(x.wait.p95), extreme(x.wait.max, x.max_bucket), pct(x.wait_share),
                           f"{x.input_bound_steps:,}") for x in d.phases], 2))
        figures = [figure(svg.histogram(x.histogram.edges, x.histogram.counts, f"Data-loader wait, rank {x.rank}",
                                        secs, width=460, markers=[("p25", x.wait_p25), ("p50", x.wait.p50),
                                                                  ("p95", x.wait.p95)]),
                          f"Wait per step, rank {x.rank} {x.phase}"
                          + (f"; the last bin also holds the {x.histogram_clipped:,} longest waits (up to "
                             f"{secs(x.wait.max)}), far beyond the rest." if x.histogram_clipped else "."))
                   for x in d.phases[:MAX_HISTOGRAMS]
                   if x.histogram.counts]
        out.append(charts(*figures))
    notes: dict[tuple[str, str, int], list[int]] = {}  # with many ranks, alike notes are one, naming the ranks
    grouped = many(len(d.loaders))
    for loader in d.loaders:
        parts = []
        if loader.workers is not None and loader.cpus_available:
            parts.append(f"{{who}} data loader runs {loader.workers} worker process(es) with "
                         f"{loader.cpus_available:g} CPUs available.")
            if loader.too_few_workers:
                parts.append(f"That is fewer than {pct(d.min_workers_share, 0)} of the CPUs: more workers would "
                             "load batches in parallel (mind the other ranks on the node).")
            elif loader.too_many_workers:
                parts.append(f"That is more than {pct(d.max_workers_share, 0)} of the CPUs: the workers compete for "
                             "cores; fewer would do.")
        elif loader.workers is not None:
            parts.append(f"{{who}} data loader runs {loader.workers} worker process(es).")
        if loader.pin_memory is False and r.gpus.gpus:
            parts.append("pin_memory is off: with pin_memory=True host-to-GPU copies of each batch are faster "
                         "and can overlap with compute.")
        if parts:
            key = (" ".join(parts), "warn" if len(parts) > 1 else "", -1 if grouped else loader.rank)
            notes.setdefault(key, []).append(loader.rank)
    for (text, kind, _), ranks in notes.items():
        who = f"Rank {ranks[0]}'s" if len(ranks) == 1 else _ranks_text(ranks) + ": each"
        out.append(note(text.replace("{who}", who), kind))
    return section("dataloader", "Data loading analysis", "".join(out))


def _ranks_text(ranks: list[int]) -> str:
    """``Ranks 0, 1, 2`` or, beyond ranksummary.TOP, ``Ranks 0, 1, 2, 3, 4 and 1,019 more``."""
    shown = ", ".join(map(str, ranks[:TOP]))
    return f"Ranks {shown}" + (f" and {len(ranks) - TOP:,} more" if len(ranks) > TOP else "")
