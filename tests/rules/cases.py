"""promtool unit tests of the generated rules, written as Python data.

``otelprof generate`` (which runs ``python -m tests.rules.cases``) writes ``tests/rules/*_test.yaml``;
``tests/test_rules.py`` checks they are current and runs ``promtool test rules`` on them. Each alert's
declaration names the files that hold its cases (``cases=``), and a test keeps that true.
Each alert has firing and non-firing cases, with edges at its thresholds. Expected
annotations are rendered from the alert's templates with the expected value, so every
firing case also checks the value the alert reports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otelprof import semconv as sc
from otelprof.analysis.histogram import bucket_quantile, cumulative_counts
from otelprof.mixin import yamlout
from otelprof.mixin.alert_model import Alert
from otelprof.mixin.alerts import alert_groups, alerts
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.promql import series_name
from otelprof.mixin.rules import recording_rules
from otelprof.mixin.ruletests import group_eval_order

HERE = Path(__file__).resolve().parent
CONFIG = MixinConfig()
ALERTS = {a.short: a for a in alerts(CONFIG)}
RECORDS = {r.key: r for r in recording_rules(CONFIG)}
RULE_FILES = ["../../deploy/prometheus/otelprof-alerts.yaml", "../../deploy/prometheus/otelprof-rules.yaml"]

TARGET = {"job": "otelprof", "instance": "10.0.0.1:9464"}


def ident(rank: int = 0, node: str = "n1", job: str = "resnet", local_rank: int | None = None,
          instance: str | None = None) -> dict[str, str]:
    return {"job_name": job, "rank": str(rank), "local_rank": str(rank if local_rank is None else local_rank),
            "node": node, "job": "otelprof", "instance": instance or f"10.0.0.{rank + 1}:9464"}


ID = ident()
IDN = {k: v for k, v in ID.items() if k not in TARGET}
GPU0 = {**ID, "gpu": "0", "hw_id": "GPU-0"}


# ------------------------------------------------------------------ Prometheus template functions (subset)

def _g4(value: float) -> str:
    """Go's %.4g."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = f"{value:.4g}"
    return re.sub(r"e([+-])(\d)$", r"e\g<1>0\2", text)


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return _g4(v) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _g4(v) + prefix


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    if v == 0:
        return _g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = int(v)
        secs, mins, hours, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {hours}h {mins}m {secs}s"
        if hours:
            return f"{sign}{hours}h {mins}m {secs}s"
        if mins:
            return f"{sign}{mins}m {secs}s"
        return f"{sign}{_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{_g4(v)}{prefix}s"


_FILTERS = {"humanize": humanize, "humanizeDuration": humanize_duration,
            "humanizePercentage": lambda v: _g4(v * 100) + "%"}


def render(template: str, labels: dict[str, str], value: float) -> str:
    def one(match: re.Match[str]) -> str:
        inner = match.group(1).strip()
        if inner.startswith("$labels."):
            return labels.get(inner[len("$labels."):], "")
        if inner in ("$value", 'printf "%.4g" $value'):
            return _g4(value)
        if inner.startswith("$value |"):
            return _FILTERS[inner.split("|", 1)[1].strip()](value)
        raise ValueError(f"template not supported by the test renderer: {inner}")

    return re.sub(r"\{\{(.*?)\}\}", one, template)


# ------------------------------------------------------------------ series helpers

def seq(segments: Sequence[tuple[int, float]], start: float = 0) -> str:
    """Expanding notation of a piecewise-linear series: ``segments`` = (intervals, increment per interval)."""
    parts, value = [], start
    for i, (n, inc) in enumerate(segments):
        if i == 0:
            parts.append(f"{_num(value)}+{_num(inc)}x{n}")
            value += n * inc
        else:
            value += inc
            parts.append(f"{_num(value)}+{_num(inc)}x{n - 1}")
            value += (n - 1) * inc
    return " ".join(parts)


def const(value: float, n: int) -> str:
    return f"{_num(value)}+0x{n}"


def _num(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


@dataclass
class Group:
    name: str
    interval: str = "10s"
    series: list[dict[str, str]] = field(default_factory=list)
    alert_tests: list[dict[str, Any]] = field(default_factory=list)
    expr_tests: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, labels: dict[str, str], values: str) -> Group:
        self.series.append({"series": name + _labels(labels), "values": values})
        return self

    def gauge(self, spec: sc.MetricSpec, labels: dict[str, str], values: str) -> Group:
        return self.add(series_name(spec), labels, values)

    def counter(self, spec: sc.MetricSpec, labels: dict[str, str], values: str) -> Group:
        return self.add(series_name(spec), labels, values)

    def started(self, labels: dict[str, str], n: int, at: float = 0) -> Group:
        return self.gauge(sc.PROCESS_START_TIME, labels, const(at, n))

    def histogram(self, spec: sc.MetricSpec, labels: dict[str, str],
                  segments: Sequence[tuple[int, dict[float, int]]]) -> Group:
        """Cumulative bucket/sum/count series; each segment = (intervals, {observed value: count per interval})."""
        bounds = spec.buckets
        bucket_segments: list[list[tuple[int, float]]] = [[] for _ in range(len(bounds) + 1)]
        sum_segments: list[tuple[int, float]] = []
        for n, observed in segments:
            per = cumulative_counts([v for v, c in observed.items() for _ in range(c)], bounds)
            for i, count in enumerate(per):
                bucket_segments[i].append((n, count))
            sum_segments.append((n, sum(v * c for v, c in observed.items())))
        for bound, segs in zip([*bounds, math.inf], bucket_segments):
            le = "+Inf" if math.isinf(bound) else repr(float(bound))
            self.add(series_name(spec, "bucket"), {**labels, "le": le}, seq(segs))
        self.add(series_name(spec, "sum"), labels, seq(sum_segments))
        self.add(series_name(spec, "count"), labels, seq(bucket_segments[-1]))
        return self

    def fires(self, short: str, at: str, *expected: tuple[dict[str, str], float]) -> Group:
        alert = ALERTS[short]
        self.alert_tests.append({"eval_time": at, "alertname": alert.name,
                                 "exp_alerts": [expect(alert, labels, value) for labels, value in expected]})
        return self

    def silent(self, short: str, at: str) -> Group:
        self.alert_tests.append({"eval_time": at, "alertname": ALERTS[short].name, "exp_alerts": []})
        return self

    def record(self, key: str, at: str, *expected: tuple[dict[str, str], float]) -> Group:
        name = RECORDS[key].name
        self.expr_tests.append({"expr": name, "eval_time": at, "exp_samples": [
            {"labels": name + _labels(labels), "value": value} for labels, value in expected]})
        return self

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "interval": self.interval, "input_series": self.series}
        if self.alert_tests:
            out["alert_rule_test"] = self.alert_tests
        if self.expr_tests:
            out["promql_expr_test"] = self.expr_tests
        return out


def expect(alert: Alert, labels: dict[str, str], value: float) -> dict[str, Any]:
    rule = alert.rule(CONFIG)
    exp_labels = {**labels, **rule["labels"]}
    annotations = {k: render(v, labels, value) for k, v in rule["annotations"].items()}
    return {"exp_labels": exp_labels, "exp_annotations": annotations}


def p(q: float, spec: sc.MetricSpec, observed: dict[float, int], intervals: int = 25) -> float:
    """The quantile histogram_quantile reports for a window of ``intervals`` identical intervals."""
    return bucket_quantile(q, spec.buckets, cumulative_counts(
        [v for v, c in observed.items() for _ in range(c * intervals)], spec.buckets))


# ------------------------------------------------------------------ system (sampled) checks
N = 100  # 10-s intervals: 1000 s of data; warm-up (500 s) ends at 510 s, a 1-min `for` fires at 570 s

UTIL = sc.GPU_UTILIZATION_DISTRIBUTION
MEM = sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION
CPU = sc.NODE_CPU_UTILIZATION


def _sampler(g: Group, cpu: int = 0, io: int = 0, labels: dict[str, str] = ID) -> Group:
    g.counter(sc.SAMPLER_SAMPLES, labels, seq([(N, 20)]))  # 2 samples/s
    g.counter(sc.SAMPLER_CPU_BOTTLENECK, labels, seq([(N, cpu)]))
    return g.counter(sc.SAMPLER_IO_BOTTLENECK, labels, seq([(N, io)]))


def _gpu(g: Group, util: dict[float, int], mem: dict[float, int] | None = None, labels: dict[str, str] = GPU0,
         gauge: float = 0.5) -> Group:
    g.histogram(UTIL, labels, [(N, util)])
    g.histogram(MEM, labels, [(N, mem or {0.5: 20})])
    return g.gauge(sc.GPU_UTILIZATION, labels, const(gauge, N))


def system_groups() -> list[Group]:
    groups = []
    g = Group("CPU bottleneck: 60 % of samples")
    _sampler(g.started(ID, N), cpu=12)
    g.silent("CPUBottleneck", "8m").silent("CPUBottleneck", "9m20s")  # warm-up, then pending for 1m
    g.fires("CPUBottleneck", "9m30s", (ID, 0.6)).silent("IOBottleneck", "10m")
    groups.append(g)

    g = Group("CPU and I/O bottleneck exactly at the 50 % threshold")
    _sampler(g.started(ID, N), cpu=10, io=10)
    g.silent("CPUBottleneck", "10m").silent("IOBottleneck", "10m")
    groups.append(g)

    g = Group("I/O bottleneck: 55 % of samples")
    _sampler(g.started(ID, N), io=11)
    g.silent("IOBottleneck", "9m20s").fires("IOBottleneck", "10m", (ID, 0.55)).silent("CPUBottleneck", "10m")
    groups.append(g)

    g = Group("GPU underutilized at 50 %; nothing else wrong")
    _gpu(g.started(ID, N), {0.5: 20})
    g.histogram(CPU, ID, [(N, {0.75: 20})])
    g.silent("GPUUnderutilized", "9m20s")
    g.fires("GPUUnderutilized", "9m30s", (GPU0, p(0.95, UTIL, {0.5: 20})))
    g.silent("GPUUtilizationFluctuating", "10m").silent("BatchSizeTooSmall", "10m")
    groups.append(g)

    g = Group("GPU underutilized edge: exactly 5 % of samples above 70 %")
    _gpu(g.started(ID, N), {0.5: 19, 0.75: 1})
    g.fires("GPUUnderutilized", "10m", (GPU0, p(0.95, UTIL, {0.5: 19, 0.75: 1})))
    groups.append(g)

    g = Group("GPU not underutilized: 10 % of samples above 70 %")
    _gpu(g.started(ID, N), {0.5: 18, 0.75: 2})
    g.silent("GPUUnderutilized", "10m")
    groups.append(g)

    g = Group("unused GPU (never busy) is not reported")
    _gpu(g.started(ID, N), {0.0: 20}, gauge=0)
    g.silent("GPUUnderutilized", "10m").silent("BatchSizeTooSmall", "10m")
    groups.append(g)

    fluct = {0.0: 10, 1.0: 10}
    g = Group("GPU fluctuating: half idle, half busy")
    _gpu(g.started(ID, N), fluct)
    g.silent("GPUUtilizationFluctuating", "9m20s")
    g.fires("GPUUtilizationFluctuating", "9m30s", (GPU0, p(0.05, UTIL, fluct)))
    g.silent("GPUUnderutilized", "10m")
    groups.append(g)

    g = Group("GPU fluctuating edge: exactly 5 % idle samples")
    _gpu(g.started(ID, N), {0.0: 1, 1.0: 19})
    g.fires("GPUUtilizationFluctuating", "10m", (GPU0, p(0.05, UTIL, {0.0: 1, 1.0: 19})))
    groups.append(g)

    half = {0.0: 10, 0.7: 10}
    g = Group("not fluctuating: the busy half stays at 70 % (p95 below the threshold)")
    _gpu(g.started(ID, N), half)
    g.silent("GPUUtilizationFluctuating", "10m").fires("GPUUnderutilized", "10m", (GPU0, p(0.95, UTIL, half)))
    groups.append(g)

    g = Group("batch size too small: GPU, memory and CPU all below 70 %")
    _gpu(g.started(ID, N), {0.5: 20}, {0.25: 20})
    g.histogram(CPU, ID, [(N, {0.3: 20})])
    g.silent("BatchSizeTooSmall", "13m20s")  # for: 5m after the warm-up
    g.fires("BatchSizeTooSmall", "13m30s", (GPU0, p(0.95, UTIL, {0.5: 20})))
    groups.append(g)

    g = Group("batch size fine: the node's CPUs are busy")
    _gpu(g.started(ID, N), {0.5: 20}, {0.25: 20})
    g.histogram(CPU, ID, [(N, {0.75: 20})])
    g.silent("BatchSizeTooSmall", "10m")
    groups.append(g)

    g = Group("batch size fine: GPU memory is 70 % used")
    _gpu(g.started(ID, N), {0.5: 20}, {0.75: 20})
    g.histogram(CPU, ID, [(N, {0.3: 20})])
    g.silent("BatchSizeTooSmall", "10m")
    groups.append(g)

    g = Group("GPU memory jumps by 25 points at 10 min")
    g.started(ID, N).histogram(MEM, GPU0, [(60, {0.5: 20}), (N - 60, {0.75: 20})])
    g.silent("GPUMemoryIncrease", "10m").silent("GPUMemoryIncrease", "10m10s")
    g.fires("GPUMemoryIncrease", "11m", ({**GPU0, **TARGET}, 0.25))
    g.silent("GPUMemoryIncrease", "12m10s")  # both windows after the jump
    groups.append(g)

    g = Group("GPU memory creeps by 3 points: below the 5-point threshold")
    g.started(ID, N).histogram(MEM, GPU0, [(60, {0.5: 20}), (N - 60, {0.53125: 20})])
    g.silent("GPUMemoryIncrease", "11m")
    groups.append(g)

    g = Group("GPU memory near capacity")
    g.started(ID, N).histogram(MEM, GPU0, [(N, {0.984375: 20})])
    g.fires("GPUMemoryNearCapacity", "5m", ({**GPU0, **TARGET}, 0.984375))
    groups.append(g)

    g = Group("GPU memory high but below 95 %")
    g.started(ID, N).histogram(MEM, GPU0, [(N, {0.9375: 20})])
    g.silent("GPUMemoryNearCapacity", "10m")
    groups.append(g)

    mib = 2**20

    def rss(name: str, segments: list[tuple[int, float]], start: float = 512 * mib, first_step: int = 0) -> Group:
        g = Group(name).started(ID, 200).gauge(sc.PROCESS_MEMORY_USAGE, ID, seq(segments, start))
        return g.gauge(sc.STEP_FIRST_TIMESTAMP, ID, (f"_x{first_step // 10} " if first_step else "")
                       + const(first_step, 200 - first_step // 10))

    leak = rss("RSS leaks 4 MiB per 10 s from 20 min (120 MiB per 5 min)", [(120, 0), (80, 4 * mib)])
    leak.silent("HostMemoryIncrease", "20m").silent("HostMemoryIncrease", "25m")  # ramp, then `for` 2m
    groups.append(leak.fires("HostMemoryIncrease", "30m", ({**ID}, 120 * mib)))
    small = rss("RSS leaks 2 MiB per 10 s (60 MiB per 5 min: under 64 MiB)", [(120, 0), (80, 2 * mib)])
    groups.append(small.silent("HostMemoryIncrease", "30m").silent("HostMemoryIncrease", "33m"))
    big = rss("8 GiB process grows 480 MiB per 5 min (under 10 %)", [(120, 0), (80, 16 * mib)], 8192 * mib)
    groups.append(big.silent("HostMemoryIncrease", "30m"))
    startup = rss("RSS grows 500 MiB while the job starts, then stays", [(30, 500 / 30 * mib), (170, 0)], 100 * mib)
    groups.append(startup.silent("HostMemoryIncrease", "10m").silent("HostMemoryIncrease", "19m")
                  .silent("HostMemoryIncrease", "30m"))
    loading = rss("RSS grows 1 GiB while a data set loads for 25 min before the first step", [(150, 7 * mib), (50, 0)],
                  first_step=1500)
    groups.append(loading.silent("HostMemoryIncrease", "25m").silent("HostMemoryIncrease", "30m"))
    early = rss("the same leak from the first step: judged only after patience + 2 windows", [(200, 4 * mib)])
    groups.append(early.silent("HostMemoryIncrease", "18m10s").silent("HostMemoryIncrease", "20m10s")
                  .fires("HostMemoryIncrease", "20m30s", (ID, 120 * mib)))

    gib = 2**30

    def container(name: str, working_set: float, limit: float | None, host: float = 0.5) -> Group:
        g = Group(name).gauge(sc.CONTAINER_MEMORY_WORKING_SET, ID, const(working_set, 30))
        if limit is not None:
            g.gauge(sc.CONTAINER_MEMORY_LIMIT, ID, const(limit, 30))
        return g.gauge(sc.SYSTEM_MEMORY_UTILIZATION, ID, const(host, 30))

    groups.append(container("container working set at 93.75 % of its 4 GiB limit", 3.75 * gib, 4 * gib)
                  .fires("HostMemoryNearLimit", "2m", (ID, 0.9375)))
    groups.append(container("container at 87.5 % of its limit; the host is 97 % full (the limit is what counts)",
                            3.5 * gib, 4 * gib, host=0.97).silent("HostMemoryNearLimit", "4m"))
    groups.append(container("no container limit: the host's memory 93.75 % used", 3.5 * gib, None, host=0.9375)
                  .fires("HostMemoryNearLimit", "2m", (ID, 0.9375)))
    groups.append(container("no container limit: the host's memory 87.5 % used", 3.5 * gib, None, host=0.875)
                  .silent("HostMemoryNearLimit", "4m"))

    gpu1 = {**ident(1, "n2"), "gpu": "0", "hw_id": "GPU-1"}
    g = Group("GPU load imbalance: 75 % vs 50 % across the job")
    g.started(ID, N).started(ident(1, "n2"), N)
    g.histogram(UTIL, GPU0, [(N, {0.75: 20})]).histogram(UTIL, gpu1, [(N, {0.5: 20})])
    g.silent("GPULoadImbalance", "13m20s").fires("GPULoadImbalance", "13m30s", ({"job_name": "resnet"}, 0.25))
    groups.append(g)

    g = Group("GPU load balanced within 20 points")
    g.started(ID, N).started(ident(1, "n2"), N)
    g.histogram(UTIL, GPU0, [(N, {0.75: 20})]).histogram(UTIL, gpu1, [(N, {0.5625: 20})])
    g.silent("GPULoadImbalance", "10m")
    groups.append(g)
    return groups


# ------------------------------------------------------------------ step checks
TRAIN = {"phase": "train"}


def step_groups() -> list[Group]:
    groups = []
    def straggler(name: str, step_sums: list[float], coll_sums: list[float] | None = None) -> Group:
        """One rank per value: steps (8 per 10 s) whose sum grows by the value, collectives by ``coll_sums``."""
        g = Group(name)
        for rank, s in enumerate(step_sums):
            labels = {**ident(rank, f"n{rank + 1}"), **TRAIN}
            g.add(series_name(sc.STEP_DURATION, "sum"), labels, seq([(60, s)]))
            g.add(series_name(sc.STEP_DURATION, "count"), labels, seq([(60, 8)]))
        for rank, s in enumerate(coll_sums or []):
            g.add(series_name(sc.COLLECTIVE_EXPOSED, "sum"), {**ident(rank, f"n{rank + 1}"), **TRAIN}, seq([(60, s)]))
        return g

    def rank(r: int) -> dict[str, str]:
        return {**ident(r, f"n{r + 1}"), **TRAIN}

    g = straggler("rank 2 computes 25 % longer (DDP: equal steps, it waits less in all-reduce)",
                  [1.5, 1.5, 1.5], [0.5, 0.5, 0.25])
    g.silent("RankStraggler", "2m").fires("RankStraggler", "2m10s", (rank(2), 1.25))
    groups.append(g)
    g = straggler("rank 2's steps 25 % longer, no collective timing", [1.0, 1.0, 1.25])
    g.fires("RankStraggler", "5m", (rank(2), 1.25))
    groups.append(g)
    g = straggler("rank 2 18.75 % slower: under the 1.2 ratio", [1.5, 1.5, 1.5], [0.5, 0.5, 0.3125])
    g.silent("RankStraggler", "5m")
    groups.append(g)
    g = straggler("single rank: no straggler", [1.0])
    g.silent("RankStraggler", "5m")
    groups.append(g)
    # Two ranks: the other rank is the peers' median (a median over both, their mean, would hide this one).
    groups.append(straggler("2 ranks: rank 1 25 % slower", [1.0, 1.25]).fires("RankStraggler", "5m", (rank(1), 1.25)))
    groups.append(straggler("2 ranks: rank 1 31.25 % slower (1.14 against the pair's mean)", [1.0, 1.3125])
                  .fires("RankStraggler", "5m", (rank(1), 1.3125)))
    groups.append(straggler("2 ranks: rank 1 18.75 % slower", [1.0, 1.1875]).silent("RankStraggler", "5m"))
    # Three ranks: the peers' median is the mean of the other two.
    groups.append(straggler("3 ranks: rank 2 against a fast and a normal peer", [0.5, 1.0, 1.25])
                  .fires("RankStraggler", "5m", (rank(2), 1.25 / 0.75)))
    groups.append(straggler("3 ranks: rank 2 12.5 % above the peers' mean", [1.0, 1.25, 1.25])
                  .silent("RankStraggler", "5m"))
    # Four ranks: the median of the other three.
    groups.append(straggler("4 ranks: two stragglers, each 25 % slower than the median of its peers",
                            [1.0, 1.0, 1.25, 1.25])
                  .fires("RankStraggler", "5m", (rank(2), 1.25), (rank(3), 1.25)))
    groups.append(straggler("4 ranks: spread out, only rank 3 is 25 % above its peers' median",
                            [0.75, 1.0, 1.125, 1.25])
                  .fires("RankStraggler", "5m", (rank(3), 1.25)))
    groups.append(straggler("4 ranks: 18.75 % is under the ratio", [1.0, 1.0, 1.0, 1.1875])
                  .silent("RankStraggler", "5m"))
    # More ranks: the job's median (exact for an even count).
    groups.append(straggler("6 ranks: one 50 % slower", [1.0, 1.0, 1.0, 1.0, 1.125, 1.5])
                  .fires("RankStraggler", "5m", (rank(5), 1.5)))
    groups.append(straggler("5 ranks: one 50 % slower", [1.0, 1.0, 1.0, 1.0, 1.5])
                  .fires("RankStraggler", "5m", (rank(4), 1.5)))

    def outliers(name: str, count: int, cost: float, steps_per_interval: int, n: int = 110) -> Group:
        """Steps of 1 s (``steps_per_interval`` per 10 s); from 300 s one outlier per interval, ``count`` of them,
        each ``cost`` seconds above the median step. The recorder creates the counters with the first step."""
        g = Group(name).started(ID, n)
        g.counter(sc.STEPS, {**ID, **TRAIN}, seq([(n, steps_per_interval)]))
        g.add(series_name(sc.STEP_DURATION, "sum"), {**ID, **TRAIN}, seq([(n, steps_per_interval)]))
        g.counter(sc.STEP_OUTLIERS, {**ID, **TRAIN}, seq([(30, 0), (count, 1), (n - 30 - count, 0)]))
        g.counter(sc.STEP_OUTLIER_EXCESS, {**ID, **TRAIN}, seq([(30, 0), (count, cost), (n - 30 - count, 0)]))
        return g

    g = outliers("11 outliers losing 6 s each: 16 % of 7 minutes' step time", 11, 6.0, 10)
    g.silent("StepOutliers", "5m").silent("StepOutliers", "6m40s")  # 10 outliers are not more than 10
    g.fires("StepOutliers", "6m50s", ({**ID, **TRAIN, **TARGET}, 66 / 410))
    g.fires("StepOutliers", "11m", ({**ID, **TRAIN, **TARGET}, 66 / 600))
    g.silent("StepOutliers", "16m50s")  # the outliers left the 10-min window
    groups.append(g)
    g = outliers("11 outliers losing 2 s each: 3.7 % of 10 minutes' step time", 11, 2.0, 10)
    groups.append(g.silent("StepOutliers", "11m"))
    g = outliers("exactly 10 outliers, 10 % of the step time", 10, 6.0, 10)
    groups.append(g.silent("StepOutliers", "8m"))
    g = outliers("11 outliers in exactly 100 steps", 11, 6.0, 2)
    groups.append(g.silent("StepOutliers", "8m20s"))
    g = outliers("12 outliers losing exactly 5 % of 10 minutes' step time", 12, 2.5, 10)
    groups.append(g.silent("StepOutliers", "11m").silent("StepOutliers", "12m"))

    g = Group("no first step after 20 min").started(ID, 130)
    g.silent("SlowInitialization", "20m").fires("SlowInitialization", "20m10s", ({**ID, **TARGET}, 1210))
    groups.append(g)
    g = Group("first step after 5 min").started(ID, 130)
    g.gauge(sc.STEP_FIRST_TIMESTAMP, ID, f"_x30 {const(300, 100)}")
    g.silent("SlowInitialization", "21m")
    groups.append(g)

    n1a, n1b = ident(0, "n1"), ident(1, "n1", local_rank=1)

    def loaders(name: str, w0: int, w1: int, cpus: int = 8) -> Group:
        g = Group(name)
        g.gauge(sc.DATALOADER_WORKERS, n1a, const(w0, 20)).gauge(sc.DATALOADER_WORKERS, n1b, const(w1, 20))
        return g.gauge(sc.CPU_AVAILABLE, n1a, const(cpus, 20))

    node = {"job_name": "resnet", "node": "n1"}
    groups.append(loaders("4 workers for 8 CPUs", 2, 2).silent("TooFewDataLoaderWorkers", "50s")
                  .fires("TooFewDataLoaderWorkers", "1m", (node, 4)).silent("TooManyDataLoaderWorkers", "2m"))
    groups.append(loaders("6 workers for 8 CPUs (over 70 %)", 3, 3).silent("TooFewDataLoaderWorkers", "2m"))
    groups.append(loaders("17 workers for 8 CPUs", 9, 8).fires("TooManyDataLoaderWorkers", "2m", (node, 17))
                  .silent("TooFewDataLoaderWorkers", "2m"))
    groups.append(loaders("16 workers for 8 CPUs (exactly 200 %)", 8, 8).silent("TooManyDataLoaderWorkers", "2m"))

    def waits(name: str, ratio_sum: float) -> Group:
        g = Group(name)
        g.add(series_name(sc.DATALOADER_WAIT_RATIO, "sum"), {**ID, **TRAIN}, seq([(40, ratio_sum)]))
        return g.add(series_name(sc.DATALOADER_WAIT_RATIO, "count"), {**ID, **TRAIN}, seq([(40, 10)]))

    groups.append(waits("steps wait 60 % of their time for data", 6.0).silent("InputBound", "1m")
                  .fires("InputBound", "1m10s", ({**ID, **TRAIN, **TARGET}, 0.6)))
    groups.append(waits("steps wait exactly 50 %", 5.0).silent("InputBound", "5m"))
    return groups


# ------------------------------------------------------------------ training checks

def training_groups() -> list[Group]:
    groups = []
    train_id, eval_id = {**ID, **TRAIN}, {**ID, "phase": "eval"}

    def losses(name: str, means: Sequence[tuple[int, float]], noise: float = 0.0, minutes: int = 45,
               first: int = 0, per_minute: int = 60) -> Group:
        """``per_minute`` training losses a minute (60 steps), ``means``: (minutes, mean loss) pieces, each step's
        loss spread by ``noise`` (standard deviation) around the mean; as the recorder's running sums."""
        g = Group(name, interval="1m").started(ID, minutes).gauge(sc.STEP_FIRST_TIMESTAMP, ID, const(first, minutes))
        finite = [(m, mean if mean == mean else None) for m, mean in means]  # NaN: no finite loss recorded
        sums = seq([(m, 0.0 if mean is None else mean * per_minute) for m, mean in finite])
        squares = seq([(m, 0.0 if mean is None else per_minute * (mean * mean + noise * noise)) for m, mean in finite])
        counts = seq([(m, 0 if mean is None else per_minute) for m, mean in finite])
        return (g.gauge(sc.LOSS_SUMMED, train_id, sums).counter(sc.LOSS_SQUARED, train_id, squares)
                .counter(sc.LOSS_RECORDED, train_id, counts))

    groups.append(losses("loss flat at 2.0", [(45, 2.0)]).silent("LossNotDecreasing", "30m")  # two windows
                  .silent("LossNotDecreasing", "35m")  # for: 5m
                  .fires("LossNotDecreasing", "36m", ({**train_id, **TARGET}, 2.0)))
    groups.append(losses("loss falls 0.05 % per window (less than 0.1 %)", [(15, 1.0), (30, 0.9995)])
                  .fires("LossNotDecreasing", "36m", ({**train_id, **TARGET}, 0.9995)))
    groups.append(losses("loss falls 0.2 % per window", [(15, 1.0), (30, 0.998)])
                  .silent("LossNotDecreasing", "36m"))
    groups.append(losses("loss decreasing steadily", [(15, 2.0), (15, 1.9), (15, 1.8)])
                  .silent("LossNotDecreasing", "40m"))
    # 10 % per-step noise, 900 steps a window: the difference of two window means has a standard error of 0.47 %
    groups.append(losses("noisy loss flat: within the noise of the means, no evidence of a plateau",
                         [(45, 1.0)], noise=0.1).silent("LossNotDecreasing", "40m"))
    groups.append(losses("noisy loss rising 1 % per window: beyond the noise", [(15, 1.0), (15, 1.01), (15, 1.02)],
                         noise=0.1).fires("LossNotDecreasing", "36m", ({**train_id, **TARGET},
                                                                        (9 * 1.01 + 6 * 1.02) / 15)))
    # 1 % noise: a standard error of 0.047 %, so a flat loss is surely not 0.1 % lower
    groups.append(losses("loss flat with 1 % noise", [(45, 1.0)], noise=0.01)
                  .fires("LossNotDecreasing", "36m", ({**train_id, **TARGET}, 1.0)))
    groups.append(losses("loss with 1 % noise falls 0.1 % per window: no sure shortfall",
                         [(15, 1.0), (15, 0.999), (15, 0.998)], noise=0.01).silent("LossNotDecreasing", "40m"))
    groups.append(losses("loss flat but no losses recorded", [(45, 2.0)], per_minute=0)
                  .silent("LossNotDecreasing", "40m"))
    groups.append(losses("training starts at 10 min, loss flat: both windows must lie in training", [(55, 2.0)],
                         minutes=55, first=600)
                  .silent("LossNotDecreasing", "31m").silent("LossNotDecreasing", "45m")
                  .fires("LossNotDecreasing", "46m", ({**train_id, **TARGET}, 2.0)))
    groups.append(losses("training resumes after a 35-min stall: no losses in the earlier window",
                         [(10, 2.0), (35, math.nan), (10, 1.9)], minutes=55)
                  .silent("LossNotDecreasing", "46m").silent("LossNotDecreasing", "50m"))
    nan = losses("the loss turns NaN at 20 min: no finite loss is recorded after", [(20, 2.0), (35, math.nan)],
                 minutes=55)
    nan.counter(sc.NONFINITE, {**train_id, "scalar": "loss"}, f"_x20 {seq([(34, 60)], 1)}")
    groups.append(nan.silent("LossNotDecreasing", "53m"))

    def spikes(name: str, values: str, phase: dict[str, str] = train_id) -> Group:
        return Group(name, interval="1m").counter(sc.LOSS_SPIKES, phase, values)

    groups.append(spikes("5 steps with a loss spike at 5 min", f"{const(0, 5)} {const(5, 20)}")
                  .silent("LossSpike", "5m").fires("LossSpike", "6m", ({**train_id, **TARGET}, 5))
                  .fires("LossSpike", "15m", ({**train_id, **TARGET}, 5)).silent("LossSpike", "16m"))
    groups.append(spikes("no spike", const(0, 20)).silent("LossSpike", "10m"))
    groups.append(spikes("a spike in an evaluation pass", f"{const(0, 5)} {const(1, 20)}", eval_id)
                  .silent("LossSpike", "6m"))

    g = Group("NaN loss at 5 min", interval="1m")
    g.counter(sc.NONFINITE, {**train_id, "scalar": "loss"}, f"_x5 {const(1, 20)}")
    g.silent("NonFiniteValues", "4m")
    g.fires("NonFiniteValues", "5m", ({**train_id, "scalar": "loss", **TARGET}, 1))
    g.silent("NonFiniteValues", "16m")  # out of the 10-min window
    groups.append(g)
    g = Group("finite values only", interval="1m")
    g.gauge(sc.LOSS, train_id, const(1.5, 20))
    groups.append(g.silent("NonFiniteValues", "10m"))

    def grads(name: str, sums: str, counts: str = seq([(20, 60)])) -> Group:
        g = Group(name, interval="1m")
        return g.counter(sc.GRAD_NORM_SUMMED, train_id, sums).counter(sc.GRAD_NORM_RECORDED, train_id, counts)

    groups.append(grads("gradient norm 1e-8", seq([(20, 60e-8)])).silent("VanishingGradients", "0m")
                  .fires("VanishingGradients", "5m", ({**train_id, **TARGET}, 1e-8)))
    groups.append(grads("one gradient norm of 1e-4 among 1e-8 norms: the mean is above the threshold",
                        seq([(5, 60e-8), (1, 1e-4 + 59e-8), (14, 60e-8)]))
                  .silent("VanishingGradients", "9m").fires("VanishingGradients", "11m", ({**train_id, **TARGET},
                                                                                          1e-8)))
    groups.append(grads("tiny gradient norms but no steps", seq([(20, 0)]), seq([(20, 0)]))
                  .silent("VanishingGradients", "10m"))
    groups.append(grads("gradient norm 2e-7 (not below the threshold)", seq([(20, 120e-7)]))
                  .silent("VanishingGradients", "10m"))

    g = Group("last step at 120 s, nothing since", interval="1m")
    g.gauge(sc.STEP_LAST_TIMESTAMP, train_id, const(120, 40))
    g.silent("TrainingStalled", "32m").fires("TrainingStalled", "33m", (IDN, 1860))  # 32m: exactly 30 min
    groups.append(g)
    g = Group("training stalled but evaluation runs", interval="1m")
    g.gauge(sc.STEP_LAST_TIMESTAMP, train_id, const(100, 40))
    g.gauge(sc.STEP_LAST_TIMESTAMP, eval_id, seq([(40, 60)]))
    groups.append(g.silent("TrainingStalled", "39m"))

    def overfit(name: str, eval_loss: float, eval_minutes: int = 30) -> Group:
        """Train losses 1.0 (60 a minute), evaluation losses ``eval_loss`` (10 a minute, for ``eval_minutes``)."""
        g = Group(name, interval="1m")
        g.gauge(sc.LOSS_SUMMED, train_id, seq([(30, 60)])).counter(sc.LOSS_RECORDED, train_id, seq([(30, 60)]))
        evals = [(eval_minutes, 10.0), (30 - eval_minutes, 0.0)] if eval_minutes < 30 else [(30, 10.0)]
        g.gauge(sc.LOSS_SUMMED, eval_id, seq([(m, c * eval_loss) for m, c in evals]))
        return g.counter(sc.LOSS_RECORDED, eval_id, seq(evals))

    groups.append(overfit("eval loss 25 % above train loss", 1.25).silent("Overfitting", "5m")
                  .fires("Overfitting", "6m", ({**ID, **TARGET}, 0.25)))
    groups.append(overfit("eval loss 6.25 % above train loss", 1.0625).silent("Overfitting", "20m"))
    groups.append(overfit("eval loss 25 % above, but no evaluation in the last 15 min", 1.25, eval_minutes=5)
                  .fires("Overfitting", "10m", ({**ID, **TARGET}, 0.25)).silent("Overfitting", "25m"))
    return groups


# ------------------------------------------------------------------ telemetry

def telemetry_groups() -> list[Group]:
    groups = []
    up = {"job": "otelprof", "instance": ID["instance"]}
    down_labels = {**up, "job_name": "resnet", "rank": "0", "node": "n1"}
    g = Group("target down after serving otelprof metrics", interval="1m")
    g.add("up", up, "1 1 1 0 0 0 0 0").gauge(sc.PROCESS_START_TIME, ID, "0 0 0 stale")
    g.silent("TargetDown", "3m").fires("TargetDown", "4m", (down_labels, 0))
    groups.append(g)
    g = Group("target down that never served otelprof metrics", interval="1m")
    g.add("up", up, "0 0 0 0 0 0")
    groups.append(g.silent("TargetDown", "5m"))

    r0, r1 = ident(0, "n1"), ident(1, "n2")
    g = Group("rank 1 vanishes while rank 0 goes on", interval="1m")
    g.started(r0, 10).gauge(sc.PROCESS_START_TIME, r1, "0 0 0 0 0 stale")
    g.silent("TelemetryAbsent", "5m").fires("TelemetryAbsent", "6m", ({"job_name": "resnet", "rank": "1",
                                                                       "node": "n2"}, 1))
    groups.append(g)
    g = Group("both ranks end together (normal completion)", interval="1m")
    g.gauge(sc.PROCESS_START_TIME, r0, "0 0 0 0 0 stale").gauge(sc.PROCESS_START_TIME, r1, "0 0 0 0 0 stale")
    groups.append(g.silent("TelemetryAbsent", "7m"))

    node = {"job_name": "resnet", "node": "n1"}
    g = Group("sampler stuck from 5 min", interval="1m")
    g.started(ID, 15).counter(sc.SAMPLER_SAMPLES, ID, seq([(5, 120), (10, 0)]))
    g.silent("SystemTelemetryAbsent", "7m").fires("SystemTelemetryAbsent", "8m", (node, 1))
    groups.append(g)
    g = Group("no sampler at all", interval="1m")
    groups.append(g.started(ID, 5).silent("SystemTelemetryAbsent", "0m").fires("SystemTelemetryAbsent", "1m",
                                                                                (node, 1)))
    g = Group("sampler running", interval="1m")
    groups.append(g.started(ID, 15).counter(sc.SAMPLER_SAMPLES, ID, seq([(15, 120)]))
                  .silent("SystemTelemetryAbsent", "10m"))

    gpu1 = {**ID, "gpu": "1", "hw_id": "GPU-1"}
    g = Group("GPU 1 disappears while the sampler runs", interval="1m")
    g.counter(sc.SAMPLER_SAMPLES, ID, seq([(15, 120)]))
    g.gauge(sc.GPU_UTILIZATION, GPU0, const(0.9, 15)).gauge(sc.GPU_UTILIZATION, gpu1, "0.9 0.9 0.9 0.9 0.9 stale")
    g.silent("GPUTelemetryAbsent", "5m").fires("GPUTelemetryAbsent", "6m", ({**node, "gpu": "1"}, 1))
    groups.append(g)
    g = Group("GPUs and sampler end together", interval="1m")
    g.counter(sc.SAMPLER_SAMPLES, ID, "0 120 240 360 480 stale")
    g.gauge(sc.GPU_UTILIZATION, GPU0, "0.9 0.9 0.9 0.9 0.9 stale")
    groups.append(g.silent("GPUTelemetryAbsent", "8m"))
    unmapped = {**ident(1, "n1"), "reason": "not_found"}
    g = Group("rank 1 was given a MIG instance NVML does not list", interval="1m")
    g.counter(sc.SAMPLER_SAMPLES, ID, seq([(15, 120)])).gauge(sc.GPU_UTILIZATION, GPU0, const(0.9, 15))
    g.gauge(sc.GPU_UNMAPPED, unmapped, const(1, 15))
    groups.append(g.silent("GPUTelemetryAbsent", "0m")
                  .fires("GPUTelemetryAbsent", "2m", ({**node, "gpu": "unmapped"}, 1)))
    g = Group("every rank names its GPU", interval="1m")
    g.counter(sc.SAMPLER_SAMPLES, ID, seq([(15, 120)])).gauge(sc.GPU_UTILIZATION, GPU0, const(0.9, 15))
    g.gauge(sc.GPU_INFO, GPU0, const(1, 15))
    groups.append(g.silent("GPUTelemetryAbsent", "10m"))

    queue = {**ID, "exporter": "queue"}
    g = Group("records dropped at 5 min", interval="1m")
    g.counter(sc.EXPORTER_DROPPED, queue, f"{const(0, 4)} {const(5, 20)}")
    groups.append(g.silent("TelemetryDropped", "4m").fires("TelemetryDropped", "5m", (queue, 5))
                  .silent("TelemetryDropped", "16m"))
    g = Group("nothing dropped", interval="1m")
    groups.append(g.counter(sc.EXPORTER_DROPPED, queue, const(0, 20)).silent("TelemetryDropped", "15m"))
    g = Group("operator spans over the per-step cap of a profiling window: a designed bound", interval="1m")
    g.counter(sc.EXPORTER_DROPPED, {**ID, "exporter": sc.DROPPED_OPERATOR_SPANS}, f"{const(0, 4)} {const(543, 20)}")
    groups.append(g.silent("TelemetryDropped", "5m").silent("TelemetryDropped", "10m"))
    from tests.rules.rules_missing import loaded_groups  # it imports this module's helpers

    return groups + loaded_groups()


# ------------------------------------------------------------------ recording rules

def recording_groups() -> list[Group]:
    g = Group("recording rules")
    _sampler(g, cpu=12, io=5)
    for labels, s, c in ((ID, 1.5, 0.5),):
        g.add(series_name(sc.STEP_DURATION, "sum"), {**labels, **TRAIN}, seq([(N, s)]))
        g.add(series_name(sc.STEP_DURATION, "count"), {**labels, **TRAIN}, seq([(N, 8)]))
        g.add(series_name(sc.COLLECTIVE_EXPOSED, "sum"), {**labels, **TRAIN}, seq([(N, c)]))
    g.histogram(UTIL, GPU0, [(N, {0.5: 20})])
    g.record("cpu_bottleneck_ratio", "10m", (ID, 0.6)).record("io_bottleneck_ratio", "10m", (ID, 0.25))
    g.record("step_compute_mean", "10m", ({**ID, **TRAIN}, 0.125))
    g.record("step_mean", "10m", ({**ID, **TRAIN}, 0.1875))
    g.record("gpu_utilization_p95", "10m", (GPU0, p(0.95, UTIL, {0.5: 20})))
    g.record("gpu_utilization_mean", "10m", ({**GPU0}, 0.5))
    return [g]


EVALUATION_INTERVAL = {"training_test.yaml": "1m", "telemetry_test.yaml": "1m", "tensors_test.yaml": "1m",
                       "rules_missing_test.yaml": "1m"}

FILES = {
    "system_test.yaml": system_groups,
    "steps_test.yaml": step_groups,
    "training_test.yaml": training_groups,
    "telemetry_test.yaml": telemetry_groups,
    "recording_test.yaml": recording_groups,
    "aggregation_test.yaml": lambda: _aggregation_groups(),
    "tensors_test.yaml": lambda: __import__("tests.rules.tensor_cases", fromlist=["_"]).tensor_groups(),
    "rules_missing_test.yaml": lambda: __import__("tests.rules.rules_missing", fromlist=["_"]).alerts_only_groups(),
}
ALERTS_ONLY = {"rules_missing_test.yaml"}
"""Files that load the alerts without the recording rules (promtool then evaluates only the alert groups)."""


def _aggregation_groups() -> list[Group]:
    from tests.rules.aggregation import aggregation_groups  # it imports this module's helpers

    return aggregation_groups()


def render_file(groups: list[Group], evaluation_interval: str = "10s", alerts_only: bool = False) -> str:
    order = group_eval_order(CONFIG)
    if alerts_only:
        loaded = {g["name"] for g in alert_groups(CONFIG)}
        order = [name for name in order if name in loaded]
    document = {"rule_files": RULE_FILES[:1] if alerts_only else RULE_FILES, "evaluation_interval": evaluation_interval,
                "group_eval_order": order, "tests": [g.data() for g in groups]}
    return yamlout.dump(document, "Generated by tests/rules/cases.py -- do not edit; run otelprof generate")


def all_groups() -> dict[str, list[Group]]:
    return {name: build() for name, build in FILES.items()}


def render_all() -> dict[str, str]:
    return {name: render_file(groups, EVALUATION_INTERVAL.get(name, "10s"), name in ALERTS_ONLY)
            for name, groups in all_groups().items()}


def write() -> list[Path]:
    changed = []
    for name, text in render_all().items():
        path = HERE / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":
    for path in write():
        print(f"updated {path}")
