"""Grafana provisioning for the dashboards: a file dashboard provider and the two data sources.

The data sources have fixed UIDs (``prometheus`` — also kube-prometheus-stack's default — and
``tempo``), which the dashboards' data-source variables select by default. Tempo links each span
to its rank's metrics (traces to metrics) and Prometheus links exemplars to Tempo.
"""

from __future__ import annotations

from typing import Any

from otelprof import semconv as sc
from otelprof.dashboards.common import PROMETHEUS_UID, TEMPO_UID
from otelprof.mixin.promql import RANK, series_name

DASHBOARDS_PATH = "/var/lib/grafana/dashboards/otelprof"
"""Where the provider reads the dashboard JSON files inside the Grafana container."""
PROMETHEUS_URL = "http://prometheus:9090"
TEMPO_URL = "http://tempo:3200"
SCRAPE_INTERVAL = "15s"
"""Prometheus's scrape interval, Grafana's lower bound for ``$__rate_interval``."""


def dashboard_provider() -> dict[str, Any]:
    return {"apiVersion": 1, "providers": [{
        "name": "otelprof",
        "orgId": 1,
        "folder": "otelprof",
        "folderUid": "otelprof",
        "type": "file",
        "disableDeletion": False,
        "allowUiUpdates": False,
        "updateIntervalSeconds": 30,
        "options": {"path": DASHBOARDS_PATH, "foldersFromFilesStructure": False},
    }]}


def _metric_query(expr: str) -> str:
    """A traces-to-metrics query; ``$$`` keeps ``$__tags`` from Grafana's env-variable expansion."""
    return expr.replace("$__tags", "$$__tags")


TEMPO_ONLY_NOTE = ("The Tempo data source alone, for a Grafana that already provisions Prometheus with uid "
                   f"`{PROMETHEUS_UID}`\n(kube-prometheus-stack does): two data sources with one uid or two "
                   "defaults break provisioning.")


def datasources(*, prometheus: bool = True, prometheus_url: str = PROMETHEUS_URL,
                tempo_url: str = TEMPO_URL) -> dict[str, Any]:
    """Prometheus and Tempo with fixed UIDs (``prometheus=False``: Tempo only) at the given URLs."""
    step = series_name(sc.STEP_DURATION, "bucket")
    step_sum = series_name(sc.STEP_DURATION, "sum")
    step_count = series_name(sc.STEP_DURATION, "count")
    wait = series_name(sc.DATALOADER_WAIT_RATIO, "sum")
    wait_count = series_name(sc.DATALOADER_WAIT_RATIO, "count")
    prometheus_source = {
        "name": "Prometheus",
        "type": "prometheus",
        "uid": PROMETHEUS_UID,
        "access": "proxy",
        "url": prometheus_url,
        "isDefault": True,
        "editable": False,
        "jsonData": {
            "httpMethod": "POST",
            "timeInterval": SCRAPE_INTERVAL,
            "exemplarTraceIdDestinations": [{"name": sc.EXEMPLAR_TRACE_ID, "datasourceUid": TEMPO_UID}],
        },
    }
    def ratio(numerator: str, denominator: str) -> str:
        return f"sum(rate({numerator}{{$__tags}}[1m])) / sum(rate({denominator}{{$__tags}}[1m]))"

    queries = [
        ("Step time p95 of this rank", f"histogram_quantile(0.95, sum by (le) (rate({step}{{$__tags}}[1m])))"),
        ("Mean step time of this rank", ratio(step_sum, step_count)),
        ("Data wait share of this rank", ratio(wait, wait_count)),
    ]
    tempo_source = {
        "name": "Tempo",
        "type": "tempo",
        "uid": TEMPO_UID,
        "access": "proxy",
        "url": tempo_url,
        "editable": False,
        "jsonData": {
            "search": {"hide": False},
            "nodeGraph": {"enabled": False},
            "tracesToMetrics": {
                "datasourceUid": PROMETHEUS_UID,
                "spanStartTimeShift": "-5m",
                "spanEndTimeShift": "5m",
                # span (resource) attribute -> Prometheus label: the job and rank of the step's process
                "tags": [{"key": sc.SERVICE_NAME, "value": sc.prometheus_label(sc.LABEL_JOB)},
                         {"key": sc.OTELPROF_RANK, "value": RANK}],
                "queries": [{"name": name, "query": _metric_query(query)} for name, query in queries],
            },
        },
    }
    sources = [prometheus_source, tempo_source] if prometheus else [tempo_source]
    return {"apiVersion": 1, "datasources": sources}
