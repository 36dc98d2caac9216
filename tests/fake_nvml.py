"""A fake NVML backend that replays recorded readings (tests/fixtures/nvml_*.json) and injected errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from otelprof.collectors.nvml import DeviceInfo, NvmlCallError

FIXTURES = Path(__file__).parent / "fixtures"


class FakeNvml:
    """Implements otelprof.collectors.nvml.NvmlBackend. ``tick`` selects the reading; ``errors`` maps
    (index, field) -> reason to fail a read; ``calls`` counts reads per (index, field)."""

    def __init__(self, fixture: str = "nvml_a100x2.json") -> None:
        self.data: dict[str, Any] = json.loads((FIXTURES / fixture).read_text())
        self.tick = 0
        self.errors: dict[tuple[int, str], str] = {}
        self.calls: dict[tuple[int, str], int] = {}
        self.shut_down = False

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
        return float(ticks[self.tick % len(ticks)][str(index)][field])

    def read_gpm(self, index: int) -> dict[str, float]:
        self._fail(index, "gpm")
        gpm = self.data.get("gpm")
        if gpm == "not_supported":
            raise NvmlCallError("not_supported", "fake: no GPM")
        return dict(gpm[str(index)])

    def process_memory(self, index: int, pid: int) -> int | None:
        self._fail(index, "process_memory")
        value = self.data["process_memory"].get(str(index))
        return None if value is None else int(value)

    def versions(self) -> tuple[str, str]:
        self._fail(-1, "versions")
        return str(self.data.get("driver_version", "")), str(self.data.get("cuda_driver_version", ""))

    def shutdown(self) -> None:
        self.shut_down = True
