"""Device time and model FLOPs: what the GPU did beside what the host saw.

* device time: per phase and region (forward, backward, optimizer), the CUDA-event device time of the steps
  that have one beside the host time of the same regions in the same steps, and their gap (host minus
  device: positive when the host takes longer than the GPU work it queues, i.e. launch overhead or host
  work in the region; negative when the GPU runs behind the host, which then waits at the next sync);
* memory: the operators that allocated the most in the profiling windows (summed over windows and ranks), the
  allocated-bytes curve of the last window with allocations, and on CUDA the caching allocator's peak and
  fragmentation (reserved - allocated) over the run, per rank, from its metric snapshots;
* communication/computation overlap: per rank, over its profiling windows, the time collective kernels ran,
  the share of it compute kernels ran beside them, and the exposed rest per profiled step;
* model FLOPs: per rank, the FLOPs per step counted after its last profiling window, times the rank's
  training steps per second over the run, and over the device's peak when the window knew one (MFU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from otelprof import semconv as sc
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
class Allocation:
    device: str
    name: str
    bytes: int
    allocations: int
    windows: int


@dataclass(frozen=True)
class MemoryCurve:
    rank: int
    device: str
    start_step: int
    points: tuple[tuple[float, int], ...]
    """(seconds since the window's start, bytes allocated)."""
    peak: int


@dataclass(frozen=True)
class Allocator:
    """A rank's CUDA caching allocator over the run (from its metric snapshots)."""

    rank: int
    gpu: str
    peak: int
    """Most bytes held by tensors at once (torch.cuda.max_memory_allocated)."""
    reserved_max: int
    fragmentation_max: int
    fragmentation_last: int
    snapshots: int


@dataclass(frozen=True)
class Overlap:
    rank: int
    windows: int
    communication: float
    """Seconds collective kernels ran, per profiled step."""
    overlap: float
    """Share of that time compute kernels ran too."""
    exposed: float
    """Seconds per profiled step the GPU only communicated."""


@dataclass(frozen=True)
class DeviceAnalysis:
    regions: tuple[DeviceRegion, ...] = ()
    flops: tuple[ModelFlops, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    curves: tuple[MemoryCurve, ...] = ()
    allocators: tuple[Allocator, ...] = ()
    memory_windows: int = 0
    """Profiling windows that recorded allocations."""
    overlap: tuple[Overlap, ...] = ()
    best_flops: ModelFlops | None = field(init=False)
    """The rank with the highest model FLOPs utilization (None when no rank has one: a CPU, or no known peak)."""
    most_exposed: Overlap | None = field(init=False)
    """The rank with the most exposed communication per profiled step: the one that waits for the others."""

    def __post_init__(self) -> None:
        rated = [x for x in self.flops if x.utilization is not None]
        object.__setattr__(self, "best_flops", max(rated, key=lambda x: x.utilization or 0.0) if rated else None)
        object.__setattr__(self, "most_exposed", max(self.overlap, key=lambda o: o.exposed, default=None))


TOP_ALLOCATIONS = 15


def _memory(view: RunView) -> tuple[tuple[Allocation, ...], tuple[MemoryCurve, ...], int]:
    totals: dict[tuple[str, str], list[int]] = {}
    curves: dict[int, MemoryCurve] = {}
    windows = 0
    for rank in view.ranks:
        for record in rank.profiles():
            memory = (record.get("operators") or {}).get("memory")
            if not memory:
                continue
            windows += 1
            for row in memory["top"]:
                found = totals.setdefault((row["device"], row["name"]), [0, 0, 0])
                found[0] += row["bytes"]
                found[1] += row["allocations"]
                found[2] += 1
            if memory["curve"]:
                device = max(memory["curve"], key=lambda d: memory["peak_bytes"].get(d, 0))
                points = memory["curve"][device]
                t0 = int(record["t"])
                curves[rank.rank] = MemoryCurve(rank.rank, device, int(record["start_step"]),
                                                tuple(((t - t0) / 1e9, v) for t, v in points),
                                                int(memory["peak_bytes"].get(device, 0)))
    rows = [Allocation(device, name, b, n, w) for (device, name), (b, n, w) in totals.items()]
    rows.sort(key=lambda a: (a.name == sc.OTHER_LABEL_VALUE, -a.bytes))  # the windows' "other" rows last
    return tuple(rows[:TOP_ALLOCATIONS]), tuple(curves[r] for r in sorted(curves)), windows


def _allocators(view: RunView) -> tuple[Allocator, ...]:
    names = {sc.CUDA_MEMORY_PEAK.name: 0, sc.CUDA_MEMORY_RESERVED.name: 1, sc.CUDA_MEMORY_FRAGMENTATION.name: 2}
    out = []
    for rank in view.ranks:
        last = rank.last_metric_snapshot()
        if last is None or not _has_cuda(last, names):
            continue
        per_gpu: dict[str, list[int]] = {}  # peak, reserved max, fragmentation max, last, snapshots
        for snapshot in rank.metric_snapshots():
            for name, gpu, value in _points(snapshot, names):
                row = per_gpu.setdefault(gpu, [0, 0, 0, 0, 0])
                index = names[name]
                row[index] = max(row[index], int(value))
                if index == 2:
                    row[3] = int(value)
                    row[4] += 1
        out += [Allocator(rank.rank, gpu, *row) for gpu, row in sorted(per_gpu.items())]
    return tuple(out)


def _has_cuda(snapshot: object, names: dict[str, int]) -> bool:
    return any(True for _ in _points(snapshot, names))


def _points(snapshot: object, names: dict[str, int]) -> list[tuple[str, str, float]]:
    out = []
    for resource_metrics in snapshot.resource_metrics:  # type: ignore[attr-defined]
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name not in names or metric.WhichOneof("data") != "gauge":
                    continue
                for point in metric.gauge.data_points:
                    value = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
                    gpu = next((a.value.string_value for a in point.attributes if a.key == sc.LABEL_GPU), "")
                    out.append((metric.name, gpu, value))
    return out


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
        repeats = c.repeats()  # a region inside one of its own name: its time once (the outer's)
        for i in range(len(c)):
            phase = c.phase_names[c.phase[i]]
            regions = device.get((phase, c.number[i]))
            if not regions:
                continue
            host: dict[str, int] = {}
            for j in range(c.ann_index[i], c.ann_index[i + 1]):
                name = c.ann_names[c.ann_name[j]]
                if name in regions and j not in repeats:
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


def _overlap(view: RunView) -> tuple[Overlap, ...]:
    out = []
    for rank in view.ranks:
        windows = steps = 0
        comm = overlapped = exposed = 0.0
        for record in rank.profiles():
            found = (record.get("operators") or {}).get("overlap")
            if not found:
                continue
            windows += 1
            steps += max(int(record["num_steps"]), 1)
            comm += found["communication_s"]
            overlapped += found["overlapped_s"]
            exposed += found["exposed_s"]
        if windows:
            out.append(Overlap(rank.rank, windows, comm / steps, share(overlapped, comm), exposed / steps))
    return tuple(out)


def device_analysis(view: RunView) -> DeviceAnalysis:
    view.say("device time and model FLOPs")
    allocations, curves, windows = _memory(view)
    return DeviceAnalysis(_device_regions(view), _model_flops(view), allocations, curves, _allocators(view), windows,
                          _overlap(view))
