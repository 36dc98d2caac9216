"""Checking the operator-profiling windows of profiles.jsonl against the format the writer uses."""

from __future__ import annotations

import math
from typing import Any

from otelprof.recording.limits import (
    INT64,
    MAX_DURATION_NS,
    MAX_PROFILE_ENTRIES,
    MAX_TIME_NS,
    check_int,
    check_str,
)


def _seconds(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r:.40}")
    return float(value)


def _entries(value: Any, kind: type) -> Any:
    if value is None:
        return kind()
    if type(value) is not kind or len(value) > MAX_PROFILE_ENTRIES:  # type: ignore[arg-type]
        raise ValueError(f"not a {kind.__name__} of at most {MAX_PROFILE_ENTRIES} entries")
    return value


def check_profile(record: Any) -> dict[str, Any]:
    """An operator-profiling window record as the writer makes it (integrations/torch_profiler.py)."""
    if type(record) is not dict:
        raise ValueError("not an object")
    trace = record.get("trace_file")
    out: dict[str, Any] = {
        "start_step": check_int(record.get("start_step", 0), -INT64 - 1, INT64),
        "num_steps": check_int(record.get("num_steps", 0), 0, INT64),
        "t": check_int(record.get("t", 0), 0, MAX_TIME_NS), "d": check_int(record.get("d", 0), 0, MAX_DURATION_NS),
        "trace_file": check_str(trace) if trace else None}
    for key in ("cpu_ops", "gpu_ops"):
        out[key] = [{"name": check_str(op["name"]), "calls": check_int(op.get("calls", 0), 0, INT64),
                     "self_s": _seconds(op.get("self_s", 0.0)), "total_s": _seconds(op.get("total_s", 0.0))}
                    for op in _entries(record.get(key), list)]
    for key in ("gpu_activity_s", "kernel_precision_s"):
        out[key] = {check_str(name): _seconds(seconds) for name, seconds in _entries(record.get(key), dict).items()}
    for key in ("phase", "trigger"):
        if record.get(key) is not None:
            out[key] = check_str(record[key])
    for key in ("operator_spans", "operator_spans_dropped"):
        if key in record:
            out[key] = check_int(record[key], 0, INT64)
    if "overhead_s" in record:
        out["overhead_s"] = _seconds(record["overhead_s"])
    if record.get("truncated") is not None:
        out["truncated"] = check_str(record["truncated"])
    if "segment" in record:
        out["segment"] = check_int(record["segment"], 0, INT64)
    if record.get("events") is not None:  # the window's event cap and what it kept (torch_profiler.py)
        out["events"] = {key: check_int(value, 0, INT64) if key != "per_step" else _seconds(value)
                         for key, value in _entries(record["events"], dict).items()
                         if key in ("kept", "dropped", "max", "heap_growth_bytes", "per_step")}
    if record.get("cost") is not None:  # the window's cost to training by part (sums to overhead_s)
        out["cost"] = {key: _seconds(value) for key, value in _entries(record["cost"], dict).items()
                       if key in ("steps_s", "flop_step_s", "processing_s")}
    if record.get("operators") is not None:
        out["operators"] = _operators(record["operators"])
    if record.get("flops") is not None:
        out["flops"] = _flops(record["flops"])
    return out


def _flops(figures: Any) -> dict[str, Any]:
    """A window's model FLOPs (integrations/flops.py ``figures``)."""
    if type(figures) is not dict:
        raise ValueError("flops: not an object")
    out: dict[str, Any] = {"per_step": _seconds(figures["per_step"])}
    for key in ("achieved", "peak", "utilization"):
        if figures.get(key) is not None:
            out[key] = _seconds(figures[key])
    for key in ("device", "dtype", "gpu_model"):
        if figures.get(key) is not None:
            out[key] = check_str(figures[key])
    return out


def _operators(summary: Any) -> dict[str, Any]:
    """A window's operator and kernel statistics (integrations/operators.py ``window_summary``)."""
    if type(summary) is not dict:
        raise ValueError("operators: not an object")
    out: dict[str, Any] = {}
    for key in ("ops", "kernels"):
        out[key] = [{"name": check_str(row["name"]), "self_s": _seconds(row.get("self_s", 0.0)),
                     "total_s": _seconds(row.get("total_s", 0.0)), "calls": check_int(row.get("calls", 0), 0, INT64),
                     "launches": check_int(row.get("launches", 0), 0, INT64)}
                    for row in _entries(summary.get(key), list)]
    for key in ("host_op_s", "device_op_s"):
        out[key] = _seconds(summary.get(key, 0.0))
    categories = _entries(summary.get("categories_s"), dict)
    out["categories_s"] = {check_str(side): {check_str(name): _seconds(seconds)
                                             for name, seconds in _entries(table, dict).items()}
                           for side, table in categories.items()}
    out["kernel_precision_s"] = {check_str(name): _seconds(seconds)
                                 for name, seconds in _entries(summary.get("kernel_precision_s"), dict).items()}
    out["device_kinds_s"] = {check_str(name): _seconds(seconds)
                             for name, seconds in _entries(summary.get("device_kinds_s"), dict).items()}
    for key in ("operators", "device_events"):
        out[key] = check_int(summary.get(key, 0), 0, INT64)
    overlap = _entries(summary.get("overlap"), dict)
    if overlap:
        out["overlap"] = {key: _seconds(overlap[key]) for key in
                          ("communication_s", "overlapped_s", "exposed_s", "compute_s", "overlap_ratio")}
    memory = _entries(summary.get("memory"), dict)
    if memory:
        out["memory"] = {
            "top": [{"device": check_str(row["device"]), "name": check_str(row["name"]),
                     "bytes": check_int(row.get("bytes", 0), 0, INT64),
                     "allocations": check_int(row.get("allocations", 0), 0, INT64)}
                    for row in _entries(memory.get("top"), list)],
            "peak_bytes": {check_str(d): check_int(v, 0, INT64)
                           for d, v in _entries(memory.get("peak_bytes"), dict).items()},
            "reserved_bytes": {check_str(d): check_int(v, 0, INT64)
                               for d, v in _entries(memory.get("reserved_bytes"), dict).items()},
            "curve": {check_str(d): [(check_int(t, 0, MAX_TIME_NS), check_int(v, 0, INT64))
                                     for t, v in _entries(points, list)]
                      for d, points in _entries(memory.get("curve"), dict).items()}}
    return out
