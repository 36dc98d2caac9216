"""Device time and FLOPs: model FLOPs utilization, device against host time, communication/computation
overlap, and memory (profiling windows, CUDA allocator).
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.analysis.report import Report
from otelprof.report import svg
from otelprof.report.blocks import IN_RECORDING, charts, figure, from_prometheus, p, section, table
from otelprof.report.formatting import DASH, finite, pct, secs, size


def _flops(v: float | None) -> str:
    """FLOPs (or FLOP/s) with a metric prefix: "1.23 T"."""
    if not finite(v):
        return DASH
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(v) >= scale:  # type: ignore[arg-type]
            return f"{v / scale:,.2f} {unit}"  # type: ignore[operator]
    return f"{v:,.0f} "


def time_and_flops(r: Report) -> str:
    """Device time and FLOPs: MFU, device against host time, overlap, memory."""
    d = r.device
    out = ["<h3>Model FLOPs utilization</h3>"]
    if from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.MODEL_FLOPS_UTILIZATION.prometheus_name} and "
                     f"{sc.MODEL_FLOPS_ACHIEVED.prometheus_name} on the training report dashboard; the per-rank "
                     f"figures are {IN_RECORDING}."))
    elif not d.flops:
        out.append(p("No data: no profiling window counted the model's FLOPs (windows count the step after them; "
                     "OTELPROF_PROFILE_FLOPS=false or torch.compile turn counting off)."))
    else:
        best = d.best_flops
        if best is not None:
            out.append(p(f"Rank {best.rank} reached {pct(best.utilization)} of the {best.gpu_model}'s dense "
                         f"{best.dtype} peak ({_flops(best.peak)}FLOP/s)."))
        else:
            out.append(p("Achieved FLOP/s without a utilization: the model ran on the CPU, or the GPU model or dtype "
                         "has no peak in the table (set OTELPROF_PEAK_FLOPS)."))
        out.append(table(("Rank", "FLOPs per step", "Steps/s", "Achieved FLOP/s", "Device", "Dtype", "Peak FLOP/s",
                          "MFU"),
                         [(x.rank, _flops(x.per_step), f"{x.steps_per_second:,.2f}", _flops(x.achieved), x.device,
                           x.dtype, _flops(x.peak), pct(x.utilization)) for x in d.flops], 0))
    out.append("<h3>Device time vs host time</h3>")
    if from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.REGION_DEVICE_DURATION.prometheus_name} beside "
                     f"{sc.ANNOTATION_DURATION.prometheus_name} on the training report dashboard."))
    elif not d.regions:
        out.append(p("No data: no CUDA-event device times were recorded (the model ran on the CPU, or outside the "
                     "PyTorch integration)."))
    else:
        out.append(p("Per region, the mean host time of the steps that have a CUDA-event device time, the mean device "
                     "time and the gap (host minus device). A large positive gap: the host spends longer than the GPU "
                     "work it queues (launch overhead, Python, host work in the region): the GPU idles. A negative "
                     "gap: the GPU runs behind the host, which then waits at the next synchronization."))
        out.append(table(("Phase", "Region", "Steps", "Host mean", "Device mean", "Gap", "Gap share of host"),
                         [(x.phase, x.region, f"{x.steps:,}", secs(x.host_mean), secs(x.device_mean),
                           secs(x.gap_mean), pct(x.gap_share)) for x in d.regions], 2))
    out.append(_overlap(r))
    out.append(_window_memory(r))
    return section("device", "Device time and FLOPs", "".join(out))


def _overlap(r: Report) -> str:
    d = r.device
    out = ['<h3 id="overlap">Communication/computation overlap</h3>']
    if from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.COMM_OVERLAP.prometheus_name} and {sc.COMM_EXPOSED.prometheus_name} on "
                     "the training report dashboard."))
    elif d.most_exposed is None:
        out.append(p("No data: no profiling window saw collective (NCCL) kernels on a GPU (a single-GPU or CPU run)."))
    else:
        worst = d.most_exposed
        out.append(p("Per rank, from the GPU kernels of its profiling windows: the time collective kernels (NCCL) ran "
                     "per profiled step, the share of it compute kernels ran beside them on the same GPU (hidden "
                     "communication), and the exposed rest, which the step waits for. A rank whose exposed time "
                     f"stands out waits for the others: rank {worst.rank} has the most "
                     f"({secs(worst.exposed)} per step)."))
        out.append(table(("Rank", "Windows", "Communication per step", "Overlapped", "Exposed per step"),
                         [(o.rank, o.windows, secs(o.communication), pct(o.overlap), secs(o.exposed))
                          for o in d.overlap], 0))
    return "".join(out)


def _window_memory(r: Report) -> str:
    d = r.device
    out = ["<h3>Memory in the profiling windows</h3>"]
    if from_prometheus(r):
        out.append(p(f"From Prometheus: {sc.OPERATOR_ALLOCATED.prometheus_name} and "
                     f"{sc.PROFILE_MEMORY_PEAK.prometheus_name} on the training report dashboard; the curves are "
                     f"{IN_RECORDING}."))
    elif not d.memory_windows:
        out.append(p("No data: no profiling window recorded allocations (OTELPROF_PROFILE_MEMORY=false, or no "
                     "window ran)."))
    else:
        out.append(p(f"The operators that allocated the most in {d.memory_windows} window(s), their own allocations "
                     "(an operator's children count for themselves), all ranks."))
        out.append(table(("Device", "Operator", "Allocated", "Allocations", "Windows"),
                         [(a.device, a.name, size(a.bytes), f"{a.allocations:,}", a.windows) for a in d.allocations],
                         2))
        charts_ = [figure(svg.xy([(f"rank {c.rank} {c.device}", [x for x, _ in c.points], [y for _, y in c.points],
                                   [y for _, y in c.points], [y for _, y in c.points])],
                                 f"Rank {c.rank}: allocated during the window of step {c.start_step}", size,
                                 lambda v: f"{v:.3g} s"),
                          f"Bytes held by tensors on {c.device} over the window (peak {size(c.peak)}).")
                   for c in d.curves[:4]]
        out.append(charts(*charts_))
    out.append("<h3>CUDA allocator over the run</h3>")
    if not d.allocators:
        out.append(p("No data: no CUDA allocator figures were recorded (the model ran on the CPU)."))
    else:
        out.append(p("Per rank and GPU: the most memory tensors held at once, the most the caching allocator "
                     "reserved, and fragmentation (reserved minus allocated: cached and split blocks no tensor uses). "
                     "Fragmentation close to the GPU's free memory makes an out-of-memory error possible with memory "
                     "to spare; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces it."))
        out.append(table(("Rank", "GPU", "Peak allocated", "Max reserved", "Max fragmentation", "Last fragmentation"),
                         [(a.rank, a.gpu, size(a.peak), size(a.reserved_max), size(a.fragmentation_max),
                           size(a.fragmentation_last)) for a in d.allocators], 2))
    return "".join(out)
