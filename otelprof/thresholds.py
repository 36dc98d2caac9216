"""Thresholds shared by the training process (which counts with them) and the alert rules and their offline twin.

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

OUTLIER_SIGMA = 3.0
"""A step slower than the mean + this many standard deviations of its phase's recent steps may be an outlier
(SageMaker Debugger's StepOutlier)..."""
OUTLIER_MIN_RATIO = 1.5
"""...if it also takes at least this many times their median: materially slower than a typical step, not
scheduler jitter on a steady run..."""
OUTLIER_MIN_EXCESS = 0.001
"""...and at least this many seconds more than their median (sub-millisecond steps)."""
