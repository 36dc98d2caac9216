"""``/metrics``: the registry's snapshot in the Prometheus text format, served on its own port.

Names follow the OpenTelemetry-to-Prometheus rules (:func:`otelprof.semconv.prometheus_name`);
resource attributes appear once, on ``target_info``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry.sdk.metrics.export import Gauge, Histogram, Metric, Sum
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.core import (
    Metric as PromMetric,
)
from prometheus_client.registry import Collector

from otelprof._log import warn_once
from otelprof.metrics import MetricRegistry
from otelprof.semconv import Kind, prometheus_label, prometheus_name

TARGET_INFO = "target_info"


def _format(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


def translate(metric: Metric) -> PromMetric | None:
    """One OTel metric (cumulative) as a Prometheus metric family."""
    data = metric.data
    unit = metric.unit or ""
    doc = metric.description or ""
    points: Any = data.data_points
    if not points:
        return None
    keys = [prometheus_label(k) for k in points[0].attributes]
    family: Any
    if isinstance(data, Histogram):
        family = HistogramMetricFamily(prometheus_name(metric.name, unit, Kind.HISTOGRAM), doc, labels=keys)
        for point in points:
            cumulative, buckets = 0, []
            for bound, count in zip([*point.explicit_bounds, float("inf")], point.bucket_counts):
                cumulative += count
                buckets.append((_format(bound), cumulative))
            family.add_metric(_values(point.attributes), buckets, point.sum)
        histogram: PromMetric = family
        return histogram
    if isinstance(data, Sum) and data.is_monotonic:
        family = CounterMetricFamily(prometheus_name(metric.name, unit, Kind.COUNTER), doc, labels=keys)
    elif isinstance(data, (Gauge, Sum)):
        family = GaugeMetricFamily(prometheus_name(metric.name, unit, Kind.GAUGE), doc, labels=keys)
    else:
        return None
    for point in points:
        family.add_metric(_values(point.attributes), point.value)
    number: PromMetric = family
    return number


def _values(attributes: Mapping[str, Any] | None) -> list[str]:
    return [str(v) for v in (attributes or {}).values()]


def _labels(attributes: Mapping[str, Any] | None) -> dict[str, str]:
    return {prometheus_label(k): str(v) for k, v in (attributes or {}).items()}


class RegistryCollector(Collector):
    """prometheus_client collector over a :class:`MetricRegistry` (snapshot on every scrape)."""

    def __init__(self, registry: MetricRegistry, resource_attributes: Mapping[str, Any]) -> None:
        self._registry = registry
        self._target_info = _labels(resource_attributes)

    def collect(self) -> Iterator[PromMetric]:
        info = GaugeMetricFamily(TARGET_INFO, "Target metadata (the OpenTelemetry resource)")
        info.add_sample(TARGET_INFO, self._target_info, 1)
        yield info
        for metric in self._registry.collect():
            family = translate(metric)
            if family is not None:
                yield family


class PrometheusEndpoint:
    """The HTTP server behind ``/metrics``; :meth:`start` warns instead of raising."""

    def __init__(self, registry: MetricRegistry, resource_attributes: Mapping[str, Any]) -> None:
        self.collector_registry = CollectorRegistry(auto_describe=False)
        self.collector_registry.register(RegistryCollector(registry, resource_attributes))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None

    def start(self, host: str, port: int) -> bool:
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.collector_registry)
        except OSError as exc:
            warn_once("prometheus:bind", "otelprof: cannot serve /metrics on %s:%d (%s); this process has no "
                      "Prometheus endpoint (set OTEL_EXPORTER_PROMETHEUS_PORT)", host, port, exc)
            return False
        self.address = (host, self._server.server_address[1])
        return True

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
