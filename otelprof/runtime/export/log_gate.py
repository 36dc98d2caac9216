"""Keeps the OpenTelemetry SDK's per-export log lines off the training job's stderr.

The SDK exporters log every failed or retried export (60-120 lines a minute with a collector down or
answering 500), and those lines quote what the server sent. otelprof reports an exporter's failures itself:
one warning, then a summary with counts every ``OTELPROF_EXPORT_WARNING_INTERVAL`` while it fails
(:class:`otelprof.runtime.export.otlp.BackgroundExporter`).

:data:`GATE` is a :class:`logging.Filter` on the loggers of the SDK and of the HTTP and gRPC clients under it
(``opentelemetry.*``, ``urllib3.*``, ``requests.*``, ``grpc.*``), attached while an otelprof exporter thread
runs and removed when the last one has ended. It holds back only records of level WARNING and above logged
on otelprof's own exporter threads, and hands each to that exporter to count: the application's own logging,
an OpenTelemetry pipeline of its own and every other thread log as before, and levels and handlers are never
changed.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterable

from otelprof._log import describe_exception

LOGGER_PREFIXES = ("opentelemetry", "urllib3", "requests", "grpc")
KNOWN_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.exporter.otlp.proto.common._internal",
    "opentelemetry.attributes",
    "urllib3.connectionpool",
)
"""Loggers the export path logs to, attached even before their module made them."""

_CREDENTIALS = re.compile(r"[^\s/@:'\"]+:[^\s/@'\"]*@")
OnRecord = Callable[[str, bool], None]
"""``(message, is_retry)``: one held-back record of an exporter's thread."""


class LogGate(logging.Filter):
    """Holds back WARNING+ records logged on watched threads (by thread name) and hands them on."""

    def __init__(self) -> None:
        super().__init__()
        self._watched: dict[str, OnRecord] = {}
        self._loggers: list[logging.Logger] = []
        self._lock = threading.Lock()

    def watch(self, thread_names: Iterable[str], on_record: OnRecord) -> None:
        """Hold back the records of these threads (attaching the gate to the loggers when it is not)."""
        with self._lock:
            for name in thread_names:
                self._watched[name] = on_record
            self._attach()

    def forget(self, thread_names: Iterable[str], on_record: OnRecord) -> None:
        """Stop watching these threads (where ``on_record`` still watches them: a later exporter may have
        taken the name); with none left, the loggers get their filters back as they were."""
        with self._lock:
            for name in thread_names:
                if self._watched.get(name) == on_record:
                    del self._watched[name]
            if not self._watched:
                for logger in self._loggers:
                    logger.removeFilter(self)
                self._loggers.clear()

    @property
    def attached(self) -> list[logging.Logger]:
        return list(self._loggers)

    def _attach(self) -> None:
        """Attach to every logger of the export path that exists now (called on each ``watch``: loggers made
        by modules imported since are covered from the next exporter on)."""
        names = set(KNOWN_LOGGERS)
        names.update(name for name, logger in list(logging.root.manager.loggerDict.items())
                     if isinstance(logger, logging.Logger) and name.startswith(LOGGER_PREFIXES))
        for name in sorted(names):
            logger = logging.getLogger(name)
            if self not in logger.filters:
                # First: the gate must see every record before a filter of the SDK's own drops repeats
                # (the gRPC exporter's lets one line of a kind through every 20 s), to count them all.
                logger.filters.insert(0, self)
                self._loggers.append(logger)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        on_record = self._watched.get(record.threadName or "")
        if on_record is None:
            return True
        try:
            message = record.getMessage()
        except Exception as exc:  # a broken format string in a library's record
            message = describe_exception(exc)
        if record.exc_info and record.exc_info[1] is not None:
            message = f"{message}: {describe_exception(record.exc_info[1])}"
        message = _CREDENTIALS.sub("", message[:4096])  # an endpoint quoted with user:password@
        with contextlib.suppress(Exception):
            on_record(message, "retrying" in message.lower())
        return False


GATE = LogGate()
