"""Telemetry sources read by the sampler: host (psutil), container (cgroup), GPUs (NVML).

Part of the runtime core: may import what :mod:`otelprof.runtime` may."""
