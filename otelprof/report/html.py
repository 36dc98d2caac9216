"""Render a :class:`~otelprof.analysis.report.Report` as one self-contained HTML page.

Rendering only: every figure comes from the report's data; this module words it and draws it
(inline CSS and SVG, no scripts, nothing loaded from the network). Sections follow the original
profiling report's order.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterable, Sequence
from html import escape

from otelprof import semconv as sc
from otelprof._version import __version__
from otelprof.analysis import diagnosis as dg
from otelprof.analysis import environment as envmod
from otelprof.analysis import framework as fw
from otelprof.analysis import progress as prog
from otelprof.analysis import system as sysmod
from otelprof.analysis.prometheus import RATE_WINDOW
from otelprof.analysis.report import ORIGIN_PROMETHEUS, Report
from otelprof.analysis.stats import BoxPlot, Bucket
from otelprof.report import svg
from otelprof.report.template import PAGE, STYLE

DASH = "-"
MAX_HISTOGRAMS = 16
MAX_BREAKDOWN_CHARTS = 4
UNCOVERED_WARN = 0.2
"""A phase whose steps spend more than this share in no region gets a note."""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("diagnosis", "Diagnosis"),
    ("summary", "Job summary"),
    ("environment", "Environment"),
    ("training", "Training progress"),
    ("system", "System usage"),
    ("framework", "Framework"),
    ("rules", "Rules"),
    ("steps", "Step durations"),
    ("gpu", "GPU utilization"),
    ("device", "Device time and FLOPs"),
    ("balance", "Load balancing"),
    ("dataloader", "Data loading"),
    ("batch", "Batch size"),
    ("cpu-bottleneck", "CPU bottlenecks"),
    ("io-bottleneck", "I/O bottlenecks"),
    ("gpu-memory", "GPU memory"),
)


# ---------------------------------------------------------------------------------------- formatting

def _ok(v: float | None) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def pct(v: float | None, digits: int = 1) -> str:
    return f"{v * 100:.{digits}f} %" if _ok(v) else DASH  # type: ignore[operator]


def secs(v: float | None) -> str:
    if not _ok(v):
        return DASH
    return "0 s" if v == 0 else dg.secs(v)


def num(v: float | None, digits: int = 4) -> str:
    if not _ok(v):
        return DASH
    assert v is not None
    return f"{v:,.0f}" if float(v).is_integer() and abs(v) < 1e15 else f"{v:.{digits}g}"


def size(v: float | None) -> str:
    if not _ok(v):
        return DASH
    assert v is not None
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


def rate(v: float | None) -> str:
    return f"{size(v)}/s" if _ok(v) else DASH


def when(unix: float | None) -> str:
    if not _ok(unix):
        return DASH
    assert unix is not None
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def bounds(b: Bucket | None, fmt: Callable[[float], str] = secs) -> str:
    """A value known only to a histogram bucket, as that bucket: "≤ 25 ms", "> 25 ms, ≤ 50 ms", "> 600 s"."""
    if b is None:
        return DASH
    if not _ok(b.high):
        return f"> {fmt(b.low)}"
    if b.low <= 0:
        return f"≤ {fmt(b.high)}"
    return f"> {fmt(b.low)}, ≤ {fmt(b.high)}"


def extreme(value: float, bucket: Bucket | None, fmt: Callable[[float], str] = secs) -> str:
    """An exact minimum or maximum when known, else the histogram bucket that holds it."""
    return fmt(value) if _ok(value) or bucket is None else bounds(bucket, fmt)


def _from_prometheus(r: Report) -> bool:
    return r.origin == ORIGIN_PROMETHEUS


IN_RECORDING = "the recording (otelprof report RUN_DIR)"
"""Where the figures Prometheus lacks are: wording shared by the sections."""


def _unit_fmt(unit: str) -> Callable[[float], str]:
    return {sysmod.UNIT_RATIO: pct, sysmod.UNIT_BYTES: size, sysmod.UNIT_RATE: rate}.get(unit, num)


def _pct0(v: float) -> str:
    return pct(v, 0)


# ---------------------------------------------------------------------------------------- building blocks

def table(headers: Sequence[str], rows: Iterable[Sequence[object]], left: int = 1, cls: Sequence[str] = ()) -> str:
    """A table; the first ``left`` columns are left-aligned; ``cls`` gives a class per row."""
    head = "".join(f'<th class="l">{escape(h)}</th>' if i < left else f"<th>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for n, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            text = cell if isinstance(cell, _Html) else escape(str(cell))
            cells.append(f'<td class="l">{text}</td>' if i < left else f"<td>{text}</td>")
        row_cls = f' class="{cls[n]}"' if n < len(cls) and cls[n] else ""
        body.append(f"<tr{row_cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Html(str):
    """Text that is already HTML (not escaped again by :func:`table`)."""


def p(text: str) -> str:
    return f"<p>{escape(text)}</p>"


def note(text: str, kind: str = "") -> str:
    return f'<div class="note {kind}">{escape(text)}</div>'


def figure(chart: str, caption: str) -> str:
    return f"<figure>{chart}<figcaption>{escape(caption)}</figcaption></figure>"


def charts(*figures: str) -> str:
    return f'<div class="charts">{"".join(f for f in figures if f)}</div>'


def section(anchor: str, title: str, body: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{body}</section>'


FOLD_BADGES = {dg.STATUS_OK: ("ok", "nothing found"), dg.STATUS_NO_DATA: ("nodata", "no data"),
               dg.STATUS_MINOR: ("ok", "minor")}


def fold(html: str, verdict: dg.SectionVerdict | None) -> str:
    """A section whose checks found nothing, as one line (its verdict) that opens to the whole section."""
    if verdict is None or verdict.status not in FOLD_BADGES:
        return html
    head_end = html.index("</h2>") + len("</h2>")
    open_tag = html.index(">") + 1
    heading = html[open_tag:head_end]
    body = html[head_end:-len("</section>")]
    cls, label = FOLD_BADGES[verdict.status]
    return (f'{html[:open_tag]}<details class="fold"><summary>{heading}<span class="badge {cls}">{label}</span> '
            f'<span class="foldline">{escape(verdict.line)}</span></summary>{body}</details></section>')


def _diagnosis(r: Report) -> str:
    d = r.diagnosis
    out = [f'<p class="headline {"good" if d.healthy else "warn"}">{escape(d.headline)}</p>']
    if d.time_split:
        out.append(f'<p class="split"><b>Where the step time goes:</b> {escape(d.time_split)}</p>')
    if d.findings:
        items = []
        for i, f in enumerate(d.findings):
            checks = "".join(f'<span class="badge fired">{escape(c)}</span> ' for c in f.checks)
            items.append(
                f'<li class="finding" id="finding-{i + 1}"><div class="cost"><b>{escape(f.title)}</b>: '
                f'{escape(f.cost_text)} {checks}<span class="muted">({escape(f.kind)}, {escape(f.severity)})</span>'
                f'</div><div class="action">What to do: {escape(f.action)}</div>'
                f'<div class="evidence muted">{escape(f.evidence)}. <a href="#{escape(f.section)}">Details</a></div>'
                "</li>")
        out.append(f'<ol class="findings">{"".join(items)}</ol>')
    if d.minor:
        out.append(p("Minor (less than " + dg.pct(dg.MATERIAL) + " of the step time each): "
                     + "; ".join(f"{f.title.lower()}: {f.cost_text}" for f in d.minor) + "."))
    if _from_prometheus(r):
        out.append(p("From Prometheus: the same diagnosis from the metrics; figures only a recording holds (outlier "
                     f"step time, operator tables) are in {IN_RECORDING}."))
    return section("diagnosis", "Diagnosis", "".join(out))


# ---------------------------------------------------------------------------------------- sections

def _summary(r: Report) -> str:
    s = r.summary
    out = []
    if s.missing:
        out.append(note("This recording lacks: " + "; ".join(s.missing) + ". The sections that need it say so.",
                        "warn"))
    if s.skipped_lines:
        out.append(note(f"{s.skipped_lines} truncated or corrupt lines were skipped while reading the recording "
                        "(a process killed while writing leaves a partial last line). Figures cover the rest.",
                        "warn"))
    if s.killed_ranks:
        out.append(note("Rank(s) " + ", ".join(map(str, s.killed_ranks)) + " never recorded a clean shutdown: the "
                        "process was killed or is still running, so the job's end is the last thing it recorded.",
                        "warn"))
    if s.terminated:
        out.append(note("Rank(s) " + ", ".join(f"{rank} at {when(at)}" for rank, at in s.terminated) + " received "
                        "SIGTERM (pod eviction or preemption, a deleted job, a stop request, a timeout): otelprof "
                        "flushed the recording then; what followed depended on the program's own handler.", "warn"))
    rows = [
        ("Job", s.job or DASH), ("Run id", s.run_id or DASH),
        ("Ranks (world size)", f"{len(s.ranks)} ({s.world_size})"),
        ("Nodes", ", ".join(s.nodes) or DASH), ("Start", when(s.start)), ("End", when(s.end)),
        ("Job duration", secs(s.duration)), ("Training loop start (first step)", when(s.training_start)),
        ("Training loop end (last step)", when(s.training_end)), ("Training loop duration", secs(s.training_duration)),
        ("Initialization", f"{secs(s.initialization)} ({pct(s.initialization_share)})"),
        ("Training loop", f"{secs(s.training_duration)} ({pct(s.training_share)})"),
        ("Finalization", f"{secs(s.finalization)} ({pct(s.finalization_share)})"),
        ("Steps", ", ".join(f"{phase}: {n:,}" for phase, n in s.steps_per_phase) or "none"),
        ("Instrumented with", (f"otelprof {s.otelprof_version}" if s.otelprof_version else
                               f"{DASH} (no target_info series of the job carries {sc.OTELPROF_VERSION})"))
        if _from_prometheus(r) else
        ("Recorded with", f"otelprof {s.otelprof_version or '?'}, recording schema {s.schema_version or '?'}"),
    ]
    out.append(charts(table(("Statistic", "Value"), rows, 2),
                      figure(svg.pie([("initialization", s.initialization or 0.0),
                                      ("training loop", s.training_duration or 0.0),
                                      ("finalization", s.finalization or 0.0)], "Job time", secs),
                             "How the job's time split: before the first step, the steps, after the last step.")))
    if not s.steps_per_phase:
        out.append(p("No step information was recorded, so there is no training loop to measure: wrap each "
                     "iteration in otelprof.step() (or use otelprof.torch.instrument / otelprof run)."))
    elif s.initialization_share > 0.2 and (s.initialization or 0) > 60:
        out.append(note(f"Initialization took {pct(s.initialization_share)} of the job. Look at what runs before "
                        "the first step: data set download or indexing, model construction and compilation, "
                        "checkpoint loading, waiting for all ranks to join.", "warn"))
    if len(s.ranks) > 1 or any(x.dropped and any(v for _, v in x.dropped) for x in s.ranks):
        out.append("<h3>Ranks</h3>" + table(
            ("Rank", "Local rank", "Node", "Status", "Started", "First step", "Last step end", "Shutdown", "Steps",
             "Dropped records", "Skipped lines"),
            [(x.rank, x.local_rank, x.node, f"{x.status} ({x.status_basis})" if x.status_basis else x.status,
              when(x.process_start), when(x.first_step_start),
              when(x.last_step_end), when(x.shutdown), f"{x.steps:,}",
              ", ".join(f"{k}: {v:,.0f}" for k, v in x.dropped if v) or "0", x.skipped_lines) for x in s.ranks], 4))
    return section("summary", "Training job summary", "".join(out))


MISSING_HINTS: dict[str, str] = {
    sc.HOST_TYPE: "detected on AWS and SageMaker only; elsewhere give it with "
                  "OTEL_RESOURCE_ATTRIBUTES=host.type=<type> (on Kubernetes the value of the node's "
                  "node.kubernetes.io/instance-type label: the downward API cannot pass node labels, so set it "
                  "where the job picks its nodes)",
    sc.CLOUD_PROVIDER: "the machine's DMI strings name no cloud (on premises, or /sys/class/dmi not visible)",
    sc.OTELPROF_GPU_MODEL: "no NVIDIA GPU or NVML library visible, or OTELPROF_GPU_METRICS / OTELPROF_SYSTEM_METRICS "
                           "off",
    envmod.GPUS_SAMPLED: "no node samples",
    envmod.LOGICAL_CPUS: "no node samples",
    sc.OTELPROF_TORCH_VERSION: "PyTorch not installed where the process ran",
}
MISSING_HINTS.update(dict.fromkeys((sc.OTELPROF_GPU_COUNT, sc.OTELPROF_GPU_DRIVER, sc.OTELPROF_CUDA_DRIVER),
                                   MISSING_HINTS[sc.OTELPROF_GPU_MODEL]))
MISSING_HINTS[sc.OTELPROF_TORCH_CUDA] = MISSING_HINTS[sc.OTELPROF_TORCH_VERSION]


def ranks_text(ranks: Sequence[int]) -> str:
    """0, 1, 2, 3, 7 as "0-3, 7"."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:12])
    return text + (" …" if len(runs) > 12 else "")


def _where(row: envmod.EnvironmentRow) -> str:
    if row.everywhere:
        return "all nodes" if row.scope == envmod.SCOPE_NODE else "all ranks"
    if row.scope == envmod.SCOPE_NODE:
        return "node(s) " + ", ".join(row.nodes[:8]) + (" …" if len(row.nodes) > 8 else "")
    return f"rank(s) {ranks_text(row.ranks)}"


def _environment(r: Report) -> str:
    e = r.environment
    out = []
    if _from_prometheus(r):
        out.append(p("From the resource attributes of the job's processes on target_info (and the instance type "
                     "from kube-state-metrics' kube_node_labels when Prometheus has it), and the node facts the "
                     "system series give."))
    else:
        out.append(p("What each rank recorded about where it ran when it started (its resource attributes), and "
                     "what the node samples counted. A value that differs between ranks or nodes gets a row per "
                     "value."))
    if e.rows:
        out.append(table(("Field", "Value", "Where"),
                         [(row.label, row.value or "not recorded", _where(row)) for row in e.rows], 3,
                         ["fired" if not row.everywhere else "" for row in e.rows]))
    differing = sorted({row.label for row in e.rows if not row.everywhere})
    if differing:
        out.append(note("Not the same everywhere: " + ", ".join(differing) + ". Ranks on different hardware or "
                        "software run at different speeds; compare them in the load-balancing section.", "warn"))
    for field, extra in e.more_values:
        out.append(p(f"{dict((f, lbl) for f, lbl, _, _ in envmod.FIELDS).get(field, field)}: {extra} more value(s) "
                     "not listed."))
    if e.missing:
        by_hint: dict[str, list[str]] = {}
        for field, label in e.missing:
            by_hint.setdefault(MISSING_HINTS.get(field, ""), []).append(label)
        older = any(field == sc.PROCESS_RUNTIME_VERSION for field, _ in e.missing)  # recorded by every otelprof since
        out.append(p("Not recorded: " + "; ".join(", ".join(labels) + (f" ({hint})" if hint else "")
                                                   for hint, labels in by_hint.items()) + "."
                     + (" Processes of an otelprof older than this report record none of these." if older else "")))
    return section("environment", "Environment", "".join(out))


CURVE_LABELS = {sc.SCALAR_LOSS: "Loss", sc.SCALAR_LEARNING_RATE: "Learning rate", prog.SAMPLES_PER_SECOND:
                "Throughput, samples/s", prog.TOKENS_PER_SECOND: "Throughput, tokens/s",
                sc.SCALAR_GRAD_NORM: "Gradient norm"}
MISSING_SCALARS = {
    sc.SCALAR_LOSS: "otelprof.record(\"loss\", loss) in the step (otelprof.torch.instrument and otelprof run record it "
                    "from backward())",
    sc.SCALAR_LEARNING_RATE: "otelprof.record(\"learning_rate\", lr) (otelprof.torch.instrument records it from the "
                             "optimizer)",
    sc.SCALAR_SAMPLES: "otelprof.record(\"samples\", batch_size) in the step (the data-loader hook records it when "
                       "a batch has a batch dimension)",
    sc.SCALAR_TOKENS: "otelprof.record(\"tokens\", n) for language models",
}


def _steps_fmt(v: float) -> str:
    return f"{v:,.0f}"


def tick(v: float) -> str:
    """A curve's value on its axis: thousands with separators, small values to 4 significant digits."""
    if not _ok(v):
        return DASH
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _curve_label(c: prog.Curve, main: str) -> str:
    who = "all ranks" if c.rank is None else f"rank {c.rank}"
    return f"{c.phase} ({who})" if c.phase != main or c.rank is not None else c.phase


def _training(r: Report) -> str:
    g = r.progress
    out = []
    live = _from_prometheus(r)
    if live:
        out.append(p(f"From Prometheus, at the resolution of its scrapes: each point is the gauge's last value "
                     f"(loss, learning rate) or the counter's rate (samples, tokens per second of wall time) at one "
                     f"evaluation time, against the {g.main_phase} steps counted by then. Every recorded value "
                     f"is in {IN_RECORDING}."))
    else:
        out.append(p(f"Recorded scalars against the {g.main_phase} step number. {g.main_phase.capitalize()} steps "
                     "give a point each; another phase (evaluation) gives a point per pass: the value the loop "
                     "recorded after the pass, else the mean of its steps' values, at the last "
                     f"{g.main_phase} step before it. Throughput is recorded samples (tokens) over each step's "
                     f"duration, all ranks added up. Long runs show at most {g.max_points} points per curve: "
                     "each the mean of a run of consecutive values, the band their minimum to maximum."))
    if not g.curves:
        out.append(note("No training scalar (loss, learning rate, samples, tokens) was recorded, so there is no "
                        "curve to draw.", "warn"))
    names = list(dict.fromkeys(c.name for c in g.curves))
    figures = []
    for name in names:
        curves = [c for c in g.curves if c.name == name]
        series = [(_curve_label(c, g.main_phase), c.x, c.y, c.low, c.high) for c in curves]
        title = CURVE_LABELS.get(name, name)
        if live:
            caption = "; ".join(f"{c.phase}: {c.values:,} point(s)" + (", where the value changed" if c.per_pass
                                                                       else "") for c in curves)
        else:
            caption = "; ".join(
                f"{c.phase}: " + ("one point per pass" if c.per_pass else
                                  "every step" if c.per_point == 1 else f"mean of {c.per_point:,} steps per point")
                + f", {c.values:,} value(s)" for c in curves)
        figures.append(figure(svg.xy(series, title, tick, _steps_fmt, width=560), f"{title} over {g.main_phase} "
                              f"steps ({caption})."))
    if figures:
        out.append(charts(*figures))
    for c in g.curves:
        if c.nonfinite:
            where = f", the first at step {c.first_nonfinite:,.0f}" if c.first_nonfinite is not None else ""
            out.append(note(f"{c.nonfinite:,} {CURVE_LABELS.get(c.name, c.name).lower()} value(s) of {c.phase} were "
                            f"NaN or infinite{where}; the curve leaves them out.", "bad"))
    if g.curves:
        out.append(table(("Curve", "Phase", "Rank", "Values", "First", "Last", "Not finite"),
                         [(CURVE_LABELS.get(c.name, c.name), c.phase, "all" if c.rank is None else c.rank,
                           f"{c.values:,}", num(c.first), num(c.last), f"{c.nonfinite:,}") for c in g.curves], 3))
    if g.curves_left_out:
        out.append(p("Curves not drawn (more than the report shows): " + ", ".join(g.curves_left_out) + "."))
    if g.missing:
        out.append(p("Not recorded: " + "; ".join(f"{name} — {MISSING_SCALARS.get(name, '')}" for name in g.missing)
                     + "."))
    return section("training", "Training progress", "".join(out))


def _system(r: Report) -> str:
    u = r.system
    if not u.nodes:
        body = p("No node samples were recorded. otelprof samples the node's CPUs, memory, disks, network and "
                 "GPUs every 500 ms in one process per node (local rank 0 by default) unless "
                 "OTELPROF_SYSTEM_METRICS is off.")
        return section("system", "System usage statistics", body + _process_rows(r))
    if _from_prometheus(r):
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
        out.append(table(("Node", "Metric", "Unit", "max", "p99", "p95", "p50", "min", "Samples"),
                         [(row.subject, row.metric, row.unit, *(_unit_fmt(row.unit)(v) for v in
                                                               (row.max, row.p99, row.p95, row.p50, row.min)),
                           f"{row.datapoints:,}") for row in u.rows], 3))
    for n in u.nodes:
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
        figures = [figure(svg.lines(series, f"Utilization on {n.node}", _pct0, 0.0, 1.0, width=760,
                                    x_fmt=_elapsed), "Utilization over time (bucket means), since the job started.")]
        if n.core_mean:
            figures.append(figure(svg.columns(n.core_mean, "Mean busy share per CPU", _pct0, lambda i: f"cpu{i}",
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
    facts = [f"{n.samples:,} samples" + (f" about every {secs(n.interval)}" if _ok(n.interval) else "")]
    if n.cores:
        facts.append(f"{n.cores} logical CPUs")
    facts.append(f"{len(n.gpus)} GPU(s)" + (f" ({', '.join(n.gpus)})" if n.gpus else ""))
    by = f"; sampled by rank {n.sampled_by_rank}" if n.sampled_by_rank >= 0 else ""
    return ", ".join(facts) + by + "."


def _elapsed(v: float) -> str:
    return secs(v) if v else "0"


def _process_rows(r: Report) -> str:
    rows = r.system.process_rows
    if not rows:
        return ""
    if _from_prometheus(r):
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


def _framework(r: Report) -> str:
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
        if f.between_steps_share > 0.25:
            out.append(note(f"{pct(f.between_steps_share)} of the training loop passed between steps (outside "
                            "otelprof.step()): evaluation, checkpointing, logging or data preparation outside "
                            "the step. Check what the loop does between steps.", "warn"))
        if f.forward and f.backward and max(f.forward_share, 1 - f.forward_share) > 0.7:
            heavier = "forward" if f.forward_share > 0.5 else "backward"
            out.append(note(f"The {heavier} pass takes {pct(max(f.forward_share, 1 - f.forward_share))} of forward "
                            "plus backward time; backward usually costs one to two times forward. An unusual "
                            "ratio can point at frozen layers, activation checkpointing or a costly loss.",
                            "warn"))
    else:
        out.append(p("No steps were recorded, so there is no breakdown of the training loop."))
    if f.regions:
        out.append("<h3>Regions inside steps</h3>")
        out.append(charts(figure(svg.bars([(x.name, x.total) for x in f.regions[:15]], "Region time", secs),
                                 "Total time per annotated region, all ranks.")))
        nested = any(_ok(x.self_time) and x.self_time < x.total for x in f.regions)
        out.append(table(("Region", "Depth", "Count", "Total", "Mean", "Max", "Share of step time")
                         + (("Self",) if nested else ()),
                         [(x.name, DASH if _from_prometheus(r) else x.depth, f"{x.count:,}", secs(x.total),
                           secs(x.mean), extreme(x.max, x.max_bucket), pct(x.share))
                          + ((secs(x.self_time) if _ok(x.self_time) else DASH,) if nested else ())
                          for x in f.regions], 1))
        if nested:
            out.append(p("Total: the region's time, nested regions included; self: less the regions directly "
                         "inside it (the all-reduces excepted: they run beside the work). A region inside one of its "
                         "own name (an annotate(\"backward\") around the hooks' own backward) is counted once."))
        if _from_prometheus(r):
            out.append(p("From Prometheus: the maximum is the histogram bucket holding the longest instance; "
                         f"nesting depths are in the traces (Tempo) and {IN_RECORDING}."))
    if f.outside_steps:
        out.append("<h3>Regions outside steps</h3>")
        out.append(table(("Region", "Count", "Total", "Mean", "Max"),
                         [(x.name, f"{x.count:,}", secs(x.total), secs(x.mean), extreme(x.max, x.max_bucket))
                          for x in f.outside_steps]))
    out.append("<h3>Operators</h3>")
    if _from_prometheus(r):
        out.append(_operators_elsewhere(r))
    elif not f.windows:
        out.append(p("No operator-profiling window was recorded. Run torch.profiler for a few steps with "
                     "otelprof.torch.profile_window(start_step, num_steps), or on a running job with "
                     "otelprof capture URL --steps N; the top CPU and GPU operators then appear here."))
    else:
        out.append(p(f"{len(f.windows)} profiling window(s): " + ", ".join(
            f"rank {w.rank} steps {w.start_step} to {w.start_step + w.num_steps - 1}"
            + (f" (trace {w.trace_file})" if w.trace_file else "") for w in f.windows[:10])
            + (" …" if len(f.windows) > 10 else "") + "."))
        for label, ops, total in (("CPU", f.cpu_operators, f.cpu_operator_time),
                                  ("GPU", f.gpu_operators, f.gpu_operator_time)):
            if not ops:
                out.append(p(f"No {label} operators were recorded" + (" (no CUDA device)." if label == "GPU" else ".")))
                continue
            out.append(f"<h3>{label} operators</h3>")
            out.append(p(f"The most expensive {label} operator was {ops[0].name} with {pct(ops[0].share)} of the "
                         f"self time of the operators recorded ({secs(total)} in all)."))
            top = [(o.name, o.self_time) for o in ops[:8]]
            rest = total - sum(t for _, t in top)
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
                     ["fired" if x.name == fw.UNCOVERED and x.share > UNCOVERED_WARN else "" for b in f.breakdowns
                      for x in b.parts]))
    for b in f.breakdowns:
        uncovered = next((x for x in b.parts if x.name == fw.UNCOVERED), None)
        if uncovered is not None and uncovered.share > UNCOVERED_WARN:
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


def _rules(r: Report) -> str:
    rules = r.rules
    out = []
    if rules.skipped:
        out.append(note(rules.skipped))
        return section("rules", "Rules summary", "".join(out))
    if rules.error:
        out.append(note(f"The checks could not be evaluated: {rules.error}", "bad"))
        return section("rules", "Rules summary", "".join(out))
    if _from_prometheus(r):
        out.append(p("The otelprof alerts this Prometheus evaluates: “Fired” counts the evaluations at which the "
                     "alert was firing for the job over the range; datapoints are the samples of the series the "
                     "alert's expression reads, for the job over the range (none: the alert had nothing to judge)."))
    else:
        out.append(p("The alert rules' offline twin: each check the Prometheus alerts make, evaluated on this "
                     f"recording every {secs(rules.interval)} with the same windows, warm-up and thresholds. “Fired” "
                     "counts the evaluations at which the check was firing; datapoints are the samples or steps it "
                     "judged."))
    order = {name: i for i, name in enumerate(dg.check_order(r.diagnosis))}
    judged = tuple(sorted(rules.judged, key=lambda row: (not row.triggered, order.get(row.alert, len(order)))))
    no_data = rules.no_data
    fired = [row for row in judged if row.triggered]
    if fired:
        top = fired[0]
        out.append(note(f"{len(fired)} of {len(judged)} checks with data fired, in the diagnosis's order (causes "
                        f"first): {', '.join(row.alert for row in fired)}. {top.alert} judged {top.datapoints:,} "
                        f"datapoints and fired at {top.firing_evaluations} of {top.evaluations} evaluations"
                        + (f", first at {when(top.first_fired)}" if top.first_fired else "") + ".", "warn"))
    elif judged:
        out.append(note(f"None of the {len(judged)} checks with data fired.", "good"))
    elif rules.rows:
        out.append(note("No check had anything to judge.", "warn"))
    rows = []
    for row in judged:
        badge = _Html(f'<span class="badge {"fired" if row.triggered else "ok"}">{escape(row.status)}</span>')
        rows.append((_Html(f"<b>{escape(row.alert)}</b><br><span class=muted>{escape(row.original or 'otelprof')}"
                           f"</span>"), badge, _Html(escape(row.description)), _Html(escape(row.recommendation)),
                     f"{row.firing_evaluations} of {row.evaluations}", f"{row.datapoints:,}",
                     ", ".join(row.subjects) or DASH,
                     _Html("<br>".join(escape(f"{k}: {v}") for k, v in row.parameters))))
    if rows:
        out.append('<div class="rules">' + table(
            ("Check (original rule)", "Verdict", "What it means", "What to do", "Fired", "Datapoints", "Where",
             "Parameters"), rows, 8, ["fired" if row.triggered else "" for row in judged]) + "</div>")
    if no_data:
        out.append(_Html(f'<p class="nodata"><span class="badge nodata">no data</span> Not judged, no data: '
                         f'{escape(", ".join(row.alert for row in no_data))}. These checks found nothing of what '
                         "they read (GPU samples for the GPU checks, steps or regions for the step checks), so they "
                         "say nothing about this run, neither fired nor ok.</p>"))
    if rules.not_evaluated:
        out.append(p("Alerts that need live series and have no offline twin: " + ", ".join(rules.not_evaluated) + "."))
    return section("rules", "Rules summary", "".join(out))


def _steps(r: Report) -> str:
    a = r.steps
    if not a.rows:
        return section("steps", "Step duration analysis",
                       p("No steps were recorded: there are no step durations to analyze."))
    live = _from_prometheus(r)
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
    out.append(table(("Rank", "Node", "Phase", "Steps", "mean", "max", "p99", "p95", "p50", "min", "std",
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
        out.append(table(("Rank", "Phase", "Samples per step (median)", "Samples/s", "Tokens/s"),
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
    live = _from_prometheus(r)
    figures = []
    for phase in dict.fromkeys(t.phase for t in g.timelines):
        lines = [t for t in g.timelines if t.phase == phase]
        series = [(f"rank {t.rank}", t.series.t, t.series.mean, t.series.mean, t.series.max) for t in lines]
        markers = [(x, d, f"rank {t.rank} step {n}: {secs(d)}" if n >= 0 else
                    f"rank {t.rank}: outlier steps counted in the window ending {_elapsed(x)} after the start")
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
        figures.append(figure(svg.xy(series, f"Step time over the run, {phase}", secs, _elapsed, width=760,
                                     markers=markers, zero=True), caption))
    out = ["<h3>Step time over the run</h3>", charts(*figures)]
    if g.timelines_left_out:
        out.append(p(f"Step times of {g.timelines_left_out} more rank/phase pair(s) are not drawn: each chart shows "
                     f"the lowest rank and the slowest others (at most {prog.MAX_TIMELINE_RANKS} per phase)."))
    return "".join(out)


def _gpu(r: Report) -> str:
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
    for t in texts:
        out.append(note(t, "warn"))
    if not texts:
        out.append(note("Every GPU was busy most of the time.", "good"))
    out.append(charts(figure(svg.boxplots([(f"{x.node} GPU {x.gpu}", x.utilization) for x in g.gpus],
                                          "GPU utilization", _pct0, 0.0, 1.0, width=760),
                             "Utilization per GPU.")))
    if _from_prometheus(r):
        out.append(p("From Prometheus: per-sample histograms per GPU. The mean is exact (sum over count), the "
                     "percentiles are interpolated within buckets, and min and max are the bucket that holds them; "
                     "power and temperature are medians of the gauges as scraped."))
    u = [x.utilization for x in g.gpus]
    out.append(table(("Node", "GPU", "min", "p5", "p25", "p50", "p75", "p95", "max", "mean", "Power (median)",
                      "Temperature (median)"),
                     [(x.node, x.gpu, extreme(b.min, b.min_bucket, pct),
                       *(pct(v) for v in (b.p5, b.q1, b.median, b.q3, b.p95)), extreme(b.max, b.max_bucket, pct),
                       pct(b.mean),
                       f"{x.power:.0f} W" if x.power is not None else DASH,
                       f"{x.temperature:.0f} °C" if x.temperature is not None else DASH) for x, b in zip(g.gpus, u)],
                     2))
    return section("gpu", "GPU utilization analysis", "".join(out))


def _balance(r: Report) -> str:
    b = r.load
    out = []
    if b.gpus:
        bins = "its histogram buckets" if _from_prometheus(r) else "2 % bins"
        out.append(p(f"How alike the GPUs worked: the distribution of each GPU's utilization ({bins}), the "
                     "Jensen-Shannon distance between those distributions (0 identical, 0.83 disjoint), and the "
                     "spread between the busiest and the least busy GPU's mean utilization."))
        if len(b.gpus) == 1:
            out.append(note("The job used a single GPU: there is nothing to balance."))
        else:
            far = [d for d in b.distances if _ok(d.distance) and d.distance > b.distance_threshold]
            spread = b.spread or 0.0
            kind = "warn" if far or spread > b.threshold else "good"
            out.append(note(f"Mean utilization spreads over {pct(spread)} between GPUs (the alert's threshold is "
                            f"{pct(b.threshold, 0)}); {len(far)} pair(s) are farther apart than "
                            f"{b.distance_threshold:g}.", kind))
        first = b.gpus[0].histogram
        out.append(charts(figure(svg.overlaid(first.edges, [(f"{g.node}/{g.gpu}", g.histogram.counts)
                                                           for g in b.gpus[:10]], "GPU utilization distributions",
                                              _pct0, width=760),
                                 "Samples per utilization bin, one line per GPU (first 10).")))
        worst = sorted((d for d in b.distances if _ok(d.distance)), key=lambda d: -d.distance)[:10]
        if worst:
            out.append(table(("GPU", "Compared with", "Distance"), [(d.a, d.b, f"{d.distance:.3f}") for d in worst], 2))
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
        out.append(table(("Phase", "Rank", "Median step", "Mean compute", "Mean collective", "Mean exposed",
                          "Compute / peers' median"),
                         [(x.phase, x.rank, secs(x.median_step), secs(x.mean_compute), secs(x.mean_collective),
                           secs(x.mean_exposed) if _ok(x.mean_exposed) else DASH,
                           f"{x.ratio:.2f}" if _ok(x.ratio) else DASH) for x in b.ranks], 2,
                         ["fired" if x.straggler else "" for x in b.ranks]))
        phases = sorted({x.phase for x in b.ranks})
        if len({x.rank for x in b.ranks}) > 1:
            out.append(charts(*(figure(svg.bars([(f"rank {x.rank}", x.mean_compute) for x in b.ranks
                                                 if x.phase == phase], f"Compute per step, {phase}", secs, width=460),
                                       f"Mean compute time per step, {phase}.") for phase in phases[:4])))
    return section("balance", "Workload balancing", "".join(out))


def _dataloader(r: Report) -> str:
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
                        "the bucket holding the longest wait." if _from_prometheus(r) else "")))
        worst = max(d.phases, key=lambda x: x.wait_share)
        if worst.wait_share > 0.2:
            out.append(note(f"Rank {worst.rank} ({worst.phase}) spent {pct(worst.wait_share)} of its step time "
                            "waiting for data: the input pipeline limits training. More loader workers, "
                            "prefetching, faster storage or cheaper preprocessing shorten the wait.", "warn"))
        out.append(table(("Rank", "Phase", "Steps", "Steps waiting", "Wait p25", "Wait p50", "Wait p95", "Wait max",
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
    for loader in d.loaders:
        parts = []
        if loader.workers is not None and loader.cpus_available:
            low, high = d.min_workers_share * loader.cpus_available, d.max_workers_share * loader.cpus_available
            parts.append(f"Rank {loader.rank}'s data loader runs {loader.workers} worker process(es) with "
                         f"{loader.cpus_available:g} CPUs available.")
            if loader.workers < low:
                parts.append(f"That is fewer than {pct(d.min_workers_share, 0)} of the CPUs: more workers would "
                             "load batches in parallel (mind the other ranks on the node).")
            elif loader.workers > high:
                parts.append(f"That is more than {pct(d.max_workers_share, 0)} of the CPUs: the workers compete for "
                             "cores; fewer would do.")
        elif loader.workers is not None:
            parts.append(f"Rank {loader.rank}'s data loader runs {loader.workers} worker process(es).")
        if loader.pin_memory is False and r.gpus.gpus:
            parts.append("pin_memory is off: with pin_memory=True host-to-GPU copies of each batch are faster "
                         "and can overlap with compute.")
        if parts:
            out.append(note(" ".join(parts), "warn" if len(parts) > 1 else ""))
    return section("dataloader", "Data loading analysis", "".join(out))


def _batch(r: Report) -> str:
    b = r.batch
    out = [p(f"When CPUs, GPUs and GPU memory all stay below their thresholds at the 95th percentile (CPU "
             f"{pct(b.cpu_threshold_p95, 0)}, GPU {pct(b.gpu_threshold_p95, 0)}, GPU memory "
             f"{pct(b.memory_threshold_p95, 0)}), the devices have room for more work per step: a larger batch, "
             "or a smaller instance.")]
    if b.gpus:
        small = [g for g in b.gpus if g.small]
        if small:
            out.append(note("Room for a larger batch on: " + ", ".join(f"{g.node} GPU {g.gpu}" for g in small) + ".",
                            "warn"))
        out.append(table(("Node", "GPU", "CPU p95 (node mean)", "GPU p95", "GPU memory p95", "All below"),
                         [(g.node, g.gpu, pct(g.cpu_p95), pct(g.utilization_p95), pct(g.memory_p95),
                           "yes" if g.small else "no") for g in b.gpus], 2, ["fired" if g.small else ""
                                                                            for g in b.gpus]))
    else:
        out.append(p("No GPU was sampled, so the batch size cannot be judged against GPU use."))
    boxes = [(f"{n.node} CPU", BoxPlot.of(n.cpu.mean)) for n in r.system.nodes]
    boxes += [(f"{g.node} GPU {g.gpu}", g.utilization) for g in r.gpus.gpus]
    boxes += [(f"{g.node} GPU {g.gpu} memory", g.memory) for g in r.gpus.gpus]
    if boxes:
        out.append(charts(figure(svg.boxplots(boxes, "Use of CPUs, GPUs and GPU memory", _pct0, 0.0, 1.0, width=760),
                                 "Node CPU (bucket means over time), GPU utilization and GPU memory per GPU.")))
    if b.samples_per_step:
        out.append(p("Recorded batch size (samples per step, median): " + ", ".join(
            f"rank {rank} {phase}: {num(v)}" for rank, phase, v in b.samples_per_step[:16]) + "."))
    return section("batch", "Batch size", "".join(out))


def _bottleneck(r: Report, io: bool) -> str:
    b = r.io_bottleneck if io else r.cpu_bottleneck
    anchor, title = ("io-bottleneck", "I/O bottlenecks") if io else ("cpu-bottleneck", "CPU bottlenecks")
    what = "I/O wait" if io else "busy"
    out = [p(f"A sample counts when some logical CPU was above {pct(b.busy_threshold, 0)} {what} while some GPU was "
             f"below {pct(b.gpu_threshold, 0)} utilization. The check fires when more than {pct(b.threshold, 0)} "
             "of the samples in its window count.")]
    if not b.nodes:
        out.append(p("No node samples were recorded."))
        return section(anchor, title, "".join(out))
    for n in b.nodes:
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


def _flops(v: float | None) -> str:
    if not _ok(v):
        return DASH
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(v) >= scale:  # type: ignore[arg-type]
            return f"{v / scale:,.2f} {unit}"  # type: ignore[operator]
    return f"{v:,.0f} "


def _device(r: Report) -> str:
    d = r.device
    out = ["<h3>Model FLOPs utilization</h3>"]
    if _from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.MODEL_FLOPS_UTILIZATION.prometheus_name} and "
                     f"{sc.MODEL_FLOPS_ACHIEVED.prometheus_name} on the training report dashboard; the per-rank "
                     f"figures are {IN_RECORDING}."))
    elif not d.flops:
        out.append(p("No data: no profiling window counted the model's FLOPs (windows count the step after them; "
                     "OTELPROF_PROFILE_FLOPS=false or torch.compile turn counting off)."))
    else:
        gpu = [x for x in d.flops if x.utilization is not None]
        if gpu:
            best = max(gpu, key=lambda x: x.utilization or 0.0)
            out.append(p(f"Rank {best.rank} reached {pct(best.utilization)} of the {best.gpu_model}'s dense "
                         f"{best.dtype} peak ({_flops(best.peak)}FLOP/s)."))
        else:
            out.append(p("Achieved FLOP/s without a utilization: the model ran on the CPU, or the GPU model or dtype "
                         "has no peak in the table (set OTELPROF_PEAK_FLOPS)."))
        out.append(table(("Rank", "FLOPs per step", "Steps/s", "Achieved FLOP/s", "Device", "Dtype", "Peak FLOP/s",
                          "MFU"),
                         [(x.rank, _flops(x.per_step), f"{x.steps_per_second:,.2f}", _flops(x.achieved), x.device,
                           x.dtype, _flops(x.peak), pct(x.utilization)) for x in d.flops], 0))
    out.append("<h3>Device time vs host time</h3>")
    if _from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.REGION_DEVICE_DURATION.prometheus_name} beside "
                     f"{sc.ANNOTATION_DURATION.prometheus_name} on the training report dashboard."))
    elif not d.regions:
        out.append(p("No data: no CUDA-event device times were recorded (the model ran on the CPU, or outside the "
                     "PyTorch integration)."))
    else:
        out.append(p("Per region, the mean host time of the steps that have a CUDA-event device time, the mean device "
                     "time and the gap (host minus device). A large positive gap: the host spends longer than the GPU "
                     "work it queues (launch overhead, Python, host work in the region): the GPU idles. A negative "
                     "gap: the GPU runs behind the host, which then waits at the next synchronization."))
        out.append(table(("Phase", "Region", "Steps", "Host mean", "Device mean", "Gap", "Gap share of host"),
                         [(x.phase, x.region, f"{x.steps:,}", secs(x.host_mean), secs(x.device_mean),
                           secs(x.gap_mean), pct(x.gap_share)) for x in d.regions], 2))
    out.append(_overlap(r))
    out.append(_window_memory(r))
    return section("device", "Device time and FLOPs", "".join(out))


def _overlap(r: Report) -> str:
    d = r.device
    out = ['<h3 id="overlap">Communication/computation overlap</h3>']
    if _from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.COMM_OVERLAP.prometheus_name} and {sc.COMM_EXPOSED.prometheus_name} on "
                     "the training report dashboard."))
    elif not d.overlap:
        out.append(p("No data: no profiling window saw collective (NCCL) kernels on a GPU (a single-GPU or CPU run)."))
    else:
        worst = max(d.overlap, key=lambda o: o.exposed)
        out.append(p("Per rank, from the GPU kernels of its profiling windows: the time collective kernels (NCCL) ran "
                     "per profiled step, the share of it compute kernels ran beside them on the same GPU (hidden "
                     "communication), and the exposed rest, which the step waits for. A rank whose exposed time "
                     f"stands out waits for the others: rank {worst.rank} has the most "
                     f"({secs(worst.exposed)} per step)."))
        out.append(table(("Rank", "Windows", "Communication per step", "Overlapped", "Exposed per step"),
                         [(o.rank, o.windows, secs(o.communication), pct(o.overlap), secs(o.exposed))
                          for o in d.overlap], 0))
    return "".join(out)


def _window_memory(r: Report) -> str:
    d = r.device
    out = ["<h3>Memory in the profiling windows</h3>"]
    if _from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.OPERATOR_ALLOCATED.prometheus_name} and "
                     f"{sc.PROFILE_MEMORY_PEAK.prometheus_name} on the training report dashboard; the curves are "
                     f"{IN_RECORDING}."))
    elif not d.memory_windows:
        out.append(p("No data: no profiling window recorded allocations (OTELPROF_PROFILE_MEMORY=false, or no "
                     "window ran)."))
    else:
        out.append(p(f"The operators that allocated the most in {d.memory_windows} window(s), their own allocations "
                     "(an operator's children count for themselves), all ranks."))
        out.append(table(("Device", "Operator", "Allocated", "Allocations", "Windows"),
                         [(a.device, a.name, size(a.bytes), f"{a.allocations:,}", a.windows) for a in d.allocations],
                         2))
        charts_ = [figure(svg.xy([(f"rank {c.rank} {c.device}", [x for x, _ in c.points], [y for _, y in c.points],
                                   [y for _, y in c.points], [y for _, y in c.points])],
                                 f"Rank {c.rank}: allocated during the window of step {c.start_step}", size,
                                 lambda v: f"{v:.3g} s"),
                          f"Bytes held by tensors on {c.device} over the window (peak {size(c.peak)}).")
                   for c in d.curves[:4]]
        out.append(charts(*charts_))
    out.append("<h3>CUDA allocator over the run</h3>")
    if not d.allocators:
        out.append(p("No data: no CUDA allocator figures were recorded (the model ran on the CPU)."))
    else:
        out.append(p("Per rank and GPU: the most memory tensors held at once, the most the caching allocator "
                     "reserved, and fragmentation (reserved minus allocated: cached and split blocks no tensor uses). "
                     "Fragmentation close to the GPU's free memory makes an out-of-memory error possible with memory "
                     "to spare; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces it."))
        out.append(table(("Rank", "GPU", "Peak allocated", "Max reserved", "Max fragmentation", "Last fragmentation"),
                         [(a.rank, a.gpu, size(a.peak), size(a.reserved_max), size(a.fragmentation_max),
                           size(a.fragmentation_last)) for a in d.allocators], 2))
    return "".join(out)


def _memory(r: Report) -> str:
    g = r.gpus
    out = []
    if g.gpus:
        out.append(p("GPU memory in use as a share of each device's memory. Memory that keeps growing over the run "
                     "ends in an out-of-memory error; memory that stays low leaves room for a larger batch."))
        for x in g.gpus:
            msgs = []
            if x.memory.p95 < 0.5:
                msgs.append(f"its 95th percentile is only {pct(x.memory.p95)}")
            if x.memory.p95 - x.memory.p5 > 0.5:
                msgs.append(f"it swings from {pct(x.memory.p5)} (p5) to {pct(x.memory.p95)} (p95)")
            if x.memory_growth > 0.05:
                msgs.append(f"it grew by {pct(x.memory_growth)} of the device between the first and last tenth of "
                            "the run")
            full = x.memory.max > 0.95 or (x.memory.max_bucket is not None and x.memory.max_bucket.low >= 0.95)
            if full:
                msgs.append(f"it peaked at {extreme(x.memory.max, x.memory.max_bucket, pct)}, close to capacity")
            if msgs:
                out.append(note(f"GPU {x.gpu} on {x.node}: " + "; ".join(msgs) + ".",
                                "warn" if x.memory_growth > 0.05 or full else ""))
        out.append(table(("Node", "GPU", "Memory", "max", "p95", "p50", "p5", "Growth"),
                         [(x.node, x.gpu, size(x.memory_total), extreme(x.memory.max, x.memory.max_bucket, pct),
                           pct(x.memory.p95), pct(x.memory.median), pct(x.memory.p5), pct(x.memory_growth))
                          for x in g.gpus], 2))
        if _from_prometheus(r):
            out.append(p("From Prometheus: max is the histogram bucket holding the largest sample, the percentiles "
                         "are interpolated within buckets; growth is the scraped gauge's mean over the last tenth "
                         "of the range minus over the first tenth (“-” when a tenth holds no scrape)."))
        out.append(charts(
            figure(svg.boxplots([(f"{x.node} GPU {x.gpu}", x.memory) for x in g.gpus], "GPU memory", _pct0, 0.0, 1.0,
                                width=760), "Memory in use per GPU."),
            figure(svg.lines([(f"GPU {x.gpu}", x.memory_series) for x in g.gpus[:10]], "GPU memory over time", _pct0,
                             0.0, 1.0, width=760, x_fmt=_elapsed), "GPU memory over time (bucket means).")))
    else:
        out.append(p("No GPU was sampled."))
    rss = [row for row in r.system.process_rows if row.unit == sysmod.UNIT_BYTES]
    if rss:
        out.append("<h3>Host memory of the training processes</h3>")
        out.append(table(("Rank", "RSS max", "p50", "min"), [(row.subject, size(row.max), size(row.p50),
                                                                 size(row.min)) for row in rss]))
    return section("gpu-memory", "GPU memory", "".join(out))


# ---------------------------------------------------------------------------------------- page

def render(report: Report) -> str:
    s = report.summary
    d = report.diagnosis
    sections = [
        _diagnosis(report), _summary(report), _environment(report), fold(_training(report), d.section("training")),
        _system(report), _framework(report), _rules(report),
        '<h2 class="muted">Analyzing the training loop</h2>',
        *(fold(html, d.section(anchor)) for anchor, html in (
            ("steps", _steps(report)), ("gpu", _gpu(report)), ("device", _device(report)),
            ("balance", _balance(report)), ("dataloader", _dataloader(report)), ("batch", _batch(report)),
            ("cpu-bottleneck", _bottleneck(report, io=False)), ("io-bottleneck", _bottleneck(report, io=True)),
            ("gpu-memory", _memory(report)))),
    ]
    sections[6] = fold(sections[6], d.section("rules"))
    from otelprof.report.tensors import layers_section  # the Layers section lives in its own module
    sections.append(layers_section(report))
    if report.notes:
        sections.append(section("notes", "Notes", "".join(note(n) for n in report.notes)))
    nav = "".join(f'<a href="#{anchor}">{escape(title)}</a>' for anchor, title in SECTIONS)
    meta = (f"run {escape(s.run_id or '?')} · {len(s.ranks)} rank(s) on {len(s.nodes)} node(s) · "
            f"{escape(secs(s.duration))} · source {escape(report.source)} · generated {escape(when(report.generated))}")
    footer = ("Generated by otelprof from the run recording (or Prometheus). The figures are computed on the "
              "recorded samples and steps; the checks are the offline twin of otelprof's Prometheus alert rules. "
              "The report is informational: confirm a finding on the timeline (otelprof timeline) before acting.")
    return PAGE.format(version=escape(__version__), title=escape(f"otelprof report: {s.job or s.run_id or 'run'}"),
                       style=STYLE, heading=escape(f"Training profile: {s.job or s.run_id or 'run'}"), meta=meta,
                       nav=nav, sections="\n".join(sections), footer=escape(footer))
