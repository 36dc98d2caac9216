"""The framework summary: time by phase, inside the steps by region, regions, and the operators of the
profiling windows.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.analysis import framework as fw
from otelprof.analysis.report import Report
from otelprof.report import svg
from otelprof.report.blocks import IN_RECORDING, charts, figure, from_prometheus, note, p, section, table
from otelprof.report.formatting import DASH, extreme, finite, pct, secs

MAX_BREAKDOWN_CHARTS = 4
MAX_WINDOW_ROWS = 10
TRUNCATED_WHY = {"events": "at the event cap (OTELPROF_PROFILE_MAX_EVENTS)"}


def summary(r: Report) -> str:
    """The framework metrics summary: phases, the time inside the steps, regions, operators."""
    f = r.framework
    out = []
    if f.phases:
        phase_chart = figure(svg.pie([(name, t) for name, t, _ in f.phases], "Time by phase", secs),
                             "Training loop time in the steps of each phase, and between steps.")
        first = f.breakdowns[0] if f.breakdowns else None
        split = figure(svg.pie([(x.name, x.seconds) for x in first.parts], f"Inside {first.phase} steps", secs,
                               colors=_part_colors(first)),
                       f"Time inside the {first.phase} steps by top-level region, and the time no region covers."
                       ) if first is not None else ""
        out.append(charts(phase_chart, split))
        out.append(table(("Phase", "Time", "Share of the training loop"),
                         [(name, secs(t), pct(sh)) for name, t, sh in f.phases]))
        out.append(_breakdowns(r))
        if f.between_steps_high:
            out.append(note(f"{pct(f.between_steps_share)} of the training loop passed between steps (outside "
                            "otelprof.step()): evaluation, checkpointing, logging or data preparation outside "
                            "the step. Check what the loop does between steps.", "warn"))
        if f.heavier_pass:
            out.append(note(f"The {f.heavier_pass} pass takes {pct(f.heavier_pass_share)} of forward "
                            "plus backward time; backward usually costs one to two times forward. An unusual "
                            "ratio can point at frozen layers, activation checkpointing or a costly loss.",
                            "warn"))
    else:
        out.append(p("No steps were recorded, so there is no breakdown of the training loop."))
    if f.regions:
        out.append("<h3>Regions inside steps</h3>")
        out.append(charts(figure(svg.bars([(x.name, x.total) for x in f.regions[:15]], "Region time", secs),
                                 "Total time per annotated region, all ranks.")))
        out.append(table(("Region", "Depth", "Count", "Total", "Mean", "Max", "Share of step time")
                         + (("Self",) if f.nested else ()),
                         [(x.name, DASH if from_prometheus(r) else x.depth, f"{x.count:,}", secs(x.total),
                           secs(x.mean), extreme(x.max, x.max_bucket), pct(x.share))
                          + ((secs(x.self_time) if finite(x.self_time) else DASH,) if f.nested else ())
                          for x in f.regions], 1))
        if f.nested:
            out.append(p("Total: the region's time, nested regions included; self: less the regions directly "
                         "inside it (the all-reduces excepted: they run beside the work). A region inside one of its "
                         "own name (an annotate(\"backward\") around the hooks' own backward) is counted once."))
        if from_prometheus(r):
            out.append(p("From Prometheus: the maximum is the histogram bucket holding the longest instance; "
                         f"nesting depths are in the traces (Tempo) and {IN_RECORDING}."))
    if f.outside_steps:
        out.append("<h3>Regions outside steps</h3>")
        out.append(table(("Region", "Count", "Total", "Mean", "Max"),
                         [(x.name, f"{x.count:,}", secs(x.total), secs(x.mean), extreme(x.max, x.max_bucket))
                          for x in f.outside_steps]))
    out.append("<h3>Operators</h3>")
    if from_prometheus(r):
        out.append(_operators_elsewhere(r))
    elif not f.windows:
        out.append(p("No operator-profiling window was recorded. Run torch.profiler for a few steps with "
                     "otelprof.torch.profile_window(start_step, num_steps), or on a running job with "
                     "otelprof capture URL --steps N; the top CPU and GPU operators then appear here."))
    else:
        out.append(_windows(f))
        for label, ops, total, rest in (("CPU", f.cpu_operators, f.cpu_operator_time, f.cpu_operators_other),
                                        ("GPU", f.gpu_operators, f.gpu_operator_time, f.gpu_operators_other)):
            if not ops:
                out.append(p(f"No {label} operators were recorded" + (" (no CUDA device)." if label == "GPU" else ".")))
                continue
            out.append(f"<h3>{label} operators</h3>")
            out.append(p(f"The most expensive {label} operator was {ops[0].name} with {pct(ops[0].share)} of the "
                         f"self time of the operators recorded ({secs(total)} in all)."))
            top = [(o.name, o.self_time) for o in ops[:fw.TOP_OPERATORS]]
            out.append(charts(table(("Operator", "Calls", "Self time", "Total time", "Share"),
                                    [(o.name, f"{o.calls:,}", secs(o.self_time), secs(o.total_time), pct(o.share))
                                     for o in ops]),
                              figure(svg.pie([*top, ("other", rest)], f"{label} operators", secs),
                                     f"Self time of the top {label} operators.")))
        mixes = []
        if f.gpu_activity:
            mixes.append(figure(svg.pie(list(f.gpu_activity), "GPU activity", secs),
                                "Device time by kind: kernels, copies, memsets, synchronization."))
        if f.kernel_precision:
            mixes.append(figure(svg.pie(list(f.kernel_precision), "Kernel precision", secs),
                                "Kernel time by arithmetic precision, guessed from kernel names."))
        if mixes:
            out.append(charts(*mixes))
    return section("framework", "Framework metrics summary", "".join(out))


PART_COLORS = {**{name: svg.color(i) for i, name in enumerate(fw.BREAKDOWN_REGIONS)}, fw.UNCOVERED: "#bab0ac",
               fw.OTHER_REGIONS: "#9c755f"}
"""One color per breakdown part in every chart; other regions take the palette's next colors."""


def _part_colors(b: fw.Breakdown) -> list[str]:
    others = iter(svg.PALETTE[len(fw.BREAKDOWN_REGIONS):])
    return [PART_COLORS.get(x.name) or next(others, "#888888") for x in b.parts]


def _breakdowns(r: Report) -> str:
    f = r.framework
    if not f.breakdowns:
        return ""
    out = ["<h3>Inside the steps</h3>"]
    if all(b.nesting_known for b in f.breakdowns):
        out.append(p("Each phase's step time split into the regions directly inside the step (data loader wait, "
                     "forward, backward, optimizer, and any other region you annotated at the top level) and the "
                     f"time no region covers (“{fw.UNCOVERED}”: the loop's own code between its regions — loss "
                     "bookkeeping, logging, zero_grad, a host sync — or work not annotated). Nested regions are "
                     "inside their parent's time, so the parts add up to the step time."))
    else:
        out.append(p("From Prometheus, region nesting is not known: each phase's step time is split into the data "
                     "loader wait, forward, backward and optimizer regions (which the integrations make directly "
                     f"inside the step) and “{fw.UNCOVERED}”, the step time they leave: other regions, the loop's "
                     f"own code and work not annotated. Nesting is in {IN_RECORDING}."))
    out.append(charts(*(figure(svg.stacked([(x.name, x.seconds) for x in b.parts], f"Inside {b.phase} steps", secs,
                                           width=760, colors=_part_colors(b)),
                               f"{b.phase}: {b.steps:,} steps, {secs(b.step_time)} in all.")
                        for b in f.breakdowns[:MAX_BREAKDOWN_CHARTS])))
    out.append(table(("Phase", "Part", "Time", "Share of step time", "Per step"),
                     [(b.phase, x.name, secs(x.seconds), pct(x.share), secs(x.per_step))
                      for b in f.breakdowns for x in b.parts], 2,
                     ["fired" if x.name == fw.UNCOVERED and b.uncovered_high else "" for b in f.breakdowns
                      for x in b.parts]))
    for b in f.breakdowns:
        uncovered = next((x for x in b.parts if x.name == fw.UNCOVERED), None)
        if uncovered is not None and b.uncovered_high:
            out.append(note(f"{pct(uncovered.share)} of the {b.phase} step time ({secs(uncovered.per_step)} per step) "
                            "is in no region. Annotate what the loop does between its regions "
                            "(otelprof.annotate(\"name\")) to see where it goes.", "warn"))
        if b.overlap > 0:
            out.append(note(f"Top-level regions of the {b.phase} steps overlapped by {secs(b.overlap)} in all (regions "
                            "timed on another thread run at the same time as the step's own): their parts add up "
                            "to more than the step time by that much."))
    return "".join(out)


def _operators_elsewhere(r: Report) -> str:
    """Prometheus counts operator-profiling windows; their operators are span events and recording lines."""
    counts = r.framework.window_counts
    where = (f"their top CPU and GPU operators are events of the {sc.SPAN_PROFILE} spans (Tempo) and tables in "
             f"{IN_RECORDING}; Prometheus only counts the windows ({sc.PROFILE_WINDOWS.name}).")
    if not counts:
        return p("No operator-profiling window completed in the range. Run torch.profiler for a few steps with "
                 "otelprof.torch.profile_window(start_step, num_steps), or on a running job with otelprof capture "
                 f"URL --steps N; {where}")
    total = sum(n for _, n in counts)
    return p(f"{total:,} operator-profiling window(s) completed in the range ("
             + ", ".join(f"rank {rank}: {n:,}" for rank, n in counts) + f"); {where}")


def _windows(f: fw.FrameworkSummary) -> str:
    """The operator-profiling windows: steps, segments and the ones stopped short."""
    rows = [(w.rank, w.trigger or DASH, w.phase or DASH,
             f"{w.start_step} to {w.last_step}" if w.last_step >= w.start_step else DASH,
             f"{w.num_steps:,}", w.segments,
             "; ".join(f"{n} of {w.segments} {TRUNCATED_WHY.get(why, why)}" for why, n in w.truncated) or "no",
             secs(w.duration), w.trace_file or DASH) for w in f.windows[:MAX_WINDOW_ROWS]]
    out = [p(f"{len(f.windows):,} profiling window(s). A window stopped short (truncated: it reached its event cap "
             "within a step, so that step is profiled in part) goes on from the next step in a further segment."),
           table(("Rank", "Trigger", "Phase", "Steps", "Profiled steps", "Segments", "Truncated", "Time", "Trace"),
                 rows, 3)]
    if len(f.windows) > MAX_WINDOW_ROWS:
        out.append(p(f"{len(f.windows) - MAX_WINDOW_ROWS:,} more window(s) are in the recording (profiles.jsonl)."))
    return "".join(out)
