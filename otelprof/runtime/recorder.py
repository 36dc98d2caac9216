"""Turns closed step and annotation records into aggregates, recording lines and spans.

Runs off the hot path: a background thread drains the queue every flush
interval, and a scrape or export drains it first so it always sees fresh data.
Only one thread processes at a time (``_drain_lock``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

from otelprof import _arguments
from otelprof import semconv as sc
from otelprof._log import describe_exception, logger, sanitize, warn_once
from otelprof.config import Config
from otelprof.recording import schema
from otelprof.recording.writer import RecordingWriter
from otelprof.runtime import hotpath as hot
from otelprof.runtime.metrics import MetricRegistry
from otelprof.runtime.span_builder import SpanBuilder, StepSpan
from otelprof.shared import collectives, nesting
from otelprof.shared.outliers import LossSpikes, StepJudge, in_windows, step_units
from otelprof.shared.sampling import SpanSelector

SpanSink = Callable[[Sequence[ReadableSpan]], None]


class LabelCap:
    """Keeps at most ``limit`` distinct label values; later ones become ``other`` (one warning)."""

    def __init__(self, label: str, limit: int) -> None:
        self.label = label
        self.limit = limit
        self.known: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.known:
            return value
        value = _arguments.clean_name(value)  # long or unencodable names: the label is the name as recorded
        if value in self.known:
            return value
        if len(self.known) < self.limit:
            self.known.add(value)
            return value
        warn_once(f"labelcap:{self.label}", "otelprof: more than %d distinct %s names; further ones are "
                  "labelled %r on metrics (OTELPROF_MAX_LABEL_VALUES)", self.limit, self.label, sc.OTHER_LABEL_VALUE)
        return sc.OTHER_LABEL_VALUE


class _Encoded(dict[str, str]):
    """Names and their JSON forms in a step line (``template`` around the JSON string), each formatted once;
    a hit is a plain dict lookup. At most 10,000 names are kept (raw names past the label cap)."""

    def __init__(self, template: str) -> None:
        super().__init__()
        self.template = template

    def __missing__(self, name: str) -> str:
        encoded = self.template.format(json.dumps(_arguments.clean_name(name)))
        if len(self) < 10_000:
            self[name] = encoded
        return encoded


MAX_WINDOWS = 16
"""Step-tracing windows armed at run time kept by the span selector (older ones have ended)."""
MAX_WINDOW_STEPS = 256
"""Spans of steps inside windows remembered for the operator spans of their window."""
_DATALOADER = sc.REGION_DATALOADER
_COLLECTIVE = sc.REGION_COLLECTIVE
_COMPILE = sc.REGION_COMPILE
DRAIN_CHUNK = 16
"""Records processed between two hand-overs of the GIL (about 0.3 ms of work) when processing at full speed."""
BACKGROUND_PAUSE = 50e-6
"""The background thread's sleep after each record. Processing holds the GIL; a training thread that comes
back from a kernel (which runs without it) while the recorder holds it waits, and ``time.sleep(0)`` does not
hand it over (the sleeping thread takes it straight back), so a chunk of records used to cost the training
thread about its whole processing time. A real sleep hands the GIL to the waiting thread, so records are
processed while the training thread runs kernels: measured on the benchmark CNN (paired blocks with and without
the recorder running concurrently), the recorder's share of the step went from +13..+23 µs in chunks to +6 µs
(median of 200 pairs)."""
_sleep = time.sleep
GENTLE_MIN_STEP_NS = 1_000_000
"""The gentle pace is for loops whose last step took at least this long (1 ms). Shorter steps are made of short
operations: the training thread takes the GIL back within microseconds, each record's hand-over then costs
it the record plus two thread wake-ups, and chunks cost less (the tiny benchmark loop: about +15 µs per step
in chunks, +25..+45 µs one record at a time)."""
GIL_CONTENDED = 1e-3
"""A ``BACKGROUND_PAUSE`` sleep that lasted this long waited for the GIL: the training thread holds it most of
the time (a loop of small operations), where waiting per record costs it more than chunks: the rest of the
drain goes at full speed."""
GENTLE_BACKLOG = 2_000
"""Past this many queued records the background thread processes at full speed (the gentle pace handles
several thousand records a second)."""


class Recorder:
    """The per-process aggregation stage between the hot path and the exporters."""

    def __init__(
        self,
        config: Config,
        registry: MetricRegistry,
        tracer_provider: TracerProvider,
        span_sinks: Sequence[SpanSink],
        writer: RecordingWriter | None,
        lifecycle: dict[str, float | None],
    ) -> None:
        self.config = config
        self.registry = registry
        self.writer = writer
        self.lifecycle = lifecycle
        self.capacity = config.queue_size
        self.queue: deque[tuple[Any, ...]] = deque()
        self.queue_dropped = 0
        self._reported_dropped = 0
        self._reported_regions = hot.dropped_regions  # the counter is per process, the metric per session
        self._reported_rejected = _arguments.rejected  # the same
        # perf_counter_ns() + offset = Unix time in ns
        self.offset_ns = time.time_ns() - time.perf_counter_ns()
        self._drain_lock = threading.RLock()
        self._wake = threading.Lock()
        """Held while nobody asked the background thread to run; :meth:`wake_up` releases it."""
        self._wake.acquire()
        self._span_sinks = list(span_sinks)
        self._collected: deque[ReadableSpan] = deque()  # ended spans; appended from any thread
        tracer_provider.add_span_processor(_CollectSpans(self._collected))
        self._spans = SpanBuilder(tracer_provider)
        self._selector = SpanSelector.from_config(config)
        self._exemplars = config.exemplars and bool(self._span_sinks)
        """Traced steps give the duration histograms' buckets exemplars (OTEL_METRICS_EXEMPLAR_FILTER), when their
        spans go somewhere."""
        self._span_seconds = 0.0  # build + export time of spans not yet settled with the selector
        self._json_names = _Encoded("{}")
        self._json_keys = _Encoded("{}:")
        self._annotation_keys: dict[tuple[str, str], tuple[str, str]] = {}
        self._region_prefixes = _Encoded("[{},")
        self._latest: dict[str, tuple[int, int, int]] = {}
        """Per phase label, since the last _settle_steps: (steps, last end in perf ns, last number)."""
        self._outliers: dict[str, StepJudge] = {}
        self._spikes: dict[str, LossSpikes] = {}
        self._slowed: dict[str | None, list[tuple[int, int]]] = {}
        """Per phase, the profiling windows (first step, steps) whose steps, and the few after, otelprof slowed."""
        self._loss_totals: dict[str, float] = {}
        """Per phase label: the running sum of finite step losses (otelprof_loss_summed)."""
        self._seen: dict[str, int] = {}
        self._phase_label = LabelCap(sc.LABEL_PHASE, config.max_label_values)
        self._annotation_label = LabelCap(sc.LABEL_ANNOTATION, config.max_label_values)
        self._current_phase: str | None = None
        self._last_phase: str | None = None
        self._last_label = ""
        """The phase of the last step record and its label (a step's phase mostly repeats the one before)."""
        self._last_step_ns = 0
        self._window_spans: dict[tuple[str, int], StepSpan] = {}
        """Spans of the latest steps inside windows: operator spans become their children."""
        """Duration of the last step processed: chooses the background pace (``GENTLE_MIN_STEP_NS``)."""

        r = registry
        self.step_duration = r.histogram(sc.STEP_DURATION)
        self.steps = r.counter(sc.STEPS)
        self.step_outliers = r.counter(sc.STEP_OUTLIERS)
        self.step_outlier_excess = r.counter(sc.STEP_OUTLIER_EXCESS)
        self.loss_summed = r.gauge(sc.LOSS_SUMMED)
        self.loss_squared = r.counter(sc.LOSS_SQUARED)
        self.loss_recorded = r.counter(sc.LOSS_RECORDED)
        self.loss_spikes = r.counter(sc.LOSS_SPIKES)
        self.grad_norm_summed = r.counter(sc.GRAD_NORM_SUMMED)
        self.grad_norm_recorded = r.counter(sc.GRAD_NORM_RECORDED)
        self.step_last = r.gauge(sc.STEP_LAST_TIMESTAMP)
        self.step_first = r.gauge(sc.STEP_FIRST_TIMESTAMP)
        self.step_number = r.gauge(sc.STEP_NUMBER)
        self.phase_active = r.gauge(sc.PHASE_ACTIVE)
        self.annotation_duration = r.histogram(sc.ANNOTATION_DURATION)
        self.nonfinite = r.counter(sc.NONFINITE)
        self.dropped = r.counter(sc.EXPORTER_DROPPED)
        self.spans_built = r.counter(sc.SPANS_BUILT)
        self.span_build_time = r.counter(sc.SPAN_BUILD_TIME)
        self.recording_bytes = r.counter(sc.RECORDING_BYTES)
        self.dataloader_wait = r.histogram(sc.DATALOADER_WAIT)
        self.dataloader_wait_ratio = r.histogram(sc.DATALOADER_WAIT_RATIO)
        self.collective_duration = r.histogram(sc.COLLECTIVE_DURATION)
        self.collective_exposed = r.histogram(sc.COLLECTIVE_EXPOSED)
        self.device_duration = r.histogram(sc.REGION_DEVICE_DURATION)
        self.scalar_gauges = {name: r.gauge(spec) for name, spec in sc.SCALAR_GAUGES.items()}
        self.scalar_counters = {name: r.counter(spec) for name, spec in sc.SCALAR_COUNTERS.items()}
        r.gauge(sc.PROCESS_START_TIME).set(lifecycle.get("process_start") or time.time())
        self.dropped.add(0, (sc.DROPPED_QUEUE,))
        registry.before_collect(self.drain)

    # ------------------------------------------------------------------ hot path entry
    def submit(self, item: tuple[Any, ...]) -> None:
        """Queue one record; when the queue is full the record is dropped and counted."""
        queue = self.queue
        if len(queue) < self.capacity:
            queue.append(item)
        else:
            self.queue_dropped += 1

    def wake_up(self) -> None:
        """Wake the background thread now (shutdown: no wait for the rest of the flush interval)."""
        if self._wake.locked():
            with contextlib.suppress(RuntimeError):  # woken by another thread in between
                self._wake.release()

    def wait(self, timeout: float) -> bool:
        """Background thread: sleep until :meth:`wake_up` or ``timeout``; True when woken."""
        return self._wake.acquire(timeout=timeout)

    def arm_window(self, start_step: int, num_steps: int, slows: str | None = None) -> None:
        """Trace every step numbered ``start_step`` .. ``start_step + num_steps - 1`` (any phase); the windows
        armed at run time (captures, periodic profiling) are the last ``MAX_WINDOWS`` ones. ``slows``: the phase
        of an operator-profiling window, whose steps (and the few after) are then never judged as outliers."""
        if slows is not None:  # no lock: called on the training thread, and list appends are atomic
            windows = self._slowed.setdefault(slows, [])
            windows.append((start_step, num_steps))
            del windows[:-MAX_WINDOWS]
        configured = len(self.config.span_windows)
        armed = self._selector.windows[configured:][-(MAX_WINDOWS - 1):]
        self._selector.windows = (*self._selector.windows[:configured], *armed, (start_step, num_steps))

    @property
    def span_builder(self) -> SpanBuilder:
        return self._spans

    def typical_step(self, phase: str) -> float:
        """Median duration in seconds of the last steps of ``phase`` the recorder saw (0: none yet): the baseline
        of a profiling window that had no steps of its own before it (a capture)."""
        judge = self._outliers.get(phase)
        recent = sorted(judge.time.window) if judge is not None else []
        return recent[len(recent) // 2] if recent else 0.0

    def window_steps(self, phase: str, start_step: int, num_steps: int) -> list[StepSpan]:
        """The spans of a window's steps that were traced (a sampler may have dropped some)."""
        with self._drain_lock:
            found = (self._window_spans.get((phase, n)) for n in range(start_step, start_step + num_steps))
            return [s for s in found if s is not None]

    def add_spans(self, spans: Sequence[ReadableSpan], dropped: int = 0, reason: str = "operator") -> None:
        """Operator spans built elsewhere (off the hot path): exported and recorded with the step spans."""
        self._collected.extend(spans)
        with self.registry.lock:
            self.spans_built.add(len(spans), (reason,))
            if dropped:
                self.dropped.add(dropped, (sc.DROPPED_OPERATOR_SPANS,))

    # ------------------------------------------------------------------ background
    def count_dropped(self, exporter: str, amount: int) -> None:
        with self.registry.lock:
            self.dropped.add(amount, (exporter,))

    def drain(self, background: bool = False) -> None:
        """Process every queued record. Safe from any thread; never raises."""
        with self._drain_lock:
            try:
                self._drain(background)
            except Exception:  # a bug here must not stop telemetry for good, nor reach the job
                logger.exception("otelprof: internal error while processing records")

    def _drain(self, background: bool = False) -> None:
        queue = self.queue
        # In the background, one record at a time with a short sleep in between while that is cheap (see
        # BACKGROUND_PAUSE); otherwise, and once the GIL turns out to be contended, chunks at full speed.
        gentle = background and len(queue) <= GENTLE_BACKLOG and self._last_step_ns >= GENTLE_MIN_STEP_NS
        chunk_size = 1 if gentle else DRAIN_CHUNK
        with self.registry.lock:
            regions = hot.dropped_regions
            if regions != self._reported_regions:
                self.dropped.add(regions - self._reported_regions, (sc.DROPPED_STEP_REGIONS,))
                self._reported_regions = regions
                warn_once("step-regions", "otelprof: a step holds %d regions; more are dropped and counted (a "
                          "step that never ends?)", hot.MAX_STEP_ANNOTATIONS)
            if self.queue_dropped != self._reported_dropped:
                self.dropped.add(self.queue_dropped - self._reported_dropped, (sc.DROPPED_QUEUE,))
                self._reported_dropped = self.queue_dropped
                warn_once("queue-full", "otelprof: record queue full (OTELPROF_QUEUE_SIZE=%d); "
                          "records are dropped and counted", self.capacity)
        while queue:
            with self.registry.lock:
                for _ in range(min(len(queue), chunk_size)):
                    item = queue.popleft()
                    try:  # free unless it raises: one record that cannot be processed costs only itself
                        kind = item[0]
                        if kind == hot.STEP:
                            self._step(item)
                        elif kind == hot.NATIVE_STEP:
                            record = item[1].pop()
                            if record is not None:
                                self._step(record)
                        elif kind == hot.ANNOTATION:
                            self._annotation(*item[1:])
                        elif kind == hot.SCALAR:
                            self._scalar_alone(*item[1:])
                        elif kind == hot.PHASE:
                            self._phase(*item[1:])
                        elif kind == hot.DEVICE:
                            self._device(item[1])
                    except Exception as exc:
                        self._failed(exc)
            # Hand the GIL over between chunks: a training thread coming back from a kernel that ran
            # without the GIL would otherwise wait up to the interpreter's switch interval (5 ms).
            if gentle:
                began = time.perf_counter()
                _sleep(BACKGROUND_PAUSE)
                if time.perf_counter() - began > GIL_CONTENDED or len(queue) > GENTLE_BACKLOG:
                    gentle, chunk_size = False, DRAIN_CHUNK
            else:
                _sleep(0)
        if _arguments.rejected != self._reported_rejected:  # arguments rejected on the hot path or just now
            with self.registry.lock:
                rejected = _arguments.rejected
                self.dropped.add(rejected - self._reported_rejected, (sc.DROPPED_INVALID,))
                self._reported_rejected = rejected
        if self._latest:  # once per drain: a collection waits for the drain (it drains first), so sees them
            with self.registry.lock:
                self._settle_steps()
        if self._collected:
            began = time.perf_counter()
            spans = [self._collected.popleft() for _ in range(len(self._collected))]
            for sink in self._span_sinks:
                sink(spans)
            self._span_seconds += time.perf_counter() - began
            with self.registry.lock:
                self.span_build_time.add(self._span_seconds)
            self._selector.settle(self._span_seconds, len(spans))
            self._span_seconds = 0.0

    def _failed(self, exc: Exception) -> None:
        """A record whose processing raised (under the registry lock): dropped, counted, one warning."""
        self.dropped.add(1, (sc.DROPPED_RECORD_ERROR,))
        logger.debug("otelprof: a record could not be processed", exc_info=True)
        warn_once("record-error", "otelprof: a record could not be processed (%s: %s); it is dropped and counted in "
                  "otelprof_exporter_dropped_total{exporter=\"record_error\"}, the others go on",
                  type(exc).__name__, sanitize(describe_exception(exc)))

    def _unix_ns(self, perf_ns: int) -> int:
        return perf_ns + self.offset_ns

    def _phase(self, phase: str, at_ns: int) -> None:
        label = self._phase_label(phase)
        if self._current_phase is not None and self._current_phase != label:
            self.phase_active.set(0, (self._current_phase,))
        self._current_phase = label
        self.phase_active.set(1, (label,))
        if self.writer is not None:
            self.writer.add_json(schema.STEPS, {"k": schema.KIND_PHASE, "ph": _arguments.clean_name(phase),
                                                "t": self._unix_ns(at_ns)})

    def _step(self, record: tuple[Any, ...]) -> None:
        """A step record: (STEP, phase, number, start_ns, end_ns, annotations, scalars, error); unpacked here, as
        slicing it for a call costs a tuple per step."""
        _, phase, number, start_ns, end_ns, annotations, scalars, error = record
        # Written for the cost per step: this runs once per training step, on a thread that shares the GIL
        # with the training loop. What only needs the last value (step counters, last step time and number,
        # lifecycle) is kept per phase and applied once per drain (_settle_steps).
        if phase == self._last_phase:  # the usual case: the same phase as the step before
            label = self._last_label
        else:
            label = self._last_label = self._phase_label(phase)
            self._last_phase = phase
        if self._current_phase != label:
            self._phase(phase, start_ns)
        labels = (label,)
        step_ns = self._last_step_ns = end_ns - start_ns
        duration = step_ns / 1e9
        start_unix = start_ns + self.offset_ns
        self.step_duration.observe(duration, labels)
        latest = self._latest.get(label)
        self._latest[label] = (1 if latest is None else latest[0] + 1, end_ns, number)
        if self.lifecycle.get("first_step_start") is None:
            self._first_step(start_unix)
        wait_ns = 0
        collective = compiled = False
        if annotations:
            keys = self._annotation_keys
            observe = self.annotation_duration.observe
            skip = nesting.repeats(annotations)  # usually None: no region inside one of its own name
            for index, (name, a_start, a_end, _depth, _err) in enumerate(annotations):
                if skip is not None and index in skip:
                    continue
                key = keys.get((label, name))
                if key is None:
                    if len(keys) > 10_000:  # raw names past the label cap would grow it for ever
                        keys.clear()
                    key = keys[(label, name)] = (label, self._annotation_label(name))
                observe((a_end - a_start) / 1e9, key)
                if name == _DATALOADER:
                    wait_ns += a_end - a_start
                elif name == _COLLECTIVE:
                    collective = True
                elif name == _COMPILE:
                    compiled = True
            if wait_ns:
                self.dataloader_wait.observe(wait_ns / 1e9, labels)
                self.dataloader_wait_ratio.observe(min(wait_ns / max(step_ns, 1), 1.0), labels)
            if collective:  # all-reduces overlap one another and the backward pass: their union, and what of it
                union_ns, exposed_ns = collectives.step_communication(start_ns, end_ns, annotations)  # is waiting
                self.collective_duration.observe(union_ns / 1e9, labels)
                self.collective_exposed.observe(exposed_ns / 1e9, labels)
        values = self._scalars(scalars, labels) if scalars else None
        if values:
            self._step_scalars(phase, values, labels)
        outlier = False
        slowed = self._slowed.get(phase)
        # a step otelprof slowed is never judged, nor one during which torch.compile compiled
        if not compiled and (not slowed or not in_windows(number, slowed)):
            judge = self._outliers.get(phase)
            if judge is None:
                c = self.config
                judge = self._outliers[phase] = StepJudge(c.outlier_sigma, c.outlier_min_steps,
                                                          c.outlier_min_ratio, c.outlier_min_excess)
                self.step_outliers.add(0, labels)  # present from the first step: no outlier is a count of 0
                self.step_outlier_excess.add(0, labels)
            excess = judge.observe(duration, step_units(values.get(sc.SCALAR_TOKENS), values.get(sc.SCALAR_SAMPLES))
                                   if values else None)
            if excess > 0:
                outlier = True
                self.step_outliers.add(1, labels)
                self.step_outlier_excess.add(excess, labels)
        seen = self._seen.get(phase, 0)
        self._seen[phase] = seen + 1
        if self.writer is not None:
            self.writer.add(schema.STEPS, self._step_line(phase, number, start_ns, start_unix, step_ns, annotations,
                                                          values, error))
        reason = self._selector.select(seen, number, duration, outlier, 1 + len(annotations))
        if reason is not None:
            self._build_step_spans(reason, phase, number, start_ns, end_ns, annotations, values, error, outlier, label)

    def _step_scalars(self, phase: str, values: dict[str, float], labels: tuple[str]) -> None:
        """A step's loss and gradient norm as sums and counts (the rules' per-step means), and loss spikes."""
        loss = values.get(sc.SCALAR_LOSS)
        if loss is not None and math.isfinite(loss):
            spikes = self._spikes.get(phase)
            if spikes is None:
                spikes = self._spikes[phase] = LossSpikes()
                self.loss_spikes.add(0, labels)  # present from the first loss: no spike is a count of 0
            if spikes.observe(loss):
                self.loss_spikes.add(1, labels)  # counted as a spike, kept out of the means (LossSpike speaks)
            else:
                total = self._loss_totals[labels[0]] = self._loss_totals.get(labels[0], 0.0) + loss
                self.loss_summed.set(total, labels)
                self.loss_squared.add(loss * loss, labels)
                self.loss_recorded.add(1, labels)
        norm = values.get(sc.SCALAR_GRAD_NORM)
        if norm is not None and math.isfinite(norm) and norm >= 0:
            self.grad_norm_summed.add(norm, labels)
            self.grad_norm_recorded.add(1, labels)

    def _first_step(self, start_unix: int) -> None:
        self.lifecycle["first_step_start"] = start_unix / 1e9
        self.step_first.set(start_unix / 1e9)
        if self.writer is not None:
            self.writer.update_manifest(lifecycle=dict(self.lifecycle))

    def _settle_steps(self) -> None:
        """Apply the per-phase step totals of the records just processed (under the registry lock)."""
        last_end = None
        for label, (count, end_ns, number) in self._latest.items():
            labels = (label,)
            self.steps.add(count, labels)
            self.step_last.set((end_ns + self.offset_ns) / 1e9, labels)
            self.step_number.set(number, labels)
            if last_end is None or end_ns > last_end:
                last_end = end_ns
        self._latest.clear()
        if last_end is not None:
            self.lifecycle["last_step_end"] = (last_end + self.offset_ns) / 1e9

    def _step_line(self, phase: str, number: int, start_ns: int, start_unix: int, step_ns: int,
                   annotations: list[tuple[str, int, int, int, str | None]], values: dict[str, float] | None,
                   error: str | None) -> str:
        """The steps.jsonl record of a step (schema.py), formatted directly: json.dumps costs 3x more."""
        line = f'{{"k":"s","ph":{self._json_names[phase]},"n":{number},"t":{start_unix},"d":{step_ns}'
        if annotations:
            prefix = self._region_prefixes
            line += ',"a":[' + ",".join([f"{prefix[name]}{a0 - start_ns},{a1 - a0},{depth}]"
                                         for name, a0, a1, depth, _ in annotations]) + "]"
        if values:
            # Like scalars outside steps: NaN/inf as strings, so every line stays strict JSON.
            key = self._json_keys
            line += ',"x":{' + ",".join([f"{key[k]}{v!r}" if math.isfinite(v) else f'{key[k]}"{v}"'
                                         for k, v in values.items()]) + "}"
        if error:
            line += f',"err":{self._json_names[error]}'
        return line + "}"

    def _scalars(self, scalars: dict[str, Any], labels: tuple[str]) -> dict[str, float]:
        values: dict[str, float] = {}
        if len(scalars) > _arguments.MAX_STEP_SCALARS:
            _arguments.reject("step-scalars", "a step recorded %d scalar names; the first %d are kept",
                              len(scalars), _arguments.MAX_STEP_SCALARS,
                              count=len(scalars) - _arguments.MAX_STEP_SCALARS)
            scalars = dict(itertools.islice(scalars.items(), _arguments.MAX_STEP_SCALARS))
        for name, raw in scalars.items():
            if type(name) is not str or not name:
                checked = _arguments.name_argument(name, "record-name", "record()")
                if checked is None:
                    continue
                name = checked
            kind = type(raw)  # floats and ints (loss, lr, samples): the common case
            try:
                value = raw if kind is float else float(raw) if kind is int else _to_float(raw)
            except OverflowError:
                value = _arguments.to_float(raw)  # rejects it: an int too large for a float
            if value is None:
                continue
            values[name] = value
            self._scalar_metric(name, value, labels)
        return values

    def _scalar_metric(self, name: str, value: float, labels: tuple[str]) -> None:
        """The scalar's series: a gauge or a counter (the catalog never names one scalar in both)."""
        if not math.isfinite(value):
            if name in sc.NONFINITE_CHECKED:
                self.nonfinite.add(1, (labels[0], name))
            return
        gauge = self.scalar_gauges.get(name)
        if gauge is not None:
            gauge.set(value, labels)
        elif value >= 0 and (counter := self.scalar_counters.get(name)) is not None:
            counter.add(value, labels)

    def _scalar_alone(self, name: str, raw: Any, phase: str, at_ns: int) -> None:
        checked = _arguments.name_argument(name, "record-name", "record()")
        if checked is None:
            return
        value = _to_float(raw)
        if value is None:
            return
        self._scalar_metric(checked, value, (self._phase_label(phase),))
        if self.writer is not None:
            self.writer.add_json(schema.STEPS, {"k": schema.KIND_SCALAR, "name": checked,
                                                "v": value if math.isfinite(value) else str(value),
                                                "ph": phase, "t": self._unix_ns(at_ns)})

    def _device(self, times: list[tuple[str, int | None, str, int]]) -> None:
        """Device times of regions (CUDA events), resolved after their steps closed: the histogram, and one
        late steps.jsonl line per step (a step's regions may also arrive over several lines)."""
        observe = self.device_duration.observe
        for phase, _number, name, duration_ns in times:
            observe(duration_ns / 1e9, (self._phase_label(phase), self._annotation_label(name)))
        if self.writer is None:
            return
        q = self._json_names
        for (phase, number), group in itertools.groupby(times, key=lambda t: (t[0], t[1])):
            step = f',"n":{number}' if number is not None else ""
            regions = ",".join(f"[{q[name]},{duration_ns}]" for _, _, name, duration_ns in group)
            self.writer.add(schema.STEPS, f'{{"k":"d","ph":{q[phase]}{step},"a":[{regions}]}}')

    def _annotation(self, name: str, phase: str | None, start_ns: int, end_ns: int, error: str | None) -> None:
        label = self._phase_label(phase) if phase is not None else sc.NO_PHASE
        labels = (label, self._annotation_label(name))
        self.annotation_duration.observe((end_ns - start_ns) / 1e9, labels)
        name = _arguments.clean_name(name)
        if self.writer is not None:
            self.writer.add_json(schema.STEPS, {"k": schema.KIND_ANNOTATION, "name": name, "ph": phase,
                                                "t": self._unix_ns(start_ns), "d": end_ns - start_ns})
        began = time.perf_counter()
        attributes: dict[str, Any] = {sc.ATTR_ANNOTATION: True, sc.ATTR_SPAN_REASON: "annotation"}
        if error:
            attributes[sc.ATTR_ERROR] = error
        context = self._spans.new_trace(name, attributes)
        if context is not None:
            self._collected.append(self._spans.span(name, context, None, self._unix_ns(start_ns),
                                                    self._unix_ns(end_ns), attributes))
            self.spans_built.add(1, ("annotation",))
            if self._exemplars:
                self.annotation_duration.exemplar((end_ns - start_ns) / 1e9, labels, context.trace_id,
                                                  context.span_id, self._unix_ns(end_ns))
        self._span_seconds += time.perf_counter() - began

    def _build_step_spans(
        self,
        reason: str,
        phase: str,
        number: int,
        start_ns: int,
        end_ns: int,
        annotations: list[tuple[str, int, int, int, str | None]],
        values: dict[str, float] | None,
        error: str | None,
        outlier: bool,
        label: str,
    ) -> None:
        began = time.perf_counter()
        attributes: dict[str, Any] = {sc.ATTR_STEP_NUMBER: number, sc.ATTR_STEP_PHASE: phase,
                                      sc.ATTR_SPAN_REASON: reason, sc.ATTR_STEP_OUTLIER: outlier}
        if values:
            for name, value in values.items():
                attributes[sc.ATTR_SCALAR_PREFIX + _arguments.clean_name(name)] = value
        if error:
            attributes[sc.ATTR_ERROR] = error
        builder = self._spans
        root = builder.new_trace(sc.SPAN_STEP, attributes)
        if root is None:  # the configured OTEL_TRACES_SAMPLER dropped this trace
            return
        unix = self.offset_ns
        collected = self._collected
        exemplars = self._exemplars
        child_attributes = {sc.ATTR_ANNOTATION: True}
        # Nesting: an annotation's parent is the innermost enclosing annotation one level up.
        parents: list[Any] = [root]
        for name, a_start, a_end, depth, a_error in sorted(annotations, key=lambda a: (a[1], a[3])):
            del parents[depth + 1:]
            parent = parents[min(depth, len(parents) - 1)]
            context = builder.child_context(parent)
            collected.append(builder.span(_arguments.clean_name(name), context, parent, a_start + unix, a_end + unix,
                                          {**child_attributes, sc.ATTR_ERROR: a_error} if a_error
                                          else child_attributes))
            parents.append(context)
            key = self._annotation_keys.get((label, name)) if exemplars else None
            if key is not None:
                self.annotation_duration.exemplar((a_end - a_start) / 1e9, key, context.trace_id, context.span_id,
                                                  a_end + unix, outlier)
        collected.append(builder.span(sc.SPAN_STEP, root, None, start_ns + unix, end_ns + unix, attributes))
        if exemplars:
            self.step_duration.exemplar((end_ns - start_ns) / 1e9, (label,), root.trace_id, root.span_id,
                                        end_ns + unix, outlier)
        if self._selector.windows and self._selector.in_window(number):
            spans = self._window_spans
            spans[(phase, number)] = StepSpan(root, number, start_ns + unix, end_ns + unix)
            if len(spans) > MAX_WINDOW_STEPS:
                del spans[next(iter(spans))]
        self._span_seconds += time.perf_counter() - began
        self.spans_built.add(1 + len(annotations), (reason,))


class _CollectSpans(SpanProcessor):
    """SpanProcessor that hands ended spans to the recorder, which forwards them to the sinks."""

    def __init__(self, into: deque[ReadableSpan]) -> None:
        self._into = into

    def on_end(self, span: ReadableSpan) -> None:
        self._into.append(span)


def _to_float(raw: Any) -> float | None:
    """A recorded value as a float (:func:`_arguments.to_float`); a step's parts (``hot.Sum``: the losses of its
    backwards, ``hot.Mean``: of an evaluation step's forwards, tensors among them) added up here, off the hot path.
    An empty list is no value; parts that do not add up to a number are an unusable argument."""
    kind = type(raw)
    if kind is not hot.Sum and kind is not hot.Mean:
        return _arguments.to_float(raw)
    if not raw:
        return None
    try:
        total = sum(raw)
    except Exception:
        total = raw  # not a number: rejected below
    value = _arguments.to_float(total)
    return value if value is None or kind is hot.Sum else value / len(raw)
