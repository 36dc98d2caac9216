"""The CUDA caching allocator's figures: one seam (:data:`backend`) between ``torch.cuda`` and the gauges.

After each optimizer step the PyTorch integration reads, for the current device, the bytes held by tensors
(allocated), the bytes the caching allocator reserved from the driver, the peak allocated since start, and
sets the gauges, with fragmentation = reserved - allocated (memory the allocator holds but no tensor uses:
cached blocks and the unusable tails of split blocks). Tests put a fake allocator in :data:`backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from otelprof import semconv as sc


@dataclass(frozen=True)
class Backend:
    available: Callable[[], bool]
    current_device: Callable[[], int]
    allocated: Callable[[int], int]
    reserved: Callable[[int], int]
    peak: Callable[[int], int]


CUDA = Backend(torch.cuda.is_available, torch.cuda.current_device, torch.cuda.memory_allocated,
               torch.cuda.memory_reserved, torch.cuda.max_memory_allocated)
backend: Backend = CUDA


def read() -> tuple[str, int, int, int] | None:
    """(device, allocated, reserved, peak) of the current CUDA device, or None without CUDA."""
    b = backend
    if not b.available():
        return None
    device = b.current_device()
    return str(device), int(b.allocated(device)), int(b.reserved(device)), int(b.peak(device))


def set_gauges(registry: Any, figures: tuple[str, int, int, int]) -> None:
    device, allocated, reserved, peak = figures
    registry.gauge(sc.CUDA_MEMORY_ALLOCATED).set(allocated, (device,))
    registry.gauge(sc.CUDA_MEMORY_RESERVED).set(reserved, (device,))
    registry.gauge(sc.CUDA_MEMORY_PEAK).set(peak, (device,))
    registry.gauge(sc.CUDA_MEMORY_FRAGMENTATION).set(max(reserved - allocated, 0), (device,))
