"""Typed data for Grafana's dashboard JSON model: only the parts otelprof's dashboards use.

Each class renders exactly the keys Grafana's published dashboard schema allows (the schema is a
test fixture, ``tests/fixtures/grafana-dashboard.schema.json``). Panel ids are given by the
caller and never derived from positions, so links to a panel survive edits of the dashboard.
Queries carry *expectations* that never reach the JSON: what the meaning test may find empty on a
machine without a GPU, DDP, a data-loader integration, and so on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from otelprof import semconv as sc
from otelprof.dashboards.ids import VAR_JOB
from otelprof.mixin.promql import series_name

Json = dict[str, Any]

PROMETHEUS = "prometheus"
TEMPO = "tempo"
DS_VAR = "datasource"
"""Name of the Prometheus data-source variable every Prometheus target refers to."""
TEMPO_VAR = "tempo"
"""Name of the Tempo data-source variable (Timeline dashboard)."""


def prometheus_ref() -> Json:
    return {"type": PROMETHEUS, "uid": f"${{{DS_VAR}}}"}


def tempo_ref() -> Json:
    return {"type": TEMPO, "uid": f"${{{TEMPO_VAR}}}"}


# ---------------------------------------------------------------------------------------------- targets

@dataclass(frozen=True)
class Prom:
    """One PromQL target.

    ``needs`` names what must be present for the query to return data (see ``NEEDS``); empty means
    any instrumented job returns data for it.
    """

    expr: str
    legend: str = ""
    instant: bool = False
    fmt: str = "time_series"
    """time_series, table or heatmap."""
    needs: frozenset[str] = frozenset()
    interval: str = ""

    def to_json(self, ref_id: str) -> Json:
        target: Json = {
            "datasource": prometheus_ref(),
            "editorMode": "code",
            "expr": self.expr,
            "format": self.fmt,
            "instant": self.instant,
            "legendFormat": self.legend or "__auto",
            "range": not self.instant,
            "refId": ref_id,
        }
        if self.interval:
            target["interval"] = self.interval
        if not self.instant and any(series in self.expr for series in EXEMPLAR_SERIES):
            target["exemplar"] = True  # a slow bucket's dot opens its trace
        return target


EXEMPLAR_SERIES = tuple(series_name(spec, "bucket") for spec in (sc.STEP_DURATION, sc.ANNOTATION_DURATION))
"""The histogram buckets whose exemplars link traced steps and regions (``/metrics`` in OpenMetrics): a range
query over them shows its exemplars."""


@dataclass(frozen=True)
class TraceQL:
    """One Tempo target: a TraceQL search (a table of traces) or a trace id (the trace panel)."""

    query: str
    limit: int = 20
    table_type: str = "traces"
    spans_per_set: int = 0

    def to_json(self, ref_id: str) -> Json:
        target: Json = {
            "datasource": tempo_ref(),
            "limit": self.limit,
            "query": self.query,
            "queryType": "traceql",
            "refId": ref_id,
            "tableType": self.table_type,
        }
        if self.spans_per_set:
            target["spss"] = self.spans_per_set
        return target


Target = Prom | TraceQL

NEEDS: dict[str, str] = {
    "gpu": "an NVIDIA GPU visible to the node's sampler (NVML)",
    "tensors": "tensor collections saved (OTELPROF_COLLECTIONS, PyTorch) with their metrics on",
    "tensor_flags": "a per-layer tensor check flagging a tensor (otelprof.tensor.flagged)",
    "symptom": "an otelprof alert that names a symptom or a risk (outlier steps, idle GPUs, memory, loss) firing",
    "gpm": "a Hopper-or-newer GPU (NVML GPM counters)",
    "cuda": "PyTorch using CUDA (torch.cuda memory statistics)",
    "ddp": "distributed data parallel training (collective time from the DDP hook)",
    "torch_dataloader": "a DataLoader instrumented by otelprof.torch (worker count, pin_memory)",
    "cgroup_limit": "a container CPU or memory limit (cgroup quota)",
    "grad_norm": "record('grad_norm', ...) or instrument(grad_norm=True)",
    "tokens": "record('tokens', ...)",
    "nonfinite": "a NaN or infinite loss or gradient norm",
    "alerts": "an otelprof alert pending or firing (the ALERTS series)",
    "alert_rules": "the otelprof alert rules loaded into Prometheus (ALERTS series over the range)",
    "throttling": "CPU throttling by the container's CFS quota",
    "sampler_errors": "a failed telemetry read",
    "overruns": "a telemetry sample that overran its interval",
    "dropped": "telemetry otelprof dropped",
}
"""What a query may need to return data, and what it means. Queries without needs must return data
for any instrumented job on any machine."""


# ---------------------------------------------------------------------------------------------- panels

@dataclass(frozen=True)
class Link:
    """A data link on a field: opens ``url`` (Grafana link variables allowed)."""

    title: str
    url: str
    new_tab: bool = False

    def to_json(self) -> Json:
        return {"targetBlank": self.new_tab, "title": self.title, "url": self.url}


@dataclass(frozen=True)
class Panel:
    """A visualization panel. ``kind`` is the plugin id (timeseries, table, stat, ...)."""

    id: int
    kind: str
    title: str
    description: str
    targets: Sequence[Target]
    unit: str
    w: int = 12
    h: int = 8
    options: Json = field(default_factory=dict)
    defaults: Json = field(default_factory=dict)
    """Extra ``fieldConfig.defaults`` (min, max, thresholds, mappings, custom, ...)."""
    overrides: Sequence[Json] = ()
    transformations: Sequence[Json] = ()
    links: Sequence[Link] = ()
    interval: str = ""

    @property
    def datasource(self) -> Json:
        if self.targets and all(isinstance(t, TraceQL) for t in self.targets):
            return tempo_ref()
        return prometheus_ref()

    def to_json(self, x: int, y: int) -> Json:
        defaults: Json = {"unit": self.unit, **self.defaults}
        if self.links:
            defaults["links"] = [link.to_json() for link in self.links]
        panel: Json = {
            "datasource": self.datasource,
            "description": self.description,
            "fieldConfig": {"defaults": defaults, "overrides": list(self.overrides)},
            "gridPos": {"h": self.h, "w": self.w, "x": x, "y": y},
            "id": self.id,
            "options": self.options,
            "targets": [t.to_json(_ref_id(i)) for i, t in enumerate(self.targets)],
            "title": self.title,
            "type": self.kind,
        }
        if self.transformations:
            panel["transformations"] = list(self.transformations)
        if self.interval:
            panel["interval"] = self.interval
        return panel


def _ref_id(index: int) -> str:
    return chr(ord("A") + index) if index < 26 else f"Q{index}"


@dataclass(frozen=True)
class Row:
    """A section: a row header followed by its panels, laid out left to right."""

    id: int
    title: str
    panels: Sequence[Panel]


# ---------------------------------------------------------------------------------------------- variables

@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    kind: str
    """query, datasource, textbox or custom."""
    query: str = ""
    description: str = ""
    multi: bool = False
    include_all: bool = False
    all_value: str = ""
    current: tuple[str, str] | None = None
    """(text, value) selected by default."""
    datasource: Json | None = None
    hide: int = 0

    def to_json(self) -> Json:
        var: Json = {
            "description": self.description,
            "hide": self.hide,
            "label": self.label,
            "name": self.name,
            "query": self.query,
            "skipUrlSync": False,
            "type": self.kind,
        }
        if self.kind in ("query", "datasource", "custom"):
            var["includeAll"] = self.include_all
            var["multi"] = self.multi
            var["options"] = []
            var["regex"] = ""
        if self.kind == "query":
            var["refresh"] = 2  # on time range change: jobs come and go
            var["sort"] = 7 if self.name != VAR_JOB else 1
        elif self.kind == "datasource":
            var["refresh"] = 1
        if self.include_all and self.all_value:
            var["allValue"] = self.all_value
        if self.datasource is not None:
            var["datasource"] = self.datasource
        if self.current is not None:
            text, value = self.current
            var["current"] = {"selected": True, "text": text, "value": value}
        return var


# ---------------------------------------------------------------------------------------------- dashboard

GRID_WIDTH = 24


@dataclass(frozen=True)
class DashboardLinks:
    """The menu of the other otelprof dashboards (by tag), keeping variables and time range."""

    tag: str

    def to_json(self) -> Json:
        return {"asDropdown": True, "icon": "external link", "includeVars": True, "keepTime": True,
                "tags": [self.tag], "targetBlank": False, "title": "otelprof", "tooltip": "",
                "type": "dashboards"}


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    tags: Sequence[str]
    variables: Sequence[Variable]
    rows: Sequence[Row]
    time_from: str = "now-1h"
    refresh: str = ""
    links: Sequence[DashboardLinks] = ()

    def panels(self) -> list[Panel]:
        return [p for row in self.rows for p in row.panels]

    def to_json(self) -> Json:
        panels: list[Json] = []
        y = 0
        for row in self.rows:
            panels.append({"collapsed": False, "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                           "id": row.id, "panels": [], "title": row.title, "type": "row"})
            y += 1
            x = 0
            line_height = 0
            for panel in row.panels:
                if panel.w > GRID_WIDTH:
                    raise ValueError(f"panel {panel.id} {panel.title!r} is wider than the grid")
                if x + panel.w > GRID_WIDTH:
                    y += line_height
                    x = line_height = 0
                panels.append(panel.to_json(x, y))
                x += panel.w
                line_height = max(line_height, panel.h)
            y += line_height
        board: Json = {
            "annotations": {"list": [{
                "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
                "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
                "type": "dashboard",
            }]},
            "description": self.description,
            "editable": True,
            "fiscalYearStartMonth": 0,
            "graphTooltip": 1,
            "links": [link.to_json() for link in self.links],
            "panels": panels,
            "schemaVersion": SCHEMA_VERSION,
            "tags": list(self.tags),
            "templating": {"list": [v.to_json() for v in self.variables]},
            "time": {"from": self.time_from, "to": "now"},
            "timezone": "browser",
            "title": self.title,
            "uid": self.uid,
            "version": 1,
        }
        if self.refresh:
            board["refresh"] = self.refresh
        return board


SCHEMA_VERSION = 39
"""Grafana 10.4's dashboard schema version; newer Grafana versions migrate it on load."""
