"""Host and process readings from psutil, as ratios of the last interval and cumulative totals.

Per-CPU ratios come from deltas of ``psutil.cpu_times(percpu=True)``; the first
call only sets the baseline. Each read that fails is reported through
``on_error("psutil", reason)`` and leaves its fields ``None``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from otelprof._log import warn_once

ErrorSink = Callable[[str, str], None]

# semconv cpu.mode -> psutil cpu_times fields
MODE_FIELDS: dict[str, tuple[str, ...]] = {
    "user": ("user",), "nice": ("nice",), "system": ("system",), "idle": ("idle",), "iowait": ("iowait",),
    "interrupt": ("irq", "softirq"), "steal": ("steal",),
}


@dataclass
class HostReading:
    cpu_modes: list[dict[str, float]] = field(default_factory=list)  # per logical CPU: mode -> ratio
    cpu_busy: list[float] = field(default_factory=list)  # per logical CPU: not idle, not iowait
    cpu_iowait: list[float] = field(default_factory=list)
    memory_used: int | None = None
    memory_total: int | None = None
    disk: dict[str, float] | None = None  # read_bytes, write_bytes, read_count, write_count
    network: dict[str, float] | None = None  # bytes_recv, bytes_sent


@dataclass
class ProcessReading:
    cpu_user: float | None = None
    cpu_system: float | None = None
    cpu_utilization: float | None = None  # of the CPUs available to the container
    rss: int | None = None
    threads: int | None = None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, psutil.AccessDenied | PermissionError):
        return "permission"
    if isinstance(exc, psutil.NoSuchProcess | FileNotFoundError):
        return "not_found"
    return "error"


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return psutil.cpu_count() or 1


class SystemCollector:
    def __init__(self, on_error: ErrorSink) -> None:
        self._on_error = on_error
        self._previous_cpu: list[Any] | None = None
        self._process = psutil.Process()
        self._previous_process: tuple[float, float] | None = None  # (cpu seconds, wall seconds)

    def _failed(self, what: str, exc: BaseException) -> None:
        reason = _reason(exc)
        self._on_error("psutil", reason)
        warn_once(f"psutil:{what}:{reason}", "otelprof: reading %s failed (%r); those series are absent", what, exc)

    def host(self) -> HostReading:
        reading = HostReading()
        try:
            self._cpu(reading)
        except Exception as exc:
            self._failed("per-CPU times", exc)
        try:
            memory = psutil.virtual_memory()
            reading.memory_total = int(memory.total)
            reading.memory_used = int(memory.total - memory.available)
        except Exception as exc:
            self._failed("memory", exc)
        try:
            disk = psutil.disk_io_counters(perdisk=False)
            if disk is not None:
                reading.disk = {"read_bytes": disk.read_bytes, "write_bytes": disk.write_bytes,
                                "read_count": disk.read_count, "write_count": disk.write_count}
        except Exception as exc:
            self._failed("disk counters", exc)
        try:
            nics = psutil.net_io_counters(pernic=True)
            reading.network = {
                "bytes_recv": float(sum(n.bytes_recv for name, n in nics.items() if name != "lo")),
                "bytes_sent": float(sum(n.bytes_sent for name, n in nics.items() if name != "lo")),
            }
        except Exception as exc:
            self._failed("network counters", exc)
        return reading

    def _cpu(self, reading: HostReading) -> None:
        current = psutil.cpu_times(percpu=True)
        previous, self._previous_cpu = self._previous_cpu, current
        if previous is None or len(previous) != len(current):
            return
        for before, after in zip(previous, current):
            deltas = {name: max(getattr(after, name, 0.0) - getattr(before, name, 0.0), 0.0)
                      for fields in MODE_FIELDS.values() for name in fields}
            total = sum(deltas.values())
            if total <= 0:
                modes = dict.fromkeys(MODE_FIELDS, 0.0)
                modes["idle"] = 1.0
            else:
                modes = {mode: sum(deltas[f] for f in fields) / total for mode, fields in MODE_FIELDS.items()}
            reading.cpu_modes.append(modes)
            reading.cpu_iowait.append(modes["iowait"])
            reading.cpu_busy.append(max(0.0, 1.0 - modes["idle"] - modes["iowait"]))

    def process(self, available_cpus: float, now: float) -> ProcessReading:
        reading = ProcessReading()
        try:
            with self._process.oneshot():
                times = self._process.cpu_times()
                reading.cpu_user, reading.cpu_system = float(times.user), float(times.system)
                reading.rss = int(self._process.memory_info().rss)
                reading.threads = int(self._process.num_threads())
        except Exception as exc:
            self._failed("process", exc)
            return reading
        used = reading.cpu_user + reading.cpu_system
        previous, self._previous_process = self._previous_process, (used, now)
        if previous is not None and now > previous[1] and available_cpus > 0:
            reading.cpu_utilization = max(used - previous[0], 0.0) / (now - previous[1]) / available_cpus
        return reading
