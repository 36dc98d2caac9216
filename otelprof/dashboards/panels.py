"""Panel constructors: one function per visualization, with the options otelprof uses everywhere."""

from __future__ import annotations

from collections.abc import Sequence

from otelprof.dashboards.model import Json, Link, Panel, Prom, Target

GREEN = "green"
YELLOW = "#EAB839"
RED = "red"


def thresholds(*steps: tuple[float | None, str]) -> Json:
    """Absolute thresholds; the first step's value is None (minus infinity)."""
    return {"mode": "absolute", "steps": [{"color": color, "value": value} for value, color in steps]}


def _reduce(calc: str = "lastNotNull") -> Json:
    return {"calcs": [calc], "fields": "", "values": False}


def timeseries(id: int, title: str, description: str, targets: Sequence[Target], unit: str, *, w: int = 12,
               h: int = 8, stack: bool = False, bars: bool = False, min: float | None = None,
               max: float | None = None, line_at: float | None = None, links: Sequence[Link] = (),
               legend_table: bool = False) -> Panel:
    """Lines (or bars) over time. ``line_at`` draws a red threshold line (an alert's threshold)."""
    custom: Json = {
        "drawStyle": "bars" if bars else "line", "fillOpacity": 60 if bars else (25 if stack else 8),
        "lineWidth": 1, "showPoints": "never", "spanNulls": False,
        "stacking": {"group": "A", "mode": "normal" if stack else "none"},
    }
    defaults: Json = {"custom": custom, "color": {"mode": "palette-classic"}}
    if min is not None:
        defaults["min"] = min
    if max is not None:
        defaults["max"] = max
    if line_at is not None:
        custom["thresholdsStyle"] = {"mode": "line+area"}
        defaults["thresholds"] = thresholds((None, "transparent"), (line_at, RED))
    legend: Json = {"calcs": ["mean", "max", "lastNotNull"] if legend_table else [],
                    "displayMode": "table" if legend_table else "list", "placement": "bottom", "showLegend": True}
    return Panel(id, "timeseries", title, description, targets, unit, w=w, h=h, defaults=defaults, links=links,
                 options={"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}})


def stat(id: int, title: str, description: str, targets: Sequence[Target], unit: str, *, w: int = 4,
         h: int = 4, calc: str = "lastNotNull", steps: Sequence[tuple[float | None, str]] = ((None, "blue"),),
         decimals: int | None = None, mappings: Sequence[Json] = ()) -> Panel:
    defaults: Json = {"color": {"mode": "thresholds"}, "thresholds": thresholds(*steps)}
    if decimals is not None:
        defaults["decimals"] = decimals
    if mappings:
        defaults["mappings"] = list(mappings)
    return Panel(id, "stat", title, description, targets, unit, w=w, h=h, defaults=defaults, options={
        "colorMode": "value", "graphMode": "none", "justifyMode": "auto", "orientation": "auto",
        "reduceOptions": _reduce(calc), "showPercentChange": False, "textMode": "auto", "wideLayout": True,
    })


def bargauge(id: int, title: str, description: str, targets: Sequence[Target], unit: str, *, w: int = 12,
             h: int = 8, min: float | None = 0, max: float | None = None,
             steps: Sequence[tuple[float | None, str]] = ((None, "blue"),)) -> Panel:
    defaults: Json = {"color": {"mode": "thresholds"}, "thresholds": thresholds(*steps)}
    if min is not None:
        defaults["min"] = min
    if max is not None:
        defaults["max"] = max
    return Panel(id, "bargauge", title, description, targets, unit, w=w, h=h, defaults=defaults, options={
        "displayMode": "gradient", "maxVizHeight": 300, "minVizHeight": 16, "minVizWidth": 8,
        "namePlacement": "auto", "orientation": "horizontal", "reduceOptions": _reduce(), "showUnfilled": True,
        "sizing": "auto", "valueMode": "color",
    })


def heatmap(id: int, title: str, description: str, expr: str, unit: str, *, w: int = 12, h: int = 8,
            needs: frozenset[str] = frozenset()) -> Panel:
    """A heatmap of a Prometheus histogram: ``expr`` gives observations per ``le`` bucket and interval."""
    target = Prom(expr, "{{le}}", fmt="heatmap", needs=needs)
    return Panel(id, "heatmap", title, description, [target], "short", w=w, h=h,
                 defaults={"custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                                      "scaleDistribution": {"type": "linear"}}},
                 options={
                     "calculate": False, "cellGap": 1, "cellValues": {"unit": "short"},
                     "color": {"exponent": 0.5, "fill": "dark-orange", "mode": "scheme", "reverse": False,
                               "scale": "exponential", "scheme": "Oranges", "steps": 64},
                     "exemplars": {"color": "rgba(255,0,255,0.7)"}, "filterValues": {"le": 1e-09},
                     "legend": {"show": True}, "rowsFrame": {"layout": "auto"},
                     "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": False},
                     "yAxis": {"axisPlacement": "left", "reverse": False, "unit": unit},
                 })


def state_timeline(id: int, title: str, description: str, targets: Sequence[Target], unit: str, *,
                   steps: Sequence[tuple[float | None, str]], mappings: Sequence[Json] = (), w: int = 24,
                   h: int = 6) -> Panel:
    return Panel(id, "state-timeline", title, description, targets, unit, w=w, h=h,
                 defaults={"color": {"mode": "thresholds"}, "thresholds": thresholds(*steps),
                           "mappings": list(mappings), "custom": {"fillOpacity": 75, "lineWidth": 0}},
                 options={"alignValue": "left", "legend": {"displayMode": "list", "placement": "bottom",
                                                           "showLegend": True},
                          "mergeValues": True, "rowHeight": 0.9, "showValue": "never",
                          "tooltip": {"mode": "single", "sort": "none"}})


def value_map(mapping: dict[str, tuple[str, str]]) -> Json:
    """A value mapping: raw value -> (text, color)."""
    return {"type": "value", "options": {value: {"color": color, "index": i, "text": text}
                                         for i, (value, (text, color)) in enumerate(mapping.items())}}


def table(id: int, title: str, description: str, columns: Sequence[tuple[str, Prom, str]],
          labels: Sequence[tuple[str, str]], *, w: int = 24, h: int = 8, default_unit: str = "short",
          sort_by: str = "") -> Panel:
    """A table joining instant queries on their labels: one column per (header, query, unit).

    ``labels`` are the (label, header) columns to show, in order; other labels are hidden.
    """
    targets = [Prom(q.expr, q.legend, instant=True, fmt="table", needs=q.needs) for _, q, _ in columns]
    refs = [chr(ord("A") + i) for i in range(len(columns))]
    value_names = [f"Value #{ref}" for ref in refs] if len(columns) > 1 else ["Value"]
    renames = {name: header for name, header in labels}
    order = {name: i for i, (name, _) in enumerate(labels)}
    for i, ((header, _, _), value) in enumerate(zip(columns, value_names)):
        renames[value] = header
        order[value] = len(labels) + i
    transformations: list[Json] = []
    if len(columns) > 1:
        transformations.append({"id": "merge", "options": {}})
    transformations.append({"id": "filterFieldsByName", "options": {"include": {"names": list(order)}}})
    transformations.append({"id": "organize", "options": {
        "excludeByName": {}, "indexByName": order, "renameByName": renames}})
    overrides = [{"matcher": {"id": "byName", "options": header},
                  "properties": [{"id": "unit", "value": unit}]}
                 for header, _, unit in columns if unit != default_unit]
    options: Json = {"cellHeight": "sm", "footer": {"countRows": False, "fields": "", "reducer": ["sum"],
                                                    "show": False}, "showHeader": True}
    if sort_by:
        options["sortBy"] = [{"desc": True, "displayName": sort_by}]
    return Panel(id, "table", title, description, targets, default_unit, w=w, h=h, overrides=overrides,
                 transformations=transformations, options=options,
                 defaults={"custom": {"align": "auto", "cellOptions": {"type": "auto"}}})
