"""Bottleneck thresholds shared by the in-process coincidence counters and the alert rules.

Defaults from SageMaker Debugger's CPUBottleneck / IOBottleneck (cpu_threshold 90 %,
gpu_threshold 10 %, io_threshold 50 %), as ratios. The sampler counts coincidences
with these values, so rules that read those counters use the same ones.
"""

from __future__ import annotations

CPU_HIGH = 0.90
"""A logical CPU busier than this (in a sample) is "high"."""
GPU_LOW = 0.10
"""A GPU less utilized than this (in a sample) is "low"."""
IOWAIT_HIGH = 0.50
"""A logical CPU with more iowait than this (in a sample) is waiting on I/O."""
