"""Cumulative in-process aggregation: counters, gauges and explicit-bucket histograms.

Plain Python (a bisect and two additions per observation) because the OTel SDK's
instruments cost ~5-6 us per call here; the result is the SDK's own metric data
model, which every exporter (OTLP, Prometheus, the recording) takes unchanged.
Writers are the background recorder and the sampler; readers take a snapshot.
Both hold :attr:`MetricRegistry.lock`.

A metric whose labels the program names (phase, annotation) keeps at most ``max_series``
label sets (``OTELPROF_MAX_SERIES``): observations of further ones are counted under
``other`` for those labels, and in ``otelprof.series.folded``.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping

from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    Sum,
)

from otelprof import semconv as sc
from otelprof._log import warn_once
from otelprof.semconv import IDENTITY_LABELS, Kind, MetricSpec

LabelValues = tuple[str, ...]

DEFAULT_MAX_SERIES = 500
"""Series one metric may have for the label sets the program names (``OTELPROF_MAX_SERIES``)."""


class _Instrument:
    def __init__(self, spec: MetricSpec, max_series: int | None = None,
                 on_fold: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self._named = tuple(i for i, label in enumerate(spec.labels) if label in sc.PROGRAM_NAMED_LABELS)
        self._max_series = max_series if self._named else None
        self._on_fold = on_fold

    def _admit(self, labels: LabelValues, series: Mapping[LabelValues, object]) -> LabelValues:
        """The label values a new series is kept under: its own while the metric is under the cap, else
        ``other`` for the labels the program names (counted)."""
        if self._max_series is None or len(series) < self._max_series:
            return labels
        if self._on_fold is not None:
            self._on_fold(self.spec.name)
        return tuple(sc.OTHER_LABEL_VALUE if i in self._named else v for i, v in enumerate(labels))

    def data(self, base: Mapping[str, str], start_ns: int, now_ns: int, exemplars: bool = False) -> Metric | None:
        """The metric's points (None without any); ``exemplars``: with the histogram buckets' exemplars."""
        raise NotImplementedError

    def _attributes(self, base: Mapping[str, str], values: LabelValues) -> dict[str, str]:
        attributes = dict(base)
        attributes.update(zip(self.spec.labels, values))
        return attributes


class Counter(_Instrument):
    """Monotonic sum per label values."""

    def __init__(self, spec: MetricSpec, max_series: int | None = None,
                 on_fold: Callable[[str], None] | None = None) -> None:
        super().__init__(spec, max_series, on_fold)
        self.values: dict[LabelValues, float] = {}

    def add(self, amount: float, labels: LabelValues = ()) -> None:
        values = self.values
        if labels not in values:
            labels = self._admit(labels, values)
        values[labels] = values.get(labels, 0) + amount

    def set_total(self, total: float, labels: LabelValues = ()) -> None:
        """Mirror a cumulative count kept elsewhere (the kernel's, NVML's)."""
        if labels not in self.values:
            labels = self._admit(labels, self.values)
        self.values[labels] = total

    def data(self, base: Mapping[str, str], start_ns: int, now_ns: int, exemplars: bool = False) -> Metric | None:
        if not self.values:
            return None
        points = [
            NumberDataPoint(self._attributes(base, labels), start_ns, now_ns, value)
            for labels, value in self.values.items()
        ]
        return Metric(self.spec.name, self.spec.description, self.spec.unit,
                      Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True))


class GaugeInstrument(_Instrument):
    """Last value per label values."""

    def __init__(self, spec: MetricSpec, max_series: int | None = None,
                 on_fold: Callable[[str], None] | None = None) -> None:
        super().__init__(spec, max_series, on_fold)
        self.values: dict[LabelValues, float] = {}

    def set(self, value: float, labels: LabelValues = ()) -> None:
        if labels not in self.values:
            labels = self._admit(labels, self.values)
        self.values[labels] = value

    def remove(self, labels: LabelValues = ()) -> None:
        """Make the series absent (its source stopped answering): missing must never look healthy."""
        self.values.pop(labels, None)

    def data(self, base: Mapping[str, str], start_ns: int, now_ns: int, exemplars: bool = False) -> Metric | None:
        if not self.values:
            return None
        points = [
            NumberDataPoint(self._attributes(base, labels), start_ns, now_ns, value)
            for labels, value in self.values.items()
        ]
        if self.spec.updown:
            return Metric(self.spec.name, self.spec.description, self.spec.unit,
                          Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=False))
        return Metric(self.spec.name, self.spec.description, self.spec.unit, Gauge(points))


class _HistogramSeries:
    __slots__ = ("counts", "sum", "min", "max", "exemplars")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0
        self.min = float("inf")
        self.max = float("-inf")
        self.exemplars: list[_Exemplar | None] | None = None
        """Per bucket, once one is set: the last traced observation in it."""


_Exemplar = tuple[float, int, int, int, bool]
"""(value, trace id, span id, Unix time in ns, held): an observation whose trace was kept."""

EXEMPLAR_HOLD_NS = 60 * 10**9
"""How long a held exemplar (an outlier step's) keeps its bucket against later, ordinary ones: at least one
scrape, so Prometheus stores it."""


class HistogramInstrument(_Instrument):
    """Explicit-bucket histogram (bounds from the catalog) per label values."""

    def __init__(self, spec: MetricSpec, max_series: int | None = None,
                 on_fold: Callable[[str], None] | None = None) -> None:
        super().__init__(spec, max_series, on_fold)
        self.bounds = spec.buckets
        self.series: dict[LabelValues, _HistogramSeries] = {}

    def observe(self, value: float, labels: LabelValues = ()) -> None:
        series = self.series.get(labels)
        if series is None:
            labels = self._admit(labels, self.series)
            series = self.series.get(labels)
            if series is None:
                series = self.series[labels] = _HistogramSeries(len(self.bounds) + 1)
        # bisect_left: a value equal to a bound belongs to that bucket (le semantics).
        series.counts[bisect_left(self.bounds, value)] += 1
        series.sum += value
        if value < series.min:
            series.min = value
        if value > series.max:
            series.max = value

    def exemplar(self, value: float, labels: LabelValues, trace_id: int, span_id: int, time_ns: int,
                 hold: bool = False) -> None:
        """Link the bucket of an observation already made to its trace (the last one per bucket, as the OTel
        SDK's aligned-bucket reservoir keeps). A ``hold`` exemplar (an outlier's) is kept against ordinary
        ones for :data:`EXEMPLAR_HOLD_NS`. Observations folded into ``other`` get none."""
        series = self.series.get(labels)
        if series is None:
            return
        slots = series.exemplars
        if slots is None:
            slots = series.exemplars = [None] * len(series.counts)
        index = bisect_left(self.bounds, value)
        current = slots[index]
        if current is not None and current[4] and not hold and time_ns - current[3] < EXEMPLAR_HOLD_NS:
            return
        slots[index] = (value, trace_id, span_id, time_ns, hold)

    def data(self, base: Mapping[str, str], start_ns: int, now_ns: int, exemplars: bool = False) -> Metric | None:
        if not self.series:
            return None
        points = [
            HistogramDataPoint(
                self._attributes(base, labels), start_ns, now_ns, sum(s.counts), s.sum,
                list(s.counts), list(self.bounds), s.min, s.max,
                _exemplars(s.exemplars) if exemplars and s.exemplars else [],
            )
            for labels, s in self.series.items()
        ]
        return Metric(self.spec.name, self.spec.description, self.spec.unit,
                      Histogram(points, AggregationTemporality.CUMULATIVE))


def _exemplars(slots: list[_Exemplar | None]) -> list[Exemplar]:
    """In bucket order (exporters find each one's bucket from its value)."""
    return [Exemplar({}, value, time_ns, span_id, trace_id)
            for value, trace_id, span_id, time_ns, _ in filter(None, slots)]


class MetricRegistry:
    """All instruments of one session, plus the identity labels put on every point."""

    def __init__(self, identity: Mapping[str, str], start_time_ns: int | None = None,
                 max_series: int = DEFAULT_MAX_SERIES) -> None:
        missing = [k for k in IDENTITY_LABELS if k not in identity]
        if missing:
            raise ValueError(f"identity labels missing: {missing}")
        self.identity = dict(identity)
        self.max_series = max_series
        self.start_time_ns = start_time_ns or time.time_ns()
        self.lock = threading.RLock()
        self._instruments: dict[str, _Instrument] = {}
        self._folding: set[str] = set()
        self._before_collect: list[Callable[[], None]] = []

    def counter(self, spec: MetricSpec) -> Counter:
        return self._get(spec, Kind.COUNTER, Counter)  # type: ignore[return-value]

    def gauge(self, spec: MetricSpec) -> GaugeInstrument:
        return self._get(spec, Kind.GAUGE, GaugeInstrument)  # type: ignore[return-value]

    def histogram(self, spec: MetricSpec) -> HistogramInstrument:
        return self._get(spec, Kind.HISTOGRAM, HistogramInstrument)  # type: ignore[return-value]

    def _get(self, spec: MetricSpec, kind: Kind, cls: type[_Instrument]) -> _Instrument:
        if spec.kind is not kind:
            raise TypeError(f"{spec.name} is a {spec.kind.value}, not a {kind.value}")
        with self.lock:
            instrument = self._instruments.get(spec.name)
            if instrument is None:
                instrument = self._instruments[spec.name] = cls(spec, self.max_series, self._fold)
            return instrument

    def _fold(self, name: str) -> None:
        """An observation of ``name`` went to ``other`` (called by a writer, which holds the lock)."""
        if name not in self._folding:
            self._folding.add(name)
            warn_once(f"series:{name}", "otelprof: %s has %d series; further phase/annotation label sets are "
                      "counted as %r (OTELPROF_MAX_SERIES)", name, self.max_series, sc.OTHER_LABEL_VALUE)
        with self.lock:
            self.counter(sc.SERIES_FOLDED).add(1, (name,))

    def add(self, spec: MetricSpec, labels: LabelValues = (), amount: float = 1) -> None:
        """Add to a counter from any thread (takes the lock)."""
        with self.lock:
            self.counter(spec).add(amount, labels)

    def before_collect(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` before each snapshot (e.g. drain pending step records)."""
        self._before_collect.append(callback)

    def collect(self, exemplars: bool = False) -> list[Metric]:
        """A consistent snapshot of every instrument with data, as OTel ``Metric`` objects; ``exemplars``: with
        the histograms' exemplars (for the exporters that carry them)."""
        for callback in self._before_collect:
            callback()
        now = time.time_ns()
        with self.lock:
            metrics = [i.data(self.identity, self.start_time_ns, now, exemplars) for i in self._instruments.values()]
        return [m for m in metrics if m is not None]


def endpoint_counter(registry: MetricRegistry | None, endpoint: str) -> Callable[[str], None] | None:
    """Counts an in-process server's refusals (by reason) in ``otelprof.endpoint.errors``."""
    if registry is None:
        return None
    return lambda reason: registry.add(sc.ENDPOINT_ERRORS, (endpoint, reason))
