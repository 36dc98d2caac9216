"""A profiling window's summary from its parsed trace: the top CPU and GPU operators, the GPU activity mix
(kernel / memcpy / memset / sync) and, on CUDA, the kernels' precision mix."""

from __future__ import annotations

import re
from typing import Any

from otelprof.integrations import operators

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


def summarize_parsed(parsed: operators.ParsedTrace, top: int) -> dict[str, Any]:
    """Top operators and GPU mixes of a parsed window (the ``cpu_ops``, ``gpu_ops``, ``gpu_activity_s`` and
    ``kernel_precision_s`` of its record)."""
    precision: dict[str, float] = {}
    activity: dict[str, float] = {}
    for event in parsed.device:
        duration = (event.end_ns - event.start_ns) / 1e9
        kind = gpu_activity(event.name) if event.kind == "kernel" else event.kind
        activity[kind] = activity.get(kind, 0.0) + duration
        if kind == "kernel":
            label = kernel_precision(event.name)
            precision[label] = precision.get(label, 0.0) + duration

    def rows(table: dict[str, list[float]]) -> list[dict[str, Any]]:
        ranked = sorted(table.items(), key=lambda kv: -kv[1][0])[:top]
        return [{"name": name, "calls": int(v[2]), "self_s": v[0], "total_s": v[1]} for name, v in ranked]

    return {"cpu_ops": rows(operators.host_table(parsed)), "gpu_ops": rows(operators.device_table(parsed)),
            "gpu_activity_s": activity, "kernel_precision_s": precision}
