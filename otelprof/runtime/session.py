"""One otelprof session per process: wires config -> resource -> recorder -> exporters.

Owns the background thread, the lifecycle times, and the process hooks
(atexit, SIGTERM, fork). Nothing here raises into the training job.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricsData, ResourceMetrics, ScopeMetrics
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otelprof import _arguments
from otelprof import semconv as sc
from otelprof._log import escape, info_once, logger, reset_warnings, warn_once
from otelprof._version import __version__
from otelprof.config import Config
from otelprof.recording import otlp_json, remote, schema
from otelprof.recording.writer import RecordingWriter, claim
from otelprof.runtime import _sigterm, _stop_exit, extensions
from otelprof.runtime import hotpath as hot
from otelprof.runtime.collectors.environment import gpu_attributes
from otelprof.runtime.collectors.sampler import Sampler
from otelprof.runtime.control import MAX_CAPTURE_STEPS, ControlServer
from otelprof.runtime.export import otlp
from otelprof.runtime.export.prometheus import PrometheusEndpoint
from otelprof.runtime.metrics import MetricRegistry
from otelprof.runtime.recorder import Recorder, SpanSink
from otelprof.runtime.resource import build_resource, identity_labels

_session: Session | None = None
_starting: Session | None = None
"""The session being built: what it began is undone when building it fails (:func:`_abandon`)."""
_session_lock = threading.Lock()
_fork_hook_installed = False


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _process_start_time() -> float:
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return time.time()


class Session:
    """A running otelprof session. Use ``otelprof.init()`` rather than building one directly."""

    def __init__(self, config: Config) -> None:
        global _starting
        _starting = self
        if not config.run_id:
            config = dataclasses.replace(config, run_id=new_run_id())
        # Resolved now: a script that changes directory (os.chdir, Hydra's job.chdir) still finishes its recording.
        if not remote.is_url(config.record_dir):  # a URL stays as it is; its spool is resolved likewise
            config = dataclasses.replace(config, record_dir=os.path.abspath(config.record_dir))
        elif config.record_spool_dir:
            config = dataclasses.replace(config, record_spool_dir=os.path.abspath(config.record_spool_dir))
        lock = None
        if config.record:
            run_id, lock = claim(remote.local_root(config), config.run_id, config.rank, os.getpid(),
                                 _process_start_time())
            if run_id != config.run_id:
                warn_once("recording:collision", "otelprof: run %s rank %d is recorded in %s by another process "
                          "(two jobs given one run id, or a restart); this process records it as run %s",
                          escape(config.run_id), config.rank, escape(config.record_dir), escape(run_id))
                config = dataclasses.replace(config, run_id=run_id)
        self.config = config
        self._pid = os.getpid()
        self._closed = False
        self._stop = threading.Event()
        self.lifecycle: dict[str, float | None] = dict.fromkeys(schema.LIFECYCLE_EVENTS)
        self.lifecycle["process_start"] = _process_start_time()
        self.lifecycle["init"] = time.time()
        self.resource = build_resource(config)
        self.registry = MetricRegistry(identity_labels(self.resource), max_series=config.max_series)
        self.run_dir: Path | None = None
        self.writer: RecordingWriter | None = None
        if config.record:
            self.run_dir = remote.local_root(config) / config.run_id / schema.rank_dir_name(config.rank)
            self.writer = RecordingWriter(self.run_dir, self._manifest(), self._writer_dropped, self._writer_bytes,
                                          lock)
        self.sampler: Sampler | None = None
        if config.system_metrics:
            self.sampler = Sampler(config, self.registry, self.writer)
            self._add_gpu_attributes(self.sampler)

        self._span_exporters: list[otlp.BackgroundExporter] = []
        for kind in config.traces_exporters:
            name = "otlp_traces" if kind == "otlp" else "console_traces"
            span_exporter = _make_exporter(otlp.make_span_exporter, kind, config.otlp_protocol, name)
            if span_exporter is not None:
                self._span_exporters.append(otlp.span_exporter(
                    span_exporter, name, config.queue_size, self._count_dropped, config.export_warning_interval))
        self._metric_exporters: list[otlp.BackgroundExporter] = []
        for kind in config.metrics_exporters:
            if kind == "prometheus":
                continue
            name = "otlp_metrics" if kind == "otlp" else "console_metrics"
            metric_exporter = _make_exporter(otlp.make_metric_exporter, kind, config.otlp_protocol, name)
            if metric_exporter is not None:
                self._metric_exporters.append(otlp.metric_exporter(
                    metric_exporter, name, self._count_dropped, timeout=min(config.metric_export_interval, 10.0),
                    warning_interval=config.export_warning_interval))

        sinks: list[SpanSink] = [exporter.offer for exporter in self._span_exporters]
        if self.writer is not None:
            sinks.append(self._record_spans)
        self.tracer_provider = TracerProvider(resource=self.resource)
        self.recorder = Recorder(config, self.registry, self.tracer_provider, sinks, self.writer, self.lifecycle)
        self.prometheus: PrometheusEndpoint | None = None
        if "prometheus" in config.metrics_exporters:
            self.prometheus = PrometheusEndpoint(self.registry, dict(self.resource.attributes))
            if not self.prometheus.start(config.prometheus_host, config.prometheus_rank_port):
                self.prometheus = None
        if self.sampler is not None:
            self.sampler.start()
        self._stop_reason: str | None = None
        self._stop_callbacks: list[Callable[[], None]] = []
        self._stop_polled = False  # the program called should_stop(): it leaves on its own
        self._stop_exit: _stop_exit.Exit | None = None
        self.capture_handler: Callable[[int], dict[str, Any]] | None = None
        self.control: ControlServer | None = None
        if config.control_port:
            self.control = ControlServer(self._control_stop, self.capture, self.status, config.control_token,
                                         self.registry)
            if not self.control.start(config.control_host, config.control_rank_port):
                self.control = None
        self._sigterm: _sigterm.SigtermHandler | None = None
        self.uploader: remote.Uploader | None = None
        if self.writer is not None and self.run_dir is not None and remote.is_url(config.record_dir):
            self.uploader = remote.start_uploader(config, self.run_dir, self.writer, self._upload_dropped,
                                                  self._adopted_parts)
        self._thread = threading.Thread(target=self._run, name="otelprof-recorder", daemon=True)
        self._thread.start()
        hot._activate(self.recorder)
        self.extensions = extensions.start_all(config)

    # ------------------------------------------------------------------ recording helpers
    def _add_gpu_attributes(self, sampler: Sampler) -> None:
        """The GPUs' model, count and driver versions, from the NVML seam the sampler just opened, join the
        resource (``OTEL_RESOURCE_ATTRIBUTES`` still wins) before the exporters are given it."""
        found = gpu_attributes(sampler.gpus)
        if not found:
            return
        self.resource = Resource(found).merge(self.resource)
        if self.writer is not None:
            self.writer.update_manifest(resource=dict(self.resource.attributes))
    def _manifest(self) -> dict[str, Any]:
        return {
            "schema_version": schema.SCHEMA_VERSION,
            "otelprof_version": __version__,
            "run_id": self.config.run_id,
            "rank": self.config.rank,
            "local_rank": self.config.local_rank,
            "world_size": self.config.world_size,
            "status": schema.STATUS_RUNNING,
            "resource": {k: v for k, v in self.resource.attributes.items()},
            "config": self.config.as_dict(),
            "lifecycle": dict(self.lifecycle),
            "files": {"steps": schema.STEPS, "spans": schema.SPANS, "metrics": schema.METRICS,
                      "samples": schema.SAMPLES},
        }

    def _record_spans(self, spans: Any) -> None:
        assert self.writer is not None
        self.writer.add(schema.SPANS, otlp_json.spans_to_json(spans))

    def _count_dropped(self, exporter: str, amount: int) -> None:
        self.recorder.count_dropped(exporter, amount)

    def _writer_dropped(self, amount: int) -> None:
        self.recorder.count_dropped(sc.DROPPED_RECORDING, amount)

    def _upload_dropped(self, amount: int) -> None:
        self.recorder.count_dropped(sc.DROPPED_RECORDING_UPLOAD, amount)

    def _adopted_parts(self, amount: int) -> None:
        self.registry.add(sc.RECORDING_ADOPTED_PARTS, (), amount)

    def _writer_bytes(self, amount: int) -> None:
        with self.registry.lock:
            self.recorder.recording_bytes.add(amount)

    # ------------------------------------------------------------------ background loop
    def _run(self) -> None:
        """Process records every flush interval (or when woken), export metrics on their interval."""
        flush_interval = self.config.flush_interval
        next_flush = time.monotonic() + flush_interval
        next_export = time.monotonic() + self.config.metric_export_interval
        while not self._stop.is_set():
            self.recorder.wait(max(next_flush - time.monotonic(), 0.0))
            if self._stop.is_set():
                return
            try:
                self.recorder.drain(background=True)
                now = time.monotonic()
                if now < next_flush:
                    continue
                next_flush = now + flush_interval
                if now >= next_export:
                    next_export = now + self.config.metric_export_interval
                    self._export_metrics()
                if self.writer is not None:
                    self.writer.flush(complete=False)  # samples go out a block at a time
            except Exception:
                logger.exception("otelprof: internal error in the background thread")

    def metrics_data(self, exemplars: bool = False) -> MetricsData:
        """A snapshot of every metric (pending records processed first); ``exemplars``: with the histograms'."""
        scope = InstrumentationScope(sc.SCOPE_NAME, __version__, sc.SCHEMA_URL)
        metrics = self.registry.collect(exemplars)
        return MetricsData([ResourceMetrics(self.resource, [ScopeMetrics(scope, metrics, sc.SCHEMA_URL)],
                                            self.resource.schema_url)])

    def _export_metrics(self) -> None:
        data = self.metrics_data(bool(self._metric_exporters))  # the recording leaves the exemplars out
        for exporter in self._metric_exporters:
            exporter.offer([data])
        if self.writer is not None:
            self.writer.add(schema.METRICS, otlp_json.metrics_to_json(data))

    # ------------------------------------------------------------------ stop and capture
    def should_stop(self) -> bool:
        """True once a stop was requested (alert action, control endpoint, ``request_stop()``).

        Check it after each step and leave the loop; the ``on_stop`` callbacks have run by then: at the
        step boundary when the request arrived during a step, here when it arrived after the step ended."""
        self._stop_polled = True
        if self._stop_reason is None:
            return False
        if self._stop_exit is not None:
            self._stop_exit.cancel()  # the program leaves on its own
        if self._stop_callbacks and hot._tls.step is None and hot._native[0] is None:  # between two steps
            self._run_stop_callbacks()
        return True

    def _exit_on_stop(self, before_exit: Callable[[], None] | None = None) -> None:
        """``otelprof run``: a stop request ends the process (:mod:`otelprof.runtime._stop_exit`) unless the
        program handles stops itself. ``before_exit`` runs before a process ended after the grace period exits."""
        self._stop_exit = _stop_exit.Exit(self, self.config.stop_grace, before_exit)

    def note_stop_exit(self, how: str, status: int) -> None:
        """Write in the manifest that a stop request ends the process (``how``: at the step boundary or after the
        grace period) and with which exit status."""
        if self.writer is not None:
            stop = self.writer.manifest.get("stop")
            self.writer.update_manifest(stop={**(stop if isinstance(stop, dict) else {}), "exit": how,
                                              "exit_status": status})

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (e.g. save a checkpoint) on the training thread at the step boundary
        after a stop request."""
        if not callable(callback):
            _arguments.reject("on-stop", "on_stop() got %s, which is not callable", _arguments.type_name(callback))
            return
        self._stop_callbacks.append(callback)

    def request_stop(self, reason: str = "requested", alert: str = "") -> dict[str, Any]:
        """Ask the training loop to stop at the next step boundary. Idempotent."""
        reason = _text_argument(reason, "requested", "request_stop(reason=...)")
        alert = _text_argument(alert, "", "request_stop(alert=...)")
        if self._stop_reason is None:
            self._stop_reason = reason
            logger.warning("otelprof: stop requested (%s%s); stopping at the next step boundary",
                           escape(reason), f", alert {escape(alert)}" if alert else "")
            if self.writer is not None:
                self.writer.update_manifest(stop={"reason": reason, "alert": alert, "time": time.time()})
            hot._step_boundary.append(self._at_stop_boundary)
            if self._stop_exit is not None:
                self._stop_exit.requested()
        return {"stopping": True, "reason": self._stop_reason, "run_id": self.config.run_id,
                "rank": self.config.rank}

    def _control_stop(self, reason: str, alert: str) -> dict[str, Any]:
        return self.request_stop(reason or "control endpoint", alert)

    def _at_stop_boundary(self) -> None:
        ending = self._stop_exit
        if ending is not None and not ending.reached():
            return  # the grace period ran out just now: the process is ending
        self._run_stop_callbacks()
        if self.config.stop_raises:
            raise hot.StopTraining(self._stop_reason or "stop requested")
        if ending is not None and not self._stop_polled:
            ending.exit()

    def _run_stop_callbacks(self) -> None:
        """The ``on_stop`` callbacks, each once, on the training thread."""
        callbacks, self._stop_callbacks = self._stop_callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                logger.exception("otelprof: an on_stop callback failed")

    def capture(self, steps: int = 10) -> dict[str, Any]:
        """Arm a profiling window for the next ``steps`` steps: the framework integration's
        operator profiler when one is installed, else spans for every step of the window."""
        if type(steps) is not int or not 1 <= steps <= MAX_CAPTURE_STEPS:
            _arguments.reject("capture-steps", "capture(steps=...) got %s, not an integer from 1 to %d",
                              _arguments.type_name(steps), MAX_CAPTURE_STEPS)
            return {"armed": False, "error": f"steps must be an integer from 1 to {MAX_CAPTURE_STEPS}"}
        if self.capture_handler is not None:
            return self.capture_handler(steps)
        start = hot.next_step_number()
        self.recorder.arm_window(start, steps)
        return {"armed": True, "kind": "spans", "start_step": start, "num_steps": steps}

    def status(self) -> dict[str, Any]:
        return {"run_id": self.config.run_id, "job_name": self.config.job_name, "rank": self.config.rank,
                "next_step": hot.next_step_number(), "phase": hot.current_phase(),
                "stop_requested": self._stop_reason}

    @property
    def control_address(self) -> tuple[str, int] | None:
        """(host, port) of the control endpoint, or None when it is off."""
        return self.control.address if self.control is not None else None

    # ------------------------------------------------------------------ public
    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """(host, port) of ``/metrics``, or None when this process serves none."""
        return self.prometheus.address if self.prometheus is not None else None

    @property
    def closed(self) -> bool:
        """True once :meth:`shutdown` began."""
        return self._closed

    @property
    def pid(self) -> int:
        """The process the session runs in (a forked child inherits the object, not the session)."""
        return self._pid

    def flush_recording(self) -> None:
        """Process pending records and write them to the recording (no export)."""
        if self._closed or os.getpid() != self._pid:
            return
        try:
            self.recorder.drain()
            if self.writer is not None:
                self.writer.flush()
        except Exception:
            logger.exception("otelprof: internal error during flush")

    def note_signal(self, name: str) -> None:
        """Write in the manifest when the process got signal ``name`` (the first time only)."""
        key = schema.SIGTERM if name == "SIGTERM" else name.lower()
        if self.writer is not None and key not in self.writer.manifest:
            self.writer.update_manifest(**{key: time.time()})
        if self.uploader is not None:
            self.uploader.wake()

    def flush(self, timeout: float | None = None) -> None:
        """Process pending records, write the recording and push queued exports (bounded wait)."""
        if self._closed or os.getpid() != self._pid:
            return
        try:
            deadline = time.monotonic() + _arguments.timeout_argument(timeout, self.config.shutdown_timeout)
            self.recorder.drain()
            self._export_metrics()
            if self.writer is not None:
                self.writer.flush()
            for exporter in self._span_exporters + self._metric_exporters:
                exporter.flush(max(deadline - time.monotonic(), 0.0))
        except Exception:
            logger.exception("otelprof: internal error during flush")

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush everything and stop, within ``timeout`` seconds (default ``OTELPROF_SHUTDOWN_TIMEOUT``)."""
        global _session
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self._stop_exit is not None:
            self._stop_exit.cancel()
        deadline = time.monotonic() + _arguments.timeout_argument(timeout, self.config.shutdown_timeout)
        try:
            hot._activate(None) if hot._active is self.recorder else None
            self._stop.set()
            extensions.stop_all(self.extensions, deadline)  # before the writer closes
            self.recorder.wake_up()
            self._thread.join(max(min(1.0, deadline - time.monotonic()), 0.0))
            if self.sampler is not None:
                self.sampler.stop(max(min(1.0, deadline - time.monotonic()), 0.0))
            self.lifecycle["shutdown"] = time.time()
            self._export_metrics()  # drains first, so the snapshot includes the last steps
            if self.writer is not None:
                self.writer.flush()
                self.writer.update_manifest(status=schema.STATUS_FINISHED, lifecycle=dict(self.lifecycle),
                                            dropped=self._dropped_summary())
            for exporter in self._span_exporters + self._metric_exporters:
                exporter.shutdown(deadline)
            if self.writer is not None:
                # Exporters abandoned at the deadline count their losses only now.
                self.writer.update_manifest(dropped=self._dropped_summary())
                self.writer.close(keep_lock=self.uploader is not None)  # claimed until its last upload ends
            if self.uploader is not None:
                self.uploader.close(max(deadline - time.monotonic(), 0.0))
                if self.writer is not None:
                    self.writer.release_lock()
            if self.prometheus is not None:
                self.prometheus.stop()
            if self.control is not None:
                self.control.stop()
            if self._sigterm is not None:
                _sigterm.uninstall(self._sigterm)
        except Exception:
            logger.exception("otelprof: internal error during shutdown")
        finally:
            with _session_lock:
                if _session is self:
                    _session = None

    def discard(self) -> None:
        """Stop without recording or exporting anything more and delete this process's local recording: other
        processes record the run in its place (``otelprof run``: the ranks a process starts with
        multiprocessing, :mod:`otelprof.cli.spawned_ranks`). Its ports are free when this returns."""
        global _session
        if self._closed or os.getpid() != self._pid:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self._stop_exit is not None:
            self._stop_exit.cancel()
        try:
            hot._activate(None) if hot._active is self.recorder else None
            if self.prometheus is not None:
                self.prometheus.stop()
            if self.control is not None:
                self.control.stop()
            if self._sigterm is not None:
                _sigterm.uninstall(self._sigterm)  # on the main thread only; elsewhere it hands the signal on
            self._stop.set()
            extensions.stop_all(self.extensions, None)
            self.recorder.wake_up()
            self._thread.join(1.0)
            if self.sampler is not None:
                self.sampler.stop(1.0)
            if self.uploader is not None:
                self.uploader.discard()
            if self.writer is not None:
                self.writer.remove(self._pid)
            deadline = time.monotonic() + self.config.shutdown_timeout
            for exporter in self._span_exporters + self._metric_exporters:
                exporter.shutdown(deadline)
        except Exception:
            logger.exception("otelprof: internal error while stopping")
        finally:
            with _session_lock:
                if _session is self:
                    _session = None

    def _dropped_summary(self) -> dict[str, float]:
        with self.registry.lock:
            return {labels[0]: value for labels, value in self.recorder.dropped.values.items()}

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _text_argument(text: object, default: str, what: str) -> str:
    """A free-text argument (a stop reason): a str, cut to a name's length; anything else is ``default``."""
    if isinstance(text, str):
        return _arguments.clean_name(text)
    _arguments.reject("text", "%s got %s, not a string", what, _arguments.type_name(text))
    return default


def _make_exporter(factory: Any, kind: str, protocol: str, name: str) -> Any:
    """The SDK exporter, or None (one warning) when its constructor raises, e.g. on a bad OTEL_* value."""
    try:
        return factory(kind, protocol)
    except Exception as exc:
        warn_once(f"exporter:{name}", "otelprof: cannot create the %s exporter (%s); it is off, the recording "
                  "and the other exporters go on", name, escape(str(exc)))
        return None


class _DisabledSession:
    """What ``init()`` returns when ``OTEL_SDK_DISABLED=true``: every method is a no-op."""

    run_dir = None
    metrics_address = None
    control_address = None

    def __init__(self, config: Config) -> None:
        self.config = config

    def flush(self, timeout: float | None = None) -> None:
        return None

    def shutdown(self, timeout: float | None = None) -> None:
        return None

    def should_stop(self) -> bool:
        return False

    def on_stop(self, callback: Callable[[], None]) -> None:
        return None

    def request_stop(self, reason: str = "requested", alert: str = "") -> dict[str, Any]:
        return {"stopping": False}

    def capture(self, steps: int = 10) -> dict[str, Any]:
        return {"armed": False}

    def __enter__(self) -> _DisabledSession:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def init(**overrides: Any) -> Session | _DisabledSession:
    """Start otelprof for this process (idempotent: a second call returns the running session)."""
    global _session, _starting, _fork_hook_installed
    try:
        with _session_lock:
            if _session is not None:  # (under otelprof run, a script's own init() lands here: nothing to say)
                if overrides:
                    warn_once("init:twice", "otelprof: init() called while a session is running (otelprof run, "
                              "or an earlier init()); keeping it, without these arguments: %s",
                              escape(", ".join(sorted(overrides))[:300]))
                else:
                    info_once("init:twice", "otelprof: init() called while a session is running; keeping it")
                return _session
            reset_warnings()
            config = Config.from_env(**overrides)
            if config.disabled:
                return _DisabledSession(config)
            session = Session(config)
            _session, _starting = session, None
            if not _fork_hook_installed:
                os.register_at_fork(after_in_child=_after_fork_in_child)
                _fork_hook_installed = True
            atexit.register(session.shutdown)
            if config.handle_sigterm:
                session._sigterm = _sigterm.install(session)
            return session
    except Exception as exc:
        logger.warning("otelprof: init() failed (%s); training goes on without otelprof", escape(repr(exc)))
        logger.debug("otelprof: init() failed", exc_info=True)
        _abandon()
        return _DisabledSession(Config())


def _abandon() -> None:
    """Undo what a session that failed to start began: its endpoints, its sampler, its recording directory."""
    global _starting
    session, _starting = _starting, None
    if session is None or session is _session:
        return
    for part in ("prometheus", "control"):
        server = session.__dict__.get(part)
        if server is not None:
            with contextlib.suppress(Exception):
                server.stop()
    sampler = session.__dict__.get("sampler")
    if sampler is not None:
        with contextlib.suppress(Exception):
            sampler.stop(1.0)
    writer = session.__dict__.get("writer")
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.remove(os.getpid())


def shutdown(timeout: float | None = None) -> None:
    """Flush and stop the running session (no-op when none runs)."""
    session = _session
    if session is not None:
        session.shutdown(timeout)


def get_session() -> Session | None:
    return _session


def _after_fork_in_child() -> None:
    """A forked child (DataLoader worker) records nothing and runs no exporter threads."""
    global _session
    hot._activate(None)
    _session = None

