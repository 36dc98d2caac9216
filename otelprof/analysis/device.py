"""Device time and model FLOPs: what the GPU did beside what the host saw.

* device time: per phase and region (forward, backward, optimizer), the CUDA-event device time of the steps
  that have one beside the host time of the same regions in the same steps, and their gap (host minus
  device: positive when the host takes longer than the GPU work it queues, i.e. launch overhead or host
  work in the region; negative when the GPU runs behind the host, which then waits at the next sync);
* model FLOPs: per rank, the FLOPs per step counted after its last profiling window, times the rank's
  training steps per second over the run, and over the device's peak when the window knew one (MFU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from otelprof.analysis.run import RunView
from otelprof.analysis.stats import share

TRAIN = "train"


@dataclass(frozen=True)
class DeviceRegion:
    phase: str
    region: str
    steps: int
    """Steps with both a host and a device time of the region."""
    host_mean: float
    device_mean: float
    gap_mean: float
    """host_mean - device_mean, seconds."""
    gap_share: float
    """gap over host time."""


@dataclass(frozen=True)
class ModelFlops:
    rank: int
    per_step: float
    steps_per_second: float
    achieved: float
    """FLOP/s over the run: per_step x steps_per_second."""
    device: str
    dtype: str
    gpu_model: str | None
    peak: float | None
    utilization: float | None
    """achieved / peak (None on a CPU or without a known peak)."""


@dataclass(frozen=True)
class DeviceAnalysis:
    regions: tuple[DeviceRegion, ...] = ()
    flops: tuple[ModelFlops, ...] = ()


def _device_regions(view: RunView) -> tuple[DeviceRegion, ...]:
    totals: dict[tuple[str, str], list[float]] = {}  # steps, host s, device s
    for rank in view.ranks:
        if not rank.device_times:
            continue
        device: dict[tuple[str, int], dict[str, int]] = {}
        for d in rank.device_times:
            if d.number is not None:
                times = device.setdefault((d.phase, d.number), {})
                times[d.name] = times.get(d.name, 0) + d.duration_ns
        c = rank.step_columns
        for i in range(len(c)):
            phase = c.phase_names[c.phase[i]]
            regions = device.get((phase, c.number[i]))
            if not regions:
                continue
            host: dict[str, int] = {}
            for j in range(c.ann_index[i], c.ann_index[i + 1]):
                name = c.ann_names[c.ann_name[j]]
                if name in regions:
                    host[name] = host.get(name, 0) + c.ann_duration[j]
            for name, host_ns in host.items():
                row = totals.setdefault((phase, name), [0, 0.0, 0.0])
                row[0] += 1
                row[1] += host_ns / 1e9
                row[2] += regions[name] / 1e9
    out = []
    for (phase, name), (steps, host_s, device_s) in totals.items():
        out.append(DeviceRegion(phase, name, int(steps), host_s / steps, device_s / steps, (host_s - device_s) / steps,
                                share(host_s - device_s, host_s)))
    return tuple(sorted(out, key=lambda r: (r.phase != TRAIN, r.phase, -r.host_mean)))


def _train_pace(view: RunView, index: int) -> float:
    """Training steps per second of rank ``index`` over its training loop (0: fewer than two steps)."""
    c = view.ranks[index].step_columns
    if TRAIN not in c.phase_names:
        return 0.0
    mask = c.phase_mask(TRAIN)
    starts = [s for s, m in zip(c.start_ns, mask) if m]
    ends = [s + d for s, d, m in zip(c.start_ns, c.duration_ns, mask) if m]
    if len(starts) < 2 or max(ends) <= min(starts):
        return 0.0
    return len(starts) / ((max(ends) - min(starts)) / 1e9)


def _model_flops(view: RunView) -> tuple[ModelFlops, ...]:
    out = []
    for index, rank in enumerate(view.ranks):
        last = None
        for record in rank.profiles():
            if record.get("flops") is not None:
                last = record["flops"]
        if last is None:
            continue
        pace = _train_pace(view, index)
        achieved = last["per_step"] * pace if pace else last.get("achieved", math.nan)
        peak = last.get("peak")
        out.append(ModelFlops(rank.rank, last["per_step"], pace, achieved, last.get("device", "unknown"),
                              last.get("dtype", "unknown"), last.get("gpu_model"), peak,
                              achieved / peak if peak and "utilization" in last else None))
    return tuple(out)


def device_analysis(view: RunView) -> DeviceAnalysis:
    view.say("device time and model FLOPs")
    return DeviceAnalysis(_device_regions(view), _model_flops(view))
