"""Dashboard UIDs, variable names and the ids of the panels alerts link to: one place for both sides.

The alert rules (``otelprof.mixin.alerts``) put a ``dashboard_url`` on every alert; with
:func:`alert_panel` they can point at the exact panel that shows what the alert judged.
A test checks that every alert has a panel here, that it is on the dashboard the alert names,
and that the panel exists. Panel ids never change once published (links in old alerts and
bookmarks rely on them); new panels get new ids.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.mixin.config import (
    DASHBOARD_GPU_SYSTEM,
    DASHBOARD_RANKS,
    DASHBOARD_TIMELINE,
    DASHBOARD_TRAINING_REPORT,
)
from otelprof.tensor_checks import LAYER_RULES, OVERTRAINING

TRAINING_REPORT = DASHBOARD_TRAINING_REPORT
TIMELINE = DASHBOARD_TIMELINE
GPU_SYSTEM = DASHBOARD_GPU_SYSTEM
RANKS = DASHBOARD_RANKS
ALL_UIDS = (TRAINING_REPORT, TIMELINE, GPU_SYSTEM, RANKS)
TAG = "otelprof"

# Variable names (URL parameters are var-<name>): the Prometheus label names they filter.
VAR_DATASOURCE = "datasource"
VAR_TEMPO = "tempo"
# Variables are named after the labels they filter, so alert links can set them.
VAR_JOB = sc.prometheus_label(sc.LABEL_JOB)
VAR_NODE = sc.prometheus_label(sc.LABEL_NODE)
VAR_RANK = sc.prometheus_label(sc.LABEL_RANK)
VAR_GPU = sc.prometheus_label(sc.LABEL_GPU)
VAR_TRACE_ID = "trace_id"
VAR_CLUSTER = sc.SCRAPE_LABEL_CLUSTER
"""The cluster label of a multi-cluster setup (Thanos, Mimir: an external label); All matches series without it."""
VAR_NAMESPACE = sc.SCRAPE_LABEL_NAMESPACE
"""The training pods' namespace (PodMonitor and scrape config target label); All matches series without it."""

# ---- Training report
REPORT_VERDICT = 51
REPORT_COSTS = 52
REPORT_CAUSES = 53
REPORT_SYMPTOMS = 54
REPORT_WHERE_TIME_GOES = 55
REPORT_INITIALIZATION = 104
REPORT_STEP_TABLE = 601
REPORT_STEP_TIME = 603
REPORT_LOSS = 1401
REPORT_NONFINITE = 1402
REPORT_GRAD_NORM = 1403
REPORT_TOP_OPERATORS = 1501
REPORT_TOP_KERNELS = 1502
REPORT_OPERATOR_CATEGORIES = 1503
REPORT_MFU = 1601
REPORT_FLOPS_ACHIEVED = 1602
REPORT_DEVICE_TIME = 1604
REPORT_TOP_ALLOCATIONS = 1605
REPORT_WINDOW_MEMORY_PEAK = 1606
REPORT_OVERLAP = 1607
REPORT_LAYER_FLAGS = 1701
REPORT_LAYER_GRADIENTS = 1702
REPORT_LAYER_GRADIENT_NORMS = 1703

# ---- GPU & system
SYSTEM_CPU_BOTTLENECK = 301
SYSTEM_IO_BOTTLENECK = 302
SYSTEM_SAMPLER = 305
SYSTEM_CONTAINER_MEMORY = 202
SYSTEM_PROCESS_MEMORY = 203
SYSTEM_GPU_UTILIZATION = 401
SYSTEM_GPU_QUANTILES = 402
SYSTEM_GPU_BALANCE = 404
SYSTEM_BATCH_SIZE = 405
SYSTEM_GPU_MEMORY = 406
SYSTEM_DATALOADER_WORKERS = 501

# ---- Ranks
RANKS_STRAGGLER = 102
RANKS_WAIT_RATIO = 201
RANKS_LAST_STEP = 301
RANKS_REPORTING = 401
RANKS_TARGETS = 402
RANKS_DROPPED = 403

# ---- Timeline
TIMELINE_STEP_TIME = 201
TIMELINE_OUTLIER_TRACES = 302

ALERT_PANELS: dict[str, tuple[str, int]] = {
    "CPUBottleneck": (GPU_SYSTEM, SYSTEM_CPU_BOTTLENECK),
    "IOBottleneck": (GPU_SYSTEM, SYSTEM_IO_BOTTLENECK),
    "GPUUnderutilized": (GPU_SYSTEM, SYSTEM_GPU_QUANTILES),
    "GPUUtilizationFluctuating": (GPU_SYSTEM, SYSTEM_GPU_QUANTILES),
    "BatchSizeTooSmall": (GPU_SYSTEM, SYSTEM_BATCH_SIZE),
    "GPUMemoryIncrease": (GPU_SYSTEM, SYSTEM_GPU_MEMORY),
    "GPUMemoryNearCapacity": (GPU_SYSTEM, SYSTEM_GPU_MEMORY),
    "HostMemoryIncrease": (GPU_SYSTEM, SYSTEM_PROCESS_MEMORY),
    "HostMemoryNearLimit": (GPU_SYSTEM, SYSTEM_CONTAINER_MEMORY),
    "GPULoadImbalance": (GPU_SYSTEM, SYSTEM_GPU_BALANCE),
    "RankStraggler": (RANKS, RANKS_STRAGGLER),
    "StepOutliers": (TIMELINE, TIMELINE_OUTLIER_TRACES),
    "SlowInitialization": (TRAINING_REPORT, REPORT_INITIALIZATION),
    "TooFewDataLoaderWorkers": (GPU_SYSTEM, SYSTEM_DATALOADER_WORKERS),
    "TooManyDataLoaderWorkers": (GPU_SYSTEM, SYSTEM_DATALOADER_WORKERS),
    "InputBound": (RANKS, RANKS_WAIT_RATIO),
    "LossNotDecreasing": (TRAINING_REPORT, REPORT_LOSS),
    "LossSpike": (TRAINING_REPORT, REPORT_LOSS),
    "NonFiniteValues": (TRAINING_REPORT, REPORT_NONFINITE),
    "VanishingGradients": (TRAINING_REPORT, REPORT_GRAD_NORM),
    "TrainingStalled": (RANKS, RANKS_LAST_STEP),
    "Overfitting": (TRAINING_REPORT, REPORT_LOSS),
    "TargetDown": (RANKS, RANKS_TARGETS),
    "TelemetryAbsent": (RANKS, RANKS_REPORTING),
    "SystemTelemetryAbsent": (GPU_SYSTEM, SYSTEM_SAMPLER),
    "GPUTelemetryAbsent": (GPU_SYSTEM, SYSTEM_GPU_UTILIZATION),
    "TelemetryDropped": (RANKS, RANKS_DROPPED),
    "RecordingRulesMissing": (RANKS, RANKS_STRAGGLER),
    **{check: (TRAINING_REPORT, REPORT_LAYER_FLAGS) for check in LAYER_RULES},
    OVERTRAINING: (TRAINING_REPORT, REPORT_LOSS),
}
"""Alert name without the ``Otelprof`` prefix -> (dashboard uid, panel id) that shows its evidence."""


def alert_panel(short_name: str) -> tuple[str, int] | None:
    """(dashboard uid, panel id) for an alert (name without prefix), or None if it has none."""
    return ALERT_PANELS.get(short_name)


def dashboard_url(grafana_url: str, uid: str, variables: dict[str, str], panel_id: int | None = None) -> str:
    """``<grafana>/d/<uid>?var-x=...&viewPanel=<id>``; values are used as given (alert templates allowed)."""
    params = [f"var-{name}={value}" for name, value in variables.items()]
    if panel_id is not None:
        params.append(f"viewPanel={panel_id}")
    query = "&".join(params)
    return f"{grafana_url.rstrip('/')}/d/{uid}" + (f"?{query}" if query else "")
