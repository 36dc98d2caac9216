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
OUTLIER_MIN_EXCESS = 0.02
"""...and at least this many seconds more than their median: a loaded machine's scheduler delays a runnable
thread by up to ~20 ms (2-18 ms measured on ~2 ms steps beside a busy neighbour), which is no bottleneck."""

OUTLIER_WINDOW = 256
"""Recent steps (of a phase) an outlier is judged against."""
AFTER_WINDOW_STEPS = 2
"""Steps after an operator-profiling window that otelprof itself slows (the FLOP-counted step, then the one
beside the window's summary): like the window's own steps, never judged as outliers."""

LOSS_SPIKE_RATIO = 3.0
"""A train loss above this many times the median of its phase's recent losses..."""
LOSS_SPIKE_SIGMA = 4.0
"""...and above their mean + this many standard deviations is a spike (a transient jump, not noise)."""
LOSS_SPIKE_MIN_STEPS = 20
"""Losses of a phase seen before any is judged."""
