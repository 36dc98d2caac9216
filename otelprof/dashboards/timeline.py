"""The "Timeline" dashboard: what each rank was doing over time, and the traced steps behind it.

State timelines come from metrics (phase, stepping, input-bound, GPU busy, alerts); the traces come
from Tempo (the step spans otelprof exports over OTLP): a TraceQL search for the job's step spans,
one for its outlier steps, and a trace panel for the trace picked in either table. Step-time panels
link to the traces of the rank and time range they show.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards import queries as pq
from otelprof.dashboards.common import dashboard, dashboard_link
from otelprof.dashboards.model import Dashboard, Link, Panel, Prom, Row, TraceQL
from otelprof.dashboards.panels import GREEN, RED, YELLOW, state_timeline, timeseries, value_map
from otelprof.mixin.config import ALERT_PREFIX, MixinConfig
from otelprof.mixin.promql import PHASE, RANK

RANK_LEGEND = "rank {{rank}}"


def _resource(attribute: str) -> str:
    return f"resource.{attribute}"


def step_spans(*conditions: str) -> str:
    """TraceQL for the job's step spans on the selected ranks (plus ``conditions``).

    Ranks are matched on ``service.instance.id`` (``<run id>-rank<rank>``, a string) because the
    ``otelprof.rank`` attribute is an integer, which TraceQL's regex match does not apply to.
    """
    parts = [f'{_resource(sc.SERVICE_NAME)} = "${ids.VAR_JOB}"', f'name = "{sc.SPAN_STEP}"',
             f'{_resource(sc.SERVICE_INSTANCE_ID)} =~ ".*-rank(${{{ids.VAR_RANK}:regex}})$"', *conditions]
    return "{ " + " && ".join(parts) + " }"


def _trace_table(id: int, title: str, description: str, query: str) -> Panel:
    keep = "&".join([*(f"var-{v}=${{{v}}}" for v in (ids.VAR_DATASOURCE, ids.VAR_TEMPO, ids.VAR_JOB)),
                     *(f"${{{v}:queryparam}}" for v in (ids.VAR_NODE, ids.VAR_RANK, ids.VAR_GPU))])
    pick = Link("Show this trace below", f"/d/{ids.TIMELINE}/{ids.TIMELINE}?{keep}&${{__url_time_range}}"
                f"&var-{ids.VAR_TRACE_ID}=${{__value.raw}}")
    return Panel(id, "table", title, description, [TraceQL(query, limit=50)], "short", w=12, h=10,
                 options={"cellHeight": "sm", "footer": {"countRows": False, "fields": "", "reducer": ["sum"],
                                                         "show": False}, "showHeader": True},
                 defaults={"custom": {"align": "auto", "cellOptions": {"type": "auto"}}},
                 overrides=[{"matcher": {"id": "byName", "options": "traceID"},
                             "properties": [{"id": "links", "value": [pick.to_json()]}]},
                            {"matcher": {"id": "byName", "options": "traceDuration"},
                             "properties": [{"id": "unit", "value": "ms"}]}])


def _states(qs: pq.Queries) -> Row:
    c = qs.config
    ratio = pq.rate_mean(qs.proc, sc.DATALOADER_WAIT_RATIO, (RANK,), qs.train)

    def alerts(state: str) -> str:
        return f'ALERTS{{alertname=~"{ALERT_PREFIX}.*", {pq.JOB_M}, alertstate="{state}"}}'

    return Row(100, "What each rank was doing", [
        state_timeline(101, "Phase per rank", "The phase each rank is in (otelprof.phase(...); train by default): "
                       "a row per rank and phase, coloured while the phase is active.",
                       [Prom(f"max by ({RANK}, {PHASE}) ({qs.proc.sel(sc.PHASE_ACTIVE)}) > 0",
                             "rank {{rank}} {{phase}}")],
                       "none", steps=((None, "blue"),), mappings=[value_map({"1": ("active", "blue")})], h=7),
        state_timeline(102, "Stepping per rank", "Steps finished per second by each rank: red while a rank finished "
                       "no step in the interval (initialization, a long evaluation outside steps, a hang).",
                       [Prom(f"sum by ({RANK}) ({pq.rate(qs.proc, sc.STEPS)})", RANK_LEGEND)], "short",
                       steps=((None, RED), (0.0001, GREEN)), h=5),
        state_timeline(103, "Input-bound per rank", "Mean share of each training step spent waiting for data: "
                       f"red above the input-bound threshold ({pq.percent(c.input_bound_threshold)}).",
                       [Prom(ratio, RANK_LEGEND)], "percentunit",
                       steps=((None, GREEN), (c.input_bound_threshold / 2, YELLOW), (c.input_bound_threshold, RED)),
                       h=5),
        state_timeline(104, "GPU busy", "Each GPU's utilization: red when idle, green when busy.",
                       [Prom(qs.gpu.sel(sc.GPU_UTILIZATION), "{{node}} GPU {{gpu}}", needs=frozenset({"gpu"}))],
                       "percentunit", steps=((None, RED), (c.gpu_threshold, YELLOW), (c.low_gpu_threshold_p95, GREEN)),
                       h=5),
        state_timeline(105, "Alerts", "otelprof alerts of the job, pending or firing, per alert and rank.",
                       [Prom(f"max by (alertname, {RANK}) ({alerts('firing')} * 2 or {alerts('pending')})",
                             "{{alertname}} {{rank}}",
                             needs=frozenset({"alerts"}))], "none", steps=((None, "transparent"),),
                       mappings=[value_map({"1": ("pending", YELLOW), "2": ("firing", RED)})], h=5),
    ])


def _step_time(qs: pq.Queries) -> Row:
    c = qs.config
    traces = Link("Traces of rank ${__field.labels.rank} in this range",
                  f"/d/{ids.TIMELINE}/{ids.TIMELINE}?var-{ids.VAR_DATASOURCE}=${{{ids.VAR_DATASOURCE}}}"
                  f"&var-{ids.VAR_TEMPO}=${{{ids.VAR_TEMPO}}}&var-{ids.VAR_JOB}=${{{ids.VAR_JOB}}}"
                  f"&var-{ids.VAR_RANK}=${{__field.labels.rank}}&${{__url_time_range}}")
    ranks = dashboard_link("Compare the ranks", ids.RANKS)
    return Row(200, "Step time", [
        timeseries(ids.TIMELINE_STEP_TIME, "Training step time per rank", "Mean of each interval's training "
                   f"steps and 95th percentile of each {c.dashboard_rate_window}'s (recording rule) per rank. "
                   "Click a line to list that rank's traced steps below.",
                   [Prom(pq.rate_mean(qs.proc, sc.STEP_DURATION, (RANK,), qs.train), "rank {{rank}} mean"),
                    Prom(qs.rule("step_p95_rate", qs.proc, qs.train), "rank {{rank}} p95")],
                   "s", min=0, links=[traces, ranks], w=16),
        timeseries(202, "Outlier steps", "Outlier steps per interval and rank (each one was traced: see the outlier "
                   "table below).",
                   [Prom(f"sum by ({RANK}) ({pq.increase(qs.proc, sc.STEP_OUTLIERS, matchers=qs.train)})",
                         RANK_LEGEND)], "short", bars=True, min=0, links=[traces], w=8),
    ])


def _traces() -> Row:
    outlier = f"span.{sc.ATTR_STEP_OUTLIER} = true"
    return Row(300, "Traces", [
        _trace_table(301, "Traced steps", "Step spans of the job on the selected ranks in the time range (Tempo "
                     "TraceQL search). otelprof traces the first steps, every outlier, profiling windows and as "
                     "many others as fit its budget. Click a trace id to show it below.", step_spans()),
        _trace_table(ids.TIMELINE_OUTLIER_TRACES, "Outlier steps", "Traced steps flagged as outliers (slower than "
                     "mean + OTELPROF_OUTLIER_SIGMA x stddev of the recent steps of their phase): the regions that "
                     "grew show in the trace.", step_spans(outlier)),
        Panel(303, "traces", "Trace", "The trace picked in a table above (or pasted in the Trace ID box): the step "
              "span and its annotated regions (data loading, forward, backward, optimizer, collectives). Spans "
              "link back to this rank's metrics (traces-to-metrics on the Tempo data source).",
              [TraceQL(f"${ids.VAR_TRACE_ID}", limit=1)], "none", w=24, h=14),
    ])


def timeline(config: MixinConfig) -> Dashboard:
    qs = pq.Queries(config)
    return dashboard(qs, ids.TIMELINE, "otelprof / Timeline",
                     "What each rank of a training job was doing over time — phase, stepping, input-bound, GPU "
                     "busy, alerts — and the traced steps behind it (Tempo).",
                     [_states(qs), _step_time(qs), _traces()], tempo=True, refresh="30s", time_from="now-30m")

