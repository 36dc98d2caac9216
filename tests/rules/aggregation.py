"""promtool cases of the dashboards' pre-aggregating recording rules (otelprof.mixin.recording_rules).

Each expected value is computed here from what the input series observe, not copied from Prometheus.
"""

from __future__ import annotations

import math

from otelprof import semconv as sc
from otelprof.mixin.promql import series_name
from otelprof.mixin.recording_rules import aggregates
from tests.rules.cases import CONFIG, TRAIN, Group, _labels, ident, p, seq

AGGREGATES = {a.key: a for a in aggregates(CONFIG)}
N = 100
STEP = sc.STEP_DURATION
WAIT = sc.DATALOADER_WAIT
ROUND = 0.0001
DROPPED = ("job", "instance")
"""Target labels the rules sum over (the dashboards never filter on them)."""


def _out(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in DROPPED}


def _round(value: float) -> float:
    """PromQL's ``round(value, ROUND)``, computed as Prometheus does (the rules' float noise stays out)."""
    inverse = 1.0 / ROUND
    return math.floor(value * inverse + 0.5) / inverse


def _expect(g: Group, key: str, at: str, *expected: tuple[dict[str, str], float]) -> Group:
    name = AGGREGATES[key].name
    g.expr_tests.append({"expr": f"round({name}, {ROUND})", "eval_time": at, "exp_samples": [
        {"labels": _labels(labels), "value": _round(value)} for labels, value in sorted(
            expected, key=lambda e: sorted(e[0].items()))]})
    return g


def _steps(g: Group, labels: dict[str, str], per_interval: float, count: int, exposed: float) -> None:
    """Step sum/count and exposed-collective sum growing by the given amounts every interval."""
    g.add(series_name(STEP, "sum"), {**labels, **TRAIN}, seq([(N, per_interval)]))
    g.add(series_name(STEP, "count"), {**labels, **TRAIN}, seq([(N, count)]))
    g.add(series_name(sc.COLLECTIVE_EXPOSED, "sum"), {**labels, **TRAIN}, seq([(N, exposed)]))


def per_interval_quantiles() -> Group:
    """Two ranks of one job and one of another job in namespace ml: per-rank p50/p95 of each minute."""
    g = Group("dashboard aggregates: per-rank step and data-wait percentiles")
    fast, slow = {0.1: 8}, {0.1: 6, 0.5: 2}
    r0, r1 = ident(0, node="n1"), ident(1, node="n2")
    bert = {**ident(0, node="n9", job="bert"), "namespace": "ml"}
    for labels, observed in ((r0, fast), (r1, slow), (bert, slow)):
        g.histogram(STEP, {**labels, **TRAIN}, [(N, observed)])
        g.histogram(WAIT, {**labels, **TRAIN}, [(N, {0.01: 7, 0.2: 1})])
    for key, q in (("step_p50_rate", 0.5), ("step_p95_rate", 0.95)):
        _expect(g, key, "10m", *((_out({**labels, **TRAIN}), p(q, STEP, observed))
                                 for labels, observed in ((r0, fast), (r1, slow), (bert, slow))))
    _expect(g, "dataloader_wait_p95_rate", "10m",
            *((_out({**labels, **TRAIN}), p(0.95, WAIT, {0.01: 7, 0.2: 1})) for labels in (r0, r1, bert)))
    return g


def job_median() -> Group:
    """Three ranks with mean compute times 0.1, 0.12 and 0.2 s per step: the job's median is 0.12 s."""
    g = Group("dashboard aggregates: the job's median compute time")
    computes = (0.1, 0.12, 0.2)
    for rank, compute in enumerate(computes):
        exposed = 0.05 * 8
        _steps(g, ident(rank, node=f"n{rank}"), compute * 8 + exposed, 8, exposed)
    _steps(g, {**ident(0, node="m0", job="bert"), "namespace": "ml"}, 0.3 * 4, 4, 0.0)
    return _expect(g, "job_step_compute_median", "10m",
                   ({"job_name": "resnet", **TRAIN}, sorted(computes)[1]),
                   ({"job_name": "bert", "namespace": "ml", **TRAIN}, 0.3))


def aggregation_groups() -> list[Group]:
    return [per_interval_quantiles(), job_median()]
