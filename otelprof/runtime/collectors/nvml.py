"""The NVML seam: the only code that calls nvidia-ml-py (``pynvml``).

:class:`NvmlBackend` is the whole surface the GPU collector uses; every value is
in base units (ratio 0-1, bytes, watts, joules, Celsius, hertz, bytes/s). Errors become
:class:`NvmlCallError` with a short reason (``not_supported``, ``gpu_lost``, ...).
Tests replace the backend with a fake that replays recorded readings.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

FIELDS: tuple[str, ...] = (
    "utilization", "memory_copy_utilization", "memory_used", "memory_total", "power", "energy", "power_limit",
    "temperature", "sm_clock", "pcie_rx", "pcie_tx", "throttle_reasons", "ecc_corrected", "ecc_uncorrected",
)
GPM_FIELDS: tuple[str, ...] = ("sm_active", "sm_occupancy", "tensor_active")
MIG_FIELDS: tuple[str, ...] = ("memory_used", "memory_total")
"""What NVML reads per MIG instance; its engine activity comes from GPM (``utilization``, Hopper and newer)."""
MIG_KEY_BASE = 1 << 16
"""Backend keys of MIG instances start here (whole GPUs are keyed by their NVML index)."""

# Clock-event (throttle) reasons worth a label, by NVML bit.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}


class NvmlUnavailable(Exception):
    """NVML cannot be used at all (library missing, driver not loaded, no permission)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class NvmlCallError(Exception):
    """One NVML query failed; ``reason`` is a short, bounded label value."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


@dataclass(frozen=True)
class DeviceInfo:
    """A GPU, or a MIG instance of one (``parent_uuid`` set)."""

    index: int
    """The backend's key: the NVML index of a GPU; :data:`MIG_KEY_BASE` and up for a MIG instance."""
    uuid: str
    """``GPU-...``, or ``MIG-...`` for a MIG instance."""
    name: str
    parent_uuid: str = ""
    """MIG: the UUID of the GPU the instance is carved from (dcgm-exporter's ``UUID`` label)."""
    gpu_instance: int = -1
    """MIG: the GPU instance id (dcgm-exporter's ``GPU_I_ID``)."""
    profile: str = ""
    """MIG: the instance's profile, e.g. ``1g.10gb`` (dcgm-exporter's ``GPU_I_PROFILE``)."""
    ordinal: int = -1
    """MIG: the device's index as CUDA numbers the visible devices (set by the collector)."""

    @property
    def is_mig(self) -> bool:
        return bool(self.parent_uuid)

    @property
    def gpu(self) -> str:
        """The ``gpu`` label: the NVML index of a GPU, the CUDA index of a MIG instance."""
        return str(self.ordinal if self.is_mig and self.ordinal >= 0 else self.index)


class NvmlBackend(Protocol):
    def device_count(self) -> int: ...

    def device(self, index: int) -> DeviceInfo: ...

    def mig_devices(self, index: int) -> list[DeviceInfo]:
        """The MIG instances of GPU ``index`` (empty when MIG mode is off or not supported); never raises."""
        ...

    def device_by_uuid(self, uuid: str) -> DeviceInfo:
        """A GPU or MIG instance by its UUID (``MIG-...`` names in NVIDIA_VISIBLE_DEVICES); raises
        :class:`NvmlCallError` (``not_found``)."""
        ...

    def read(self, index: int, field: str) -> float:
        """One field of :data:`FIELDS` in base units; raises :class:`NvmlCallError`."""
        ...

    def read_gpm(self, index: int) -> dict[str, float]:
        """:data:`GPM_FIELDS` as ratios since the previous call; raises ``NvmlCallError('not_supported')``."""
        ...

    def process_memory(self, index: int, pid: int) -> int | None:
        """GPU memory used by ``pid`` on the device, or None when the process is not listed."""
        ...

    def versions(self) -> tuple[str, str]:
        """(driver version, newest CUDA version the driver supports as "12.4"); raises :class:`NvmlCallError`."""
        ...

    def shutdown(self) -> None: ...


def _reason(error: Exception) -> str:
    name = type(error).__name__
    if name.startswith("NVMLError_"):
        name = name[len("NVMLError_"):]
    mapping = {"NotSupported": "not_supported", "GpuIsLost": "gpu_lost", "NoPermission": "no_permission",
               "LibraryNotFound": "library_not_found", "DriverNotLoaded": "driver_not_loaded",
               "Timeout": "timeout", "Unknown": "unknown", "NotFound": "not_found",
               "InsufficientSize": "insufficient_size", "InvalidArgument": "invalid_argument"}
    return mapping.get(name, "error")


class PynvmlBackend:
    """:class:`NvmlBackend` over nvidia-ml-py."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("not_installed", "nvidia-ml-py is not installed (pip install otelprof[gpu])") from exc
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(_reason(exc), str(exc)) from exc
        self._handles: dict[int, Any] = {}
        self._gpm_previous: dict[int, Any] = {}
        self._mig: dict[str, DeviceInfo] = {}
        self._mig_parent: dict[int, Any] = {}

    def _handle(self, index: int) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            handle = self._handles[index] = self._call(self._nvml.nvmlDeviceGetHandleByIndex, index)
        return handle

    def _call(self, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except self._nvml.NVMLError as exc:
            raise NvmlCallError(_reason(exc), str(exc)) from exc

    def device_count(self) -> int:
        return int(self._call(self._nvml.nvmlDeviceGetCount))

    def device(self, index: int) -> DeviceInfo:
        handle = self._handle(index)
        uuid = self._call(self._nvml.nvmlDeviceGetUUID, handle)
        name = self._call(self._nvml.nvmlDeviceGetName, handle)
        return DeviceInfo(index, _text(uuid), _text(name))

    def mig_devices(self, index: int) -> list[DeviceInfo]:
        n = self._nvml
        try:
            handle = self._handle(index)
            if self._call(n.nvmlDeviceGetMigMode, handle)[0] != n.NVML_DEVICE_MIG_ENABLE:
                return []
            count = int(self._call(n.nvmlDeviceGetMaxMigDeviceCount, handle))
        except (NvmlCallError, AttributeError, TypeError, IndexError):  # no MIG, or a binding without it
            return []
        devices = []
        for slot in range(count):
            try:
                devices.append(self._mig_device(self._call(n.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot),
                                                handle))
            except NvmlCallError:  # an empty slot (not_found)
                continue
        return devices

    def device_by_uuid(self, uuid: str) -> DeviceInfo:
        n = self._nvml
        known = self._mig.get(uuid)
        if known is not None:
            return known
        handle = self._call(n.nvmlDeviceGetHandleByUUID, uuid)
        if uuid.startswith("MIG-") or self._call(n.nvmlDeviceIsMigDeviceHandle, handle):
            return self._mig_device(handle, self._call(n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, handle))
        index = int(self._call(n.nvmlDeviceGetIndex, handle))
        self._handles[index] = handle
        return DeviceInfo(index, _text(self._call(n.nvmlDeviceGetUUID, handle)),
                          _text(self._call(n.nvmlDeviceGetName, handle)))

    def _mig_device(self, handle: Any, parent: Any) -> DeviceInfo:
        n = self._nvml
        uuid = _text(self._call(n.nvmlDeviceGetUUID, handle))
        known = self._mig.get(uuid)
        if known is not None:
            return known
        name = _text(self._call(n.nvmlDeviceGetName, handle))
        key = MIG_KEY_BASE + len(self._mig)
        self._handles[key] = handle
        self._mig_parent[key] = parent
        device = self._mig[uuid] = DeviceInfo(
            key, uuid, name, parent_uuid=_text(self._call(n.nvmlDeviceGetUUID, parent)),
            gpu_instance=int(self._call(n.nvmlDeviceGetGpuInstanceId, handle)), profile=mig_profile(name))
        return device

    def read(self, index: int, field: str) -> float:
        n, h = self._nvml, self._handle(index)
        if field == "utilization":
            return float(self._call(n.nvmlDeviceGetUtilizationRates, h).gpu) / 100.0
        if field == "memory_copy_utilization":
            return float(self._call(n.nvmlDeviceGetUtilizationRates, h).memory) / 100.0
        if field == "memory_used":
            return float(self._call(n.nvmlDeviceGetMemoryInfo, h).used)
        if field == "memory_total":
            return float(self._call(n.nvmlDeviceGetMemoryInfo, h).total)
        if field == "power":
            return float(self._call(n.nvmlDeviceGetPowerUsage, h)) / 1000.0
        if field == "energy":  # millijoules since the driver loaded (Volta and newer)
            return float(self._call(n.nvmlDeviceGetTotalEnergyConsumption, h)) / 1000.0
        if field == "power_limit":
            return float(self._call(n.nvmlDeviceGetEnforcedPowerLimit, h)) / 1000.0
        if field == "temperature":
            return float(self._call(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU))
        if field == "sm_clock":
            return float(self._call(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)) * 1e6
        if field == "pcie_rx":
            return float(self._call(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)) * 1024.0
        if field == "pcie_tx":
            return float(self._call(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)) * 1024.0
        if field == "throttle_reasons":
            return float(self._call(n.nvmlDeviceGetCurrentClocksThrottleReasons, h))
        if field in ("ecc_corrected", "ecc_uncorrected"):
            kind = (n.NVML_MEMORY_ERROR_TYPE_CORRECTED if field == "ecc_corrected"
                    else n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)
            return float(self._call(n.nvmlDeviceGetTotalEccErrors, h, kind, n.NVML_VOLATILE_ECC))
        raise NvmlCallError("invalid_argument", f"unknown field {field}")

    def read_gpm(self, index: int) -> dict[str, float]:
        n, h = self._nvml, self._handle(index)
        parent = self._mig_parent.get(index)
        if index not in self._gpm_previous:
            support = self._call(n.nvmlGpmQueryDeviceSupport, h if parent is None else parent)
            if not getattr(support, "isSupportedDevice", 0):
                raise NvmlCallError("not_supported", "GPM needs a Hopper or newer GPU")
        sample = self._call(n.nvmlGpmSampleAlloc)
        if parent is None:
            self._call(n.nvmlGpmSampleGet, h, sample)
        else:  # a MIG instance: sampled on its GPU, by GPU instance id
            self._call(n.nvmlGpmMigSampleGet, parent, self._call(n.nvmlDeviceGetGpuInstanceId, h), sample)
        previous = self._gpm_previous.get(index)
        self._gpm_previous[index] = sample
        if previous is None:
            raise NvmlCallError("warming_up", "first GPM sample")
        request = n.c_nvmlGpmMetricsGet_t()
        request.version = n.NVML_GPM_METRICS_GET_VERSION
        metrics = [n.NVML_GPM_METRIC_SM_UTIL, n.NVML_GPM_METRIC_SM_OCCUPANCY, n.NVML_GPM_METRIC_ANY_TENSOR_UTIL]
        names = list(GPM_FIELDS)
        if parent is not None:  # NVML has no utilization of a MIG instance: its graphics engine activity stands in
            metrics.append(n.NVML_GPM_METRIC_GRAPHICS_UTIL)
            names.append("utilization")
        request.numMetrics = len(metrics)
        request.sample1 = previous
        request.sample2 = sample
        for i, metric in enumerate(metrics):
            request.metrics[i].metricId = metric
        result = self._call(n.nvmlGpmMetricsGet, request)
        self._call(n.nvmlGpmSampleFree, previous)
        values = [float(result.metrics[i].value) / 100.0 for i in range(len(metrics))]
        return dict(zip(names, values))

    def process_memory(self, index: int, pid: int) -> int | None:
        processes = self._call(self._nvml.nvmlDeviceGetComputeRunningProcesses, self._handle(index))
        for process in processes:
            if process.pid == pid and process.usedGpuMemory is not None:
                return int(process.usedGpuMemory)
        return None

    def versions(self) -> tuple[str, str]:
        driver = _text(self._call(self._nvml.nvmlSystemGetDriverVersion))
        cuda = int(self._call(self._nvml.nvmlSystemGetCudaDriverVersion))
        return driver, cuda_version(cuda)

    def shutdown(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def cuda_version(code: int) -> str:
    """NVML's CUDA version code (12040) as "12.4"; "" for 0 (unknown)."""
    return f"{code // 1000}.{code % 1000 // 10}" if code > 0 else ""


def mig_profile(name: str) -> str:
    """The profile in a MIG device's NVML name ("NVIDIA A100-SXM4-40GB MIG 1g.5gb" -> "1g.5gb"); "" if none."""
    _, found, profile = name.rpartition(" MIG ")
    return profile.strip()[:32] if found else ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
