"""The "GPU & system" dashboard: what the node's sampler sees, and the evidence of the system alerts.

Host, container and GPU series come from one process per node (OTELPROF_NODE_SAMPLER_LOCAL_RANK),
so these panels filter by job, node and GPU, not by rank; process panels filter by rank too.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards import queries as pq
from otelprof.dashboards.common import dashboard
from otelprof.dashboards.model import Dashboard, Prom, Row
from otelprof.dashboards.panels import (
    GREEN,
    RED,
    YELLOW,
    bargauge,
    heatmap,
    state_timeline,
    timeseries,
    value_map,
)
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.promql import GPU, JOB, NODE, RANK

GPU_NEEDS = frozenset({"gpu"})
LIMIT = frozenset({"cgroup_limit"})
DIRECTION_DISK = sc.prometheus_label(sc.LABEL_DISK_DIRECTION)
DIRECTION_NET = sc.prometheus_label(sc.LABEL_NETWORK_DIRECTION)
REASON = sc.prometheus_label(sc.LABEL_REASON)
SOURCE = sc.prometheus_label(sc.LABEL_SOURCE)
ERROR_TYPE = sc.prometheus_label(sc.LABEL_ERROR_TYPE)
GPU_LEGEND = "{{node}} GPU {{gpu}}"


def _cpu(qs: pq.Queries) -> Row:
    return Row(100, "CPU", [
        timeseries(101, "CPU busy per core", "Per logical CPU: share of each sample interval not idle and not in "
                   "iowait. One core pinned at 100 % while the others idle is a single-threaded input pipeline.",
                   [Prom(pq.cpu_busy(qs.node), "{{node}} cpu {{cpu_logical_number}}")], "percentunit", min=0, max=1),
        heatmap(102, "Node CPU distribution", "Telemetry samples per bucket of the node's mean CPU busy share, per "
                "interval (every sample, whatever the scrape interval).",
                pq.heatmap(qs.node, sc.NODE_CPU_UTILIZATION), "percentunit"),
        timeseries(103, "Container CPU", "CPUs used by the container (cgroup CPU time per second), the CPUs it "
                   "may use (quota, else affinity mask) and its quota when one is set.",
                   [Prom(f"sum by ({JOB}, {NODE}) ({pq.rate(qs.node, sc.CONTAINER_CPU_TIME)})", "{{node}} used"),
                    Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.CPU_AVAILABLE)})", "{{node}} available"),
                    Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.CONTAINER_CPU_LIMIT)})", "{{node}} quota",
                         needs=LIMIT)], "short", min=0, w=8),
        timeseries(104, "CPU throttling", "Share of CFS periods in which the container hit its CPU quota: "
                   "throttled training processes are slow ranks.",
                   [Prom(f"sum by ({JOB}, {NODE}) ({pq.rate(qs.node, sc.CONTAINER_CPU_THROTTLED_PERIODS)}) / "
                         f"(sum by ({JOB}, {NODE}) ({pq.rate(qs.node, sc.CONTAINER_CPU_PERIODS)}) > 0)", "{{node}}",
                         needs=LIMIT)], "percentunit", min=0, max=1, w=8),
        timeseries(105, "Process CPU", "CPU used by each training process over the last sample interval, as a "
                   "share of the CPUs the container may use.",
                   [Prom(qs.proc.sel(sc.PROCESS_CPU_UTILIZATION), "rank {{rank}}")], "percentunit", min=0, w=8),
    ])


def _memory_io(qs: pq.Queries) -> Row:
    c = qs.config
    return Row(200, "Memory, disk and network", [
        timeseries(201, "Host memory", "Host memory in use and in total.",
                   [Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.SYSTEM_MEMORY_USAGE)})", "{{node}} used"),
                    Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.SYSTEM_MEMORY_LIMIT)})", "{{node}} total")],
                   "bytes", min=0, w=8),
        timeseries(ids.SYSTEM_CONTAINER_MEMORY, "Container memory", "Memory charged to the container, its working "
                   "set (less inactive file cache) and its limit (an OOM kill comes at the limit; the near-limit "
                   f"alert fires above {pq.percent(c.host_memory_limit_threshold)} of it).",
                   [Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.CONTAINER_MEMORY_USAGE)})", "{{node}} used"),
                    Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.CONTAINER_MEMORY_WORKING_SET)})",
                         "{{node}} working set"),
                    Prom(f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.CONTAINER_MEMORY_LIMIT)})", "{{node}} limit",
                         needs=LIMIT)], "bytes", min=0, w=8),
        timeseries(ids.SYSTEM_PROCESS_MEMORY, "Process memory", "Resident memory of each training process (the "
                   f"memory-increase alert compares {c.host_memory_increase_window} means).",
                   [Prom(qs.proc.sel(sc.PROCESS_MEMORY_USAGE), "rank {{rank}}")], "bytes", min=0, w=8),
        timeseries(204, "Disk throughput", "Bytes read and written per second on all disks.",
                   [Prom(f"sum by ({JOB}, {NODE}, {DIRECTION_DISK}) ({pq.rate(qs.node, sc.SYSTEM_DISK_IO)})",
                         "{{node}} {{disk_io_direction}}")], "Bps", min=0, w=8),
        timeseries(205, "Disk operations", "Disk reads and writes per second.",
                   [Prom(f"sum by ({JOB}, {NODE}, {DIRECTION_DISK}) ({pq.rate(qs.node, sc.SYSTEM_DISK_OPERATIONS)})",
                         "{{node}} {{disk_io_direction}}")], "iops", min=0, w=8),
        timeseries(206, "Network throughput", "Bytes received and transmitted per second on all interfaces but "
                   "loopback (gradient all-reduce traffic between nodes shows here).",
                   [Prom(f"sum by ({JOB}, {NODE}, {DIRECTION_NET}) ({pq.rate(qs.node, sc.SYSTEM_NETWORK_IO)})",
                         "{{node}} {{network_io_direction}}")], "Bps", min=0, w=8),
    ])


def _coincidences(qs: pq.Queries) -> Row:
    c = qs.config
    return Row(300, "Bottleneck samples and sampler", [
        timeseries(ids.SYSTEM_CPU_BOTTLENECK, "CPU bottleneck samples", "Share of the node's telemetry samples of "
                   f"the last {c.window} with some CPU above {pq.percent(c.cpu_threshold)} busy while some GPU was "
                   f"below {pq.percent(c.gpu_threshold)} (the CPU-bottleneck alert's value, threshold "
                   f"{pq.percent(c.cpu_bottleneck_threshold)}), and its two halves.",
                   [Prom(qs.rule("cpu_bottleneck_ratio", qs.node), "{{node}} bottleneck"),
                    Prom(qs.rule("high_cpu_ratio", qs.node), "{{node}} busy CPU"),
                    Prom(qs.rule("low_gpu_ratio", qs.node), "{{node}} idle GPU")],
                   "percentunit", min=0, max=1, line_at=c.cpu_bottleneck_threshold),
        timeseries(ids.SYSTEM_IO_BOTTLENECK, "I/O bottleneck samples", "Share of the node's telemetry samples of "
                   f"the last {c.window} with some CPU above {pq.percent(c.io_threshold)} in iowait while some GPU "
                   f"was below {pq.percent(c.gpu_threshold)} (the I/O-bottleneck alert's value, threshold "
                   f"{pq.percent(c.io_bottleneck_threshold)}).",
                   [Prom(qs.rule("io_bottleneck_ratio", qs.node), "{{node}} bottleneck")],
                   "percentunit", min=0, max=1, line_at=c.io_bottleneck_threshold),
        timeseries(303, "I/O wait per core", "Per logical CPU: share of each sample interval waiting for I/O.",
                   [Prom(pq.iowait(qs.node), "{{node}} cpu {{cpu_logical_number}}")], "percentunit", min=0, max=1,
                   w=8),
        timeseries(304, "Sampler errors", "Failed telemetry reads per second by source and reason (a missing GPU "
                   "library shows once as nvml/library_not_found); the series behind them are absent, never zero.",
                   [Prom(f"sum by ({NODE}, {SOURCE}, {REASON}) ({pq.rate(qs.node, sc.SAMPLER_ERRORS)})",
                         "{{node}} {{source}} {{reason}}", needs=frozenset({"sampler_errors"}))],
                   "short", min=0, w=8),
        timeseries(ids.SYSTEM_SAMPLER, "Sampler", "Telemetry samples per second per node (zero or absent: the "
                   "node's sampler stopped, see the system-telemetry alert), skipped ticks, and the sampler's CPU "
                   "share.",
                   [Prom(f"sum by ({NODE}) ({pq.rate(qs.node, sc.SAMPLER_SAMPLES)})", "{{node}} samples/s"),
                    Prom(f"sum by ({NODE}) ({pq.rate(qs.node, sc.SAMPLER_OVERRUNS)})", "{{node}} overruns/s",
                         needs=frozenset({"overruns"})),
                    Prom(f"sum by ({NODE}) ({pq.rate(qs.node, sc.SAMPLER_TIME)})", "{{node}} CPU share")],
                   "short", min=0, w=8),
    ])


def _gpu(qs: pq.Queries) -> Row:
    c = qs.config
    cuda = frozenset({"cuda"})
    gpm = frozenset({"gpm"})
    return Row(400, "GPU", [
        timeseries(ids.SYSTEM_GPU_UTILIZATION, "GPU utilization", "Share of each sample period a kernel ran, per "
                   "GPU (NVML). A GPU that stops reporting while the sampler runs fires the GPU-telemetry alert.",
                   [Prom(qs.gpu.sel(sc.GPU_UTILIZATION), GPU_LEGEND, needs=GPU_NEEDS)], "percentunit", min=0, max=1),
        timeseries(ids.SYSTEM_GPU_QUANTILES, "GPU utilization p5 and p95, last " + c.window, "Per GPU, the 5th and "
                   f"95th percentile of the samples of the last {c.window} (recording rules): p95 below "
                   f"{pq.percent(c.low_gpu_threshold_p95)} is an underused GPU; p5 below "
                   f"{pq.percent(c.low_gpu_threshold_p5)} with p95 above it a fluctuating one.",
                   [Prom(qs.rule("gpu_utilization_p95", qs.gpu), GPU_LEGEND + " p95", needs=GPU_NEEDS),
                    Prom(qs.rule("gpu_utilization_p5", qs.gpu), GPU_LEGEND + " p5", needs=GPU_NEEDS)],
                   "percentunit", min=0, max=1, line_at=c.low_gpu_threshold_p95),
        heatmap(403, "GPU utilization distribution", "Telemetry samples per utilization bucket and interval, all "
                "selected GPUs.", pq.heatmap(qs.gpu, sc.GPU_UTILIZATION_DISTRIBUTION), "percentunit", w=8,
                needs=GPU_NEEDS),
        bargauge(ids.SYSTEM_GPU_BALANCE, "GPU load balance, last " + c.window, "Exact mean utilization of each GPU "
                 f"over the last {c.window} (recording rule). The load-imbalance alert fires when the job's busiest "
                 f"and idlest GPU differ by more than {pq.percent(c.load_balancing_threshold)} points.",
                 [Prom(qs.rule("gpu_utilization_mean", qs.gpu), GPU_LEGEND, instant=True, needs=GPU_NEEDS)],
                 "percentunit", max=1, w=8),
        timeseries(ids.SYSTEM_BATCH_SIZE, "Batch size inputs: p95, last " + c.window, "The batch-size alert's three "
                   f"inputs over the last {c.window}: 95th percentile of GPU utilization, GPU memory and the node's "
                   f"mean CPU; {pq.all_below(pq.batch_size_thresholds(c))} means nothing is busy.",
                   [Prom(qs.rule("gpu_utilization_p95", qs.gpu), GPU_LEGEND + " utilization", needs=GPU_NEEDS),
                    Prom(qs.rule("gpu_memory_utilization_p95", qs.gpu), GPU_LEGEND + " memory", needs=GPU_NEEDS),
                    Prom(qs.rule("node_cpu_utilization_p95", qs.node), "{{node}} CPU")],
                   "percentunit", min=0, max=1, line_at=c.batch_size_gpu_threshold_p95, w=8),
        timeseries(ids.SYSTEM_GPU_MEMORY, "GPU memory in use", "Share of each GPU's memory in use and its mean over "
                   f"the last {c.window}; the memory-increase alert compares {c.gpu_memory_increase_window} means, "
                   f"the near-capacity alert fires above {pq.percent(c.gpu_memory_capacity_threshold)}.",
                   [Prom(qs.gpu.sel(sc.GPU_MEMORY_UTILIZATION), GPU_LEGEND, needs=GPU_NEEDS),
                    Prom(qs.rule("gpu_memory_utilization_mean", qs.gpu), GPU_LEGEND + " mean " + c.window,
                         needs=GPU_NEEDS)],
                   "percentunit", min=0, max=1, line_at=c.gpu_memory_capacity_threshold, w=8),
        timeseries(407, "GPU memory used", "GPU memory in use and in total (bytes), and this job's processes' share "
                   "of it.",
                   [Prom(qs.gpu.sel(sc.GPU_MEMORY_USAGE), GPU_LEGEND + " used", needs=GPU_NEEDS),
                    Prom(qs.gpu.sel(sc.GPU_MEMORY_LIMIT), GPU_LEGEND + " total", needs=GPU_NEEDS),
                    Prom(f"sum by ({NODE}, {GPU}) ({qs.proc.sel(sc.PROCESS_GPU_MEMORY)})", GPU_LEGEND + " processes",
                         needs=GPU_NEEDS)], "bytes", min=0, w=8),
        timeseries(408, "PyTorch allocator", "Per rank and device: allocated, reserved and peak memory of "
                   "PyTorch's caching allocator.",
                   [Prom(qs.proc.sel(sc.CUDA_MEMORY_ALLOCATED), "rank {{rank}} allocated", needs=cuda),
                    Prom(qs.proc.sel(sc.CUDA_MEMORY_RESERVED), "rank {{rank}} reserved", needs=cuda),
                    Prom(qs.proc.sel(sc.CUDA_MEMORY_PEAK), "rank {{rank}} peak", needs=cuda)], "bytes", min=0, w=8),
        timeseries(409, "Power", "Power draw and the enforced power limit per GPU.",
                   [Prom(qs.gpu.sel(sc.GPU_POWER), GPU_LEGEND, needs=GPU_NEEDS),
                    Prom(qs.gpu.sel(sc.GPU_POWER_LIMIT), GPU_LEGEND + " limit", needs=GPU_NEEDS)], "watt", min=0, w=8),
        timeseries(410, "Temperature", "GPU core temperature.",
                   [Prom(qs.gpu.sel(sc.GPU_TEMPERATURE), GPU_LEGEND, needs=GPU_NEEDS)], "celsius", w=8),
        timeseries(411, "SM clock", "Streaming-multiprocessor clock per GPU: a drop under load is throttling.",
                   [Prom(qs.gpu.sel(sc.GPU_SM_CLOCK), GPU_LEGEND, needs=GPU_NEEDS)], "hertz", min=0, w=8),
        state_timeline(412, "Clock throttle reasons", "When each GPU's clocks were held down, by reason (power "
                       "cap, thermal, ...).",
                       [Prom(f"max by ({NODE}, {GPU}, {REASON}) ({qs.gpu.sel(sc.GPU_THROTTLE)})",
                             GPU_LEGEND + " {{reason}}", needs=GPU_NEEDS)], "none",
                       steps=((None, "transparent"),),
                       mappings=[value_map({"0": ("no", "transparent"), "1": ("throttled", RED)})], w=12, h=8),
        timeseries(413, "PCIe throughput", "Bytes per second over PCIe per GPU and direction.",
                   [Prom(qs.gpu.sel(sc.GPU_PCIE_THROUGHPUT), GPU_LEGEND + " {{network_io_direction}}",
                         needs=GPU_NEEDS)],
                   "Bps", min=0, w=12),
        timeseries(414, "SM activity (GPM)", "Share of SMs busy, warp occupancy and tensor-core activity (NVML "
                   "GPM, Hopper and newer): utilization says a kernel ran, these say how much of the GPU it used.",
                   [Prom(qs.gpu.sel(sc.GPU_SM_ACTIVE), GPU_LEGEND + " SM active", needs=gpm),
                    Prom(qs.gpu.sel(sc.GPU_SM_OCCUPANCY), GPU_LEGEND + " occupancy", needs=gpm),
                    Prom(qs.gpu.sel(sc.GPU_TENSOR_ACTIVE), GPU_LEGEND + " tensor", needs=gpm)],
                   "percentunit", min=0, max=1, w=8),
        timeseries(415, "Memory copy utilization", "Share of time each GPU's memory was read or written.",
                   [Prom(qs.gpu.sel(sc.GPU_MEMORY_COPY_UTILIZATION), GPU_LEGEND, needs=GPU_NEEDS)], "percentunit",
                   min=0, max=1, w=8),
        timeseries(416, "ECC errors", "Corrected and uncorrected GPU memory errors per interval.",
                   [Prom(f"sum by ({NODE}, {GPU}, {ERROR_TYPE}) ({pq.increase(qs.gpu, sc.GPU_ERRORS)})",
                         GPU_LEGEND + " {{error_type}}", needs=GPU_NEEDS)], "short", bars=True, w=8),
    ])


def _data_loader(qs: pq.Queries) -> Row:
    c = qs.config
    workers = f"sum by ({JOB}, {NODE}) ({qs.proc.sel(sc.DATALOADER_WORKERS)})"
    cpus = f"max by ({JOB}, {NODE}) ({qs.node.sel(sc.CPU_AVAILABLE)})"
    return Row(500, "Data loader", [
        timeseries(ids.SYSTEM_DATALOADER_WORKERS, "Data-loader workers vs CPUs", "Per node: worker processes of "
                   "the ranks' instrumented DataLoaders, the CPUs the container may use, and the alerts' band "
                   f"({c.dataloader_min_threshold:g}x to {c.dataloader_max_threshold:g}x the CPUs).",
                   [Prom(workers, "{{node}} workers", needs=frozenset({"torch_dataloader"})),
                    Prom(cpus, "{{node}} CPUs available"),
                    Prom(f"{c.dataloader_min_threshold:g} * {cpus}", "{{node}} fewest advised"),
                    Prom(f"{c.dataloader_max_threshold:g} * {cpus}", "{{node}} most advised")],
                   "short", min=0, w=12),
        state_timeline(502, "pin_memory per rank", "1 when the rank's instrumented DataLoader pins host memory.",
                       [Prom(f"max by ({RANK}) ({qs.proc.sel(sc.DATALOADER_PIN_MEMORY)})", "rank {{rank}}",
                             needs=frozenset({"torch_dataloader"}))], "none",
                       steps=((None, YELLOW), (1, GREEN)),
                       mappings=[value_map({"0": ("not pinned", YELLOW), "1": ("pinned", GREEN)})], w=12, h=8),
    ])


def gpu_system(config: MixinConfig) -> Dashboard:
    qs = pq.Queries(config)
    return dashboard(qs, ids.GPU_SYSTEM, "otelprof / GPU & system",
                     "What each node's telemetry sampler sees — CPUs, container limits, memory, disk, network, "
                     "GPUs — and the evidence behind the CPU, I/O, GPU and data-loader alerts.",
                     [_cpu(qs), _memory_io(qs), _coincidences(qs), _gpu(qs), _data_loader(qs)], refresh="30s")
