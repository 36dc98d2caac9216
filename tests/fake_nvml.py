"""A fake NVML backend that replays recorded readings (tests/fixtures/nvml_*.json) and injected errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otelprof.runtime.collectors.nvml import MIG_KEY_BASE, DeviceInfo, NvmlCallError, mig_profile

FIXTURES = Path(__file__).parent / "fixtures"


class FakeNvml:
    """Implements otelprof.runtime.collectors.nvml.NvmlBackend. ``tick`` selects the reading; ``errors`` maps
    (index, field) -> reason to fail a read; ``calls`` counts reads per (index, field). A device entry's ``mig``
    lists its MIG instances (MIG mode on), keyed from MIG_KEY_BASE in listing order like the real backend; their
    readings are under their UUID in the ticks, ``process_memory`` and ``gpm``. ``hidden_mig`` instances are not
    enumerated under their GPU, only found by UUID (as in a container given one MIG instance)."""

    def __init__(self, fixture: str = "nvml_a100x2.json") -> None:
        self.data: dict[str, Any] = json.loads((FIXTURES / fixture).read_text())
        self.tick = 0
        self.errors: dict[tuple[int, str], str] = {}
        self.calls: dict[tuple[int, str], int] = {}
        self.shut_down = False
        self.mig: dict[int, DeviceInfo] = {}

    def _key(self, index: int) -> str:
        return self.mig[index].uuid if index in self.mig else str(index)

    def _mig(self, parent: int, entry: dict[str, Any]) -> DeviceInfo:
        for known in self.mig.values():
            if known.uuid == entry["uuid"]:
                return known
        device = DeviceInfo(MIG_KEY_BASE + len(self.mig), entry["uuid"], entry["name"],
                            parent_uuid=self.data["devices"][parent]["uuid"], gpu_instance=int(entry["gpu_instance"]),
                            profile=mig_profile(entry["name"]))
        self.mig[device.index] = device
        return device

    def mig_devices(self, index: int) -> list[DeviceInfo]:
        entries = self.data["devices"][index].get("mig", [])
        return [self._mig(index, e) for e in entries if not e.get("hidden")]

    def device_by_uuid(self, uuid: str) -> DeviceInfo:
        self._fail(-1, "device_by_uuid")
        for parent, gpu in enumerate(self.data["devices"]):
            if gpu["uuid"] == uuid:
                return self.device(parent)
            for entry in gpu.get("mig", []):
                if entry["uuid"] == uuid:
                    return self._mig(parent, entry)
        raise NvmlCallError("not_found", f"fake: no device {uuid}")

    def device_count(self) -> int:
        return len(self.data["devices"])

    def device(self, index: int) -> DeviceInfo:
        entry = self.data["devices"][index]
        return DeviceInfo(index, entry["uuid"], entry["name"])

    def _fail(self, index: int, field: str) -> None:
        self.calls[(index, field)] = self.calls.get((index, field), 0) + 1
        reason = self.errors.get((index, field)) or self.errors.get((index, "*"))
        if reason:
            raise NvmlCallError(reason, f"fake {reason}")

    def read(self, index: int, field: str) -> float:
        self._fail(index, field)
        ticks = self.data["ticks"]
        values = ticks[self.tick % len(ticks)][self._key(index)]
        if field not in values:
            raise NvmlCallError("not_supported", f"fake: {field} not supported")
        return float(values[field])

    def read_gpm(self, index: int) -> dict[str, float]:
        self._fail(index, "gpm")
        gpm = self.data.get("gpm")
        if gpm == "not_supported":
            raise NvmlCallError("not_supported", "fake: no GPM")
        if self._key(index) not in gpm:
            raise NvmlCallError("not_supported", "fake: no GPM on this device")
        return dict(gpm[self._key(index)])

    def process_memory(self, index: int, pid: int) -> int | None:
        self._fail(index, "process_memory")
        value = self.data["process_memory"].get(self._key(index))
        return None if value is None else int(value)

    def versions(self) -> tuple[str, str]:
        self._fail(-1, "versions")
        return str(self.data.get("driver_version", "")), str(self.data.get("cuda_driver_version", ""))

    def shutdown(self) -> None:
        self.shut_down = True
