"""The alert rules' offline twin: the same checks, names and thresholds, evaluated on a recording.

The mixin's alerts (:mod:`otelprof.mixin.alerts`) run in Prometheus on counters and histograms
that the training process keeps per sample and per step; here the same conditions run on the
raw samples (``samples.jsonl``) and step records (``steps.jsonl``) of a recording, at a fixed
evaluation interval, with the same windows, warm-up and ``for`` durations. Quantiles use
Prometheus's ``histogram_quantile`` on the same 5 % buckets, so both sides agree.

The result speaks the report's vocabulary: whether a check triggered, how many evaluations
fired (SageMaker's "RuleTriggered"), how many datapoints it judged, and its parameters.
Telemetry-absence alerts have no offline meaning (the recording is the telemetry) and the
data-loader worker checks need framework gauges, so those are not evaluated here.

Each group of checks lives in a module of its own (``*_checks``), listed once in :data:`GROUPS`;
this module runs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from otelprof.analysis import step_checks, system_checks, training_checks
from otelprof.analysis.check_context import CheckContext, CheckGroup, Conditions, Firing
from otelprof.analysis.check_recording import rank_data
from otelprof.analysis.check_tables import RankData
from otelprof.mixin.alert_model import Alert
from otelprof.mixin.alerts import alerts
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.recording.ranks import Recording

__all__ = ["GROUPS", "OFFLINE_CHECKS", "CheckResult", "evaluate", "evaluate_ranks", "firing_at"]

GROUPS: tuple[CheckGroup, ...] = (
    system_checks.GROUP,
    step_checks.GROUP,
    training_checks.GROUP,
)
"""The groups of checks in runbook order (output and JSON keep it): a new group is one line here."""

OFFLINE_CHECKS = tuple(short for group in GROUPS for short in group.checks)
"""Alerts (names without the prefix) that have an offline twin."""


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict over the run, in the report's vocabulary."""

    alert: str
    original: str
    severity: str
    triggered: bool
    evaluations: int
    firing_evaluations: int
    """Evaluations at which the alert was firing (the report's "triggered N times")."""
    datapoints: int
    first_fired: float | None
    value: float | None
    """The alert's value when it first fired."""
    subjects: tuple[str, ...]
    parameters: tuple[tuple[str, str], ...]


def conditions(ctx: CheckContext) -> Conditions:
    """Condition and datapoint count per alert short name, in :data:`OFFLINE_CHECKS` order. Datapoints are what
    the check reads (GPU samples, losses, ...); a check that never judged them (no data, or never past its
    warm-up) gets 0 in :func:`evaluate_ranks`, reported as "no data", never "ok"."""
    return {short: entry for group in GROUPS for short, entry in group.conditions(ctx).items()}


def evaluate_ranks(ranks: list[RankData], config: MixinConfig | None = None, interval: float = 10.0,
                   start: float | None = None, end: float | None = None,
                   only: Collection[str] | None = None) -> list[CheckResult]:
    """Evaluate every offline-capable check (``only``: those of these short names) every ``interval`` seconds
    from ``start`` to ``end``."""
    config = config or MixinConfig()
    if not ranks:
        return []
    start = min(r.process_start for r in ranks) if start is None else start
    end = max(max(r.end for r in ranks) if end is None else end, start)
    times = [start + i * interval for i in range(int((end - start) // interval) + 1)]
    if times[-1] < end:
        times.append(end)  # judge the recording's last data too
    ctx = CheckContext(ranks, config)
    by_short = {a.short: a for a in alerts(config)}
    checks = [(short, by_short[short], condition, datapoints) for short, (condition, datapoints)
              in conditions(ctx).items() if short in by_short  # not those disabled in the config
              and (only is None or short in only)]
    states = [list(_states(alert, condition(times), times)) for _, alert, condition, _ in checks]
    results = []
    for (short, alert, _, datapoints), kept in zip(checks, states):
        result = _run(alert, kept, datapoints, times)
        if short not in ctx.judged:  # never past its warm-up, or never with data in its windows
            result = dataclasses.replace(result, datapoints=0)
        results.append(result)
    return results


def firing_at(ranks: list[RankData], config: MixinConfig, interval: float, at: Sequence[float],
              start: float = 0.0) -> dict[float, set[tuple[str, str]]]:
    """(alert name, subject) pairs firing at each time of ``at`` (evaluating every ``interval`` from ``start``)."""
    ctx = CheckContext(ranks, config)
    by_short = {a.short: a for a in alerts(config)}
    last = max(at)
    times = [start + i * interval for i in range(int((last - start) // interval) + 1)]
    out: dict[float, set[tuple[str, str]]] = {t: set() for t in at}
    for short, (condition, _) in conditions(ctx).items():
        alert = by_short.get(short)
        if alert is None:
            continue
        for t, firing in _states(alert, condition(times), times):
            if t in out:
                out[t] |= {(alert.name, f.subject) for f in firing}
    return out


def _states(alert: Alert, found: Sequence[list[Firing]],
            times: Sequence[float]) -> Iterable[tuple[float, list[Firing]]]:
    """Prometheus's pending -> firing logic: a subject fires once its condition held for ``for`` (``found``: the
    subjects for which it held at each time)."""
    hold = seconds(alert.for_)
    active: dict[str, float] = {}
    for t, holding in zip(times, found):
        current = {f.subject: f for f in holding}
        active = {s: active.get(s, t) for s in current}
        yield t, [current[s] for s in sorted(current) if t - active[s] >= hold]


def _run(alert: Alert, states: Iterable[tuple[float, list[Firing]]], datapoints: int,
         times: Sequence[float]) -> CheckResult:
    """The verdict of one check from its :func:`_states` at every evaluation time."""
    firing_evaluations = 0
    first: float | None = None
    value: float | None = None
    subjects: set[str] = set()
    for t, firing in states:
        if firing:
            firing_evaluations += 1
            subjects |= {f.subject for f in firing}
            if first is None:
                first, value = t, firing[0].value
    return CheckResult(alert.name, alert.runbook.original, alert.severity, first is not None, len(times),
                       firing_evaluations, datapoints, first, value, tuple(sorted(subjects)),
                       alert.runbook.thresholds)


def evaluate(recording: Recording, config: MixinConfig | None = None, interval: float = 10.0,
             only: Collection[str] | None = None) -> list[CheckResult]:
    """Every offline-capable alert check on a recording (all ranks; ``only``: those of these short names)."""
    return evaluate_ranks([rank_data(r, config) for r in recording.ranks], config, interval, only=only)


HALF = frozenset({"GPUUnderutilized", "GPUUtilizationFluctuating", "BatchSizeTooSmall", "GPUMemoryIncrease",
                  "GPUMemoryNearCapacity", "HostMemoryIncrease", "HostMemoryNearLimit", "GPULoadImbalance"})
"""About half the checks' work on a large recording (at 1,024 ranks each half takes about as long, 2.7-2.8
CPU-s): the GPU and memory checks, which share their GPU series' least values, extents and windows; what one of
two processes evaluates, the other evaluating the rest (the CPU and I/O bottleneck checks, the step and
training checks)."""
