"""``/metrics``: the registry's snapshot in the Prometheus text format (0.0.4), or in OpenMetrics 1.0 when the
scraper prefers it (``Accept: application/openmetrics-text``), on its own port.

Names follow the OpenTelemetry-to-Prometheus rules (:func:`otelprof.semconv.prometheus_name`);
resource attributes appear once, on ``target_info``. OpenMetrics adds the histogram buckets'
exemplars: the ``trace_id`` and ``span_id`` of the last traced step (or region) in each bucket,
an outlier's first, so a dashboard links a slow bucket to its trace. The text is rendered here
rather than by prometheus_client's generic exposition because every series carries the same
identity labels: rendering them once per scrape keeps an 8-GPU, 64-core node's scrape at a few
milliseconds.
"""

from __future__ import annotations

import gzip
import math
import threading
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Histogram, Metric, Sum

from otelprof._arguments import encodable
from otelprof._log import escape, warn_once
from otelprof.runtime._http import BackgroundServer, Limits, QuietHandler
from otelprof.runtime.metrics import MetricRegistry, endpoint_counter
from otelprof.semconv import (
    ENDPOINT_METRICS,
    EXEMPLAR_SPAN_ID,
    EXEMPLAR_TRACE_ID,
    Kind,
    prometheus_label,
    prometheus_name,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
TARGET_INFO = "target_info"


def wants_openmetrics(accept: str) -> bool:
    """Whether an ``Accept`` header prefers OpenMetrics to the text format (by its q-values; ties go to
    OpenMetrics, as Prometheus lists it first). Anything unparsable means the text format."""
    best = {"openmetrics": 0.0, "text": 0.0}
    for part in accept[:2000].split(","):
        media, *params = (p.strip() for p in part.split(";"))
        media = media.lower()
        kind = ("openmetrics" if media == "application/openmetrics-text"
                else "text" if media in ("text/plain", "text/*", "*/*") else None)
        if kind is None:
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # also NaN
                    q = 0.0
        best[kind] = max(best[kind], q)
    return best["openmetrics"] > 0.0 and best["openmetrics"] >= best["text"]


def _escape_value(value: object) -> str:
    return encodable(str(value)).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str, openmetrics: bool = False) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r'\"') if openmetrics else text


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(attributes: Mapping[str, Any]) -> str:
    return ",".join(f'{prometheus_label(k)}="{_escape_value(v)}"' for k, v in attributes.items())


class _LabelCache:
    """Rendered label sets, keyed by the attribute items: identical on every scrape."""

    def __init__(self) -> None:
        self._cache: dict[tuple[tuple[str, Any], ...], str] = {}

    def __call__(self, attributes: Mapping[str, Any]) -> str:
        key = tuple(attributes.items())
        text = self._cache.get(key)
        if text is None:
            if len(self._cache) > 100_000:  # bounded even if label values churn
                self._cache.clear()
            text = self._cache[key] = _labels(attributes)
        return text


def render(metrics: Iterable[Metric], resource_attributes: Mapping[str, Any], labels: _LabelCache | None = None,
           openmetrics: bool = False) -> str:
    """The text exposition of ``metrics`` (cumulative), with ``target_info`` first; ``openmetrics``: in
    OpenMetrics 1.0, with the histogram buckets' exemplars."""
    labels = labels or _LabelCache()
    out = [f"# HELP {TARGET_INFO} Target metadata (the OpenTelemetry resource)", f"# TYPE {TARGET_INFO} gauge",
           f"{TARGET_INFO}{{{_labels(resource_attributes)}}} 1"]
    for metric in metrics:
        _render_metric(metric, labels, out, openmetrics)
    out.append("# EOF\n" if openmetrics else "")
    return "\n".join(out)


def _exemplar(exemplar: Any) -> str:
    """`` # {trace_id="…",span_id="…"} value timestamp`` (seconds), the OpenMetrics exemplar of a bucket."""
    return (f' # {{{EXEMPLAR_TRACE_ID}="{exemplar.trace_id:032x}",{EXEMPLAR_SPAN_ID}="{exemplar.span_id:016x}"}} '
            f"{_number(exemplar.value)} {exemplar.time_unix_nano / 1e9:.3f}")


def _bucket_exemplars(bounds: Any, exemplars: Any) -> dict[int, str]:
    """Bucket index -> its rendered exemplar."""
    return {bisect_left(bounds, e.value): _exemplar(e) for e in exemplars
            if e.trace_id is not None and e.span_id is not None}


def _render_metric(metric: Metric, labels: _LabelCache, out: list[str], openmetrics: bool = False) -> None:
    data = metric.data
    points: Any = data.data_points
    if not points:
        return
    unit = metric.unit or ""
    if isinstance(data, Histogram):
        kind = Kind.HISTOGRAM
    elif isinstance(data, Sum) and data.is_monotonic:
        kind = Kind.COUNTER
    elif isinstance(data, (Gauge, Sum)):
        kind = Kind.GAUGE
    else:
        return
    name = prometheus_name(metric.name, unit, kind)
    # The text format names a counter's metadata like its sample, with _total; OpenMetrics names the family.
    meta = name + "_total" if kind is Kind.COUNTER and not openmetrics else name
    out.append(f"# HELP {meta} {_escape_help(metric.description or '', openmetrics)}")
    out.append(f"# TYPE {meta} {kind.value}")
    if kind is Kind.HISTOGRAM:
        for point in points:
            base = labels(point.attributes)
            sep = "," if base else ""
            marks = _bucket_exemplars(point.explicit_bounds, point.exemplars) if openmetrics and point.exemplars else {}
            cumulative = 0
            for index, (bound, count) in enumerate(zip(point.explicit_bounds, point.bucket_counts)):
                cumulative += count
                out.append(f'{name}_bucket{{{base}{sep}le="{_number(float(bound))}"}} {cumulative}'
                           + marks.get(index, ""))
            cumulative += point.bucket_counts[-1]
            out.append(f'{name}_bucket{{{base}{sep}le="+Inf"}} {cumulative}'
                       + marks.get(len(point.explicit_bounds), ""))
            out.append(f"{name}_count{{{base}}} {cumulative}")
            out.append(f"{name}_sum{{{base}}} {_number(point.sum)}")
        return
    sample = name + "_total" if kind is Kind.COUNTER else name
    for point in points:
        out.append(f"{sample}{{{labels(point.attributes)}}} {_number(point.value)}")


CACHE_INTERVAL = 1.0
"""Seconds a rendered exposition is reused: scrapes within it get the same text (never older data)."""
LIMITS = Limits(workers=4, max_connections=64, deadline=10.0, rate=10.0, connection_rate=20.0)
"""Four workers, 64 open connections, 10 s per connection (Prometheus' default scrape timeout), 10 scrapes and
20 new connections a second (a Prometheus pair scrapes each target every 15-60 s)."""


class _Rendering:
    """One format's latest rendering and when it was made."""

    __slots__ = ("at", "text", "gzipped")

    def __init__(self) -> None:
        self.at = -math.inf
        self.text = b""
        self.gzipped: bytes | None = None


class PrometheusEndpoint:
    """The HTTP server behind ``/metrics``; :meth:`start` warns instead of raising.

    Rendering holds the training process's GIL, so it is bounded whatever scrapers do: one rendering at a time,
    reused for :data:`CACHE_INTERVAL` seconds (per format, also gzipped once), and the server's :data:`LIMITS`."""

    def __init__(self, registry: MetricRegistry, resource_attributes: Mapping[str, Any],
                 cache_interval: float = CACHE_INTERVAL) -> None:
        self._registry = registry
        self._resource = dict(resource_attributes)
        self._labels = _LabelCache()
        self._render_lock = threading.Lock()
        self.cache_interval = cache_interval
        self._renderings = {False: _Rendering(), True: _Rendering()}
        self._server = BackgroundServer(LIMITS, endpoint_counter(registry, ENDPOINT_METRICS))
        self.address: tuple[str, int] | None = None

    def render(self, openmetrics: bool = False) -> str:
        """A fresh exposition (no reuse)."""
        with self._render_lock:
            return render(self._registry.collect(openmetrics), self._resource, self._labels, openmetrics)

    def exposition(self, gzipped: bool = False, openmetrics: bool = False) -> bytes:
        """The exposition, rendered at most once per :attr:`cache_interval` however many scrapers ask."""
        with self._render_lock:  # one rendering at a time; scrapers that waited find it fresh
            cached = self._renderings[openmetrics]
            now = time.monotonic()
            if now - cached.at >= self.cache_interval:
                cached.text = render(self._registry.collect(openmetrics), self._resource, self._labels,
                                     openmetrics).encode("utf-8")
                cached.gzipped = None
                cached.at = now
            if not gzipped:
                return cached.text
            if cached.gzipped is None:
                cached.gzipped = gzip.compress(cached.text, compresslevel=1)
            return cached.gzipped

    def start(self, host: str, port: int) -> bool:
        endpoint = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
                openmetrics = wants_openmetrics(self.headers.get("Accept", ""))
                try:
                    body = endpoint.exposition(gzipped, openmetrics)
                except Exception:  # never take the training process down over a scrape
                    self.send_json(500, {"error": "otelprof could not render metrics"})
                    return
                self.send_body(200, OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE, body,
                               *([("Content-Encoding", "gzip")] if gzipped else []))

        try:
            self.address = self._server.start(host, port, Handler, "otelprof-metrics")
        except (OSError, OverflowError) as exc:  # OverflowError: a port above 65535
            warn_once("prometheus:bind", "otelprof: cannot serve /metrics on %s:%d (%s); this process has no "
                      "Prometheus endpoint (set OTEL_EXPORTER_PROMETHEUS_PORT)", escape(host), port, escape(str(exc)))
            return False
        return True

    def stop(self) -> None:
        self._server.stop()
