"""Telemetry sources read by the sampler: host (psutil), container (cgroup), GPUs (NVML)."""
