"""The "Training report" dashboard: SageMaker Debugger's profiling report, section by section, live.

Sections follow the original profiling report: job summary, system usage statistics, framework
summary, rules summary, step duration analysis, GPU utilization analysis, batch size, CPU bottleneck,
I/O bottleneck, load balancing, GPU memory, data loader; then training health, where the training
rules' alerts point. Statistics cover the dashboard's time range: pick the job's run.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards import queries as pq
from otelprof.dashboards.common import dashboard, dashboard_link
from otelprof.dashboards.model import Dashboard, Prom, Row
from otelprof.dashboards.panels import (
    GREEN,
    RED,
    YELLOW,
    bargauge,
    heatmap,
    stat,
    state_timeline,
    table,
    timeseries,
    value_map,
)
from otelprof.dashboards.tensors import layers_row
from otelprof.mixin.alert_text import pct
from otelprof.mixin.config import ALERT_PREFIX, MixinConfig, seconds
from otelprof.mixin.promql import GPU, JOB, NODE, PHASE, RANK

ANNOTATION = sc.prometheus_label(sc.LABEL_ANNOTATION)
SCALAR = sc.prometheus_label(sc.LABEL_SCALAR)
NETWORK_DIRECTION = sc.prometheus_label(sc.LABEL_NETWORK_DIRECTION)
RANGE_NOTE = "over the dashboard's time range (select the job's run)"
GPU_NEEDS = frozenset({"gpu"})


CAUSES = ("InputBound", "CPUBottleneck", "IOBottleneck", "RankStraggler", "SlowInitialization",
          "TooFewDataLoaderWorkers", "BatchSizeTooSmall")
"""Alerts that name a cause of lost time; the others (outlier steps, idle GPUs, memory, loss) name symptoms
or risks. The report's diagnosis (otelprof.analysis.diagnosis) orders its findings the same way."""


def _cost(expr: str, name: str) -> str:
    return pq.label(expr, "cost", name)


def _diagnosis(qs: pq.Queries) -> Row:
    """The diagnosis first: what costs the job time over the range, ranked, and the alerts behind it, causes
    first; a healthy job shows no firing alert and where its step time goes."""
    train_time = pq.total(qs.proc, sc.STEP_DURATION, (JOB,), "sum", qs.train)
    region = pq.total(qs.proc, sc.ANNOTATION_DURATION, (JOB,), "sum",
                      f'{qs.train}, {ANNOTATION}="{sc.REGION_DATALOADER}"')
    samples = pq.total(qs.node, sc.SAMPLER_SAMPLES, (JOB,))
    loop = pq.loop_in_range(qs.proc, (JOB,))
    all_steps = pq.total(qs.proc, sc.STEP_DURATION, (JOB,), "sum")
    start = pq.first(qs.proc, sc.PROCESS_START_TIME, (JOB,))
    first_step = pq.first(qs.proc, sc.STEP_FIRST_TIMESTAMP, (JOB,))
    end = pq.last_seen(qs.proc, (JOB,))
    costs = " or ".join((
        _cost(f"{region} / {train_time}", "waiting for data (share of train step time)"),
        _cost(f"{pq.total(qs.node, sc.SAMPLER_CPU_BOTTLENECK, (JOB,))} / {samples}",
              "CPU bottleneck (share of samples a GPU waited)"),
        _cost(f"{pq.total(qs.node, sc.SAMPLER_IO_BOTTLENECK, (JOB,))} / {samples}",
              "I/O bottleneck (share of samples a GPU waited)"),
        _cost(f"clamp_min(1 - {all_steps} / {loop}, 0)", "between steps (share of the training loop)"),
        _cost(f"({first_step} - {start}) / ({end} - {start})", "initialization (share of the job)"),
        _cost(f"1 - avg by ({JOB}) (avg_over_time({qs.gpu.sel(sc.GPU_UTILIZATION)}[{pq.RANGE}]))",
              "GPUs idle (share of the time)"),
    ))
    regions = (sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER)

    def in_region(matcher: str) -> str:
        return pq.total(qs.proc, sc.ANNOTATION_DURATION, (JOB,), "sum", f"{qs.train}, {ANNOTATION}{matcher}")

    shares = [_cost(in_region('="' + name + '"') + f" / {train_time}", name) for name in regions]
    covered = in_region('=~"' + "|".join(regions) + '"')
    parts = " or ".join([*shares, _cost(f"clamp_min(1 - {covered} / {train_time}, 0)", "uncovered")])
    causes = f'alertname=~"{ALERT_PREFIX}({"|".join(CAUSES)})"'
    firing = _alerts_selector("firing")

    def fired(matcher: str) -> str:
        """Per alert, the rule evaluations at which it was firing over the range."""
        return (f"sum by (alertname, severity) (count_over_time({firing.replace('}', ', ' + matcher + '}')}"
                f"[{pq.RANGE}]))")

    verdict = "count(" + fired('severity=~"warning|critical"') + ") or vector(0)"
    return Row(50, "Diagnosis", [
        stat(ids.REPORT_VERDICT, "Verdict", "otelprof alerts of severity warning or critical that fired for the "
             f"job {RANGE_NOTE}: none means healthy (the bars beside it say where the time goes).",
             [Prom(verdict, "alerts that fired", instant=True)], "none", w=4, h=8,
             steps=((None, GREEN), (1, RED)), mappings=[value_map({"0": ("healthy", GREEN)})]),
        bargauge(ids.REPORT_COSTS, "What costs time, ranked", "Each cost the diagnosis weighs, " + RANGE_NOTE
                 + ", largest first: the train steps' wait for data over their time, the samples in which a GPU "
                 "waited while a CPU was busy (or in iowait), the training loop's time between steps, the time "
                 "before the first step over the job, and the GPUs' mean idle share (needs a GPU). Start with "
                 "the top bar; the report (otelprof report) gives this run's action for each.",
                 [Prom(f"sort_desc({costs})", "{{cost}}", instant=True)], "percentunit", w=8, h=8, max=1,
                 steps=((None, GREEN), (0.05, YELLOW), (0.25, RED))),
        table(ids.REPORT_CAUSES, "Causes that fired", "Alerts that name a cause of lost time (waiting for data, "
              "CPU or I/O bottleneck, a straggler, a slow start, too few loader workers, a small batch), with the "
              f"rule evaluations at which each fired {RANGE_NOTE}. Fix these before the symptoms beside them.",
              [("Evaluations firing", Prom(fired(causes), needs=frozenset({"alerts"})), "short")],
              [("alertname", "Alert"), ("severity", "Severity")], sort_by="Evaluations firing", w=6, h=8),
        table(ids.REPORT_SYMPTOMS, "Symptoms and risks that fired", "The other otelprof alerts that fired "
              f"{RANGE_NOTE} (outlier steps, idle GPUs, memory, loss): often the consequence of a cause on the "
              "left, or a risk that costs no time yet.",
              [("Evaluations firing", Prom(fired(causes.replace("=~", "!~")), needs=frozenset({"alerts", "symptom"})),
                "short")],
              [("alertname", "Alert"), ("severity", "Severity")], sort_by="Evaluations firing", w=6, h=8),
        bargauge(ids.REPORT_WHERE_TIME_GOES, "Where the train step time goes", "Share of the train steps' time "
                 "in the data loader, forward, backward and optimizer regions, and uncovered (the rest of each "
                 "step: the loop's own code and work no region covers), " + RANGE_NOTE + ".",
                 [Prom(f"sort_desc({parts})", "{{cost}}", instant=True)], "percentunit", w=24, h=5, max=1),
    ])


def _job_summary(qs: pq.Queries) -> Row:
    c = qs.config
    start = pq.first(qs.proc, sc.PROCESS_START_TIME)
    end = pq.last_seen(qs.proc)
    first_step = pq.first(qs.proc, sc.STEP_FIRST_TIMESTAMP)
    last_step = pq.last(qs.proc, sc.STEP_LAST_TIMESTAMP)
    duration = f"({end} - {start})"
    init = f"(({first_step} or vector(time())) - {start})"
    loop = f"({last_step} - {first_step})"
    final = f"clamp_min({end} - {last_step}, 0)"
    steps = pq.total(qs.proc, sc.STEPS, (PHASE,))
    samples = pq.total(qs.proc, sc.SAMPLES, (), matchers=qs.train)
    init_limit = seconds(c.max_initialization_time)
    return Row(100, "Job summary", [
        stat(101, "Start", "When the first process of the job started (otelprof_process_start_time_seconds), "
             + RANGE_NOTE + ".", [Prom(f"{start} * 1000", "start", instant=True)], "dateTimeAsIso"),
        stat(102, "End (last report)", "When Prometheus last scraped a process of the job: the job's end, or "
             "now while it runs.", [Prom(f"{end} * 1000", "end", instant=True)], "dateTimeAsIso"),
        stat(103, "Job duration", "From the first process start to the last report.",
             [Prom(duration, "duration", instant=True)], "s"),
        stat(ids.REPORT_INITIALIZATION, "Initialization", "From the first process start to the first step "
             "of any rank; while no step has started, the time since the start (the SlowInitialization "
             f"alert fires after {c.max_initialization_time}).", [Prom(init, "initialization", instant=True)],
             "s", steps=((None, GREEN), (pq.whole(init_limit / 2), YELLOW), (pq.whole(init_limit), RED))),
        stat(105, "Training loop", "From the first step's start to the last step's end (any rank).",
             [Prom(loop, "training loop", instant=True)], "s"),
        stat(106, "Finalization", "From the last step's end to the last report (checkpointing, evaluation "
             "outside steps, shutdown).", [Prom(final, "finalization", instant=True)], "s"),
        bargauge(107, "Share of the job", "Initialization, training loop and finalization as shares of the "
                 "job's duration (the original report's pie chart).",
                 [Prom(f"{init} / {duration}", "initialization", instant=True),
                  Prom(f"{loop} / {duration}", "training loop", instant=True),
                  Prom(f"{final} / {duration}", "finalization", instant=True)],
                 "percentunit", w=12, h=6, max=1),
        stat(108, "Steps", "Steps finished per phase " + RANGE_NOTE + ".",
             [Prom(steps, "{{phase}}", instant=True)], "short", w=6, h=6),
        stat(109, "Training throughput", "Training samples per second of the training loop (record('samples', "
             "n) or the PyTorch integration), all selected ranks together.",
             [Prom(f"{samples} / {pq.loop_in_range(qs.proc)}", "samples/s", instant=True)], "short", w=6, h=6),
    ])


def _usage_stat(qs: pq.Queries, stat_name: str) -> str:
    """One statistic (max, p99, p95, p50, min) of each usage metric per node, as rows labelled ``metric``."""
    q_values = {"max": 1.0, "p99": 0.99, "p95": 0.95, "p50": 0.5, "min": 0.0}
    quantile = q_values[stat_name]
    by_node = (JOB, NODE)

    def scraped(expr: str) -> str:
        if stat_name == "max":
            return pq.over_time("max_over_time", expr)
        if stat_name == "min":
            return pq.over_time("min_over_time", expr)
        return pq.over_time(f"quantile_over_time({quantile:g},", expr)

    cpu = pq.quantile(quantile, qs.node, sc.NODE_CPU_UTILIZATION, by_node) if stat_name != "min" \
        else scraped(f"avg by ({JOB}, {NODE}) ({pq.cpu_busy(qs.node)})")
    parts = [
        pq.label(cpu, "metric", "CPU"),
        pq.label(scraped(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.SYSTEM_MEMORY_UTILIZATION)})"),
                 "metric", "CPU memory"),
        pq.label(scraped(f"avg by ({JOB}, {NODE}) ({qs.gpu.sel(sc.GPU_UTILIZATION)})"), "metric", "GPU"),
        pq.label(scraped(f"avg by ({JOB}, {NODE}) ({qs.gpu.sel(sc.GPU_MEMORY_UTILIZATION)})"), "metric",
                 "GPU memory"),
        pq.label(scraped(f"avg by ({JOB}, {NODE}) ({pq.iowait(qs.node)})"), "metric", "I/O wait"),
    ]
    return " or ".join(parts)


def _network_stat(qs: pq.Queries, stat_name: str) -> str:
    rate = f"sum by ({JOB}, {NODE}, {NETWORK_DIRECTION}) ({pq.rate(qs.node, sc.SYSTEM_NETWORK_IO)})"
    if stat_name in ("max", "min"):
        return pq.over_time(f"{stat_name}_over_time", rate)
    quantile = {"p99": 0.99, "p95": 0.95, "p50": 0.5}[stat_name]
    return pq.over_time(f"quantile_over_time({quantile:g},", rate)


STATS = ("max", "p99", "p95", "p50", "min")


def _system_usage(qs: pq.Queries) -> Row:
    return Row(200, "System usage statistics", [
        table(201, "Utilization per node", "Per node " + RANGE_NOTE + ": CPU is the busy share averaged over "
              "all cores, taken from every telemetry sample (per-sample histogram, 5 % buckets; max is the "
              "bucket's upper bound, min is from the scraped per-core values); CPU memory is host memory in use; "
              "GPU and GPU memory are averaged over the node's GPUs and I/O wait over its cores, at each scrape. "
              "GPU rows need a GPU.",
              [(name, Prom(_usage_stat(qs, name)), "percentunit") for name in STATS],
              [(NODE, "Node"), ("metric", "Metric")], default_unit="percentunit", h=9),
        table(202, "Network per node", "Bytes per second received and transmitted on all interfaces but "
              "loopback, per node " + RANGE_NOTE + ", from the scraped counters.",
              [(name, Prom(_network_stat(qs, name)), "Bps") for name in STATS],
              [(NODE, "Node"), (NETWORK_DIRECTION, "Direction")], default_unit="Bps", h=9),
        timeseries(203, "Usage over time", "Node averages over time: CPU busy share over the samples of each "
                   "interval, GPU utilization over the node's GPUs (needs a GPU), host memory in use.",
                   [Prom(pq.rate_mean(qs.node, sc.NODE_CPU_UTILIZATION, (JOB, NODE)), "{{node}} CPU"),
                    Prom(f"avg by ({JOB}, {NODE}) ({qs.gpu.sel(sc.GPU_UTILIZATION)})", "{{node}} GPU",
                         needs=GPU_NEEDS),
                    Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.SYSTEM_MEMORY_UTILIZATION)})",
                         "{{node}} CPU memory")],
                   "percentunit", w=24, min=0, max=1),
    ])


def _framework(qs: pq.Queries) -> Row:
    step_time = pq.total(qs.proc, sc.STEP_DURATION, (JOB, RANK, PHASE), "sum")
    loop = pq.loop_in_range(qs.proc, (JOB, RANK))
    all_steps = pq.total(qs.proc, sc.STEP_DURATION, (JOB, RANK), "sum")
    fwd_bwd = pq.total(qs.proc, sc.ANNOTATION_DURATION, (ANNOTATION,), "sum",
                       f'{qs.train}, {ANNOTATION}=~"{sc.REGION_FORWARD}|{sc.REGION_BACKWARD}"')
    ann_total = pq.total(qs.proc, sc.ANNOTATION_DURATION, (PHASE, ANNOTATION), "sum")
    ann_count = pq.total(qs.proc, sc.ANNOTATION_DURATION, (PHASE, ANNOTATION), "count")
    top = f"topk(15, {ann_total})"
    return Row(300, "Framework summary", [
        bargauge(301, "Time per phase", "Per rank, the share of its training loop (inside the range) spent in "
                 "steps of each phase, and between steps (data loading outside steps, logging, checkpoints). "
                 "Much time between steps deserves a look at the timeline.",
                 [Prom(f"{step_time} / on ({JOB}, {RANK}) group_left() {loop}", "rank {{rank}} · {{phase}}",
                       instant=True),
                  Prom(f"clamp_min(1 - {all_steps} / {loop}, 0)", "rank {{rank}} · between steps", instant=True)],
                 "percentunit", max=1),
        bargauge(302, "Forward vs backward", "Share of the time in the forward and backward regions of training "
                 "steps (annotate('forward') / annotate('backward') or the PyTorch integration).",
                 [Prom(f"{fwd_bwd} / ignoring ({ANNOTATION}) group_left() sum({fwd_bwd})", "{{annotation}}",
                       instant=True)], "percentunit", max=1),
        table(303, "Top annotated regions", "The 15 annotated regions with the most total time "
              f"{RANGE_NOTE}, all selected ranks together (phase {sc.NO_PHASE}: outside steps). Operator-level "
              "breakdowns come from profiling windows (otelprof.torch.profile_window or an alert's capture).",
              [("Total", Prom(top), "s"),
               ("Calls", Prom(f"{ann_count} and on ({PHASE}, {ANNOTATION}) {top}"), "short"),
               ("Mean", Prom(f"({ann_total} / {ann_count}) and on ({PHASE}, {ANNOTATION}) {top}"), "s")],
              [(PHASE, "Phase"), (ANNOTATION, "Region")], sort_by="Total", w=12),
        timeseries(304, "Where step time goes", "Per interval, the share of wall time each annotated region of "
                   "training steps takes (averaged over the selected ranks); the rest of a step is unannotated.",
                   [Prom(f"avg by ({ANNOTATION}) (sum by ({RANK}, {ANNOTATION}) "
                         f"({pq.rate(qs.proc, sc.ANNOTATION_DURATION, 'sum', qs.train)}))", "{{annotation}}")],
                   "percentunit", stack=True, min=0, w=12),
    ])


def _alerts_selector(state: str = "") -> str:
    matchers = [f'alertname=~"{ALERT_PREFIX}.*"', pq.JOB_M]
    if state:
        matchers.append(f'alertstate="{state}"')
    return "ALERTS{" + ", ".join(matchers) + "}"


def _rules() -> Row:
    firing = _alerts_selector("firing")
    alerts_needs = frozenset({"alerts"})
    states = (f"max by (alertname) ({_alerts_selector('firing')} * 2 or {_alerts_selector('pending')})")
    return Row(400, "Rules summary", [
        table(401, "Alerts firing now", "otelprof alerts firing for this job at the end of the range (the "
              "ALERTS series Prometheus keeps for its alert rules). The runbook explains each.",
              [("Series", Prom(f"count by (alertname, severity, {NODE}, {RANK}, {GPU}) ({firing})",
                               needs=alerts_needs), "short")],
              [("alertname", "Alert"), ("severity", "Severity"), (NODE, "Node"), (RANK, "Rank"), (GPU, "GPU")],
              w=12),
        table(402, "Rule evaluations that fired", "Per alert, the rule evaluations in which it was firing "
              f"{RANGE_NOTE} (the original report's 'triggered N times'; multiply by the evaluation interval "
              "for the time spent firing).",
              [("Evaluations firing", Prom(f"sum by (alertname, severity) (count_over_time({firing}[{pq.RANGE}]))",
                                           needs=alerts_needs), "short")],
              [("alertname", "Alert"), ("severity", "Severity")], sort_by="Evaluations firing", w=12),
        state_timeline(403, "Alert states", "When each otelprof alert of the job was pending or firing.",
                       [Prom(states, "{{alertname}}", needs=alerts_needs)], "none",
                       steps=((None, "transparent"),),
                       mappings=[value_map({"1": ("pending", YELLOW), "2": ("firing", RED)})]),
    ])


def _steps(qs: pq.Queries) -> Row:
    c = qs.config
    labels = (JOB, NODE, RANK, PHASE)
    steps = pq.total(qs.proc, sc.STEPS, labels)
    outliers = pq.total(qs.proc, sc.STEP_OUTLIERS, labels)
    timeline = dashboard_link("Traces of rank ${__field.labels.rank} (timeline)", ids.TIMELINE,
                              rank_from_field=True)
    return Row(600, "Step duration analysis", [
        table(ids.REPORT_STEP_TABLE, "Step time per rank", "Per rank and phase " + RANGE_NOTE + ": exact mean, "
              "percentiles interpolated in the histogram's buckets, max as the upper bound of the highest "
              "non-empty bucket, and the outlier steps (slower than mean + OTELPROF_OUTLIER_SIGMA x stddev of "
              "the recent steps of their phase, detected in the process; every outlier step is traced).",
              [("Mean", Prom(pq.mean(qs.proc, sc.STEP_DURATION, labels)), "s"),
               ("p50", Prom(pq.quantile(0.5, qs.proc, sc.STEP_DURATION, labels)), "s"),
               ("p95", Prom(pq.quantile(0.95, qs.proc, sc.STEP_DURATION, labels)), "s"),
               ("p99", Prom(pq.quantile(0.99, qs.proc, sc.STEP_DURATION, labels)), "s"),
               ("Max ≤", Prom(pq.quantile(1.0, qs.proc, sc.STEP_DURATION, labels)), "s"),
               ("Steps", Prom(steps), "short"),
               ("Outliers", Prom(outliers), "short"),
               ("Outlier share", Prom(f"{outliers} / {steps}"), "percentunit")],
              [(NODE, "Node"), (RANK, "Rank"), (PHASE, "Phase")]),
        heatmap(602, "Training step time distribution", "Training steps per step-time bucket and interval, "
                "all selected ranks: a second band above the main one is a recurring slow step (data stalls, "
                "periodic evaluation or checkpointing).",
                pq.heatmap(qs.proc, sc.STEP_DURATION, qs.train), "s"),
        timeseries(ids.REPORT_STEP_TIME, "Training step time per rank", "Median and 95th percentile of the "
                   f"training steps of each {c.dashboard_rate_window}, per rank (recording rules). Click a "
                   "line for the rank's traced steps on the timeline.",
                   [Prom(qs.rule("step_p50_rate", qs.proc, qs.train), "rank {{rank}} p50"),
                    Prom(qs.rule("step_p95_rate", qs.proc, qs.train), "rank {{rank}} p95")],
                   "s", links=[timeline]),
        timeseries(604, "Outlier steps", "Outlier steps per interval and rank; each was traced and can be opened "
                   "from the timeline's outlier table.",
                   [Prom(f"sum by ({RANK}, {PHASE}) ({pq.increase(qs.proc, sc.STEP_OUTLIERS)})",
                         "rank {{rank}} {{phase}}")],
                   "short", bars=True, links=[timeline]),
    ])


def _gpu_utilization(qs: pq.Queries) -> Row:
    c = qs.config
    gpu_labels = (JOB, NODE, GPU)
    return Row(700, "GPU utilization analysis", [
        table(701, "Utilization per GPU", "Per GPU " + RANGE_NOTE + ": percentiles of every telemetry sample "
              "(per-sample histogram, 5 % buckets). The original report drew these as box plots; p95 below "
              f"{pct(c.low_gpu_threshold_p95)} is an underused GPU, p5 below {pct(c.low_gpu_threshold_p5)} with p95 "
              f"above {pct(c.low_gpu_threshold_p95)} a fluctuating one.",
              [(name, Prom(pq.quantile(q, qs.gpu, sc.GPU_UTILIZATION_DISTRIBUTION, gpu_labels), needs=GPU_NEEDS),
                "percentunit")
               for name, q in (("p5", 0.05), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p95", 0.95))],
              [(NODE, "Node"), (GPU, "GPU")], default_unit="percentunit", w=12),
        timeseries(702, "GPU utilization", "Share of each sample period a kernel ran, per GPU (NVML).",
                   [Prom(qs.gpu.sel(sc.GPU_UTILIZATION), "{{node}} GPU {{gpu}}", needs=GPU_NEEDS)],
                   "percentunit", min=0, max=1),
        heatmap(703, "GPU utilization distribution", "Telemetry samples per utilization bucket and interval, "
                "all selected GPUs.", pq.heatmap(qs.gpu, sc.GPU_UTILIZATION_DISTRIBUTION), "percentunit", w=24,
                needs=GPU_NEEDS),
    ])


def _batch_size(qs: pq.Queries) -> Row:
    c = qs.config
    below = pq.all_below(pq.batch_size_thresholds(c), pct)
    return Row(800, "Batch size", [
        bargauge(801, "95th percentiles", "The BatchSize rule's three inputs " + RANGE_NOTE + ": when GPU "
                 f"utilization, GPU memory and the node's CPU are {below} at the 95th percentile, a larger "
                 "batch (or a smaller instance) would use the hardware better.",
                 [Prom(pq.quantile(0.95, qs.gpu, sc.GPU_UTILIZATION_DISTRIBUTION, (NODE, GPU)),
                       "{{node}} GPU {{gpu}} utilization", instant=True, needs=GPU_NEEDS),
                  Prom(pq.quantile(0.95, qs.gpu, sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, (NODE, GPU)),
                       "{{node}} GPU {{gpu}} memory", instant=True, needs=GPU_NEEDS),
                  Prom(pq.quantile(0.95, qs.node, sc.NODE_CPU_UTILIZATION, (NODE,)), "{{node}} CPU", instant=True)],
                 "percentunit", max=1, steps=((None, "blue"), (c.batch_size_gpu_threshold_p95, GREEN))),
        timeseries(802, "Throughput", "Samples per second per phase, all selected ranks together "
                   "(record('samples', n) or the PyTorch integration).",
                   [Prom(f"sum by ({PHASE}) ({pq.rate(qs.proc, sc.SAMPLES)})", "{{phase}} samples/s")],
                   "short", min=0, w=6),
        timeseries(803, "Token throughput", "Tokens per second per phase (record('tokens', n)).",
                   [Prom(f"sum by ({PHASE}) ({pq.rate(qs.proc, sc.TOKENS)})", "{{phase}} tokens/s",
                         needs=frozenset({"tokens"}))], "short", min=0, w=6),
    ])


def _bottleneck(qs: pq.Queries, row_id: int, title: str, what: str, counter: sc.MetricSpec, rule_key: str,
                threshold: float, per_core: str, per_core_title: str, per_core_expr: str) -> Row:
    c = qs.config
    share = (f"{pq.total(qs.node, counter, (JOB, NODE))} / {pq.total(qs.node, sc.SAMPLER_SAMPLES, (JOB, NODE))}")
    return Row(row_id, title, [
        stat(row_id + 1, "Bottleneck samples", f"Per node, the share of telemetry samples {RANGE_NOTE} in which "
             f"{what} while some GPU was below {pq.percent(c.gpu_threshold)} utilization (counted per sample "
             "in the process: exact at any scrape interval). Zero without a GPU: no GPU waits.",
             [Prom(share, "{{node}}", instant=True)], "percentunit", w=6, h=8,
             steps=((None, GREEN), (threshold, RED))),
        timeseries(row_id + 2, "Bottleneck share, last " + c.window, "The share the alert judges: bottleneck "
                   f"samples among the node's samples of the last {c.window} (recording rule), with the "
                   "alert's threshold.",
                   [Prom(qs.rule(rule_key, qs.node), "{{node}}")], "percentunit", min=0, max=1, line_at=threshold,
                   w=8),
        timeseries(row_id + 3, per_core_title, f"Per logical CPU: {per_core}.",
                   [Prom(per_core_expr, "{{node}} cpu {{cpu_logical_number}}")], "percentunit", min=0, max=1,
                   w=10),
    ])


def _load_balancing(qs: pq.Queries) -> Row:
    c = qs.config
    compute = qs.rule("step_compute_mean", qs.proc, qs.train)
    return Row(1100, "Load balancing across GPUs and ranks", [
        bargauge(1101, "Mean utilization per GPU", "Exact mean of every telemetry sample per GPU "
                 f"{RANGE_NOTE}. The load-imbalance alert compares the busiest and the idlest GPU of the job "
                 f"(threshold {pq.percent(c.load_balancing_threshold)} points).",
                 [Prom(pq.mean(qs.gpu, sc.GPU_UTILIZATION_DISTRIBUTION, (NODE, GPU)), "{{node}} GPU {{gpu}}",
                       instant=True, needs=GPU_NEEDS)], "percentunit", max=1),
        bargauge(1102, "Mean training step time per rank", "Exact mean step time per rank " + RANGE_NOTE + ". In "
                 "synchronous training every rank waits for the slowest at each all-reduce.",
                 [Prom(pq.mean(qs.proc, sc.STEP_DURATION, (RANK,), qs.train), "rank {{rank}}", instant=True)], "s"),
        timeseries(1103, "Compute time per step vs the job's median", "Per rank, mean step time less "
                   f"exposed collective (all-reduce) time over the last {c.straggler_window}, divided by the median "
                   "over the job's "
                   f"ranks; the straggler alert fires above {c.straggler_ratio:g}.",
                   [Prom(f"{compute} / on ({JOB}, {PHASE}) group_left() quantile by ({JOB}, {PHASE}) (0.5, {compute})",
                         "rank {{rank}}")], "none", line_at=c.straggler_ratio, w=24),
    ])


def _gpu_memory(qs: pq.Queries) -> Row:
    c = qs.config
    gpu_labels = (NODE, GPU)
    return Row(1200, "GPU memory", [
        table(1201, "Memory per GPU", "Share of each GPU's memory in use " + RANGE_NOTE + " (per-sample "
              "histogram; max is the bucket's upper bound). The original flagged p95 below 50 % as room for a "
              "larger batch.",
              [(name, Prom(pq.quantile(q, qs.gpu, sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, gpu_labels),
                           needs=GPU_NEEDS), "percentunit")
               for name, q in (("max ≤", 1.0), ("p95", 0.95), ("p50", 0.5), ("p5", 0.05))],
              [(NODE, "Node"), (GPU, "GPU")], default_unit="percentunit", w=8),
        timeseries(1202, "GPU memory in use", "Share of each GPU's memory in use (NVML), with the near-capacity "
                   f"alert's threshold ({pq.percent(c.gpu_memory_capacity_threshold)}).",
                   [Prom(qs.gpu.sel(sc.GPU_MEMORY_UTILIZATION), "{{node}} GPU {{gpu}}", needs=GPU_NEEDS)],
                   "percentunit", min=0, max=1, line_at=c.gpu_memory_capacity_threshold, w=8),
        timeseries(1203, "PyTorch allocator", "Per rank and device: memory held by tensors and reserved by "
                   "PyTorch's caching allocator (torch.cuda). Reserved far above allocated is fragmentation or "
                   "cache, not the model.",
                   [Prom(qs.proc.sel(sc.CUDA_MEMORY_ALLOCATED), "rank {{rank}} gpu {{gpu}} allocated",
                         needs=frozenset({"cuda"})),
                    Prom(qs.proc.sel(sc.CUDA_MEMORY_RESERVED), "rank {{rank}} gpu {{gpu}} reserved",
                         needs=frozenset({"cuda"})),
                    Prom(qs.proc.sel(sc.CUDA_MEMORY_FRAGMENTATION), "rank {{rank}} gpu {{gpu}} fragmentation",
                         needs=frozenset({"cuda"})),
                    Prom(qs.proc.sel(sc.CUDA_MEMORY_PEAK), "rank {{rank}} gpu {{gpu}} peak",
                         needs=frozenset({"cuda"}))], "bytes", min=0, w=8),
    ])


def _data_loader(qs: pq.Queries) -> Row:
    c = qs.config
    workers = f"sum by ({JOB}, {NODE}) ({qs.proc.sel(sc.DATALOADER_WORKERS)})"
    cpus = f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.CPU_AVAILABLE)})"
    loader = frozenset({"torch_dataloader"})
    return Row(1300, "Data loader", [
        stat(1301, "Workers vs CPUs", "Per node: data-loader worker processes of all ranks (PyTorch integration) "
             "and the CPUs the container may use (cgroup quota, else the affinity mask). The original advised "
             f"between {pq.percent(c.dataloader_min_threshold)} and {pq.percent(c.dataloader_max_threshold)} of "
             "the CPUs.",
             [Prom(workers, "{{node}} workers", instant=True, needs=loader),
              Prom(cpus, "{{node}} CPUs", instant=True)], "short", w=6, h=8),
        stat(1302, "pin_memory", "Per rank: 1 when the instrumented DataLoader pins host memory (faster "
             "host-to-GPU copies), 0 when it does not.",
             [Prom(qs.proc.sel(sc.DATALOADER_PIN_MEMORY), "rank {{rank}}", instant=True, needs=loader)], "none", w=3,
             h=8, steps=((None, YELLOW), (1, GREEN))),
        timeseries(1303, "Data wait share per step", "Per rank, the mean share of each training step spent "
                   "waiting for the next batch (the 'dataloader' region) over each interval, with the "
                   f"input-bound alert's threshold ({pq.percent(c.input_bound_threshold)}).",
                   [Prom(pq.rate_mean(qs.proc, sc.DATALOADER_WAIT_RATIO, (RANK,), qs.train), "rank {{rank}}")],
                   "percentunit", min=0, max=1, line_at=c.input_bound_threshold, w=7),
        heatmap(1304, "Data wait per step", "Training steps per data-wait bucket and interval, all selected "
                "ranks.", pq.heatmap(qs.proc, sc.DATALOADER_WAIT, qs.train), "s", w=8),
    ])


def _training_health(qs: pq.Queries) -> Row:
    c = qs.config
    nonfinite = frozenset({"nonfinite"})
    return Row(1400, "Training health", [
        timeseries(ids.REPORT_LOSS, "Loss", "Last recorded loss per rank and phase. The loss alerts compare "
                   f"means over {c.loss_window} (not decreasing) and eval vs train (overfitting).",
                   [Prom(qs.proc.sel(sc.LOSS), "rank {{rank}} {{phase}}")], "none", w=8),
        timeseries(ids.REPORT_NONFINITE, "Non-finite values", "NaN or infinite losses and gradient norms recorded "
                   "per interval; any stops the job when the webhook acts on the alert.",
                   [Prom(f"sum by ({RANK}, {PHASE}, {SCALAR}) ({pq.increase(qs.proc, sc.NONFINITE)})",
                         "rank {{rank}} {{scalar}}", needs=nonfinite)], "short", bars=True, w=5),
        timeseries(ids.REPORT_GRAD_NORM, "Gradient norm", "Last recorded global gradient norm per rank "
                   f"(log scale in mind: the vanishing-gradient alert fires below "
                   f"{c.vanishing_gradient_threshold:g}).",
                   [Prom(qs.proc.sel(sc.GRAD_NORM), "rank {{rank}} {{phase}}", needs=frozenset({"grad_norm"}))],
                   "none", w=6),
        timeseries(1404, "Learning rate", "Last recorded learning rate per rank.",
                   [Prom(qs.proc.sel(sc.LEARNING_RATE), "rank {{rank}} {{phase}}")], "none", w=5),
    ])


OPERATOR = sc.prometheus_label(sc.LABEL_OPERATOR)
DEVICE_KIND = sc.prometheus_label(sc.LABEL_DEVICE_KIND)
CATEGORY = sc.prometheus_label(sc.LABEL_CATEGORY)
PRECISION = sc.prometheus_label(sc.LABEL_PRECISION)
WINDOW_NOTE = ("from the last operator-profiling window in the range (periodic every OTELPROF_PROFILE_EVERY, "
               "a capture, or profile_window), per profiled step, averaged over the selected ranks")


def _last_window(qs: pq.Queries, spec: sc.MetricSpec, labels: tuple[str, ...], matchers: str = "") -> str:
    return f"avg by ({pq.by(*labels)}) (last_over_time({qs.proc.sel(spec, '', matchers)}[{pq.RANGE}]))"


def _operators(qs: pq.Queries) -> Row:
    cpu, gpu = f'{DEVICE_KIND}="cpu"', f'{DEVICE_KIND}="gpu"'
    ops_self = _last_window(qs, sc.OPERATOR_SELF_TIME, (OPERATOR,), cpu)
    top_ops = f"topk(15, {ops_self})"
    kernels_self = _last_window(qs, sc.OPERATOR_SELF_TIME, (OPERATOR,), gpu)
    top_kernels = f"topk(15, {kernels_self})"
    categories = _last_window(qs, sc.OPERATOR_CATEGORY_TIME, (DEVICE_KIND, CATEGORY))
    return Row(1500, "Operators and kernels", [
        table(ids.REPORT_TOP_OPERATORS, "Top operators", "The 15 host operators with the most self time "
              f"{WINDOW_NOTE}; the rest of the window's operators are summed as other.",
              [("Self", Prom(top_ops), "s"),
               ("Total", Prom(f"{_last_window(qs, sc.OPERATOR_TOTAL_TIME, (OPERATOR,), cpu)} and on ({OPERATOR}) "
                              f"{top_ops}"), "s"),
               ("Calls", Prom(f"{_last_window(qs, sc.OPERATOR_CALLS, (OPERATOR,), cpu)} and on ({OPERATOR}) "
                              f"{top_ops}"), "short")],
              [(OPERATOR, "Operator")], sort_by="Self", w=12),
        table(ids.REPORT_TOP_KERNELS, "Top kernels", "The 15 GPU kernels, memcpys and memsets with the most device "
              f"time {WINDOW_NOTE}; the rest as other.",
              [("Time", Prom(top_kernels, needs=GPU_NEEDS), "s"),
               ("Launches", Prom(f"{_last_window(qs, sc.OPERATOR_CALLS, (OPERATOR,), gpu)} and on ({OPERATOR}) "
                                 f"{top_kernels}", needs=GPU_NEEDS), "short")],
              [(OPERATOR, "Kernel")], sort_by="Time", w=12),
        bargauge(ids.REPORT_OPERATOR_CATEGORIES, "Operator time by category", "Share of host operator self time "
                 "(cpu) and of kernel time (gpu) by category (matmul, convolution, attention, normalization, "
                 f"elementwise, memory copy, communication, other: by name pattern), {WINDOW_NOTE}.",
                 [Prom(f"{categories} / ignoring ({CATEGORY}) group_left() sum by ({DEVICE_KIND}) ({categories})",
                       "{{device}} · {{category}}", instant=True)], "percentunit", max=1, w=8),
        stat(1504, "Host share of operator time", "Host operator self time over host plus device operator time, "
             f"{WINDOW_NOTE}: 1 on a CPU-only run; near 1 on a GPU means the GPU waits for the host.",
             [Prom(f"avg (last_over_time({qs.proc.sel(sc.OPERATOR_HOST_RATIO)}[{pq.RANGE}]))", instant=True)],
             "percentunit", w=4),
        bargauge(1505, "Kernel precision mix", f"Share of GPU kernel time by arithmetic precision {WINDOW_NOTE}.",
                 [Prom(_last_window(qs, sc.KERNEL_PRECISION, (PRECISION,)), "{{precision}}", instant=True,
                       needs=GPU_NEEDS)], "percentunit", max=1, w=6),
        stat(1506, "Profiling windows' cost", "Time the profiling windows added to training (their steps beyond "
             "the usual pace, plus their processing) over the training loop in the range; the schedule keeps it "
             "within OTELPROF_PROFILE_BUDGET (1 %).",
             [Prom(f"sum({pq.total(qs.proc, sc.PROFILE_OVERHEAD, (JOB, RANK))}) / "
                   f"sum({pq.loop_in_range(qs.proc, (JOB, RANK))})", instant=True)], "percentunit", w=6),
    ])


def _device_and_flops(qs: pq.Queries) -> Row:
    regions = f'{ANNOTATION}=~"{sc.REGION_FORWARD}|{sc.REGION_BACKWARD}|{sc.REGION_OPTIMIZER}",{qs.train}'
    host = pq.mean(qs.proc, sc.ANNOTATION_DURATION, (ANNOTATION,), regions)
    device = pq.mean(qs.proc, sc.REGION_DEVICE_DURATION, (ANNOTATION,), qs.train)
    return Row(1600, "Device time and model FLOPs", [
        stat(ids.REPORT_MFU, "Model FLOPs utilization", "Achieved FLOP/s over the GPU's dense peak for the dtype "
             "in use (MFU), from the last profiling window in the range, averaged over the selected ranks. FLOPs "
             "per step are counted (torch.utils.flop_counter) in the step after each window; the peak comes from "
             "the GPU model (NVML) or OTELPROF_PEAK_FLOPS. GPU runs only.",
             [Prom(f"avg (last_over_time({qs.proc.sel(sc.MODEL_FLOPS_UTILIZATION)}[{pq.RANGE}]))", instant=True,
                   needs=GPU_NEEDS)], "percentunit", w=4, steps=((None, RED), (0.3, YELLOW), (0.45, GREEN))),
        stat(ids.REPORT_FLOPS_ACHIEVED, "Achieved FLOP/s", "FLOPs per step times steps per second, all selected "
             "ranks together, from the last profiling window in the range (CPU runs too).",
             [Prom(f"sum (last_over_time({qs.proc.sel(sc.MODEL_FLOPS_ACHIEVED)}[{pq.RANGE}]))", instant=True)],
             "flops", w=4),
        stat(1603, "FLOPs per step", "Model FLOPs of one training step (forward, backward, optimizer) of one rank.",
             [Prom(f"avg (last_over_time({qs.proc.sel(sc.MODEL_FLOPS)}[{pq.RANGE}]))", instant=True)], "short", w=4),
        table(ids.REPORT_DEVICE_TIME, "Device time vs host time", "Mean host time of the training step regions "
              "beside their mean device time from CUDA events, and the gap (host minus device): a large positive "
              "gap is launch overhead or host work the GPU waits for; a negative one, a GPU running behind the "
              f"host (which waits at the next sync). {RANGE_NOTE}.",
              [("Host", Prom(host), "s"), ("Device", Prom(device, needs=GPU_NEEDS), "s"),
               ("Gap", Prom(f"{host} - {device}", needs=GPU_NEEDS), "s")],
              [(ANNOTATION, "Region")], sort_by="Host", w=12),
        table(ids.REPORT_TOP_ALLOCATIONS, "Top allocating operators", "Bytes allocated per profiled step by the 15 "
              f"operators that allocated the most (their own allocations; profile_memory), {WINDOW_NOTE}.",
              [("Allocated", Prom(f"topk(15, {_last_window(qs, sc.OPERATOR_ALLOCATED, (DEVICE_KIND, OPERATOR))})"),
                "bytes")], [(DEVICE_KIND, "Device"), (OPERATOR, "Operator")], sort_by="Allocated", w=12),
        table(ids.REPORT_OVERLAP, "Communication/computation overlap", "Per rank, from the GPU kernels of the last "
              "profiling window in the range: the share of the time collective kernels (NCCL) ran during which "
              "compute kernels ran too on the same GPU, and the exposed communication per profiled step (collectives "
              "with nothing beside them: time the step waits). The rank that stands out is the straggler's "
              "partner or the straggler. GPU runs with collectives only.",
              [("Overlap", Prom(f"max by ({RANK}) (last_over_time({qs.proc.sel(sc.COMM_OVERLAP)}[{pq.RANGE}]))",
                                needs=GPU_NEEDS), "percentunit"),
               ("Exposed per step", Prom(f"max by ({RANK}) (last_over_time({qs.proc.sel(sc.COMM_EXPOSED)}"
                                         f"[{pq.RANGE}]))", needs=GPU_NEEDS), "s")],
              [(RANK, "Rank")], sort_by="Exposed per step", w=6),
        stat(ids.REPORT_WINDOW_MEMORY_PEAK, "Window memory peak", "The most memory tensors held at once during the "
             "last profiling window in the range, host (cpu) and GPU, the largest of the selected ranks.",
             [Prom(f"max by ({DEVICE_KIND}) (last_over_time({qs.proc.sel(sc.PROFILE_MEMORY_PEAK)}[{pq.RANGE}]))",
                   "{{device}}", instant=True)], "bytes", w=6),
    ])


def training_report(config: MixinConfig) -> Dashboard:
    qs = pq.Queries(config)
    c = config
    rows = [
        _diagnosis(qs), _job_summary(qs), _system_usage(qs), _framework(qs), _rules(), _steps(qs),
        _gpu_utilization(qs), _batch_size(qs),
        _bottleneck(qs, 900, "CPU bottleneck", f"some CPU was above {pq.percent(c.cpu_threshold)} busy",
                    sc.SAMPLER_CPU_BOTTLENECK, "cpu_bottleneck_ratio", c.cpu_bottleneck_threshold,
                    "share of each sample interval busy (not idle, not iowait)", "CPU busy per core",
                    pq.cpu_busy(qs.node)),
        _bottleneck(qs, 1000, "I/O bottleneck", f"some CPU was above {pq.percent(c.io_threshold)} in iowait",
                    sc.SAMPLER_IO_BOTTLENECK, "io_bottleneck_ratio", c.io_bottleneck_threshold,
                    "share of each sample interval waiting for I/O", "I/O wait per core", pq.iowait(qs.node)),
        _load_balancing(qs), _gpu_memory(qs), _data_loader(qs), _training_health(qs), _operators(qs),
        _device_and_flops(qs), layers_row(qs),
    ]
    return dashboard(qs, ids.TRAINING_REPORT, "otelprof / Training report",
                     "The profiling report of a training job, live from Prometheus: job summary, system usage, "
                     "framework summary, rules, step time, GPU utilization, batch size, CPU and I/O bottlenecks, "
                     "load balancing, GPU memory, data loader, training health, operators and kernels, device time and "
                     "model FLOPs.", rows,
                     time_from="now-3h")

