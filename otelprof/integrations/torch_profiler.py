"""Operator-profiling windows: ``torch.profiler`` for a few chosen steps, never for every step.

A window starts as step ``start_step`` begins and stops as its ``num_steps``-th step ends.
Its result — top CPU and GPU operators (calls, self and total time), on CUDA the kernel precision
mix and the GPU activity mix (kernel / memcpy / memset / sync) — goes to the recording
(``profiles.jsonl``) and out as one ``otelprof.profile`` span whose events are the top operators;
optionally the full Chrome trace is kept next to the recording. The summary is computed on a
background thread so the training thread only pays for starting and stopping the profiler.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import Event

from otelprof import _warnings
from otelprof import hotpath as hot
from otelprof import semconv as sc
from otelprof._log import info_once, logger, warn_once
from otelprof.recording import schema
from otelprof.span_builder import SpanBuilder

_PRECISIONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fp8", re.compile(r"fp8|e4m3|e5m2", re.I)),
    ("bf16", re.compile(r"bf16|bfloat16", re.I)),
    ("fp16", re.compile(r"fp16|half|h884|h1688|h16816|hmma|f16", re.I)),
    ("tf32", re.compile(r"tf32|1688gemm|xmma.*tf32", re.I)),
    ("int8", re.compile(r"int8|i8|imma", re.I)),
    ("fp64", re.compile(r"fp64|double|dgemm|dmma", re.I)),
    ("fp32", re.compile(r"fp32|float|sgemm|f32|s1688|s884", re.I)),
)


def kernel_precision(name: str) -> str:
    """Best guess of a CUDA kernel's arithmetic precision from its name."""
    for label, pattern in _PRECISIONS:
        if pattern.search(name):
            return label
    return "other"


def gpu_activity(name: str) -> str:
    """kernel, memcpy, memset or sync for a device-side (or synchronizing runtime) event name."""
    lowered = name.lower()
    if "memcpy" in lowered:
        return "memcpy"
    if "memset" in lowered:
        return "memset"
    if "synchronize" in lowered or "streamwaitevent" in lowered:
        return "sync"
    return "kernel"


@dataclass
class _Window:
    start_step: int
    num_steps: int
    chrome_trace: bool
    top: int
    trigger: str = "api"
    phase: str | None = None
    """Only steps of this phase open and count the window (None: the current phase at each step)."""
    on_finished: Callable[[float], None] | None = None
    """Called from the processing thread once the window is summarized, with its measured overhead in s."""
    profiler: Any = None
    thread: int = 0
    """``threading.get_ident()`` of the thread that started the profiler: torch.profiler's callbacks are that
    thread's, and only that thread can stop it (stopped elsewhere, they stay; the process crashes at exit)."""
    started_ns: int = 0
    shift_ns: int = 0
    """Recorder clock (perf counter + its offset) minus the profiler's (wall clock) at the start."""
    begins: deque[int] = field(default_factory=lambda: deque(maxlen=BASELINE_STEPS + 1))
    """perf_counter_ns at the start of the steps before the window (its baseline) and of its first step."""
    after_ns: int = 0
    """perf_counter_ns when the step after the window began (0: not yet)."""
    measured: threading.Event = field(default_factory=threading.Event)
    step_overhead_s: float = 0.0
    counter: Any = None
    """The FLOP counter of the step after the window (flops.py), while it counts."""
    counter_thread: int = 0
    """The thread whose dispatch-mode stack holds the counter (the only one that can pop it)."""
    counted: threading.Event = field(default_factory=threading.Event)
    flop_count: dict[str, Any] | None = None
    flop_step_ns: int = 0
    """Duration of the counted step (with the counter's cost)."""


UNKNOWN_FREE_WARNING = 1000
"""With ``profile_memory``, PyTorch's CPU allocator logs "Memory block of unknown size was allocated before the
profiling started" to stderr at the first and then every 1000th free of a block allocated before a profiler
started (a c10 LOG(WARNING), which no Python setting silences). The first window frees one such block while
stderr is muted, so the first line, which every run would print, is not the job's; a later one comes only
after 1000 such frees inside windows (tens per window: hours of a default schedule). OTELPROF_PROFILE_MEMORY=false
avoids them altogether."""

BASELINE_STEPS = 3
"""Steps just before a window whose mean period is the window's baseline (a periodic window is armed that
many steps ahead)."""
AFTER_STEP_WAIT = 10.0
"""Seconds the processing thread waits for the step after the window (to measure the window's overhead)."""
CLOSE_WAIT = 5.0
"""Longest wait, as the session shuts down, for windows being summarized (within its shutdown timeout)."""


class ProfileWindows:
    """Arms and runs windows: started as a step begins, stopped as the window's last step ends,
    both on the training thread.

    torch.profiler and the FLOP counter belong to the thread that started them (thread-local RecordFunction
    callbacks, the thread's dispatch-mode stack): each is stopped on that thread only — at the window's end, when
    the session closes there, when that thread ends, or at exit (the main thread's). A profiler left running
    at exit makes the process crash in torch's teardown ("Requested callback is not found", then SIGSEGV)."""

    def __init__(self) -> None:
        self._pending: list[_Window] = []
        self._running: _Window | None = None
        self._after: _Window | None = None
        self._counting: _Window | None = None
        self._orphans: list[_Window] = []
        """Windows (profiling or counting) the session dropped that only their own thread can stop."""
        self._threads: list[threading.Thread] = []
        """Summarizing threads, joined (bounded) when the session closes."""
        self._exit_hook = False
        self._lock = threading.Lock()

    @property
    def busy(self) -> bool:
        """A window is armed, running or not yet measured."""
        return bool(self._pending) or self._running is not None or self._after is not None

    def reset(self) -> None:
        """A new session (the hot path's callbacks were cleared): forget armed windows, stop what is left."""
        self.close(0.0)
        with self._lock:
            if not self._exit_hook:  # after the session's own shutdown at exit (atexit runs the last first)
                self._exit_hook = True
                atexit.register(self.release_thread)

    def close(self, timeout: float) -> None:
        """The session ends: armed windows are forgotten; a running profiler or FLOP counter is stopped here when
        this thread started it (the window is dropped), else by its own thread (:meth:`release_thread`); windows
        being summarized get ``timeout`` seconds to finish (no step after them is coming)."""
        with self._lock:
            self._pending.clear()
            running, self._running = self._running, None
            after, self._after = self._after, None
            counting, self._counting = self._counting, None
            while self._on_begin in hot._step_begin:
                hot._step_begin.remove(self._on_begin)
            for callback in (self._on_end, self._on_counted):
                while callback in hot._step_boundary:
                    hot._step_boundary.remove(callback)
            self._orphans += [window for window in (running, counting) if window is not None]
            threads, self._threads = self._threads, []
        for window in (after, counting):
            if window is not None:  # its summary goes on without the step after it (or its FLOP count)
                window.measured.set()
                window.counted.set()
        self.release_thread()
        deadline = time.monotonic() + max(timeout, 0.0)
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0.0))
        if self._orphans:
            info_once("profile:orphan", "otelprof: the session closed while a profiling window ran on another "
                      "thread; it stops when that thread ends")

    def release_thread(self) -> None:
        """Stop the profiler and the FLOP counter this thread started, dropping their windows: when the session
        closes, when the thread ends and, for the main thread, at exit."""
        me = threading.get_ident()
        with self._lock:
            for window in (self._running, self._counting):
                if window is not None and me in (window.thread, window.counter_thread):
                    self._orphans.append(window)
            if self._running is not None and self._running.thread == me:
                self._running = None
            if self._counting is not None and self._counting.counter_thread == me:
                self._counting = None
            mine = [w for w in self._orphans if w.thread == me or (w.counter is not None and w.counter_thread == me)]
            self._orphans = [w for w in self._orphans if not any(w is m for m in mine)]
        for window in mine:
            if window.counter is not None and window.counter_thread == me:
                self._stop_count(window, 0)
            if window.thread == me:
                _stop_profiler(window)

    def arm(self, start_step: int, num_steps: int, *, chrome_trace: bool = False, top: int = 15,
            trigger: str = "api", phase: str | None = None,
            on_finished: Callable[[float], None] | None = None) -> dict[str, Any]:
        if num_steps < 1 or start_step < 0:
            raise ValueError("profile windows need start_step >= 0 and num_steps >= 1")
        with self._lock:
            self._pending.append(_Window(start_step, num_steps, chrome_trace, top, trigger, phase, on_finished))
            self._pending.sort(key=lambda w: w.start_step)
            if self._on_begin not in hot._step_begin:
                hot._step_begin.append(self._on_begin)
        return {"armed": True, "kind": "torch.profiler", "start_step": start_step, "num_steps": num_steps}

    def _on_begin(self, step: hot.StepContext) -> None:
        now = time.perf_counter_ns()
        if hot._active is None:  # no session (a window armed as it closed): no profiler to start
            return
        with self._lock:
            counting = self._counting
            if counting is not None and counting.counter_thread == threading.get_ident():
                self._stop_count(counting, 0)  # the counted step raised: its boundary never came
            after = self._after
            if after is not None and step.phase == (after.phase or step.phase):
                after.after_ns = now
                self._after = None
                after.measured.set()
                self._start_count(after)
                if not self._pending and self._counting is None:
                    hot._step_begin.remove(self._on_begin)
            if self._running is not None or not self._pending:
                return
            window = self._pending[0]
            if window.phase is not None and step.phase != window.phase:
                return
            window.begins.append(now)
            if step.number < window.start_step:
                return
            self._pending.pop(0)
            window.start_step = step.number
            window.phase = step.phase
            if not self._pending and self._after is None:
                hot._step_begin.remove(self._on_begin)
            if self._start(window):
                hot._step_boundary.append(self._on_end)

    def _on_end(self) -> None:
        with self._lock:
            window = self._running
            if window is None:
                return
            if (hot.next_step_number(window.phase) < window.start_step + window.num_steps
                    or window.thread != threading.get_ident()):  # the profiler is stopped on its own thread
                hot._step_boundary.append(self._on_end)
                return
            self._running = None
            self._after = window  # the next step's start closes the window's measurement
            if self._on_begin not in hot._step_begin:
                hot._step_begin.append(self._on_begin)
            self._finish(window)

    def _start_count(self, window: _Window) -> None:
        """Count the FLOPs of this step (the one after the window) until its end."""
        from otelprof.integrations import flops
        from otelprof.session import get_session

        session = get_session()
        if session is not None and session.config.profile_flops:
            window.counter = flops.start()
        if window.counter is None:
            window.counted.set()
            return
        window.counter_thread = threading.get_ident()
        _watch_thread_end()
        self._counting = window
        hot._step_boundary.append(self._on_counted)

    def _on_counted(self) -> None:
        with self._lock:
            window = self._counting
            if window is None:
                return
            if window.counter_thread != threading.get_ident():  # popped from its own thread's mode stack only
                hot._step_boundary.append(self._on_counted)
                return
            self._stop_count(window, time.perf_counter_ns() - window.after_ns)
            if not self._pending and self._after is None and self._on_begin in hot._step_begin:
                hot._step_begin.remove(self._on_begin)

    def _stop_count(self, window: _Window, step_ns: int) -> None:
        from otelprof.integrations import flops

        if self._counting is window:
            self._counting = None
        count = flops.stop(window.counter)
        window.counter = None
        window.counter_thread = 0
        if step_ns > 0:
            window.flop_count, window.flop_step_ns = count, step_ns
        window.counted.set()

    def _start(self, window: _Window) -> bool:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        try:
            from otelprof.session import get_session as _session

            current = _session()
            memory = bool(current is not None and current.config.profile_memory)
            with _warnings.untouched():  # the first start imports torch._inductor, whose imports add filters
                window.profiler = profile(activities=activities, record_shapes=False, with_stack=False,
                                          profile_memory=memory)
                window.thread = threading.get_ident()
                _watch_thread_end()
                with _quiet_stderr():
                    before = torch.empty(16) if memory else None
                    window.profiler.start()
                    del before  # see UNKNOWN_FREE_WARNING
        except Exception as exc:  # another profiler is active, or Kineto is unavailable
            window.thread = 0
            warn_once("profile:start", "otelprof: cannot start torch.profiler (%s); window skipped", exc)
            return False
        window.started_ns = time.time_ns()
        from otelprof.session import get_session

        session = get_session()
        recorder = getattr(session, "recorder", None)
        if recorder is not None:
            window.shift_ns = time.perf_counter_ns() + recorder.offset_ns - time.time_ns()
            # the window's steps are always traced, and never judged as outliers (otelprof slows them)
            recorder.arm_window(window.start_step, window.num_steps, slows=window.phase)
        self._running = window
        return True

    def _finish(self, window: _Window) -> None:
        ended_ns = time.time_ns()
        window.thread = 0
        try:
            with _quiet_stderr(), _warnings.untouched():
                window.profiler.stop()
        except Exception as exc:
            warn_once("profile:stop", "otelprof: torch.profiler failed to stop (%s)", exc)
            return
        thread = threading.Thread(target=_summarize, args=(window, ended_ns), name="otelprof-profile", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()


def _stop_profiler(window: _Window) -> None:
    """Stop a dropped window's profiler (on the thread that started it), nothing recorded."""
    profiler, window.profiler, window.thread = window.profiler, None, 0
    window.measured.set()
    if profiler is not None:
        with contextlib.suppress(Exception), _quiet_stderr(), _warnings.untouched():
            profiler.stop()


_thread_end = threading.local()


class _AtThreadEnd:
    """Kept in a thread-local of a thread (other than the main one) that started a profiler or a FLOP counter:
    dropped as the thread ends, on that thread, it stops what the thread left running."""

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            windows.release_thread()


def _watch_thread_end() -> None:
    if threading.current_thread() is not threading.main_thread() and not hasattr(_thread_end, "watch"):
        _thread_end.watch = _AtThreadEnd()


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null while the profiler starts or stops: Kineto prints ``USDT ... profiler_start``
    lines there whatever its log level, and the training job's stderr is not ours to write to. The profiler
    calls hold the GIL, so only native threads writing in those few milliseconds would lose a line."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 2)
        finally:
            os.close(devnull)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _baseline_ns(window: _Window) -> float:
    """Mean period of the steps just before the window (0: unknown)."""
    begins = list(window.begins)
    return (begins[-1] - begins[0]) / (len(begins) - 1) if len(begins) >= 2 else 0.0


def _step_overhead(window: _Window) -> float:
    """The window's steps (with starting and stopping the profiler) beyond as many steps at the baseline pace,
    and the FLOP-counted step beyond one."""
    baseline = _baseline_ns(window)
    if not baseline or not window.after_ns:
        return 0.0
    window_ns = max((window.after_ns - window.begins[-1]) - window.num_steps * baseline, 0.0)
    return (window_ns + max(window.flop_step_ns - baseline, 0.0)) / 1e9


def _device_time(event: Any, attribute: str) -> float:
    for name in (attribute.replace("cuda", "device"), attribute):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


def summarize_profile(profiler: Any, top: int) -> dict[str, Any]:
    """Top operators and GPU mixes from a stopped ``torch.profiler.profile``."""
    averages = list(profiler.key_averages())
    cpu = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    gpu = sorted((e for e in averages if _device_time(e, "self_cuda_time_total") > 0),
                 key=lambda e: _device_time(e, "self_cuda_time_total"), reverse=True)[:top]
    precision: dict[str, float] = {}
    activity: dict[str, float] = {}
    for event in profiler.events() or []:
        device = str(getattr(event, "device_type", "")).upper()
        if "CUDA" not in device:
            continue
        duration = float(getattr(event, "device_time", 0.0) or getattr(event, "cuda_time", 0.0) or 0.0) / 1e6
        kind = gpu_activity(event.name)
        activity[kind] = activity.get(kind, 0.0) + duration
        if kind == "kernel":
            label = kernel_precision(event.name)
            precision[label] = precision.get(label, 0.0) + duration
    return {
        "cpu_ops": [{"name": e.key, "calls": int(e.count), "self_s": e.self_cpu_time_total / 1e6,
                     "total_s": e.cpu_time_total / 1e6} for e in cpu],
        "gpu_ops": [{"name": e.key, "calls": int(e.count), "self_s": _device_time(e, "self_cuda_time_total") / 1e6,
                     "total_s": _device_time(e, "cuda_time_total") / 1e6} for e in gpu],
        "gpu_activity_s": dict(activity),
        "kernel_precision_s": dict(precision),
    }


def _kineto_trace(window: _Window, keep: str | None) -> dict[str, Any] | None:
    """The window's Kineto trace as JSON (written to ``keep`` when given, else to a temporary file)."""
    fd, path = tempfile.mkstemp(prefix="otelprof-profile-", suffix=".json")
    os.close(fd)
    try:
        window.profiler.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            trace = json.load(f)
        if keep is not None:
            shutil.move(path, keep)
        return trace if isinstance(trace, dict) else None
    except (OSError, ValueError, RuntimeError) as exc:
        warn_once("profile:trace", "otelprof: cannot read the profiler's trace (%s); no operator spans", exc)
        return None
    finally:
        if os.path.exists(path):
            os.unlink(path)


def _profile_span(builder: SpanBuilder, window: _Window, summary: dict[str, Any], ended_ns: int) -> list[Any]:
    """The window's ``otelprof.profile`` span, its top operators as events (none when the sampler drops it)."""
    attributes = {sc.ATTR_PROFILE_START: window.start_step, sc.ATTR_PROFILE_STEPS: window.num_steps,
                  sc.ATTR_PROFILE_TRIGGER: window.trigger}
    context = builder.new_trace(sc.SPAN_PROFILE, attributes)
    if context is None:
        return []
    events = [Event("operator", {sc.ATTR_OP_NAME: op["name"], sc.ATTR_OP_DEVICE: device, sc.ATTR_OP_CALLS: op["calls"],
                                 sc.ATTR_OP_SELF_TIME: op["self_s"], sc.ATTR_OP_TOTAL_TIME: op["total_s"]}, ended_ns)
              for device, ops in (("cpu", summary["cpu_ops"]), ("gpu", summary["gpu_ops"])) for op in ops]
    return [builder.span(sc.SPAN_PROFILE, context, None, window.started_ns, ended_ns, attributes, events)]


def _summarize(window: _Window, ended_ns: int) -> None:
    began = time.thread_time()
    try:
        with _warnings.untouched():
            _process(window, ended_ns, began)
    except Exception:
        logger.exception("otelprof: summarizing a profiling window failed")
        if window.on_finished is not None:
            window.on_finished(0.0)


def _process(window: _Window, ended_ns: int, began: float) -> None:
    from otelprof.integrations import operators
    from otelprof.session import get_session

    session = get_session()
    summary = summarize_profile(window.profiler, window.top)
    if session is None:
        return
    config = session.config
    record: dict[str, Any] = {"start_step": window.start_step, "num_steps": window.num_steps,
                              "phase": window.phase, "trigger": window.trigger,
                              "t": window.started_ns, "d": ended_ns - window.started_ns, **summary}
    keep = None
    if window.chrome_trace and session.run_dir is not None:
        keep = str(session.run_dir / f"profile-step{window.start_step}.trace.json")
    trace = _kineto_trace(window, keep)
    recorder = session.recorder
    if trace is not None:
        if keep is not None:
            record["trace_file"] = os.path.basename(keep)
        parsed = operators.parse_kineto_trace(trace, window.shift_ns)
        window_stats = operators.window_summary(parsed, config.profile_top_k, kernel_precision)
        record["operators"] = window_stats
        recorder.drain()  # the window's step records, so that their spans exist
        steps = recorder.window_steps(window.phase or hot.current_phase(), window.start_step, window.num_steps)
        spans, dropped = operators.operator_spans(recorder.span_builder, parsed, steps, config.profile_max_spans)
        recorder.add_spans(spans, dropped)
        record["operator_spans"] = len(spans)
        record["operator_spans_dropped"] = dropped
        operators.set_metrics(session.registry, window_stats, window.num_steps)
    if window.measured.wait(AFTER_STEP_WAIT):
        window.counted.wait(AFTER_STEP_WAIT)
    if window.flop_count is not None:
        from otelprof.integrations import flops

        model = session.resource.attributes.get(sc.OTELPROF_GPU_MODEL)
        figures = flops.figures(window.flop_count, _baseline_ns(window) / 1e9, str(model) if model else None,
                                config.peak_flops)
        record["flops"] = figures
        flops.set_metrics(session.registry, figures)
    overhead = _step_overhead(window) + (time.thread_time() - began)
    record["overhead_s"] = overhead
    if session.writer is not None:
        session.writer.add_json(schema.PROFILES, record)
    recorder.add_spans(_profile_span(recorder.span_builder, window, summary, ended_ns), reason="window")
    with session.registry.lock:
        session.registry.counter(sc.PROFILE_WINDOWS).add(1)
        session.registry.counter(sc.PROFILE_OVERHEAD).add(overhead)
    if window.on_finished is not None:
        window.on_finished(overhead)


windows = ProfileWindows()
"""The process's profiling windows: the PyTorch integration's, captures' and the periodic schedule's."""
