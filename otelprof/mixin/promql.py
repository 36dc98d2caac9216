"""PromQL building blocks. Every metric name comes from a catalog spec, never a hand-typed string.

Counts over a window are exact differences of the cumulative series,
``x - (x offset W or x * 0)``: no ``rate()`` extrapolation, a series born inside the
window counts from its first sample (``increase()`` would miss a counter that first
appears at 1), and histogram buckets keep exact per-sample distributions.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.semconv import Kind, MetricSpec

JOB = sc.prometheus_label(sc.LABEL_JOB)
RANK = sc.prometheus_label(sc.LABEL_RANK)
LOCAL_RANK = sc.prometheus_label(sc.LABEL_LOCAL_RANK)
NODE = sc.prometheus_label(sc.LABEL_NODE)
GPU = sc.prometheus_label(sc.LABEL_GPU)
HW_ID = sc.prometheus_label(sc.LABEL_HW_ID)
HW_TYPE = sc.prometheus_label(sc.LABEL_HW_TYPE)
PHASE = sc.prometheus_label(sc.LABEL_PHASE)
SCALAR = sc.prometheus_label(sc.LABEL_SCALAR)
EXPORTER = sc.prometheus_label(sc.LABEL_EXPORTER)
IDENTITY = tuple(sc.prometheus_label(label) for label in sc.IDENTITY_LABELS)

_SUFFIXES = {"": (Kind.GAUGE,), "_total": (Kind.COUNTER,), "_bucket": (Kind.HISTOGRAM,),
             "_sum": (Kind.HISTOGRAM,), "_count": (Kind.HISTOGRAM,)}


def series_name(spec: MetricSpec, part: str = "") -> str:
    """The sample name of ``spec``: counters gain ``_total``; histograms take ``part`` (bucket/sum/count)."""
    if spec.kind is Kind.COUNTER:
        return spec.prometheus_name + "_total"
    if spec.kind is Kind.HISTOGRAM:
        if part not in ("bucket", "sum", "count"):
            raise ValueError(f"{spec.name} is a histogram: say bucket, sum or count")
        return f"{spec.prometheus_name}_{part}"
    return spec.prometheus_name


def catalog_series_names() -> set[str]:
    """Every sample name the catalog produces (what rules may reference)."""
    names: set[str] = set()
    for spec in sc.METRICS:
        if spec.kind is Kind.HISTOGRAM:
            names.update(series_name(spec, part) for part in ("bucket", "sum", "count"))
        else:
            names.add(series_name(spec))
    return names


def by(*labels: str) -> str:
    return ", ".join(labels)


class Q:
    """Builds selectors and window expressions with the config's extra matchers."""

    def __init__(self, selector: str = "") -> None:
        self.selector = selector.strip()

    def sel(self, spec: MetricSpec, part: str = "", matchers: str = "") -> str:
        inner = ", ".join(m for m in (self.selector, matchers) if m)
        return f"{series_name(spec, part)}{{{inner}}}" if inner else series_name(spec, part)

    def delta(self, spec: MetricSpec, window: str, part: str = "", matchers: str = "",
              offset: str = "") -> str:
        """Exact growth of a cumulative series over ``window`` (ending ``offset`` ago)."""
        s = self.sel(spec, part, matchers)
        now = f"{s} offset {offset}" if offset else s
        before = f"{s} offset {_add(window, offset)}"
        return f"({now} - ({before} or {now} * 0))"

    def window_mean(self, spec: MetricSpec, window: str, matchers: str = "", offset: str = "") -> str:
        """Mean of a histogram's observations over ``window`` (exact: sum and count differences)."""
        return (f"{self.delta(spec, window, 'sum', matchers, offset)} / "
                f"{self.delta(spec, window, 'count', matchers, offset)}")

    def window_quantile(self, q: float, spec: MetricSpec, window: str, matchers: str = "") -> str:
        return f"histogram_quantile({q}, {self.delta(spec, window, 'bucket', matchers)})"

    def age(self) -> str:
        """Seconds since each process started."""
        return f"(time() - {self.sel(sc.PROCESS_START_TIME)})"

    def warmed_up(self, patience: str) -> str:
        """``and`` clause: the process started more than ``patience`` ago (joined per process)."""
        return f"and on ({JOB}, {RANK}) {self.age()} > {_seconds_literal(patience)}"


def _add(a: str, b: str) -> str:
    if not b:
        return a
    from otelprof.mixin.config import seconds

    return f"{int(seconds(a) + seconds(b))}s"


def _seconds_literal(duration: str) -> str:
    from otelprof.mixin.config import seconds

    value = seconds(duration)
    return str(int(value)) if value == int(value) else repr(value)


def number(value: float) -> str:
    """A float as PromQL writes it (``0.5``, ``1e-07``)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


_CHILDREN = ("lhs", "rhs", "expr", "param", "args", "vector_selector")
"""The attributes of promql-parser's nodes that hold sub-expressions."""


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects, read from promql-parser's syntax tree (``ValueError`` when it
    is no PromQL)."""
    import promql_parser

    found: set[str] = set()
    stack = [promql_parser.parse(expr)]
    while stack:
        node = stack.pop()
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                found.add(node.name)
            found.update(m.value for m in node.matchers.matchers
                         if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal)
            continue
        for attr in _CHILDREN:
            child = getattr(node, attr, None)
            if isinstance(child, list):
                stack.extend(child)
            elif child is not None and type(child).__module__ == promql_parser.__name__:
                stack.append(child)
    return found
