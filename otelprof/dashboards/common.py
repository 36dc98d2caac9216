"""What every otelprof dashboard shares: variables, the dashboard menu, links between dashboards."""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards.model import (
    PROMETHEUS,
    TEMPO,
    Dashboard,
    DashboardLinks,
    Link,
    Row,
    Variable,
    prometheus_ref,
)
from otelprof.dashboards.queries import JOB_M, NODE_M, PLACE_M, Queries, Scope
from otelprof.mixin.promql import GPU, JOB, NODE, RANK

PROMETHEUS_UID = "prometheus"
"""Fixed UID of the provisioned Prometheus data source (kube-prometheus-stack's default too)."""
TEMPO_UID = "tempo"
"""Fixed UID of the provisioned Tempo data source."""

_ALL = ("All", "$__all")
_PRESENT = sc.PROCESS_START_TIME
"""Every otelprof process exports its start time: the variables list what it labels."""
_CLUSTER_M = f'{ids.VAR_CLUSTER}=~"${ids.VAR_CLUSTER}"'


def variables(qs: Queries, *, tempo: bool = False, trace_id: bool = False) -> list[Variable]:
    """datasource, cluster, namespace, job_name, node, rank, gpu (+ tempo, trace_id on the timeline)."""

    def present(place: str) -> str:
        return Scope(place, qs.config).sel(_PRESENT)

    result = [Variable(ids.VAR_DATASOURCE, "Data source", "datasource", PROMETHEUS,
                       "Prometheus that scrapes the training processes.", current=("Prometheus", PROMETHEUS_UID))]
    if tempo:
        result.append(Variable(ids.VAR_TEMPO, "Traces", "datasource", TEMPO,
                               "Tempo that receives the training processes' spans (OTLP through a collector).",
                               current=("Tempo", TEMPO_UID)))
    result += [
        Variable(ids.VAR_CLUSTER, "Cluster", "query", f"label_values({present('')}, {ids.VAR_CLUSTER})",
                 "Cluster (the cluster label of a multi-cluster Prometheus, Thanos or Mimir; empty with one cluster).",
                 multi=True, include_all=True, all_value=".*", current=_ALL, datasource=prometheus_ref()),
        Variable(ids.VAR_NAMESPACE, "Namespace", "query",
                 f"label_values({present(_CLUSTER_M)}, {ids.VAR_NAMESPACE})",
                 "Namespace of the training pods.", multi=True, include_all=True, all_value=".*", current=_ALL,
                 datasource=prometheus_ref()),
        Variable(ids.VAR_JOB, "Job", "query", f"label_values({present(PLACE_M)}, {JOB})",
                 "Training job (OTELPROF_JOB_NAME, the job_name label).", datasource=prometheus_ref()),
        Variable(ids.VAR_NODE, "Node", "query", f"label_values({present(JOB_M)}, {NODE})",
                 "Nodes of the job.", multi=True, include_all=True, all_value=".*", current=_ALL,
                 datasource=prometheus_ref()),
        Variable(ids.VAR_RANK, "Rank", "query",
                 f"label_values({present(f'{JOB_M}, {NODE_M}')}, {RANK})",
                 "Global ranks of the job on the selected nodes.", multi=True, include_all=True, all_value=".*",
                 current=_ALL, datasource=prometheus_ref()),
        Variable(ids.VAR_GPU, "GPU", "query",
                 f"label_values({qs.node.sel(sc.GPU_UTILIZATION)}, {GPU})",
                 "GPU index (NVML numbering in the container) on the selected nodes.", multi=True,
                 include_all=True, all_value=".*", current=_ALL, datasource=prometheus_ref()),
    ]
    if trace_id:
        result.append(Variable(ids.VAR_TRACE_ID, "Trace ID", "textbox", "",
                               "Trace shown in the trace panel: click a trace in the tables above, or paste an id.",
                               current=("", "")))
    return result


def dashboard(qs: Queries, uid: str, title: str, description: str, rows: list[Row], *, tempo: bool = False,
              refresh: str = "", time_from: str = "now-1h") -> Dashboard:
    return Dashboard(uid, title, description, (ids.TAG,), variables(qs, tempo=tempo, trace_id=tempo), rows,
                     time_from=time_from, refresh=refresh, links=(DashboardLinks(ids.TAG),))


def dashboard_link(title: str, uid: str, *, rank_from_field: bool = False, extra: str = "") -> Link:
    """A data link to another otelprof dashboard, keeping data source, job, nodes and time range."""
    rank = "${__field.labels.rank}" if rank_from_field else f"${{{ids.VAR_RANK}:queryparam}}"
    rank_param = f"var-{ids.VAR_RANK}={rank}" if rank_from_field else rank
    url = (f"/d/{uid}/{uid}?var-{ids.VAR_DATASOURCE}=${{{ids.VAR_DATASOURCE}}}"
           f"&${{{ids.VAR_CLUSTER}:queryparam}}&${{{ids.VAR_NAMESPACE}:queryparam}}&var-{ids.VAR_JOB}=${{{ids.VAR_JOB}}}"
           f"&${{{ids.VAR_NODE}:queryparam}}&{rank_param}&${{__url_time_range}}{extra}")
    return Link(title, url)
