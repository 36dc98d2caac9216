"""OTLP (and console) export on background threads with bounded queues.

The SDK exporters block while a collector is down (retries with backoff up to
``OTEL_EXPORTER_OTLP_TIMEOUT``). Here they only ever block their own thread: the
queue in front of them is bounded, what does not fit or fails is counted as
dropped, and :meth:`BackgroundExporter.shutdown` gives up at a deadline.

What the SDK logs on an exporter's thread is held back (:mod:`otelprof.runtime.export.log_gate`) and counted: a
failing exporter gives one warning, then one summary line every ``warning_interval`` seconds while it fails
(and a last one at shutdown), with what the server said sanitised and cut (:func:`otelprof._log.sanitize`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otelprof._log import describe_exception, logger, sanitize
from otelprof.runtime.export.log_gate import GATE

MAX_BATCH = 512


@dataclass
class FailureCounts:
    """An exporter's failures since its last warning or summary line."""

    batches: int = 0
    items: int = 0
    retries: int = 0
    reason: str = ""  # the last thing the SDK said (kept from one line to the next)
    since: float = 0.0  # Unix time of the last line (or of the exporter's start)


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
        target: str = "",
        warning_interval: float = 300.0,
    ) -> None:
        self.name = name
        self.target = sanitize(target) if target else ""
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
        self._warning_interval = warning_interval
        self._failure_lock = threading.Lock()  # _dropped runs under _count_lock too
        self._failures = FailureCounts(since=time.time())
        self._warned = False
        self._next_summary = 0.0  # time.monotonic() from which a failure prints a summary
        self._threads = (f"otelprof-{name}", f"otelprof-{name}-close")
        GATE.watch(self._threads, self._sdk_record)
        self._thread = threading.Thread(target=self._run, name=self._threads[0], daemon=True)
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

    def _sdk_record(self, message: str, retry: bool) -> None:
        """A record the SDK logged on this exporter's thread (held back by the log gate)."""
        with self._failure_lock:
            if retry:
                self._failures.retries += 1
            if "shutdown" not in message.lower():  # "Shutdown in progress, aborting retry." says nothing new
                self._failures.reason = message
        self._report(message)

    def _dropped(self, count: int, why: str) -> None:
        """``count`` items of one batch are lost: counted, and reported when a line is due."""
        self._on_dropped(self.name, count)
        with self._failure_lock:
            self._failures.batches += 1
            self._failures.items += count
        self._report(why)

    def _report(self, why: str) -> None:
        """The first warning at the first failure (a drop or a retry), then a summary when one is due."""
        with self._failure_lock:
            now = time.monotonic()
            if self._warned and now < self._next_summary:
                return
            first, self._warned = not self._warned, True
            self._next_summary = now + self._warning_interval
            failures = self._failures
            self._failures = FailureCounts(reason=failures.reason, since=time.time())
        if first:
            logger.warning("otelprof: %s export%s is failing (%s); data is dropped and counted in "
                           "otelprof_exporter_dropped_total, training goes on; a summary follows every %gs while "
                           "it fails", self.name, self._to(), sanitize(failures.reason or why), self._warning_interval)
        else:
            self._summary(failures, "failing")

    def _to(self) -> str:
        return f" to {self.target}" if self.target else ""

    def _summary(self, failures: FailureCounts, state: str) -> None:
        logger.warning("otelprof: %s export%s %s: %d batch%s (%d items) dropped, %d retries since %s (last: %s)",
                       self.name, self._to(), state, failures.batches, "" if failures.batches == 1 else "es",
                       failures.items, failures.retries,
                       time.strftime("%H:%M:%S", time.localtime(failures.since)), sanitize(failures.reason)
                       or "the receiver did not accept the data")

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            GATE.forget(self._threads[:1], self._sdk_record)

    def _loop(self) -> None:
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
                    why = f"{type(exc).__name__}: {describe_exception(exc)}"
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
        closer = threading.Thread(target=self._safe_close, name=self._threads[1], daemon=True)
        closer.start()
        closer.join(max(deadline - time.monotonic(), 0.0))
        with self._failure_lock:
            failures = self._failures
            self._failures = FailureCounts(reason=failures.reason, since=time.time())
        if (failures.batches or failures.retries) and self._warned:  # what the last line did not count yet
            self._summary(failures, "failed")

    def _safe_close(self) -> None:
        try:
            self._close()
        except Exception:
            logger.debug("otelprof: closing %s failed", self.name, exc_info=True)
        finally:
            GATE.forget(self._threads[1:], self._sdk_record)


def target_of(exporter: object) -> str:
    """Where an SDK exporter sends to (its endpoint without user info or query), or "" when it does not say."""
    endpoint = getattr(exporter, "_endpoint", "")
    if not isinstance(endpoint, str):
        return ""
    scheme, sep, rest = endpoint.rpartition("://")
    return scheme + sep + rest.rpartition("@")[2].partition("?")[0]


def span_exporter(
    exporter: SpanExporter, name: str, capacity: int, on_dropped: Callable[[str, int], None],
    warning_interval: float = 300.0,
) -> BackgroundExporter:
    def export(batch: list[ReadableSpan]) -> bool:
        return exporter.export(batch) is SpanExportResult.SUCCESS

    return BackgroundExporter(name, export, exporter.shutdown, capacity, on_dropped, target=target_of(exporter),
                              warning_interval=warning_interval)


def metric_exporter(
    exporter: MetricExporter, name: str, on_dropped: Callable[[str, int], None], timeout: float,
    warning_interval: float = 300.0,
) -> BackgroundExporter:
    """Snapshots are cumulative, so only the newest matters: a queue of two, one export per batch."""

    def export(batch: list[MetricsData]) -> bool:
        return exporter.export(batch[-1], timeout_millis=timeout * 1000) is MetricExportResult.SUCCESS

    return BackgroundExporter(name, export, lambda: exporter.shutdown(timeout_millis=timeout * 1000),
                              2, on_dropped, batch=2, target=target_of(exporter),
                              warning_interval=warning_interval)


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
