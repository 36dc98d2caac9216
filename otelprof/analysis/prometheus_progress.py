"""The report's environment, training curves, step time over the run, step-time breakdown and the alerts'
datapoints, from Prometheus (the companion of :mod:`otelprof.analysis.prometheus`).

At Prometheus's resolution: the curves are ``query_range`` evaluations (at most
:data:`~otelprof.analysis.progress.MAX_POINTS` over the range) of the last recorded loss, learning rate
and gradient norm (gauges) and of the samples/tokens rates, against the main phase's steps counted by
then; a phase other than the main one keeps a point where its gauge changed (about one per evaluation
pass). Step time over the run is the mean step time per rate window, with the 99th percentile of the
window's step-duration histogram as the band and the windows in which outliers were counted marked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from otelprof import semconv as sc
from otelprof.analysis import environment as envmod
from otelprof.analysis.framework import BREAKDOWN_REGIONS, Breakdown, breakdown
from otelprof.analysis.progress import (
    MAIN_PHASE,
    MAX_OUTLIER_MARKS,
    MAX_POINTS,
    MAX_TIMELINE_PHASES,
    MAX_TIMELINE_RANKS,
    SAMPLES_PER_SECOND,
    TOKENS_PER_SECOND,
    Curve,
    Progress,
    StepTimeline,
    curve_order,
    downsample,
)
from otelprof.analysis.stats import Series
from otelprof.analysis.steps import StepAnalysis
from otelprof.analysis.system import SystemUsage
from otelprof.mixin.promql import PHASE, RANK


class _RangeClient(Protocol):
    def query_range(self, promql: str, start: float, end: float,
                    step: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]: ...


class _Queries(Protocol):
    """What these queries need of :mod:`otelprof.analysis.prometheus`'s: a job's series over a time range."""

    @property
    def client(self) -> _RangeClient: ...
    @property
    def job(self) -> str: ...
    @property
    def start(self) -> float: ...
    @property
    def end(self) -> float: ...
    @property
    def window(self) -> str: ...
    @property
    def sel(self) -> str: ...

    def s(self, spec: sc.MetricSpec, part: str = "", extra: str = "") -> str: ...

    def q(self, promql: str) -> list[tuple[dict[str, str], float]]: ...


RATE_WINDOW = 60.0
"""Seconds: rates over time use windows of at least this (and two evaluation steps)."""
KUBE_NODE_LABELS = "kube_node_labels"
"""kube-state-metrics' series of node labels (with ``--metric-labels-allowlist=nodes=[...]``)."""
INSTANCE_TYPE_LABELS = ("label_node_kubernetes_io_instance_type", "label_beta_kubernetes_io_instance_type")
SCALAR_GAUGES = ((sc.LOSS, sc.SCALAR_LOSS), (sc.LEARNING_RATE, sc.SCALAR_LEARNING_RATE),
                 (sc.GRAD_NORM, sc.SCALAR_GRAD_NORM))


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _phase(phase: str) -> str:
    return f'{PHASE}="{_esc(phase)}"'


def _key(t: float) -> int:
    return round(t * 1000)


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank) if rank.isdigit() else 1 << 30, rank)


# ------------------------------------------------------------------------------------------- environment

def environment(qs: _Queries, system: SystemUsage) -> envmod.Environment:
    """From ``target_info`` (resource attributes as labels), kube-state-metrics' node labels for the
    instance type when Prometheus has them, and the node facts of the system section."""
    wanted = {sc.prometheus_label(k): k for _, _, keys, _ in envmod.FIELDS for k in keys}
    rank_label, host, k8s_node = (sc.prometheus_label(k) for k in (sc.OTELPROF_RANK, sc.HOST_NAME,
                                                                    sc.K8S_NODE_NAME))
    job = _esc(qs.job)
    seen: dict[tuple[int, str], dict[str, Any]] = {}
    for selector in (f'target_info{{{sc.prometheus_label(sc.SERVICE_NAME)}="{job}"}}', f'target_info{{job="{job}"}}'):
        for labels, _ in qs.q(f"last_over_time({selector}[{qs.window}])"):
            rank = labels.get(rank_label, "")
            node = labels.get(k8s_node) or labels.get(host) or ""
            if not rank.isdigit():
                continue
            attrs = seen.setdefault((int(rank), node), {})
            for label, value in labels.items():
                if label in wanted and value and wanted[label] not in attrs:
                    attrs[wanted[label]] = value
    nodes = sorted({node for _, node in seen} | {n.node for n in system.nodes})
    types = _instance_types(qs, nodes)
    for (_, node), attrs in seen.items():
        if sc.HOST_TYPE not in attrs and node in types:
            attrs[sc.HOST_TYPE] = types[node]
    facts: dict[str, dict[str, str]] = {}
    for n in system.nodes:
        found = facts.setdefault(n.node, {})
        if n.cores:
            found[envmod.LOGICAL_CPUS] = str(n.cores)
        found[envmod.GPUS_SAMPLED] = str(len(n.gpus))
    subjects = [envmod.Subject(rank, node, attrs) for (rank, node), attrs in seen.items()]
    return envmod.environment(subjects, facts)


def _instance_types(qs: _Queries, nodes: list[str]) -> dict[str, str]:
    if not nodes:
        return {}
    pattern = "|".join(re.escape(n) for n in nodes)
    try:
        found = qs.q(f'last_over_time({KUBE_NODE_LABELS}{{node=~"{_esc(pattern)}"}}[{qs.window}])')
    except Exception:  # no kube-state-metrics: the instance type stays unknown
        return {}
    out = {}
    for labels, _ in found:
        value = next((labels[k] for k in INSTANCE_TYPE_LABELS if labels.get(k)), "")
        if value and labels.get("node"):
            out[labels["node"]] = value
    return out


# ------------------------------------------------------------------------------------------- curves

def grid(start: float, end: float) -> tuple[float, float, float]:
    """(first, last evaluation time, whole seconds between them) of at most MAX_POINTS + 1 evaluations that end
    at ``end`` (to the millisecond, as the queries send times): the last scrape of the range is always seen."""
    last = math.floor(end * 1000) / 1000
    step = float(max(math.ceil((last - start) / MAX_POINTS), 1))
    return last - math.floor((last - start) / step) * step, last, step


def progress(qs: _Queries, steps_per_phase: Iterable[tuple[str, int]], steps: StepAnalysis,
             origin: float) -> Progress:
    counts = dict(steps_per_phase)
    main = MAIN_PHASE if MAIN_PHASE in counts or not counts else max(counts.items(), key=lambda kv: kv[1])[0]
    first, last, step = grid(qs.start, qs.end)
    window = f"{max(RATE_WINDOW, 2 * step):.0f}s"
    clocks: dict[str, dict[int, float]] = {}
    for labels, points in qs.client.query_range(f"sum by ({RANK}) ({qs.s(sc.STEPS, extra=_phase(main))})",
                                                first, last, step):
        clocks[labels.get(RANK, "")] = {_key(t): v for t, v in points}
    curves: list[Curve] = []
    recorded: set[str] = set()
    for spec, name in SCALAR_GAUGES:
        per_phase: dict[str, tuple[str, list[tuple[float, float]]]] = {}
        for labels, points in qs.client.query_range(qs.s(spec), first, last, step):
            rank, phase = labels.get(RANK, ""), labels.get(PHASE, "")
            if phase not in per_phase or _rank_order(rank) < _rank_order(per_phase[phase][0]):
                per_phase[phase] = (rank, points)
        for phase, (rank, points) in per_phase.items():
            recorded.add(name)
            clock = clocks.get(rank, {})
            xs: list[float] = []
            ys: list[float] = []
            for t, v in points:
                x = clock.get(_key(t))
                if x is None or (phase != main and ys and v == ys[-1]):
                    continue
                xs.append(x)
                ys.append(v)
            curve = downsample(name, phase, int(rank) if rank.isdigit() else None, xs, ys, MAX_POINTS, phase != main)
            if curve is not None:
                curves.append(curve)
    lowest = min(clocks, key=_rank_order) if clocks else ""
    for spec, scalar, label in ((sc.SAMPLES, sc.SCALAR_SAMPLES, SAMPLES_PER_SECOND),
                                (sc.TOKENS, sc.SCALAR_TOKENS, TOKENS_PER_SECOND)):
        found = qs.client.query_range(f"sum(rate({qs.s(spec, extra=_phase(main))}[{window}]))", first, last, step)
        xs, ys = [], []
        for _, points in found:
            for t, v in points:
                x = clocks.get(lowest, {}).get(_key(t))
                if x is not None and math.isfinite(v) and (v > 0 or ys):  # not the windows before the first samples
                    xs.append(x)
                    ys.append(v)
        if any(ys):
            recorded.add(scalar)
            curve = downsample(label, main, None, xs, ys, MAX_POINTS)
            if curve is not None:
                curves.append(curve)
    curves.sort(key=lambda c: curve_order(c.name, c.phase, main))
    timelines, left_out = _timelines(qs, main, counts, steps, origin, (first, last, step), window)
    expected = (sc.SCALAR_LOSS, sc.SCALAR_LEARNING_RATE, sc.SCALAR_SAMPLES, sc.SCALAR_TOKENS)
    return Progress(main, tuple(curves), tuple(timelines), tuple(n for n in expected if n not in recorded), (),
                    left_out, MAX_POINTS)


def _timelines(qs: _Queries, main: str, counts: dict[str, int], steps: StepAnalysis, origin: float,
               times: tuple[float, float, float], window: str) -> tuple[list[StepTimeline], int]:
    first, last, step = times
    phases = sorted(counts, key=lambda p: (p != main, -counts[p], p))
    out: list[StepTimeline] = []
    left_out = 0
    for index, phase in enumerate(phases):
        sel = _phase(phase)
        duration_sum = qs.s(sc.STEP_DURATION, "sum", sel)
        duration_count = qs.s(sc.STEP_DURATION, "count", sel)
        means = {labels.get(RANK, ""): points for labels, points in qs.client.query_range(
            f"sum by ({RANK}) (rate({duration_sum}[{window}])) / sum by ({RANK}) (rate({duration_count}[{window}]))",
            first, last, step)}
        ranks = [r for r in means if any(math.isfinite(v) for _, v in means[r])]
        if index >= MAX_TIMELINE_PHASES:
            left_out += len(ranks)
            continue
        mean = {r: _mean(v for _, v in means[r]) for r in ranks}
        ordered = sorted(ranks, key=_rank_order)
        chosen = sorted(([ordered[0]] if ordered else [])
                        + sorted(ordered[1:], key=lambda r: -mean[r])[:MAX_TIMELINE_RANKS - 1], key=_rank_order)
        left_out += len(ranks) - len(chosen)
        if not chosen:
            continue
        rank_sel = f'{RANK}=~"{"|".join(re.escape(r) for r in chosen)}"'
        p99 = {labels.get(RANK, ""): {_key(t): v for t, v in points} for labels, points in qs.client.query_range(
            f"histogram_quantile(0.99, sum by ({RANK}, le) (rate({qs.s(sc.STEP_DURATION, 'bucket', sel)}[{window}])))",
            first, last, step)}
        marked = {labels.get(RANK, ""): [t for t, _ in points] for labels, points in qs.client.query_range(
            f"sum by ({RANK}) (increase({qs.s(sc.STEP_OUTLIERS, extra=f'{sel}, {rank_sel}')}[{window}])) > 0",
            first, last, step)}
        for rank in chosen:
            points = [(t, v) for t, v in means[rank] if math.isfinite(v)]
            at = {_key(t): v for t, v in points}
            highs = [p99.get(rank, {}).get(_key(t), math.nan) for t, _ in points]
            series = Series(tuple(t - origin for t, _ in points), tuple(v for _, v in points),
                            tuple(h if math.isfinite(h) and h >= v else v for h, (_, v) in zip(highs, points)))
            outliers = tuple((t - origin, at[_key(t)], -1) for t in marked.get(rank, []) if _key(t) in at)
            row = steps.row(int(rank), phase) if rank.isdigit() else None
            out.append(StepTimeline(int(rank) if rank.isdigit() else -1, phase, series,
                                    row.durations.count if row else 0, 1, math.nan, outliers[:MAX_OUTLIER_MARKS],
                                    row.outliers if row else 0))
    return out, left_out


def _mean(values: Iterable[float]) -> float:
    found = [v for v in values if math.isfinite(v)]
    return math.fsum(found) / len(found) if found else math.nan


# ------------------------------------------------------------------------------------------- breakdown

def breakdowns(step_time: dict[str, float], region_time: dict[tuple[str, ...], float],
               steps_per_phase: Iterable[tuple[str, int]]) -> tuple[Breakdown, ...]:
    """Per phase: step time into the four regions the integrations make at the top level, and the rest."""
    counts = dict(steps_per_phase)
    out = []
    for phase, total in step_time.items():
        if not total:
            continue
        regions = {name: region_time[(name, phase)] for name in BREAKDOWN_REGIONS if region_time.get((name, phase))}
        covered = math.fsum(regions.values())
        out.append(breakdown(phase, counts.get(phase, 0), total, regions, max(total - covered, 0.0),
                             max(covered - total, 0.0), nesting_known=False))
    return tuple(sorted(out, key=lambda b: (-b.step_time, b.phase)))


# ------------------------------------------------------------------------------------------- alerts

GUARD = f"{sc.PROCESS_START_TIME.prometheus_name}"
"""Every alert's warm-up guard reads the process start time, which every process exports: not an input."""


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def input_series(expr: str, recorded: Mapping[str, str] | None = None) -> set[str]:
    """The catalog series an alert's expression reads, also through the recording rules it reads
    (``recorded``: a recording rule's name -> its expression)."""
    names: set[str] = set()
    for spec in sc.METRICS:
        names.update(spec.prometheus_name + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count"))
    tokens = set(_NAME.findall(expr))
    pending = tokens & set(recorded or ())
    seen: set[str] = set()
    while pending and recorded:  # a recording rule may read another one
        name = pending.pop()
        seen.add(name)
        more = set(_NAME.findall(recorded[name]))
        tokens |= more
        pending |= (more & set(recorded)) - seen
    found = tokens & names
    return found - {GUARD} if found - {GUARD} else found


def datapoints(qs: _Queries, exprs: dict[str, str], recorded: Mapping[str, str] | None = None) -> dict[str, int]:
    """Per alert: the samples (scrapes) of its scarcest input series for the job over the range (through the
    recording rules ``recorded``); 0 when one of them is absent (the alert had nothing to judge)."""
    inputs = {name: input_series(expr, recorded) for name, expr in exprs.items()}
    every = sorted(set().union(*inputs.values())) if inputs else []
    if not every:
        return dict.fromkeys(exprs, 0)
    samples = {}
    for name in every:  # one query each: count_over_time drops the series name
        found = qs.q(f"sum(count_over_time({name}{{{qs.sel}}}[{qs.window}]))")
        samples[name] = int(found[0][1]) if found else 0
    return {alert: min((samples.get(s, 0) for s in series), default=0) for alert, series in inputs.items()}
