"""PromQL for the dashboards: selectors bound to the dashboard variables, statistics over the range.

Metric names come from the catalog (:mod:`otelprof.semconv`) through the mixin's PromQL helpers,
recording-rule names from :func:`otelprof.mixin.rules.recording_names`; nothing is hand-typed. What depends on
the mixin config (selectors, the train phase, recording-rule names) is bound to one config by :class:`Queries`.

Statistics "over the range" use the dashboard's time range (``$__range``) and the mixin's exact
window differences (``x - (x offset W or x * 0)``): a job that starts inside the range counts from
its first sample, and histogram buckets keep the exact per-step / per-sample distributions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.mixin.config import GPU_SOURCE_DCGM, MixinConfig
from otelprof.mixin.gpu_source import RECORD_BY_SERIES
from otelprof.mixin.promql import GPU, JOB, NODE, PHASE, RANK, Q, series_name
from otelprof.mixin.recording_rules import aggregate_names
from otelprof.mixin.rules import recording_names
from otelprof.semconv import MetricSpec

RANGE = "$__range"
RANGE_S = "$__range_s"
RATE = "$__rate_interval"
INTERVAL = "$__interval"

PLACE_M = f'{ids.VAR_CLUSTER}=~"${ids.VAR_CLUSTER}", {ids.VAR_NAMESPACE}=~"${ids.VAR_NAMESPACE}"'
"""Cluster and namespace (multi-cluster, several training namespaces); their All (``.*``) also matches no label."""
JOB_M = f'{PLACE_M}, {JOB}="${ids.VAR_JOB}"'
NODE_M = f'{NODE}=~"${ids.VAR_NODE}"'
RANK_M = f'{RANK}=~"${ids.VAR_RANK}"'
GPU_M = f'{GPU}=~"${ids.VAR_GPU}"'


class Scope(Q):
    """The series of the dashboard variables' selection (``place``), read as ``config`` says.

    A raw otelprof series gets the config's ``selector`` before ``place`` (as the rules filter their inputs); with
    ``gpu_source=dcgm`` a GPU gauge is the dcgm-exporter record standing for it, and a recording rule's series
    (:meth:`Queries.rule`) is filtered by ``place`` only: its rule applied the selector already.
    """

    def __init__(self, place: str, config: MixinConfig) -> None:
        super().__init__(", ".join(m for m in (config.selector.strip(), place) if m))
        self.place = place
        self.records = RECORD_BY_SERIES if config.gpu_source == GPU_SOURCE_DCGM else {}

    def sel(self, spec: MetricSpec, part: str = "", matchers: str = "") -> str:
        record = self.records.get(series_name(spec, part))
        if record is None:
            return super().sel(spec, part, matchers)
        return filtered(record, self.place, matchers)


def filtered(name: str, *matchers: str) -> str:
    """``name{matchers}`` (the non-empty ones), or the bare name."""
    inner = ", ".join(m for m in matchers if m)
    return f"{name}{{{inner}}}" if inner else name


class Queries:
    """What the panels read, for one mixin config: every threshold, window, selector and recording-rule name the
    dashboards show comes from ``config`` (``otelprof mixin --set``), never from a default."""

    def __init__(self, config: MixinConfig) -> None:
        self.config = config
        self.train = f'{PHASE}="{config.train_phase}"'
        """Matcher of the training phase's series."""
        self.proc = Scope(f"{JOB_M}, {NODE_M}, {RANK_M}", config)
        """Per-process series (every rank): steps, annotations, process telemetry."""
        self.node = Scope(f"{JOB_M}, {NODE_M}", config)
        """Node-wide series, sampled by one process per node: host, container, coincidences."""
        self.gpu = Scope(f"{JOB_M}, {NODE_M}, {GPU_M}", config)
        """Per-GPU series."""
        self.job = Scope(JOB_M, config)
        self.rules = {**recording_names(config), **aggregate_names(config)}

    def rule(self, key: str, scope: Scope, matchers: str = "") -> str:
        """A recording rule's series (the rules ``config`` generates), filtered like ``scope`` (plus ``matchers``)."""
        inner = ", ".join(m for m in (scope.place, matchers) if m)
        return f"{self.rules[key]}{{{inner}}}"


def percent(value: float) -> str:
    """A ratio as the panels quote it: ``0.5`` -> ``50%``, ``0.333`` -> ``33.3%``."""
    return f"{value * 100:g}%"


def all_below(thresholds: Sequence[float], quote: Callable[[float], str] = percent) -> str:
    """``all below 70%`` when the thresholds agree, else ``below 70%, 60% and 50% respectively``."""
    if len(set(thresholds)) == 1:
        return f"all below {quote(thresholds[0])}"
    quoted = [quote(t) for t in thresholds]
    return f"below {', '.join(quoted[:-1])} and {quoted[-1]} respectively"


def batch_size_thresholds(c: MixinConfig) -> tuple[float, float, float]:
    """The batch-size alert's 95th-percentile thresholds: GPU utilization, GPU memory, the node's CPU."""
    return c.batch_size_gpu_threshold_p95, c.batch_size_gpu_memory_threshold_p95, c.batch_size_cpu_threshold_p95


def whole(value: float) -> float:
    """``value``, as an int when it is one (a threshold step writes ``1200``, not ``1200.0``)."""
    return int(value) if value == int(value) else value


def by(*labels: str) -> str:
    return ", ".join(labels)


# ---------------------------------------------------------------------------------------------- over the range

def total(q: Q, spec: MetricSpec, labels: tuple[str, ...], part: str = "", matchers: str = "") -> str:
    """Growth of a cumulative series over the dashboard range, summed by ``labels``."""
    return f"sum by ({by(*labels)}) ({q.delta(spec, RANGE, part, matchers)})"


def mean(q: Q, spec: MetricSpec, labels: tuple[str, ...], matchers: str = "") -> str:
    """Exact mean of a histogram's observations over the range."""
    return f"{total(q, spec, labels, 'sum', matchers)} / {total(q, spec, labels, 'count', matchers)}"


def quantile(quantile_: float, q: Q, spec: MetricSpec, labels: tuple[str, ...], matchers: str = "") -> str:
    """Quantile of a histogram's observations over the range (Prometheus's bucket interpolation).

    ``quantile_ == 1`` gives the upper bound of the highest non-empty bucket.
    """
    return f"histogram_quantile({quantile_:g}, {total(q, spec, (*labels, 'le'), 'bucket', matchers)})"


def first(q: Q, spec: MetricSpec, labels: tuple[str, ...] = ()) -> str:
    """Smallest value of a gauge over the range (min over ``labels`` groups)."""
    grouping = f" by ({by(*labels)})" if labels else ""
    return f"min{grouping} (min_over_time({q.sel(spec)}[{RANGE}]))"


def last(q: Q, spec: MetricSpec, labels: tuple[str, ...] = ()) -> str:
    grouping = f" by ({by(*labels)})" if labels else ""
    return f"max{grouping} (max_over_time({q.sel(spec)}[{RANGE}]))"


def last_seen(q: Q, labels: tuple[str, ...] = ()) -> str:
    """Unix time of the last scrape of the processes over the range (the job's end, or now)."""
    grouping = f" by ({by(*labels)})" if labels else ""
    return f"max{grouping} (max_over_time(timestamp({q.sel(sc.PROCESS_START_TIME)})[{RANGE}:{INTERVAL}]))"


def loop_in_range(q: Q, labels: tuple[str, ...] = ()) -> str:
    """Seconds of the training loop inside the range: last step end - max(first step start, range start)."""
    grouping = f" by ({by(*labels)})" if labels else ""
    return (f"(max{grouping} (max_over_time({q.sel(sc.STEP_LAST_TIMESTAMP)}[{RANGE}])) - "
            f"clamp_min(max{grouping} (min_over_time({q.sel(sc.STEP_FIRST_TIMESTAMP)}[{RANGE}])), "
            f"time() - {RANGE_S}))")


def over_time(func: str, expr: str) -> str:
    """``func`` (e.g. ``max_over_time``, ``quantile_over_time(0.95,``) of ``expr`` scraped over the range."""
    if func.endswith(","):
        return f"{func} {expr}[{RANGE}:{INTERVAL}])"
    return f"{func}({expr}[{RANGE}:{INTERVAL}])"


# ---------------------------------------------------------------------------------------------- over time

def rate(q: Q, spec: MetricSpec, part: str = "", matchers: str = "") -> str:
    return f"rate({q.sel(spec, part, matchers)}[{RATE}])"


def increase(q: Q, spec: MetricSpec, part: str = "", matchers: str = "") -> str:
    return f"increase({q.sel(spec, part, matchers)}[{RATE}])"


def rate_quantile(quantile_: float, q: Q, spec: MetricSpec, labels: tuple[str, ...], matchers: str = "") -> str:
    return f"histogram_quantile({quantile_:g}, sum by ({by(*labels, 'le')}) ({rate(q, spec, 'bucket', matchers)}))"


def rate_mean(q: Q, spec: MetricSpec, labels: tuple[str, ...], matchers: str = "") -> str:
    return (f"sum by ({by(*labels)}) ({rate(q, spec, 'sum', matchers)}) / "
            f"sum by ({by(*labels)}) ({rate(q, spec, 'count', matchers)})")


def heatmap(q: Q, spec: MetricSpec, matchers: str = "") -> str:
    """Observations per bucket and interval, for a heatmap of a histogram."""
    return f"sum by (le) ({increase(q, spec, 'bucket', matchers)})"


def cpu_busy(q: Q) -> str:
    """Per logical CPU: share of the last sample interval not idle and not in iowait."""
    cpu = sc.prometheus_label(sc.LABEL_CPU)
    mode = sc.prometheus_label(sc.LABEL_CPU_MODE)
    idle = q.sel(sc.SYSTEM_CPU_UTILIZATION, matchers=mode + '=~"idle|iowait"')
    return f"1 - sum by ({by(JOB, NODE, cpu)}) ({idle})"


def iowait(q: Q) -> str:
    mode = sc.prometheus_label(sc.LABEL_CPU_MODE)
    return q.sel(sc.SYSTEM_CPU_UTILIZATION, matchers=f'{mode}="iowait"')


def label(expr: str, name: str, value: str) -> str:
    """``expr`` with a constant label added (to tell unioned rows apart in a table)."""
    return f'label_replace({expr}, "{name}", "{value}", "", "")'


# ---------------------------------------------------------------------------------------------- units

_UNITS = {"s": "s", "By": "bytes", "1": "percentunit", "W": "watt", "Cel": "celsius", "Hz": "hertz",
          "By/s": "Bps", "": "none"}


def unit(spec: MetricSpec) -> str:
    """Grafana unit id for a catalog metric."""
    if spec.unit.startswith("{"):
        return "short"
    return _UNITS[spec.unit]

