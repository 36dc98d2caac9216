"""Dashboard UIDs, variable names and the ids of the panels alerts link to: one place for both sides.

The alert rules (``otelprof.mixin.alerts``) put a ``dashboard_url`` on every alert; each alert declares the
panel (``panel=``, one of the ids here) that shows what it judged, and its link opens that panel.
A test checks that every alert names a panel and that it exists on the dashboard the alert names.
Panel ids never change once published (links in old alerts and bookmarks rely on them); new panels get new ids.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.mixin.config import (
    DASHBOARD_GPU_SYSTEM,
    DASHBOARD_RANKS,
    DASHBOARD_TIMELINE,
    DASHBOARD_TRAINING_REPORT,
)

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

def dashboard_url(grafana_url: str, uid: str, variables: dict[str, str], panel_id: int | None = None) -> str:
    """``<grafana>/d/<uid>?var-x=...&viewPanel=<id>``; values are used as given (alert templates allowed)."""
    params = [f"var-{name}={value}" for name, value in variables.items()]
    if panel_id is not None:
        params.append(f"viewPanel={panel_id}")
    query = "&".join(params)
    return f"{grafana_url.rstrip('/')}/d/{uid}" + (f"?{query}" if query else "")
