"""The report's main sections from a live system: PromQL over the catalog's series, through
Prometheus's HTTP API, for one job and a time range.

What Prometheus keeps is coarser than a recording: distributions come from the per-sample and
per-step histograms (quantiles at bucket resolution, interpolated like ``histogram_quantile``),
gauges are known at scrape resolution, and there are no individual steps, regions or operator
windows. The result is the same :class:`~otelprof.analysis.report.Report` with origin
``prometheus``: minima and maxima are the histogram buckets that hold them (:class:`Bucket`), each system
row says whether it comes from a per-sample histogram, a gauge as scraped or an expression evaluated over the
range (``UsageRow.source``), the job's otelprof version and run ids come from ``target_info``,
outliers and operator-profiling windows are counted by their counters, and what only spans or a
recording hold (outlier step numbers, operator tables, nesting depths) stays empty for the report to
point there.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from otelprof import semconv as sc
from otelprof.analysis import prometheus_progress
from otelprof.analysis.batch import batch_size
from otelprof.analysis.bottlenecks import Bottleneck, NodeBottleneck
from otelprof.analysis.dataloader import DataLoaderAnalysis, LoaderPhase, loader_config
from otelprof.analysis.framework import BETWEEN_STEPS, FrameworkSummary, Region
from otelprof.analysis.gpu import GpuAnalysis, GpuUsage, MemoryFlags
from otelprof.analysis.loadbalance import GpuDistance, GpuLoad, LoadBalance, RankLoad, js_distance
from otelprof.analysis.report import FORMAT_VERSION, ORIGIN_PROMETHEUS, Report
from otelprof.analysis.rule_row import RuleRow
from otelprof.analysis.rules import RulesSummary
from otelprof.analysis.stats import BoxPlot, Bucket, Distribution, Histogram, Series, share
from otelprof.analysis.step_checks import peers_median
from otelprof.analysis.steps import PhaseSteps, StepAnalysis
from otelprof.analysis.summary import JobSummary, RankSummary
from otelprof.analysis.system import (
    SOURCE_EVALUATED,
    SOURCE_HISTOGRAM,
    SOURCE_SCRAPES,
    UNIT_BYTES,
    UNIT_RATE,
    UNIT_RATIO,
    NodeUsage,
    SystemUsage,
    UsageRow,
    gpu_order,
    verdict,
)
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.promql import GPU, NODE, PHASE, RANK, series_name

NAN = math.nan
MODE = sc.prometheus_label(sc.LABEL_CPU_MODE)
LOOKBACK = "30d"
"""How far back to look for a finished job's series when no range is given."""


class PrometheusError(Exception):
    """Prometheus cannot be reached, refused a query, or has no series of the job."""


class Client:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        url = url.rstrip("/")
        if not url.startswith(("http://", "https://")):
            url = "http://" + url
        self.url = url
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> Any:
        target = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(target, timeout=self.timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:300]
            raise PrometheusError(f"{self.url} answered {error.code} to {params.get('query', path)!r}: {detail}") \
                from error
        except (urllib.error.URLError, OSError, ValueError) as error:
            raise PrometheusError(f"cannot reach Prometheus at {self.url}: {error}") from error
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus refused {params.get('query', path)!r}: {body.get('error')}")
        return body.get("data")

    def query(self, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        data = self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        if data.get("resultType") == "scalar":
            return [({}, float(data["result"][1]))]
        return [(dict(r["metric"]), float(r["value"][1])) for r in data.get("result", [])]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[tuple[dict[str, str],
                                                                                          list[tuple[float, float]]]]:
        data = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{max(step, 1.0):.0f}"})
        return [(dict(r["metric"]), [(float(t), float(v)) for t, v in r["values"]]) for r in data.get("result", [])]

    def query_raw(self, promql: str, at: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """A range selector at ``at``: the raw samples (scrape time, value) of each series."""
        data = self._get("/api/v1/query", {"query": promql, "time": f"{at:.3f}"})
        return [(dict(r["metric"]), [(float(t), float(v)) for t, v in r.get("values", [])])
                for r in data.get("result", [])]

    def rules(self) -> list[dict[str, Any]]:
        data = self._get("/api/v1/rules", {"type": "alert"})
        return list(data.get("groups", []))


def parse_time(text: str | None) -> float | None:
    """Unix seconds, ``now``, ``now-2h`` / ``now-30m``, or an ISO 8601 time (UTC when no zone is given)."""
    if text is None or text == "":
        return None
    text = text.strip()
    if text.startswith("now"):
        rest = text[3:]
        if not rest:
            return time.time()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        if rest[0] == "-" and rest[-1] in units:
            return time.time() - float(rest[1:-1]) * units[rest[-1]]
        raise ValueError(f"cannot read the time {text!r}")
    try:
        return float(text)
    except ValueError:
        pass
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()


class _Queries:
    def __init__(self, client: Client, job: str, start: float, end: float) -> None:
        self.client = client
        self.job = job
        self.start = start
        self.end = end
        self.window = f"{max(math.ceil(end - start), 1)}s"
        self.sel = f'{sc.prometheus_label(sc.LABEL_JOB)}="{_escape(job)}"'

    def s(self, spec: sc.MetricSpec, part: str = "", extra: str = "") -> str:
        return f"{series_name(spec, part)}{{{self.sel}{', ' + extra if extra else ''}}}"

    def delta(self, spec: sc.MetricSpec, part: str = "", extra: str = "") -> str:
        """The growth of a counter (or histogram part) over the range. Its last sample in the range, not its value
        at the end: a job that has ended has stale series there."""
        x = self.s(spec, part, extra)
        last = f"last_over_time({x}[{self.window}])"
        return f"({last} - ({x} offset {self.window} or {last} * 0))"

    def q(self, promql: str) -> list[tuple[dict[str, str], float]]:
        return self.client.query(promql, self.end)

    def by(self, promql: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {tuple(m.get(label, "") for label in labels): v for m, v in self.q(promql)}

    def histogram(self, spec: sc.MetricSpec, *labels: str, extra: str = "") -> dict[tuple[str, ...],
                                                                                   list[tuple[float, float]]]:
        """Per label set: (upper bound, cumulative count) of the histogram's growth over the range."""
        out: dict[tuple[str, ...], list[tuple[float, float]]] = {}
        for m, v in self.q(f"sum by ({', '.join((*labels, 'le'))}) ({self.delta(spec, 'bucket', extra)})"):
            out.setdefault(tuple(m.get(label, "") for label in labels), []).append((float(m["le"]), v))
        return {k: sorted(v) for k, v in out.items()}


def _ended(qs: _Queries) -> float:
    """The range's end, or, for a job whose series end before it (the job ended), about when they end (to a
    subquery step): the job's duration and finalization are its own, not the range's."""
    if qs.q(f"count({qs.s(sc.PROCESS_START_TIME)})"):
        return qs.end
    step = max(math.ceil((qs.end - qs.start) / 1000), 1)
    rows = qs.q(f"max(max_over_time(timestamp({qs.s(sc.PROCESS_START_TIME)})[{qs.window}:{step}s]))")
    seen = rows[0][1] + step if rows and math.isfinite(rows[0][1]) else qs.end
    return seen if qs.start < seen < qs.end else qs.end


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """``histogram_quantile`` on (upper bound, cumulative count) pairs; NaN when empty. Quantile 0 is the
    lower edge of the first bucket holding an observation, quantile 1 the upper edge of the last one."""
    from otelprof.analysis.histogram import bucket_quantile as prom_quantile

    finite_bounds = [b for b, _ in buckets if math.isfinite(b)]
    counts = [c for b, c in buckets if math.isfinite(b)] + [buckets[-1][1] if buckets else 0.0]
    if not buckets or not counts[-1]:
        return NAN
    if q <= 0:
        first = next(i for i, c in enumerate(counts) if c > 0)
        return finite_bounds[first - 1] if 0 < first <= len(finite_bounds) else 0.0
    if q >= 1:
        last = next(i for i, c in enumerate(counts) if c >= counts[-1])
        return finite_bounds[min(last, len(finite_bounds) - 1)] if finite_bounds else NAN
    try:
        return prom_quantile(q, finite_bounds, counts)
    except ZeroDivisionError:
        return NAN


def extreme_buckets(buckets: list[tuple[float, float]]) -> tuple[Bucket | None, Bucket | None]:
    """The buckets holding the smallest and the largest observation, from (upper bound, cumulative count)
    pairs sorted by bound (``+Inf`` last); None when there is no observation. The first bucket's lower
    edge is 0 (otelprof's histograms hold durations and ratios)."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None, None
    lows = [0.0] + [b for b, _ in buckets[:-1]]
    first = next(i for i, (_, c) in enumerate(buckets) if c > 0)
    last = next(i for i, (_, c) in enumerate(buckets) if c >= total)
    return Bucket(lows[first], buckets[first][0]), Bucket(lows[last], buckets[last][0])


def _box(buckets: list[tuple[float, float]], total: float, count: float) -> BoxPlot:
    """A box plot at bucket resolution: exact mean (sum over count), interpolated quantiles, min and max as
    the buckets holding them (NaN ``min``/``max``), whiskers clipped to those buckets' outer edges."""
    if not buckets or not count:
        return BoxPlot.of(())
    q = [bucket_quantile(p, buckets) for p in (0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0)]
    iqr = q[4] - q[2]
    low, high = extreme_buckets(buckets)
    return BoxPlot(int(count), NAN, q[1], q[2], q[3], q[4], q[5], NAN, total / count,
                   max(q[0], q[2] - 1.5 * iqr), min(q[6], q[4] + 1.5 * iqr), low, high)


def _per_bucket(buckets: list[tuple[float, float]]) -> Histogram:
    finite_buckets = [(b, c) for b, c in buckets if math.isfinite(b)]
    if not finite_buckets:
        return Histogram((), ())
    edges = [0.0] + [b for b, _ in finite_buckets]
    counts, previous = [], 0.0
    for _, c in finite_buckets:
        counts.append(round(max(c - previous, 0.0)))
        previous = c
    return Histogram(tuple(edges), tuple(counts))


def _series(points: list[tuple[float, float]], origin: float) -> Series:
    if not points:
        return Series((), (), ())
    return Series(tuple(t - origin for t, _ in points), tuple(v for _, v in points), tuple(v for _, v in points))


def report_from_prometheus(url: str, job: str, start: float | None = None, end: float | None = None,
                           config: MixinConfig | None = None, progress: Callable[[str], None] | None = None,
                           timeout: float = 30.0) -> Report:
    """Query Prometheus at ``url`` for job ``job`` between ``start`` and ``end`` (Unix seconds; by default
    from the job's first process start to its last recorded step or now)."""
    config = config or MixinConfig()
    client = Client(url, timeout)
    say = progress or (lambda message: None)
    now = time.time()
    probe = _Queries(client, job, now, now)
    say(f"querying {client.url} for job {job}")
    starts = probe.by(f"last_over_time({probe.s(sc.PROCESS_START_TIME)}[{LOOKBACK}])", RANK, NODE)
    if not starts:
        raise PrometheusError(f"Prometheus at {client.url} has no otelprof series of job {job!r} in the last "
                              f"{LOOKBACK} (label {sc.prometheus_label(sc.LABEL_JOB)}); check the job name and "
                              "that Prometheus scrapes the training processes")
    lasts = probe.by(f"max by ({RANK}) (last_over_time({probe.s(sc.STEP_LAST_TIMESTAMP)}[{LOOKBACK}]))", RANK)
    if start is None:
        start = min(starts.values())
    if end is None:
        end = min(now, max(lasts.values()) + 60.0) if lasts else now
    if end <= start:
        raise PrometheusError(f"the range ends ({end:.0f}) before it starts ({start:.0f})")
    asked = _Queries(client, job, start, end)
    end = _ended(asked)
    qs = _Queries(client, job, start, end)
    firsts = qs.by(f"last_over_time({qs.s(sc.STEP_FIRST_TIMESTAMP)}[{qs.window}])", RANK)
    ranks_last = qs.by(f"max by ({RANK}) (last_over_time({qs.s(sc.STEP_LAST_TIMESTAMP)}[{qs.window}]))", RANK)
    steps_by = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEPS)})", RANK, PHASE)
    rank_nodes = {rank: node for (rank, node) in starts}
    rank_start = {rank: v for (rank, _), v in starts.items()}
    nodes = sorted(set(rank_nodes.values()))
    ranks = []
    rank_names = sorted(rank_start, key=lambda r: int(r) if r.isdigit() else 1 << 30)
    statuses = _rank_status(asked, rank_names, now)  # running or stopped by the range asked for
    for rank in rank_names:
        status, basis = statuses[rank]
        ranks.append(RankSummary(int(rank) if rank.isdigit() else -1, 0, rank_nodes[rank], status,
                                 rank_start[rank], firsts.get((rank,)), ranks_last.get((rank,)), None,
                                 int(sum(v for (r, _), v in steps_by.items() if r == rank)), 0, (), basis))
    per_phase: dict[str, int] = {}
    for (_, phase), v in steps_by.items():
        per_phase[phase] = per_phase.get(phase, 0) + round(v)
    job_start = max(start, min(rank_start.values()))
    training_start = min(firsts.values()) if firsts else None
    training_end = max(ranks_last.values()) if ranks_last else None
    duration = end - job_start
    training = training_end - training_start if training_start and training_end else None
    init = training_start - job_start if training_start else None
    final = end - training_end if training_end else None
    run_ids, versions, world_size = _resource(qs)
    summary = JobSummary(", ".join(run_ids), job, ", ".join(versions), "", max(world_size or 0, len(ranks)),
                         tuple(ranks), tuple(nodes), job_start, end, duration,
                         training_start, training_end, training, init, final, max(share(init or 0, duration), 0),
                         max(share(training or 0, duration), 0), max(share(final or 0, duration), 0),
                         tuple(sorted(per_phase.items())), (), 0,
                         () if per_phase else ("no steps in the range",))
    say("system usage")
    system = dataclasses.replace(_system(qs, nodes, job_start), process_rows=_process_rows(qs, rank_names))
    say("environment")
    environment = prometheus_progress.environment(qs, system)
    say("steps and regions")
    steps = _steps(qs, rank_nodes)
    framework = _framework(qs, summary)
    say("training curves")
    curves = prometheus_progress.progress(qs, summary.steps_per_phase, steps, job_start)
    say("GPUs")
    gpus = _gpus(qs, config, job_start)
    say("alerts")
    rules = _rules(qs, config)
    cpu, io = _bottlenecks(qs, config)
    load = _load(qs, config, gpus)
    loader = _loader(qs, config)
    utc = datetime.timezone.utc
    first, last = datetime.datetime.fromtimestamp(start, utc), datetime.datetime.fromtimestamp(end, utc)
    notes = (f"From Prometheus {client.url}, job {job}, {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC. "
             "Distributions "
             "come from histograms (bucket resolution): quantiles are interpolated within buckets, and minima "
             "and maxima are shown as the bucket that holds them. Gauges are known at their scrapes only: their "
             "figures are exact over the scraped values, which miss the samples in between. Outlier steps and "
             "operator-profiling windows are counted, not listed; the steps, regions and operator tables "
             "themselves are in the traces "
             "(Tempo) and the recording (otelprof report RUN_DIR).",)
    return Report(FORMAT_VERSION, f"{client.url} job={job}", time.time(), summary, system, framework, rules, steps,
                  gpus, batch_size(system, gpus, steps, config), cpu, io, load, loader, notes, ORIGIN_PROMETHEUS,
                  environment, curves)


def _resource(qs: _Queries) -> tuple[list[str], list[str], int | None]:
    """The run ids, otelprof versions and world size of the job's processes, from their OpenTelemetry resource:
    ``target_info`` (the /metrics endpoint's, labelled service_name; a collector's, job), or resource attributes
    a collector copied onto the series. Empty when Prometheus has neither."""
    run_id, version, world = (sc.prometheus_label(a) for a in (sc.OTELPROF_RUN_ID, sc.OTELPROF_VERSION,
                                                                sc.OTELPROF_WORLD_SIZE))
    name = _escape(qs.job)
    found = []
    for selector in (f'target_info{{{sc.prometheus_label(sc.SERVICE_NAME)}="{name}"}}', f'target_info{{job="{name}"}}',
                     qs.s(sc.PROCESS_START_TIME)):
        found += [m for m, _ in qs.q(f"last_over_time({selector}[{qs.window}])") if m.get(version) or m.get(run_id)]
    sizes = [int(m[world]) for m in found if m.get(world, "").isdigit()]
    return (sorted({m[run_id] for m in found if m.get(run_id)}), sorted({m[version] for m in found if m.get(version)}),
            max(sizes) if sizes else None)


QUANTILES = (1.0, 0.99, 0.95, 0.5, 0.0)
RATE_WINDOW = 60
"""Seconds: network and disk rows are rates over this window."""


def _histogram_row(node: str, metric: str, unit: str, buckets: list[tuple[float, float]] | None,
                   count: float) -> UsageRow | None:
    """Every sample, at bucket resolution: interpolated quantiles, max and min as the buckets holding them."""
    if not buckets or not count:
        return None
    p99, p95, p50 = (bucket_quantile(q, buckets) for q in (0.99, 0.95, 0.5))
    low, high = extreme_buckets(buckets)
    return UsageRow(node, metric, unit, NAN, p99, p95, p50, NAN, int(count), SOURCE_HISTOGRAM, None, high, low)


def _within(value: float, low: float, top: float) -> float:
    """A quantile within the minimum and maximum of the same values: Prometheus interpolates between two
    samples and can pass the larger by a rounding (a p99 one ulp above the max)."""
    if math.isnan(value) or math.isnan(low) or math.isnan(top):
        return value
    return min(max(value, low), top)


def _gauge_rows(qs: _Queries, metric: str, unit: str, expr: str, scraped: str, step: int | None = None,
                by: str = NODE) -> dict[str, UsageRow]:
    """Per node (or per value of label ``by``): quantiles of ``expr``. With ``step`` None ``expr`` is a gauge
    selector and the quantiles are over its scraped values (SOURCE_SCRAPES: max and min exact at the scrapes,
    quantile 1 and 0 of them); else ``expr`` is evaluated every ``step`` seconds (SOURCE_EVALUATED).
    Datapoints are the scrapes of ``scraped``, the underlying series."""
    if step is None:
        values = {q: qs.by(f"max by ({by}) (quantile_over_time({q}, {expr}[{qs.window}]))", by)
                  for q in QUANTILES}
    else:
        values = {q: qs.by(f"quantile_over_time({q}, ({expr})[{qs.window}:{step}s])", by) for q in QUANTILES}
    scrapes = qs.by(f"max by ({by}) (count_over_time({scraped}[{qs.window}]))", by)
    rows = {}
    for (key,), p50 in values[0.5].items():
        top, p99, p95, _, low = (values[q].get((key,), NAN) for q in QUANTILES)
        p99, p95, p50 = (_within(v, low, top) for v in (p99, p95, p50))
        rows[key] = UsageRow(key, metric, unit, top, p99, p95, p50, low, int(scrapes.get((key,), 0)),
                             SOURCE_SCRAPES if step is None else SOURCE_EVALUATED,
                             None if step is None else float(step))
    return rows


def _process_rows(qs: _Queries, ranks: list[str]) -> tuple[UsageRow, ...]:
    """Per rank, the gauges the sampler exports on every rank (process CPU share, resident memory) as
    scraped over the range: max and min exact at the scrapes, quantiles over the scraped values; samples
    between scrapes are not seen. Subjects ``rank N`` as in a recording's report."""
    out = []
    for metric, unit, spec in (("Process CPU", UNIT_RATIO, sc.PROCESS_CPU_UTILIZATION),
                               ("Process memory (RSS)", UNIT_BYTES, sc.PROCESS_MEMORY_USAGE)):
        rows = _gauge_rows(qs, metric, unit, qs.s(spec), qs.s(spec), by=RANK)
        out += [dataclasses.replace(rows[rank], subject=f"rank {rank}") for rank in ranks if rank in rows]
    return tuple(out)


STATUS_TAIL = 900.0
"""Seconds before the range end in which the raw scrapes of each process are read for its status."""
STATUS_INTERVALS = 3
"""A process is running when its series were last scraped at most this many scrape intervals before the end."""


def _rank_status(qs: _Queries, ranks: list[str], now: float) -> dict[str, tuple[str, str]]:
    """Per rank: (status, basis). ``running`` when its own series (the process-start gauge every rank
    exports while it lives) was last scraped within STATUS_INTERVALS scrape intervals (median gap of its
    scrapes) of the range end; ``stopped`` when the scrapes ended before that; ``unknown`` otherwise, with
    why. A stopped process exited or became unreachable to Prometheus; the series cannot tell which."""
    at = min(qs.end, now)
    tail = max(min(STATUS_TAIL, at - qs.start), 1.0)
    raw: dict[str, list[float]] = {}
    try:
        for m, points in qs.client.query_raw(f"{qs.s(sc.PROCESS_START_TIME)}[{tail:.0f}s]", at):
            raw.setdefault(m.get(RANK, ""), []).extend(t for t, _ in points)
    except PrometheusError as error:
        return {rank: ("unknown", f"raw scrapes not readable: {error}") for rank in ranks}
    out = {}
    for rank in ranks:
        times = sorted(set(raw.get(rank, [])))
        if len(times) < 2:
            out[rank] = ("unknown", f"{len(times)} scrape(s) of {sc.PROCESS_START_TIME.prometheus_name} in the "
                                    f"last {tail:.0f} s of the range: no scrape interval to judge by")
            continue
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        interval = gaps[len(gaps) // 2]
        ago = at - times[-1]
        status = "running" if ago <= STATUS_INTERVALS * interval else "stopped"
        out[rank] = (status, f"last scraped {ago:.0f} s before the range end, scraped every {interval:.0f} s")
    return out


def _system(qs: _Queries, nodes: list[str], origin: float) -> SystemUsage:
    rows: list[UsageRow] = []
    cpu_h = qs.histogram(sc.NODE_CPU_UTILIZATION, NODE)
    cpu_n = qs.by(f"sum by ({NODE}) ({qs.delta(sc.NODE_CPU_UTILIZATION, 'count')})", NODE)
    gpu_h = qs.histogram(sc.GPU_UTILIZATION_DISTRIBUTION, NODE)
    gpu_n = qs.by(f"sum by ({NODE}) ({qs.delta(sc.GPU_UTILIZATION_DISTRIBUTION, 'count')})", NODE)
    mem_h = qs.histogram(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, NODE)
    mem_n = qs.by(f"sum by ({NODE}) ({qs.delta(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, 'count')})", NODE)
    # Expressions over several series are evaluated at this step: at most 1000 points per node, and every
    # scrape seen while scrapes are at least a step apart.
    step = max(math.ceil((qs.end - qs.start) / 1000), 1)
    cpu_label = sc.prometheus_label(sc.LABEL_CPU)
    idle_cpus = qs.s(sc.SYSTEM_CPU_UTILIZATION, extra=MODE + '="idle"')
    iowait_cpus = qs.s(sc.SYSTEM_CPU_UTILIZATION, extra=MODE + '="iowait"')
    busy_cpus = qs.s(sc.SYSTEM_CPU_UTILIZATION, extra=MODE + '!~"idle|iowait"')
    memory = qs.s(sc.SYSTEM_MEMORY_UTILIZATION)
    network, disk = qs.s(sc.SYSTEM_NETWORK_IO), qs.s(sc.SYSTEM_DISK_IO)
    busy = f"sum by ({NODE}) ({busy_cpus}) / count by ({NODE}) ({idle_cpus})"
    busiest = f"max by ({NODE}) (sum by ({NODE}, {cpu_label}) ({busy_cpus}))"
    iowait = f"avg by ({NODE}) ({iowait_cpus})"
    gauges = {
        "CPU, busiest core": _gauge_rows(qs, "CPU, busiest core", UNIT_RATIO, busiest, idle_cpus, step),
        "I/O wait": _gauge_rows(qs, "I/O wait", UNIT_RATIO, iowait, iowait_cpus, step),
        "CPU memory": _gauge_rows(qs, "CPU memory", UNIT_RATIO, memory, memory),
        "Network": _gauge_rows(qs, "Network", UNIT_RATE, f"sum by ({NODE}) (rate({network}[{RATE_WINDOW}s]))",
                               network, step),
        "Disk": _gauge_rows(qs, "Disk", UNIT_RATE, f"sum by ({NODE}) (rate({disk}[{RATE_WINDOW}s]))", disk, step),
    }
    facts = _node_facts(qs, cpu_label)
    range_step = max((qs.end - qs.start) / 400, 1.0)

    def over_time(expr: str) -> dict[str, list[tuple[float, float]]]:
        return {m.get(NODE, ""): pts for m, pts in qs.client.query_range(expr, qs.start, qs.end, range_step)}

    series = {name: over_time(expr) for name, expr in (
        ("cpu", busy), ("busiest", busiest), ("iowait", iowait), ("memory", f"max by ({NODE}) ({memory})"),
        ("gpu", f"avg by ({NODE}) ({qs.s(sc.GPU_UTILIZATION)})"),
        ("gpu memory", f"avg by ({NODE}) ({qs.s(sc.GPU_MEMORY_UTILIZATION)})"))}
    out_nodes = []
    for node in nodes:
        key = (node,)
        candidates = [
            _histogram_row(node, "CPU", UNIT_RATIO, cpu_h.get(key), cpu_n.get(key, 0.0)),
            gauges["CPU, busiest core"].get(node),
            gauges["I/O wait"].get(node),
            gauges["CPU memory"].get(node),
            _histogram_row(node, "GPU", UNIT_RATIO, gpu_h.get(key), gpu_n.get(key, 0.0)),
            _histogram_row(node, "GPU memory", UNIT_RATIO, mem_h.get(key), mem_n.get(key, 0.0)),
            gauges["Network"].get(node),
            gauges["Disk"].get(node),
        ]
        node_rows = [r for r in candidates if r is not None]
        rows += node_rows
        if not node_rows:
            continue
        cpu_row = next((r for r in node_rows if r.metric == "CPU"), None)
        gpu_row = next((r for r in node_rows if r.metric == "GPU"), None)
        rank, interval, cores, gpus = facts.get(node, (-1, NAN, 0, ()))
        plots = {name: _series(points.get(node, []), origin) for name, points in series.items()}
        out_nodes.append(NodeUsage(node, rank, int(cpu_n.get(key, 0.0)), interval, cores, gpus,
                                   verdict(cpu_row, gpu_row), (), plots["cpu"], plots["busiest"], plots["iowait"],
                                   plots["memory"], plots["gpu"], plots["gpu memory"]))
    return SystemUsage(tuple(rows), (), tuple(out_nodes))


def _node_facts(qs: _Queries, cpu_label: str) -> dict[str, tuple[int, float, int, tuple[str, ...]]]:
    """Per node: the rank that sampled it (the one with most samples), the seconds between samples (the
    slope of its sample counter over the range; NaN when the counter reset or has too few scrapes),
    the logical CPUs (distinct CPUs of its per-CPU series; 0 when none) and its GPUs."""
    samples = qs.s(sc.SAMPLER_SAMPLES)
    taken = qs.by(f"sum by ({NODE}, {RANK}) ({qs.delta(sc.SAMPLER_SAMPLES)})", NODE, RANK)
    slopes = qs.by(f"deriv({samples}[{qs.window}]) and (resets({samples}[{qs.window}]) == 0)", NODE, RANK)
    idle = qs.s(sc.SYSTEM_CPU_UTILIZATION, extra=MODE + '="idle"')
    cores = qs.by(f"count by ({NODE}) (count by ({NODE}, {cpu_label}) (last_over_time({idle}[{qs.window}])))",
                  NODE)
    gpus: dict[str, list[str]] = {}
    for node, gpu in qs.by(f"group by ({NODE}, {GPU}) (last_over_time("
                           f"{qs.s(sc.GPU_UTILIZATION_DISTRIBUTION, 'count')}[{qs.window}]))", NODE, GPU):
        gpus.setdefault(node, []).append(gpu)
    best: dict[str, tuple[float, str]] = {}
    for (node, rank), n in taken.items():
        if n > 0 and rank.isdigit() and n > best.get(node, (0.0, ""))[0]:
            best[node] = (n, rank)
    out = {}
    for node in {*best, *(n for (n,) in cores), *gpus}:
        rank = best.get(node, (0.0, ""))[1]
        slope = slopes.get((node, rank), NAN)
        out[node] = (int(rank) if rank else -1, 1 / slope if slope > 0 else NAN, int(cores.get((node,), 0)),
                     tuple(sorted(gpus.get(node, ()), key=gpu_order)))
    return out


def _steps(qs: _Queries, rank_nodes: dict[str, str]) -> StepAnalysis:
    buckets = qs.histogram(sc.STEP_DURATION, RANK, PHASE)
    sums = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEP_DURATION, 'sum')})", RANK, PHASE)
    counts = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEP_DURATION, 'count')})", RANK, PHASE)
    outliers = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEP_OUTLIERS)})", RANK, PHASE)
    samples = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.SAMPLES)})", RANK, PHASE)
    tokens = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.TOKENS)})", RANK, PHASE)
    rows = []
    throughput: dict[str, float] = {}
    for key in sorted(counts, key=lambda k: (int(k[0]) if k[0].isdigit() else 1 << 30, k[1])):
        n, total = counts[key], sums.get(key, 0.0)
        if not n:
            continue
        b = buckets.get(key, [])
        dist = Distribution(int(n), total / n, NAN, NAN, bucket_quantile(0.5, b), bucket_quantile(0.95, b),
                            bucket_quantile(0.99, b), NAN)
        fastest, slowest = extreme_buckets(b)
        per_second = samples[key] / total if samples.get(key) and total else None
        if per_second is not None:
            throughput[key[1]] = throughput.get(key[1], 0.0) + per_second
        rows.append(PhaseSteps(int(key[0]) if key[0].isdigit() else -1, rank_nodes.get(key[0], ""), key[1], dist, NAN,
                               int(outliers.get(key, 0.0)), (), _per_bucket(b),
                               samples[key] / n if samples.get(key) else None, per_second,
                               tokens[key] / total if tokens.get(key) and total else None, fastest, slowest))
    return StepAnalysis(NAN, tuple(rows), tuple(sorted(throughput.items())))


def _framework(qs: _Queries, summary: JobSummary) -> FrameworkSummary:
    phase_time = qs.by(f"sum by ({PHASE}) ({qs.delta(sc.STEP_DURATION, 'sum')})", PHASE)
    label = sc.prometheus_label(sc.LABEL_ANNOTATION)
    sums = qs.by(f"sum by ({label}, {PHASE}) ({qs.delta(sc.ANNOTATION_DURATION, 'sum')})", label, PHASE)
    counts = qs.by(f"sum by ({label}, {PHASE}) ({qs.delta(sc.ANNOTATION_DURATION, 'count')})", label, PHASE)
    longest = {
        True: qs.histogram(sc.ANNOTATION_DURATION, label, extra=f'{PHASE}!="{_escape(sc.NO_PHASE)}"'),
        False: qs.histogram(sc.ANNOTATION_DURATION, label, extra=f'{PHASE}="{_escape(sc.NO_PHASE)}"'),
    }
    windows = qs.by(f"sum by ({RANK}) ({qs.delta(sc.PROFILE_WINDOWS)})", RANK)
    loop = sum((r.last_step_end or 0) - (r.first_step_start or 0) for r in summary.ranks
               if r.first_step_start and r.last_step_end)
    in_steps = sum(phase_time.values())
    between = max(loop - in_steps, 0.0)
    phases = [(p[0], t, share(t, loop)) for p, t in sorted(phase_time.items(), key=lambda kv: -kv[1])]
    if loop:
        phases.append((BETWEEN_STEPS, between, share(between, loop)))
    inside: dict[str, list[float]] = {}
    outside: dict[str, list[float]] = {}
    for (name, phase), total in sums.items():
        acc = outside if phase == sc.NO_PHASE else inside
        entry = acc.setdefault(name, [0.0, 0.0])
        entry[0] += counts.get((name, phase), 0.0)
        entry[1] += total

    def regions(acc: dict[str, list[float]], in_step: bool) -> tuple[Region, ...]:
        rows = [Region(name, int(c), t, t / c if c else NAN, NAN, share(t, in_steps), 0,
                       extreme_buckets(longest[in_step].get((name,), []))[1])
                for name, (c, t) in acc.items()]
        return tuple(sorted(rows, key=lambda r: -r.total))

    forward = inside.get(sc.REGION_FORWARD, [0.0, 0.0])[1]
    backward = inside.get(sc.REGION_BACKWARD, [0.0, 0.0])[1]
    window_counts = tuple(sorted((int(rank), round(n)) for (rank,), n in windows.items()
                          if rank.isdigit() and round(n) > 0))
    in_step_sums = {key: total for key, total in sums.items() if key[1] != sc.NO_PHASE}
    return FrameworkSummary(tuple(phases), share(between, loop), forward, backward, share(forward, forward + backward),
                            regions(inside, True), regions(outside, False), (), (), 0.0, 0.0, (), (), (),
                            window_counts, prometheus_progress.breakdowns({p[0]: t for p, t in phase_time.items()},
                                                                          in_step_sums, summary.steps_per_phase))


def _gpus(qs: _Queries, config: MixinConfig, origin: float) -> GpuAnalysis:
    util = qs.histogram(sc.GPU_UTILIZATION_DISTRIBUTION, NODE, GPU)
    util_sum = qs.by(f"sum by ({NODE}, {GPU}) ({qs.delta(sc.GPU_UTILIZATION_DISTRIBUTION, 'sum')})", NODE, GPU)
    util_n = qs.by(f"sum by ({NODE}, {GPU}) ({qs.delta(sc.GPU_UTILIZATION_DISTRIBUTION, 'count')})", NODE, GPU)
    mem = qs.histogram(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, NODE, GPU)
    mem_sum = qs.by(f"sum by ({NODE}, {GPU}) ({qs.delta(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, 'sum')})", NODE, GPU)
    mem_n = qs.by(f"sum by ({NODE}, {GPU}) ({qs.delta(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, 'count')})", NODE, GPU)
    totals = qs.by(f"max by ({NODE}, {GPU}) (max_over_time({qs.s(sc.GPU_MEMORY_LIMIT)}[{qs.window}]))", NODE, GPU)
    power = qs.by(f"max by ({NODE}, {GPU}) (quantile_over_time(0.5, {qs.s(sc.GPU_POWER)}[{qs.window}]))", NODE, GPU)
    temp = qs.by(f"max by ({NODE}, {GPU}) (quantile_over_time(0.5, {qs.s(sc.GPU_TEMPERATURE)}[{qs.window}]))",
                 NODE, GPU)
    # memory growth: the scraped gauge's mean over the last tenth of the range minus over the first tenth
    tenth = max((qs.end - qs.start) / 10, 1.0)
    mean_memory = f"max by ({NODE}, {GPU}) (avg_over_time({qs.s(sc.GPU_MEMORY_UTILIZATION)}[{tenth * 1000:.0f}ms]))"
    first_tenth = {tuple(m.get(label, "") for label in (NODE, GPU)): v
                   for m, v in qs.client.query(mean_memory, qs.start + tenth)}
    last_tenth = qs.by(mean_memory, NODE, GPU)
    range_step = max((qs.end - qs.start) / 400, 1.0)

    def over_time(spec: sc.MetricSpec) -> dict[tuple[str, ...], Series]:
        return {(m.get(NODE, ""), m.get(GPU, "")): _series(points, origin) for m, points in qs.client.query_range(
            f"max by ({NODE}, {GPU}) ({qs.s(spec)})", qs.start, qs.end, range_step)}

    util_series, memory_series = over_time(sc.GPU_UTILIZATION), over_time(sc.GPU_MEMORY_UTILIZATION)
    rows = []
    for key in sorted(util_n, key=lambda k: (k[0], gpu_order(k[1]))):
        ubox = _box(util.get(key, []), util_sum.get(key, 0.0), util_n[key])
        mbox = _box(mem.get(key, []), mem_sum.get(key, 0.0), mem_n.get(key, 0.0))
        busy = ubox.count > 0 and ubox.mean > 0  # some sample above 0, from the exact sum (max is a bucket)
        growth = last_tenth[key] - first_tenth[key] if key in last_tenth and key in first_tenth else NAN
        empty = Series((), (), ())
        rows.append(GpuUsage(
            key[0], key[1], ubox, mbox, totals.get(key), power.get(key), temp.get(key),
            busy and ubox.p95 < config.low_gpu_threshold_p95,
            ubox.count > 0 and ubox.p5 < config.low_gpu_threshold_p5 and ubox.p95 > config.low_gpu_threshold_p95,
            ubox.count > 0 and not busy, growth, util_series.get(key, empty), memory_series.get(key, empty),
            MemoryFlags.of(mbox, growth, config)))
    return GpuAnalysis(config.low_gpu_threshold_p95, config.low_gpu_threshold_p5, tuple(rows))


def _rules(qs: _Queries, config: MixinConfig) -> RulesSummary:
    from otelprof.mixin.alerts import alerts
    from otelprof.mixin.rules import recording_rules

    mine = {a.name: a for a in alerts(config)}
    try:
        groups = qs.client.rules()
    except PrometheusError:
        groups = []
    loaded: dict[str, float] = {}
    for group in groups:
        for rule in group.get("rules", []):
            if rule.get("name") in mine:
                loaded[str(rule["name"])] = float(group.get("interval", 60.0) or 60.0)
    firing = qs.by(f'count_over_time(ALERTS{{alertstate="firing", {qs.sel}}}[{qs.window}])', "alertname")
    per_alert: dict[str, float] = {}
    for (name,), count in firing.items():
        per_alert[name] = max(per_alert.get(name, 0.0), count)
    rows = []
    span = qs.end - qs.start
    recorded = {record.name: record.expr for record in recording_rules(config)}
    judged = prometheus_progress.datapoints(qs, {name: alert.expr for name, alert in mine.items()
                                                 if name in loaded or name in per_alert}, recorded)
    for name, alert in mine.items():
        if name not in loaded and name not in per_alert:
            continue
        count = int(per_alert.get(name, 0))
        evaluations = int(span // loaded[name]) if name in loaded else 0
        rows.append(RuleRow(name, alert.runbook.original, alert.severity, alert.runbook.meaning, alert.runbook.todo,
                            count > 0, count, evaluations, judged.get(name, 0), None, None, (),
                            alert.runbook.thresholds, alert.summary))
    rows.sort(key=lambda r: (-r.firing_evaluations, r.alert))
    interval = min(loaded.values()) if loaded else NAN
    not_loaded = tuple(n for n in mine if n not in loaded and n not in per_alert)
    return RulesSummary(interval, tuple(rows), not_loaded,
                        None if rows else "this Prometheus has no otelprof alert rules loaded (otelprof mixin writes "
                                          "them) and no otelprof alert fired for the job")


def _bottlenecks(qs: _Queries, config: MixinConfig) -> tuple[Bottleneck, Bottleneck]:
    def node_sum(spec: sc.MetricSpec) -> dict[tuple[str, ...], float]:
        return qs.by(f"sum by ({NODE}) ({qs.delta(spec)})", NODE)

    samples = node_sum(sc.SAMPLER_SAMPLES)
    low = node_sum(sc.SAMPLER_LOW_GPU)
    high = node_sum(sc.SAMPLER_HIGH_CPU)
    cpu = node_sum(sc.SAMPLER_CPU_BOTTLENECK)
    io = node_sum(sc.SAMPLER_IO_BOTTLENECK)
    cpu_rows, io_rows = [], []
    for key, n in sorted(samples.items()):
        if not n:
            continue
        cpu_rows.append(NodeBottleneck(key[0], int(n), int(low.get(key, 0)), int(high.get(key, 0)),
                                       int(cpu.get(key, 0)), share(cpu.get(key, 0.0), n), ()))
        io_rows.append(NodeBottleneck(key[0], int(n), int(low.get(key, 0)), 0, int(io.get(key, 0)),
                                      share(io.get(key, 0.0), n), ()))
    return (Bottleneck("cpu", config.cpu_threshold, config.gpu_threshold, config.cpu_bottleneck_threshold,
                       tuple(cpu_rows)),
            Bottleneck("io", config.io_threshold, config.gpu_threshold, config.io_bottleneck_threshold,
                       tuple(io_rows)))


def _load(qs: _Queries, config: MixinConfig, gpus: GpuAnalysis) -> LoadBalance:
    util = qs.histogram(sc.GPU_UTILIZATION_DISTRIBUTION, NODE, GPU)
    loads = [GpuLoad(g.node, g.gpu, g.utilization.mean, _per_bucket(util.get((g.node, g.gpu), [])))
             for g in gpus.gpus if g.utilization.count]
    distances = [GpuDistance(f"{a.node}/{a.gpu}", f"{b.node}/{b.gpu}", js_distance(a.histogram.counts,
                                                                                     b.histogram.counts))
                 for i, a in enumerate(loads) for b in loads[i + 1:]][:120]
    means = [g.mean for g in loads]
    step_sum = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEP_DURATION, 'sum')})", RANK, PHASE)
    step_n = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEP_DURATION, 'count')})", RANK, PHASE)
    wait = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.DATALOADER_WAIT, 'sum')})", RANK, PHASE)
    coll = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.COLLECTIVE_DURATION, 'sum')})", RANK, PHASE)
    exposed = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.COLLECTIVE_EXPOSED, 'sum')})", RANK, PHASE)
    medians = {k: bucket_quantile(0.5, v) for k, v in qs.histogram(sc.STEP_DURATION, RANK, PHASE).items()}
    per_phase: dict[str, list[tuple[int, float, float, float, float]]] = {}
    for key, n in step_n.items():
        if n and key[0].isdigit():
            waited = exposed.get(key, coll.get(key, 0.0))  # a version without the exposed series: all of it
            compute = max(step_sum.get(key, 0.0) - wait.get(key, 0.0) - waited, 0.0) / n
            per_phase.setdefault(key[1], []).append((int(key[0]), medians.get(key, NAN), compute,
                                                     coll.get(key, 0.0) / n, waited / n))
    ranks = []
    for phase, rows in sorted(per_phase.items()):
        computes = [r[2] for r in rows]
        for rank, median, compute, collective, waited in sorted(rows):
            peers = peers_median(computes, compute) if len(rows) > 1 else None
            ratio = compute / peers if peers else NAN
            ranks.append(RankLoad(phase, rank, median, compute, collective, ratio,
                                  len(rows) > 1 and ratio > config.straggler_ratio, waited))
    return LoadBalance(config.load_balancing_threshold, max(means) - min(means) if len(means) > 1 else None, 0.5,
                       tuple(loads), tuple(distances), tuple(ranks), config.straggler_ratio)


def _loader(qs: _Queries, config: MixinConfig) -> DataLoaderAnalysis:
    waits = qs.histogram(sc.DATALOADER_WAIT, RANK, PHASE)
    wait_sum = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.DATALOADER_WAIT, 'sum')})", RANK, PHASE)
    wait_n = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.DATALOADER_WAIT, 'count')})", RANK, PHASE)
    step_sum = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEP_DURATION, 'sum')})", RANK, PHASE)
    step_n = qs.by(f"sum by ({RANK}, {PHASE}) ({qs.delta(sc.STEP_DURATION, 'count')})", RANK, PHASE)
    ratios = qs.histogram(sc.DATALOADER_WAIT_RATIO, RANK, PHASE)
    phases = []
    for key in sorted(wait_n):
        n = wait_n[key]
        if not n or not key[0].isdigit():
            continue
        b = waits.get(key, [])
        r = ratios.get(key, [])
        bound = 0.0
        if r:
            below = max((c for le, c in r if le <= config.input_bound_threshold), default=0.0)
            bound = r[-1][1] - below
        steps = round(max(step_n.get(key, n), n))  # every step of the phase; the wait histogram counts those waiting
        phases.append(LoaderPhase(
            int(key[0]), key[1], steps, round(n), Distribution(int(n), wait_sum.get(key, 0.0) / n, NAN, NAN,
                                                               bucket_quantile(0.5, b), bucket_quantile(0.95, b),
                                                               bucket_quantile(0.99, b), NAN),
            bucket_quantile(0.25, b), Distribution(int(n), NAN, NAN, NAN, bucket_quantile(0.5, r),
                                                   bucket_quantile(0.95, r), bucket_quantile(0.99, r), NAN),
            int(bound), share(wait_sum.get(key, 0.0), step_sum.get(key, 0.0)), _per_bucket(b),
            extreme_buckets(b)[1]))
    workers = qs.by(f"last_over_time({qs.s(sc.DATALOADER_WORKERS)}[{qs.window}])", RANK)
    pins = qs.by(f"last_over_time({qs.s(sc.DATALOADER_PIN_MEMORY)}[{qs.window}])", RANK)
    cpus = qs.by(f"last_over_time({qs.s(sc.CPU_AVAILABLE)}[{qs.window}])", RANK)
    loaders = [loader_config(int(rank), int(v), bool(pins[(rank,)]) if (rank,) in pins else None, cpus.get((rank,)),
                             config) for (rank,), v in sorted(workers.items()) if rank.isdigit()]
    return DataLoaderAnalysis(sc.REGION_DATALOADER, config.input_bound_threshold, config.dataloader_min_threshold,
                              config.dataloader_max_threshold, tuple(phases), tuple(loaders))
