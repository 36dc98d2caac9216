"""The "Ranks" dashboard: the ranks of a distributed job side by side — stragglers, input, progress, telemetry."""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards import queries as pq
from otelprof.dashboards.common import dashboard, dashboard_link
from otelprof.dashboards.model import Dashboard, Prom, Row
from otelprof.dashboards.panels import (
    GREEN,
    RED,
    bargauge,
    state_timeline,
    table,
    timeseries,
    value_map,
)
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.promql import JOB, NODE, PHASE, RANK, by
from otelprof.mixin.recording_rules import PER_JOB

EXPORTER = sc.prometheus_label(sc.LABEL_EXPORTER)
REASON = sc.prometheus_label(sc.LABEL_REASON)
RANK_LEGEND = "rank {{rank}}"
EXTREMES = 5
"""Per-rank time series draw this many highest and lowest ranks at each step: 10 lines at 1,024 ranks."""
SHOWN = f" Shows the {EXTREMES} highest and {EXTREMES} lowest ranks at each moment."


def _extremes(expr: str) -> str:
    """``expr``'s ``EXTREMES`` highest and lowest series at each evaluation (all of them in a small job)."""
    return f"topk({EXTREMES}, {expr}) or bottomk({EXTREMES}, {expr})"


def _step_time(qs: pq.Queries) -> Row:
    c = qs.config
    compute = qs.rule("step_compute_mean", qs.proc, qs.train)
    median = qs.rule("job_step_compute_median", qs.job, qs.train)
    labels = (NODE, RANK)
    timeline = dashboard_link("Traces of rank ${__field.labels.rank} (timeline)", ids.TIMELINE,
                              rank_from_field=True)
    return Row(100, "Step time across ranks", [
        timeseries(101, "Mean training step time per rank", f"Exact mean of each rank's training steps over the "
                   f"last {c.straggler_window} (recording rule). Click a line for the rank's traces." + SHOWN,
                   [Prom(_extremes(qs.rule("step_mean", qs.proc, qs.train)), RANK_LEGEND)], "s", min=0,
                   links=[timeline]),
        timeseries(ids.RANKS_STRAGGLER, "Compute time per step vs the job's median", "Per rank: mean step time "
                   "less exposed collective (all-reduce) time over the last "
                   f"{c.straggler_window}, divided by the median over the job's ranks (recording rules). "
                   f"Above {c.straggler_ratio:g} the straggler alert fires: that rank holds the others up at every "
                   "all-reduce." + SHOWN,
                   [Prom(_extremes(f"{compute} / on ({by(*PER_JOB)}) group_left() {median}"), RANK_LEGEND)],
                   "none", line_at=c.straggler_ratio,
                   links=[timeline]),
        timeseries(103, "Collective time per step", "Per rank: mean time at least one of its gradient all-reduces "
                   "was in flight per training step (DDP communication hook; buckets in flight at once count once), "
                   "and the exposed part: all-reduce time its backward pass did not overlap. Fast ranks wait here "
                   "for the straggler." + SHOWN,
                   [Prom(_extremes(pq.rate_mean(qs.proc, sc.COLLECTIVE_DURATION, (RANK,), qs.train)), RANK_LEGEND,
                         needs=frozenset({"ddp"})),
                    Prom(_extremes(pq.rate_mean(qs.proc, sc.COLLECTIVE_EXPOSED, (RANK,), qs.train)),
                         RANK_LEGEND + " exposed", needs=frozenset({"ddp"}))], "s", min=0, w=8),
        bargauge(104, "Mean training step time per rank", "Exact mean over the dashboard's time range.",
                 [Prom(pq.mean(qs.proc, sc.STEP_DURATION, (RANK,), qs.train), RANK_LEGEND, instant=True)], "s", w=8),
        timeseries(105, "Training step time p95 per rank", "95th percentile of each rank's training steps over "
                   f"each {c.dashboard_rate_window} (recording rule)."
                   + SHOWN, [Prom(_extremes(qs.rule("step_p95_rate", qs.proc, qs.train)), RANK_LEGEND)], "s",
                   min=0, w=8, links=[timeline]),
        table(106, "Ranks over the range", "Per rank over the dashboard's time range: training steps, mean and "
              "95th-percentile step time, outlier steps, mean data wait share and samples per second.",
              [("Steps", Prom(pq.total(qs.proc, sc.STEPS, labels, matchers=qs.train)), "short"),
               ("Mean", Prom(pq.mean(qs.proc, sc.STEP_DURATION, labels, qs.train)), "s"),
               ("p95", Prom(pq.quantile(0.95, qs.proc, sc.STEP_DURATION, labels, qs.train)), "s"),
               ("Outliers", Prom(pq.total(qs.proc, sc.STEP_OUTLIERS, labels, matchers=qs.train)), "short"),
               ("Data wait", Prom(pq.mean(qs.proc, sc.DATALOADER_WAIT_RATIO, labels, qs.train)), "percentunit"),
               ("Samples/s", Prom(f"{pq.total(qs.proc, sc.SAMPLES, labels, matchers=qs.train)} / {pq.RANGE_S}"),
                "short")],
              [(NODE, "Node"), (RANK, "Rank")]),
    ])


def _input(qs: pq.Queries) -> Row:
    c = qs.config
    return Row(200, "Input pipeline", [
        timeseries(ids.RANKS_WAIT_RATIO, "Data wait share per rank", "Mean share of each training step spent "
                   f"waiting for the next batch over the last {c.input_bound_window} (recording rule); above "
                   f"{pq.percent(c.input_bound_threshold)} the input-bound alert fires." + SHOWN,
                   [Prom(_extremes(qs.rule("dataloader_wait_ratio", qs.proc, qs.train)), RANK_LEGEND)], "percentunit",
                   min=0,
                   max=1, line_at=c.input_bound_threshold),
        timeseries(202, "Data wait per step p95", "95th percentile of the time each training step waited for its "
                   f"batch, per rank over each {c.dashboard_rate_window} (recording rule)." + SHOWN,
                   [Prom(_extremes(qs.rule("dataloader_wait_p95_rate", qs.proc, qs.train)), RANK_LEGEND)], "s",
                   min=0),
    ])


def _progress(qs: pq.Queries) -> Row:
    c = qs.config
    stalled = int(seconds(c.stalled_training_threshold))
    return Row(300, "Progress", [
        timeseries(ids.RANKS_LAST_STEP, "Time since the last step", "Per rank: seconds since its last step of any "
                   f"phase ended; the stalled-training alert fires above {c.stalled_training_threshold}. A rank "
                   "stuck in a collective shows here while its process still answers scrapes." + SHOWN,
                   [Prom(_extremes(f"time() - max by ({JOB}, {NODE}, {RANK}) ({qs.proc.sel(sc.STEP_LAST_TIMESTAMP)})"),
                         RANK_LEGEND)], "s", min=0, line_at=stalled, w=8),
        timeseries(302, "Steps per second", "Steps finished per second by each rank and phase.",
                   [Prom(f"sum by ({RANK}, {PHASE}) ({pq.rate(qs.proc, sc.STEPS)})", "rank {{rank}} {{phase}}")],
                   "short", min=0, w=8),
        timeseries(303, "Step number", "Number of each rank's last finished step, per phase: ranks of one job "
                   "move in lockstep.",
                   [Prom(f"max by ({RANK}, {PHASE}) ({qs.proc.sel(sc.STEP_NUMBER)})", "rank {{rank}} {{phase}}")],
                   "short", w=8),
    ])


def _telemetry(qs: pq.Queries) -> Row:
    c = qs.config
    job_label, instance_label = c.target_labels
    present = f"group by ({job_label}, {instance_label}, {JOB}, {NODE}, {RANK}) " \
              f"(last_over_time({qs.proc.sel(sc.PROCESS_START_TIME)}[{c.absent_lookback}]))"
    return Row(400, "Telemetry", [
        timeseries(ids.RANKS_REPORTING, "Reporting ranks", "Ranks whose series Prometheus has now, per node. A "
                   "drop while the job goes on is a rank that died (the telemetry-absent alert).",
                   [Prom(f"count by ({NODE}) ({qs.proc.sel(sc.PROCESS_START_TIME)})", "{{node}}")], "short", min=0,
                   w=8),
        state_timeline(ids.RANKS_TARGETS, "Scrape targets", "Each training process's /metrics target: up or "
                       "down (the target-down alert). Absence of data is never health: a target that vanished "
                       f"shows as down for {c.absent_lookback}.",
                       [Prom(f"max by ({instance_label}, {RANK}) (up * on ({job_label}, {instance_label}) "
                             f"group_left ({JOB}, {NODE}, {RANK}) {present})", "rank {{rank}} {{instance}}")],
                       "none", steps=((None, RED), (1, GREEN)),
                       mappings=[value_map({"0": ("down", RED), "1": ("up", GREEN)})], w=16, h=8),
        timeseries(ids.RANKS_DROPPED, "Dropped telemetry", "Records, spans or exports otelprof dropped per interval "
                   "instead of blocking training, by exporter (queue, otlp_traces, otlp_metrics, recording).",
                   [Prom(f"sum by ({RANK}, {EXPORTER}) ({pq.increase(qs.proc, sc.EXPORTER_DROPPED)})",
                         "rank {{rank}} {{exporter}}")], "short", min=0, bars=True, w=8),
        timeseries(404, "Spans built", "Spans built per second by the reason the step was traced (first steps, "
                   "budget, outliers, profiling windows).",
                   [Prom(f"sum by ({RANK}, {REASON}) ({pq.rate(qs.proc, sc.SPANS_BUILT)})",
                         "rank {{rank}} {{reason}}")],
                   "short", min=0, w=8),
        timeseries(405, "Recording written", "Bytes per second written to the local run recording per rank.",
                   [Prom(f"sum by ({RANK}) ({pq.rate(qs.proc, sc.RECORDING_BYTES)})", RANK_LEGEND)], "Bps", min=0,
                   w=8),
    ])


def ranks(config: MixinConfig) -> Dashboard:
    qs = pq.Queries(config)
    return dashboard(qs, ids.RANKS, "otelprof / Ranks",
                     "The ranks of a distributed training job side by side: step and compute time against the "
                     "job's median (stragglers), input waits, progress, and whether every rank still reports.",
                     [_step_time(qs), _input(qs), _progress(qs), _telemetry(qs)], refresh="30s")
