"""GPU readings above the NVML seam: visible devices, unsupported fields, lost GPUs, error counting.

A field that fails is absent from that sample; ``not_supported`` fields are not
asked again; a lost GPU is dropped. Each failure is reported through
``on_error(source, reason)`` and warned about once. NVML that cannot start because
there is no NVIDIA GPU (no driver, no library, no device node) is no failure: one
info line, no warning; other start failures are warned about by the process that
samples the node (``warn``), so not once per rank. Nothing here raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from otelprof._log import info_once, warn_once
from otelprof.runtime.collectors.nvml import (
    FIELDS,
    MIG_FIELDS,
    DeviceInfo,
    NvmlBackend,
    NvmlCallError,
    NvmlUnavailable,
    PynvmlBackend,
)

ErrorSink = Callable[[str, str], None]

NO_DEVICE_REASONS = frozenset({"library_not_found", "driver_not_loaded"})
"""Why NVML cannot start on a machine without an NVIDIA GPU (or whose container does not see one)."""
DEVICE_NODES = ("/dev/nvidiactl", "/proc/driver/nvidia/version")


def nvidia_device_present() -> bool:
    """An NVIDIA driver's device node is visible: a GPU is there even when nvidia-ml-py is not installed."""
    return any(os.path.exists(path) for path in DEVICE_NODES)


@dataclass
class GpuReading:
    """One GPU in one sample: only the fields that could be read."""

    device: DeviceInfo
    values: dict[str, float] = field(default_factory=dict)
    process_memory: int | None = None


def visible_selectors(env: Mapping[str, str]) -> list[str] | None:
    """GPU selectors (indices or UUID prefixes) from CUDA/NVIDIA_VISIBLE_DEVICES; None = all."""
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = env.get(name)
        if value is None:
            continue
        value = value.strip()
        if value.lower() in ("all", ""):
            return None if value else []
        if value.lower() in ("none", "void", "-1"):
            return []
        return [part.strip() for part in value.split(",") if part.strip()]
    return None


def _matches(device: DeviceInfo, selector: str) -> bool:
    if selector.isdigit():  # a MIG instance by its CUDA index: where CUDA numbers it among all devices
        return (device.ordinal if device.is_mig else device.index) == int(selector)
    return device.uuid.startswith(selector) or device.uuid.startswith("GPU-" + selector)


def names_a_gpu(selectors: list[str] | None) -> bool:
    """The visible-devices list names a GPU or MIG instance by UUID: the runtime gave this process a GPU."""
    return bool(selectors) and any(s.startswith(("GPU-", "MIG-")) for s in selectors or ())


UNMAPPED_NOT_FOUND = "not_found"
"""``otelprof.gpu.unmapped`` reason: NVML does not list the GPU or MIG instance the process was given."""
UNMAPPED_AMBIGUOUS = "ambiguous"
"""``otelprof.gpu.unmapped`` reason: several GPUs visible and ``LOCAL_RANK`` names none of them."""


class GpuCollector:
    """Reads every visible GPU through an :class:`NvmlBackend`."""

    def __init__(
        self,
        on_error: ErrorSink,
        backend_factory: Callable[[], NvmlBackend] = PynvmlBackend,
        env: Mapping[str, str] | None = None,
        pid: int | None = None,
        gpm: bool = True,
        warn: bool = True,
    ) -> None:
        self._on_error = on_error
        self._warn = warn
        self._pid = os.getpid() if pid is None else pid
        self._gpm = gpm
        self.backend: NvmlBackend | None = None
        self.devices: list[DeviceInfo] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._gpm_unsupported: set[int] = set()
        self.selectors = visible_selectors(os.environ if env is None else env)
        self.failure = ""
        """Why NVML could not list the GPUs ("" when it could)."""
        self.listed = 0
        """GPUs NVML lists, visible to this process or not."""
        try:
            self.backend = backend_factory()
        except NvmlUnavailable as exc:
            self._unavailable(exc.reason, f"otelprof: NVML unavailable ({exc}); no GPU metrics")
            return
        except Exception as exc:  # a broken driver binding must not stop the sampler
            self._unavailable("error", f"otelprof: NVML failed to start ({exc!r}); no GPU metrics")
            return
        try:
            self.devices = self._list(self.backend, self.selectors)
        except NvmlCallError as exc:
            self.failure = exc.reason
            self._error("nvml", exc.reason, f"otelprof: cannot list GPUs ({exc}); no GPU metrics", key="nvml:list")

    def _list(self, backend: NvmlBackend, selectors: list[str] | None) -> list[DeviceInfo]:
        """The visible devices as CUDA sees them: a GPU in MIG mode is its MIG instances."""
        devices: list[DeviceInfo] = []
        self.listed = backend.device_count()
        for index in range(self.listed):
            gpu = backend.device(index)
            try:
                instances = backend.mig_devices(index)
            except Exception:  # an old backend or binding: the GPU as a whole
                instances = []
            devices.extend(instances or [gpu])
        devices = _numbered(devices)
        if selectors is None:
            return devices
        chosen = [d for d in devices if any(_matches(d, s) for s in selectors)]
        for selector in selectors:  # a MIG instance NVML does not enumerate under its GPU in this container
            if selector.startswith("MIG-") and not any(d.uuid.startswith(selector) for d in chosen):
                with contextlib.suppress(Exception):
                    chosen.append(backend.device_by_uuid(selector))
        return _numbered(chosen)

    def device_for(self, local_rank: int) -> tuple[DeviceInfo | None, str]:
        """The device this process computes on (the only visible one, else the one at ``local_rank``), or None
        and why not ("" when the process has no GPU at all: nothing is missing)."""
        devices = self.devices
        if len(devices) == 1:
            return devices[0], ""
        if 0 <= local_rank < len(devices):
            return devices[local_rank], ""
        gpu_given = names_a_gpu(self.selectors) or self.listed > 0 or nvidia_device_present()
        if not gpu_given or self.selectors == []:
            return None, ""
        if self.backend is None or self.failure:
            return None, self.failure or self.start_failure
        return None, UNMAPPED_AMBIGUOUS if devices else UNMAPPED_NOT_FOUND

    start_failure = ""
    """Why NVML could not start ("" when it did)."""

    def _unavailable(self, reason: str, message: str) -> None:
        self.start_failure = reason
        self._on_error("nvml", reason)
        no_device = reason in NO_DEVICE_REASONS or (reason == "not_installed" and not nvidia_device_present())
        if no_device or not self._warn:
            info_once("nvml:init", "%s%s", message, " (no NVIDIA GPU visible)" if no_device else "")
        else:
            warn_once("nvml:init", "%s", message)

    def _error(self, source: str, reason: str, message: str, key: str) -> None:
        self._on_error(source, reason)
        warn_once(key, "%s", message)

    def sample(self, node_wide: bool = True) -> list[GpuReading]:
        """Read the visible GPUs: every field when ``node_wide``, else only this process's memory."""
        backend = self.backend
        if backend is None:
            return []
        readings = []
        lost: list[DeviceInfo] = []
        for device in self.devices:
            reading = GpuReading(device)
            try:
                if node_wide:
                    self._read_fields(backend, reading)
                memory = self._read(backend, device, "process_memory",
                                    lambda d=device: backend.process_memory(d.index, self._pid))  # type: ignore[misc]
                reading.process_memory = int(memory) if memory is not None else None
            except _GpuLost:
                lost.append(device)
                continue
            readings.append(reading)
        for device in lost:
            self.devices.remove(device)
        return readings

    def _read_fields(self, backend: NvmlBackend, reading: GpuReading) -> None:
        device = reading.device
        for name in MIG_FIELDS if device.is_mig else FIELDS:
            value = self._read(backend, device, name, lambda n=name: backend.read(device.index, n))  # type: ignore[misc]
            if value is not None:
                reading.values[name] = float(value)
        if self._gpm and device.index not in self._gpm_unsupported:
            try:
                reading.values.update(backend.read_gpm(device.index))
            except Exception as exc:
                if not isinstance(exc, NvmlCallError):
                    exc = NvmlCallError("error", repr(exc))
                if exc.reason == "gpu_lost":
                    self._lost(device, exc)
                if exc.reason != "warming_up":
                    self._gpm_unsupported.add(device.index)
                    if exc.reason != "not_supported":
                        self._error("nvml", exc.reason, f"otelprof: GPM read failed on GPU {device.index} ({exc})",
                                    key=f"nvml:gpm:{device.index}")

    def _read(self, backend: NvmlBackend, device: DeviceInfo, name: str, call: Callable[[], float | int | None]
              ) -> float | int | None:
        if (device.index, name) in self._unsupported:
            return None
        try:
            return call()
        except _GpuLost:
            raise
        except Exception as exc:
            if not isinstance(exc, NvmlCallError):  # a binding bug: count it like any failed read
                exc = NvmlCallError("error", repr(exc))
            if exc.reason == "gpu_lost":
                self._lost(device, exc)
            if exc.reason == "not_supported":
                self._unsupported.add((device.index, name))
            self._error("nvml", exc.reason, f"otelprof: NVML {name} on GPU {device.index} failed ({exc}); the "
                        "series is absent", key=f"nvml:{device.index}:{name}:{exc.reason}")
            return None

    def _lost(self, device: DeviceInfo, exc: NvmlCallError) -> None:
        self._error("nvml", "gpu_lost", f"otelprof: GPU {device.index} ({device.uuid}) is lost ({exc}); its "
                    "series are absent from now on", key=f"nvml:lost:{device.index}")
        raise _GpuLost()

    def shutdown(self) -> None:
        if self.backend is not None:
            with contextlib.suppress(Exception):
                self.backend.shutdown()
            self.backend = None


class _GpuLost(Exception):
    pass


def _numbered(devices: list[DeviceInfo]) -> list[DeviceInfo]:
    """MIG instances numbered by their place in ``devices``, as CUDA numbers the visible devices."""
    return [dataclasses.replace(d, ordinal=i) if d.is_mig else d for i, d in enumerate(devices)]
