"""Recording rules that pre-aggregate for the dashboards what they would otherwise compute at every refresh.

At a few hundred ranks, a panel drawing each rank's step-time percentile per interval runs
``histogram_quantile`` over every rank's 31 buckets at every point of the graph (twice on the Ranks
dashboard: highest and lowest ranks), seconds per refresh (docs/scale.md). These rules compute it once per
evaluation; the panels read the result. Names follow ``level:metric:operations``:

* ``otelprof`` -- per training process and phase, over ``dashboard_rate_window`` (Grafana's
  ``$__rate_interval`` at the default scrape interval), grouped by the labels the dashboards filter on;
* ``otelprof_job`` -- per job and phase (``cluster``, ``namespace``, ``job_name``, ``phase``).

Labels the dashboards do not filter on (``instance``, ``pod``, ...) are summed over, as the panels did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from otelprof import semconv as sc
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.promql import JOB, LOCAL_RANK, NODE, PHASE, RANK, Q, by
from otelprof.mixin.rules import recording_names
from otelprof.semconv import MetricSpec

GROUP = "otelprof-aggregation"
PLACE = (sc.SCRAPE_LABEL_CLUSTER, sc.SCRAPE_LABEL_NAMESPACE)
"""Where a job runs: external and scrape labels the dashboards filter on (absent labels group as empty)."""
PER_PROCESS = (*PLACE, JOB, NODE, RANK, LOCAL_RANK, PHASE)
PER_JOB = (*PLACE, JOB, PHASE)
LEVELS = {PER_PROCESS: "otelprof", PER_JOB: "otelprof_job"}


@dataclass(frozen=True)
class Aggregate:
    key: str
    """Stable key the dashboards look names up by."""
    labels: tuple[str, ...]
    metric: str
    operation: str
    expr: str
    help: str

    @property
    def name(self) -> str:
        return f"{LEVELS[self.labels]}:{self.metric.removeprefix('otelprof_')}:{self.operation}"

    def rule(self) -> dict[str, Any]:
        return {"record": self.name, "expr": self.expr}


def _rate_quantile(q: Q, quantile: float, spec: MetricSpec, window: str) -> str:
    return (f"histogram_quantile({quantile:g}, sum by ({by(*PER_PROCESS, 'le')}) "
            f"(rate({q.sel(spec, 'bucket')}[{window}])))")


def aggregates(c: MixinConfig) -> list[Aggregate]:
    q = Q(c.selector)
    w = c.dashboard_rate_window
    step = sc.STEP_DURATION.prometheus_name
    wait = sc.DATALOADER_WAIT.prometheus_name
    compute = recording_names(c)["step_compute_mean"]
    return [
        Aggregate("step_p50_rate", PER_PROCESS, step, f"p50_rate{w}", _rate_quantile(q, 0.5, sc.STEP_DURATION, w),
                  f"Median step time per process and phase over each {w}."),
        Aggregate("step_p95_rate", PER_PROCESS, step, f"p95_rate{w}", _rate_quantile(q, 0.95, sc.STEP_DURATION, w),
                  f"95th percentile step time per process and phase over each {w}."),
        Aggregate("dataloader_wait_p95_rate", PER_PROCESS, wait, f"p95_rate{w}",
                  _rate_quantile(q, 0.95, sc.DATALOADER_WAIT, w),
                  f"95th percentile of each step's wait for its batch, per process and phase over each {w}."),
        Aggregate("job_step_compute_median", PER_JOB, "step_compute_seconds", f"median_{c.straggler_window}",
                  f"quantile by ({by(*PER_JOB)}) (0.5, {compute})",
                  "Median over a job's ranks of the mean compute time per step (step time less exposed collective "
                  "time): what the straggler panel divides each rank's by."),
    ]


def aggregate_names(c: MixinConfig | None = None) -> dict[str, str]:
    """Recording-rule name by key (for the dashboards)."""
    return {a.key: a.name for a in aggregates(c or MixinConfig())}


def group(c: MixinConfig) -> dict[str, Any]:
    return {"name": GROUP, "rules": [a.rule() for a in aggregates(c)]}
