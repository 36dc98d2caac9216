"""Container limits and usage from cgroup v2 or v1, so utilization is judged against the pod's limit.

Pure file parsing from a root directory (``/sys/fs/cgroup`` by default), so fixture
trees of both layouts test it. Unreadable files give ``None`` fields, never exceptions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path("/sys/fs/cgroup")
V1_UNLIMITED = 1 << 62  # v1 reports "no limit" as a huge page-aligned number (e.g. 9223372036854771712)


@dataclass(frozen=True)
class CgroupReading:
    version: int
    cpu_limit_cores: float | None  # None: no CPU quota
    cpu_usage_seconds: float | None
    periods: int | None
    throttled_periods: int | None
    throttled_seconds: float | None
    memory_limit_bytes: int | None  # None: no memory limit
    memory_usage_bytes: int | None
    memory_working_set_bytes: int | None = None
    """Usage less inactive page cache (what the kernel cannot reclaim easily; kubelet's "working set")."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _stat(path: Path) -> dict[str, int]:
    text = _read(path) or ""
    result = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        number = _int(value.strip())
        if number is not None:
            result[key] = number
    return result


def _own_path(proc_cgroup: str, controller: str | None) -> str:
    """This process's cgroup path for ``controller`` (None: the v2 unified hierarchy)."""
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controller is None and controllers == "":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    return "/"


def _resolve(base: Path, own: str) -> Path:
    """The process's own cgroup directory if visible (host view), else the base (cgroup namespace)."""
    candidate = base / own.lstrip("/")
    return candidate if own not in ("", "/") and candidate.is_dir() else base


def _working_set(usage: int | None, inactive_file: int | None) -> int | None:
    """Usage less inactive file cache, as the kubelet computes it; usage when memory.stat is unreadable."""
    if usage is None:
        return None
    return max(usage - inactive_file, 0) if inactive_file is not None else usage


class CgroupReader:
    """Reads the current process's cgroup (v2 preferred; v1 when the unified hierarchy has no controllers)."""

    def __init__(self, root: Path = DEFAULT_ROOT, proc_cgroup: str | None = None) -> None:
        self.root = Path(root)
        if proc_cgroup is None:
            proc_cgroup = _read(Path(f"/proc/{os.getpid()}/cgroup")) or ""
        self.version = 2 if (self.root / "cgroup.controllers").exists() else 1
        if self.version == 2:
            self._cpu = self._memory = _resolve(self.root, _own_path(proc_cgroup, None))
        else:
            self._cpu = _resolve(self._v1_dir("cpu"), _own_path(proc_cgroup, "cpu"))
            self._cpuacct = _resolve(self._v1_dir("cpuacct"), _own_path(proc_cgroup, "cpuacct"))
            self._memory = _resolve(self.root / "memory", _own_path(proc_cgroup, "memory"))

    def _v1_dir(self, controller: str) -> Path:
        for name in (controller, "cpu,cpuacct", "cpuacct,cpu"):
            if (self.root / name).is_dir():
                return self.root / name
        return self.root / controller

    @property
    def available(self) -> bool:
        return self._cpu.is_dir() or self._memory.is_dir()

    def read(self) -> CgroupReading:
        return self._read_v2() if self.version == 2 else self._read_v1()

    def _read_v2(self) -> CgroupReading:
        limit: float | None = None
        quota = (_read(self._cpu / "cpu.max") or "max").split()
        if quota and quota[0] != "max":
            period = _int(quota[1]) if len(quota) > 1 else 100_000
            q = _int(quota[0])
            if q and period:
                limit = q / period
        stat = _stat(self._cpu / "cpu.stat")
        memory_max = _read(self._memory / "memory.max")
        usage = _int(_read(self._memory / "memory.current"))
        return CgroupReading(
            version=2,
            cpu_limit_cores=limit,
            cpu_usage_seconds=stat["usage_usec"] / 1e6 if "usage_usec" in stat else None,
            periods=stat.get("nr_periods"),
            throttled_periods=stat.get("nr_throttled"),
            throttled_seconds=stat["throttled_usec"] / 1e6 if "throttled_usec" in stat else None,
            memory_limit_bytes=None if memory_max in (None, "max") else _int(memory_max),
            memory_usage_bytes=usage,
            memory_working_set_bytes=_working_set(usage, _stat(self._memory / "memory.stat").get("inactive_file")),
        )

    def _read_v1(self) -> CgroupReading:
        limit: float | None = None
        quota = _int(_read(self._cpu / "cpu.cfs_quota_us"))
        period = _int(_read(self._cpu / "cpu.cfs_period_us"))
        if quota is not None and quota > 0 and period:
            limit = quota / period
        stat = _stat(self._cpu / "cpu.stat")
        usage_ns = _int(_read(self._cpuacct / "cpuacct.usage"))
        memory_limit = _int(_read(self._memory / "memory.limit_in_bytes"))
        usage = _int(_read(self._memory / "memory.usage_in_bytes"))
        return CgroupReading(
            version=1,
            cpu_limit_cores=limit,
            cpu_usage_seconds=usage_ns / 1e9 if usage_ns is not None else None,
            periods=stat.get("nr_periods"),
            throttled_periods=stat.get("nr_throttled"),
            throttled_seconds=stat["throttled_time"] / 1e9 if "throttled_time" in stat else None,
            memory_limit_bytes=None if memory_limit is None or memory_limit >= V1_UNLIMITED else memory_limit,
            memory_usage_bytes=usage,
            memory_working_set_bytes=_working_set(
                usage, _stat(self._memory / "memory.stat").get("total_inactive_file")),
        )
