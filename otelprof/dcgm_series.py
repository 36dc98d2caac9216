"""NVIDIA dcgm-exporter's series, which the mixin reads instead of otelprof's own GPU series with
``gpu_source=dcgm`` (:mod:`otelprof.mixin.gpu_source`): names and units as dcgm-exporter exports them.
"""

from __future__ import annotations

# NVIDIA dcgm-exporter's default counters (etc/default-counters.csv), read instead of otelprof's own GPU series.
# Labels: gpu (host index), UUID, pci_bus_id, device, modelName, Hostname, and with pod attribution
# pod/namespace/container of the pod using the GPU (exported_pod, ... after a honorLabels: false scrape).
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""GPU utilization in percent (0-100)."""
DCGM_MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"
"""Memory (copy engine) utilization in percent."""
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"
"""Framebuffer memory used, MiB."""
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
"""Framebuffer memory free, MiB."""
DCGM_FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
"""Framebuffer memory reserved by the driver, MiB (newer dcgm-exporters; used + free + reserved = total)."""
DCGM_POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
"""Power draw, W."""
DCGM_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"
"""GPU temperature, Celsius."""
DCGM_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"
"""SM clock, MHz."""
DCGM_TENSOR_ACTIVE = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
"""Ratio of cycles the tensor pipe is active (0-1)."""
DCGM_GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
"""Ratio of time the graphics engine is active (0-1); reported for MIG instances, where DCGM_FI_DEV_GPU_UTIL is
not."""
DCGM_SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
"""Ratio of cycles an SM has at least one warp assigned (0-1)."""
DCGM_SM_OCCUPANCY = "DCGM_FI_PROF_SM_OCCUPANCY"
"""Ratio of warps resident on an SM to its maximum (0-1)."""
DCGM_PCIE_TX_BYTES = "DCGM_FI_PROF_PCIE_TX_BYTES"
"""PCIe bytes transmitted, bytes per second (a rate, despite the name)."""
DCGM_PCIE_RX_BYTES = "DCGM_FI_PROF_PCIE_RX_BYTES"
"""PCIe bytes received, bytes per second."""
DCGM_TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
"""Energy since boot, mJ (counter)."""
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
"""The last XID error's code (gauge; 0 none)."""
DCGM_CORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
"""Rows remapped for correctable errors (counter)."""
DCGM_UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
"""Rows remapped for uncorrectable errors (counter)."""
DCGM_ECC_SBE_VOLATILE = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
"""Single-bit (corrected) volatile ECC errors (counter; commented out in the default counters)."""
DCGM_ECC_DBE_VOLATILE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
"""Double-bit (uncorrected) volatile ECC errors (counter; commented out in the default counters)."""
DCGM_LABEL_UUID = "UUID"
DCGM_LABEL_GPU = "gpu"
DCGM_LABEL_GPU_INSTANCE = "GPU_I_ID"
"""A MIG instance's GPU instance id; absent on a whole GPU's series (``UUID`` is the GPU's on both)."""
DCGM_LABEL_GPU_PROFILE = "GPU_I_PROFILE"
DCGM_SERIES: tuple[str, ...] = (DCGM_GPU_UTIL, DCGM_MEM_COPY_UTIL, DCGM_FB_USED, DCGM_FB_FREE, DCGM_FB_RESERVED,
                                DCGM_POWER_USAGE, DCGM_GPU_TEMP, DCGM_SM_CLOCK, DCGM_TENSOR_ACTIVE,
                                DCGM_GR_ENGINE_ACTIVE, DCGM_SM_ACTIVE, DCGM_SM_OCCUPANCY, DCGM_PCIE_TX_BYTES,
                                DCGM_PCIE_RX_BYTES, DCGM_TOTAL_ENERGY, DCGM_XID_ERRORS,
                                DCGM_CORRECTABLE_REMAPPED_ROWS, DCGM_UNCORRECTABLE_REMAPPED_ROWS,
                                DCGM_ECC_SBE_VOLATILE, DCGM_ECC_DBE_VOLATILE)
