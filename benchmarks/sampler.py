"""Sampler cost: one sample, CPU share at the default interval, memory over a soak, /metrics render time.

    python benchmarks/sampler.py            # ~1 minute
    python benchmarks/sampler.py --quick    # ~15 s

Figures:
* one sample on this machine (real psutil + cgroup; NVML absent here), median of repeats;
* the sampler thread's CPU share at 500 ms, from process CPU time while the main thread sleeps;
* memory growth over a soak of many samples (tracemalloc, after garbage collection);
* /metrics render time for a synthetic 8-GPU, 64-core node (goal <= 10 ms).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import psutil

from otelprof.config import Config
from otelprof.recording.writer import RecordingWriter
from otelprof.runtime.collectors.nvml import DeviceInfo
from otelprof.runtime.collectors.sampler import Sampler
from otelprof.runtime.collectors.system import HostReading
from otelprof.runtime.export.prometheus import PrometheusEndpoint
from otelprof.runtime.metrics import MetricRegistry
from otelprof.semconv import CPU_MODES

IDENTITY = {"job_name": "bench", "rank": "0", "local_rank": "0", "node": "node-0"}


class SyntheticNvml:
    """Eight GPUs with fixed, plausible readings (a benchmark needs no replay)."""

    def __init__(self, count: int = 8) -> None:
        self.count = count

    def device_count(self) -> int:
        return self.count

    def device(self, index: int) -> DeviceInfo:
        return DeviceInfo(index, f"GPU-{index:08d}-0000-0000-0000-000000000000", "NVIDIA H100 80GB HBM3")

    def read(self, index: int, field: str) -> float:
        return {"memory_used": 60e9, "memory_total": 80e9, "power": 550.0, "power_limit": 700.0,
                "temperature": 65.0, "sm_clock": 1.98e9, "throttle_reasons": 0.0}.get(field, 0.5)

    def read_gpm(self, index: int) -> dict[str, float]:
        return {"sm_active": 0.8, "sm_occupancy": 0.4, "tensor_active": 0.6}

    def process_memory(self, index: int, pid: int) -> int | None:
        return 10**9

    def shutdown(self) -> None:
        return None


def _sampler(tmp: Path, nvml: Any = None) -> tuple[Sampler, MetricRegistry]:
    registry = MetricRegistry(IDENTITY)
    writer = RecordingWriter(tmp, {"schema_version": "1.0"}, lambda n: None, lambda n: None)
    sampler = Sampler(Config.from_env({}), registry, writer, nvml_factory=(lambda: nvml) if nvml else None)
    return sampler, registry


def one_sample_cost(tmp: Path, repeats: int) -> float:
    sampler, _ = _sampler(tmp)
    sampler.sample()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        sampler.sample()
        times.append(time.perf_counter() - began)
        sampler.writer.flush()  # type: ignore[union-attr]
    return statistics.median(times)


def cpu_share(tmp: Path, seconds: float) -> tuple[float, int]:
    sampler, _ = _sampler(tmp)
    process = psutil.Process()
    sampler.start()
    time.sleep(1.0)
    before = process.cpu_times()
    taken = sampler.samples_taken
    began = time.monotonic()
    time.sleep(seconds)
    after = process.cpu_times()
    elapsed = time.monotonic() - began
    samples = sampler.samples_taken - taken
    sampler.stop()
    used = (after.user - before.user) + (after.system - before.system)
    return used / elapsed, samples


def soak(tmp: Path, samples: int) -> int:
    sampler, _ = _sampler(tmp, SyntheticNvml())
    for _ in range(200):
        sampler.sample()
    sampler.writer.flush()  # type: ignore[union-attr]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(samples):
        sampler.sample()
        if i % 20 == 0:
            sampler.writer.flush()  # type: ignore[union-attr]
    sampler.writer.flush()  # type: ignore[union-attr]
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename"))


def render_time(tmp: Path, repeats: int) -> tuple[float, int, int]:
    sampler, registry = _sampler(tmp, SyntheticNvml(8))
    cores = 64
    modes = {m: 1.0 / len(CPU_MODES) for m in CPU_MODES}
    host = HostReading(cpu_modes=[dict(modes)] * cores, cpu_busy=[0.7] * cores, cpu_iowait=[0.05] * cores,
                       memory_used=10**11, memory_total=2 * 10**12,
                       disk={"read_bytes": 1, "write_bytes": 1, "read_count": 1, "write_count": 1},
                       network={"bytes_recv": 1.0, "bytes_sent": 1.0})
    sampler.system.host = lambda: host  # type: ignore[method-assign]
    for _ in range(3):
        sampler.sample()
    endpoint = PrometheusEndpoint(registry, {"service.name": "bench"})
    body = endpoint.render().encode()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        endpoint.render()
        times.append(time.perf_counter() - began)
    series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    return statistics.median(times), series, len(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short run (~15 s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        cost = one_sample_cost(tmp / "a", 50 if args.quick else 300)
        share, taken = cpu_share(tmp / "b", 5.0 if args.quick else 30.0)
        growth = soak(tmp / "c", 1000 if args.quick else 10_000)
        render, series, size = render_time(tmp / "d", 20 if args.quick else 100)
    results = {
        "one_sample_us": cost * 1e6,
        "cpu_share_of_one_core": share,
        "samples_during_share": taken,
        "soak_samples": 1000 if args.quick else 10_000,
        "soak_growth_bytes": growth,
        "render_ms_8gpu_64core": render * 1e3,
        "render_series": series,
        "render_bytes": size,
    }
    print(f"one sample (real psutil + cgroup, median)     {cost * 1e6:8.0f} us")
    print(f"sampler CPU share at 500 ms                   {share * 100:8.3f} % of one core   (goal <= 0.2 %; "
          f"{taken} samples)")
    print(f"memory growth over {results['soak_samples']} samples (8 GPUs)    {growth:8d} bytes")
    print(f"/metrics render, 8 GPUs x 64 cores            {render * 1e3:8.2f} ms   (goal <= 10 ms; {series} series, "
          f"{size / 1024:.0f} KiB)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
