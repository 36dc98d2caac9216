"""OTLP (and console) export on background threads with bounded queues.

The SDK exporters block while a collector is down (retries with backoff up to
``OTEL_EXPORTER_OTLP_TIMEOUT``). Here they only ever block their own thread: the
queue in front of them is bounded, what does not fit or fails is counted as
dropped, and :meth:`BackgroundExporter.shutdown` gives up at a deadline.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelprof._log import logger, warn_once

MAX_BATCH = 512


class BackgroundExporter:
    """One exporter, one thread, one bounded queue of items (spans, or metric snapshots)."""

    def __init__(
        self,
        name: str,
        export: Callable[[list[Any]], bool],
        close: Callable[[], None],
        capacity: int,
        on_dropped: Callable[[str, int], None],
        batch: int = MAX_BATCH,
    ) -> None:
        self.name = name
        self._export = export
        self._close = close
        self._capacity = capacity
        self._batch = batch
        self._on_dropped = on_dropped
        self._queue: deque[Any] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._count_lock = threading.Lock()
        self._inflight = 0  # items of the batch being exported right now
        self._abandoned = False  # shutdown gave up on the thread and already counted its batch
        self._thread = threading.Thread(target=self._run, name=f"otelprof-{name}", daemon=True)
        self._thread.start()

    def offer(self, items: Sequence[Any]) -> None:
        """Queue items without blocking; items beyond the capacity are dropped and counted."""
        room = self._capacity - len(self._queue)
        accepted = items[: max(room, 0)]
        self._idle.clear()
        self._queue.extend(accepted)
        if len(accepted) < len(items):
            self._dropped(len(items) - len(accepted), "queue full")
        self._wake.set()

    def _dropped(self, count: int, why: str) -> None:
        self._on_dropped(self.name, count)
        warn_once(f"export:{self.name}", "otelprof: %s export is failing (%s); data is dropped and counted in "
                  "otelprof_exporter_dropped_total, training goes on", self.name, why)

    def _run(self) -> None:
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            while self._queue:
                batch = [self._queue.popleft() for _ in range(min(self._batch, len(self._queue)))]
                self._inflight = len(batch)
                try:
                    ok = self._export(batch)
                except Exception as exc:  # an exporter bug must not kill the thread
                    logger.debug("otelprof: %s export raised", self.name, exc_info=True)
                    ok = False
                    why = repr(exc)
                else:
                    why = "the receiver did not accept the data"
                with self._count_lock:
                    self._inflight = 0
                    if not ok and not self._abandoned:
                        self._dropped(len(batch), why)
            self._idle.set()
            if self._stop.is_set():
                return

    def flush(self, timeout: float) -> bool:
        """Wait until the queue is empty (True) or ``timeout`` seconds pass (False)."""
        self._wake.set()
        return self._idle.wait(timeout)

    def shutdown(self, deadline: float) -> None:
        """Export what is queued until ``deadline`` (a ``time.monotonic()`` value), then let go."""
        self._stop.set()
        self._wake.set()
        self._thread.join(max(deadline - time.monotonic(), 0.0))
        if self._thread.is_alive():
            with self._count_lock:
                self._abandoned = True
                left = len(self._queue) + self._inflight
                self._queue.clear()
                self._inflight = 0
            if left:
                self._dropped(left, "shutdown deadline reached")
        closer = threading.Thread(target=self._safe_close, name=f"otelprof-{self.name}-close", daemon=True)
        closer.start()
        closer.join(max(deadline - time.monotonic(), 0.0))

    def _safe_close(self) -> None:
        try:
            self._close()
        except Exception:
            logger.debug("otelprof: closing %s failed", self.name, exc_info=True)


def span_exporter(
    exporter: SpanExporter, name: str, capacity: int, on_dropped: Callable[[str, int], None]
) -> BackgroundExporter:
    def export(batch: list[ReadableSpan]) -> bool:
        return exporter.export(batch) is SpanExportResult.SUCCESS

    return BackgroundExporter(name, export, exporter.shutdown, capacity, on_dropped)


def metric_exporter(
    exporter: MetricExporter, name: str, on_dropped: Callable[[str, int], None], timeout: float
) -> BackgroundExporter:
    """Snapshots are cumulative, so only the newest matters: a queue of two, one export per batch."""

    def export(batch: list[MetricsData]) -> bool:
        return exporter.export(batch[-1], timeout_millis=timeout * 1000) is MetricExportResult.SUCCESS

    return BackgroundExporter(name, export, lambda: exporter.shutdown(timeout_millis=timeout * 1000),
                              2, on_dropped, batch=2)


def make_span_exporter(kind: str, protocol: str) -> SpanExporter:
    """The SDK exporter for ``otlp`` (per protocol) or ``console``; they read ``OTEL_EXPORTER_OTLP_*``."""
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http()


def make_metric_exporter(kind: str, protocol: str) -> MetricExporter:
    if kind == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        return Grpc()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    return Http()
