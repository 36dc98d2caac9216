"""Operator-profiling windows: ``torch.profiler`` for a few chosen steps, never for every step.

A window starts as step ``start_step`` begins and stops as its ``num_steps``-th step ends.
Its result — top CPU and GPU operators (calls, self and total time), on CUDA the kernel precision
mix and the GPU activity mix (kernel / memcpy / memset / sync) — goes to the recording
(``profiles.jsonl``) and out as one ``otelprof.profile`` span whose events are the top operators;
optionally the full Chrome trace is kept next to the recording. The summary is computed on a
background thread so the training thread only pays for starting and stopping the profiler.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from otelprof import hotpath as hot
from otelprof import semconv as sc
from otelprof._log import logger, warn_once
from otelprof.recording import schema

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
    profiler: Any = None
    started_ns: int = 0


class ProfileWindows:
    """Arms and runs windows: started as a step begins, stopped as the window's last step ends,
    both on the training thread."""

    def __init__(self) -> None:
        self._pending: list[_Window] = []
        self._running: _Window | None = None
        self._lock = threading.Lock()

    def arm(self, start_step: int, num_steps: int, *, chrome_trace: bool = False, top: int = 15) -> dict[str, Any]:
        if num_steps < 1 or start_step < 0:
            raise ValueError("profile windows need start_step >= 0 and num_steps >= 1")
        with self._lock:
            self._pending.append(_Window(start_step, num_steps, chrome_trace, top))
            self._pending.sort(key=lambda w: w.start_step)
            if self._on_begin not in hot._step_begin:
                hot._step_begin.append(self._on_begin)
        return {"armed": True, "kind": "torch.profiler", "start_step": start_step, "num_steps": num_steps}

    def _on_begin(self, step: hot.StepContext) -> None:
        with self._lock:
            if self._running is not None or not self._pending or step.number < self._pending[0].start_step:
                return
            window = self._pending.pop(0)
            window.start_step = step.number
            if not self._pending:
                hot._step_begin.remove(self._on_begin)
            if self._start(window):
                hot._step_boundary.append(self._on_end)

    def _on_end(self) -> None:
        with self._lock:
            window = self._running
            if window is None:
                return
            if hot.next_step_number() < window.start_step + window.num_steps:
                hot._step_boundary.append(self._on_end)
                return
            self._running = None
            self._finish(window)
            if self._pending and self._on_begin not in hot._step_begin:
                hot._step_begin.append(self._on_begin)

    def _start(self, window: _Window) -> bool:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        try:
            window.profiler = profile(activities=activities, record_shapes=False, with_stack=False)
            window.profiler.start()
        except Exception as exc:  # another profiler is active, or Kineto is unavailable
            warn_once("profile:start", "otelprof: cannot start torch.profiler (%s); window skipped", exc)
            return False
        window.started_ns = time.time_ns()
        self._running = window
        return True

    def _finish(self, window: _Window) -> None:
        ended_ns = time.time_ns()
        try:
            window.profiler.stop()
        except Exception as exc:
            warn_once("profile:stop", "otelprof: torch.profiler failed to stop (%s)", exc)
            return
        threading.Thread(target=_summarize, args=(window, ended_ns), name="otelprof-profile", daemon=True).start()


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


def _summarize(window: _Window, ended_ns: int) -> None:
    from otelprof.session import get_session

    session = get_session()
    try:
        summary = summarize_profile(window.profiler, window.top)
    except Exception:
        logger.exception("otelprof: summarizing a profiling window failed")
        return
    if session is None:
        return
    record: dict[str, Any] = {"start_step": window.start_step, "num_steps": window.num_steps,
                              "t": window.started_ns, "d": ended_ns - window.started_ns, **summary}
    if window.chrome_trace and session.run_dir is not None:
        path = session.run_dir / f"profile-step{window.start_step}.trace.json"
        try:
            window.profiler.export_chrome_trace(str(path))
            record["trace_file"] = path.name
        except Exception as exc:
            warn_once("profile:trace", "otelprof: cannot write the Chrome trace (%s)", exc)
    if session.writer is not None:
        session.writer.add_json(schema.PROFILES, record)
    tracer = session.tracer_provider.get_tracer("otelprof")
    span = tracer.start_span(sc.SPAN_PROFILE, start_time=window.started_ns, attributes={
        sc.ATTR_PROFILE_START: window.start_step, sc.ATTR_PROFILE_STEPS: window.num_steps})
    for device, ops in (("cpu", summary["cpu_ops"]), ("gpu", summary["gpu_ops"])):
        for op in ops:
            span.add_event("operator", attributes={"otelprof.op.name": op["name"], "otelprof.op.device": device,
                                                   "otelprof.op.calls": op["calls"],
                                                   "otelprof.op.self_time": op["self_s"],
                                                   "otelprof.op.total_time": op["total_s"]},
                           timestamp=ended_ns)
    span.end(end_time=ended_ns)
    with session.registry.lock:
        session.registry.counter(sc.PROFILE_WINDOWS).add(1)
