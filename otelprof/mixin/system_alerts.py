"""The system alerts (group ``otelprof-system``): CPU and I/O bottlenecks, GPU utilization and memory, host
memory, load balance across the job's GPUs."""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.mixin import config as mc
from otelprof.mixin.alert_model import CAUSE, OFFLINE_SYSTEM, RISK, SYMPTOM, Alert, AlertGroup, Runbook
from otelprof.mixin.alert_text import AT_GPU, AT_RANK, L_JOB, L_NODE, NUM, PCT, human, nbytes, params, pct
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.gpu_source import GpuReadings
from otelprof.mixin.promql import GPU, HW_ID, IDENTITY, JOB, NODE, RANK, Q, number
from otelprof.mixin.rules import reuse

NAME = "otelprof-system"


def alerts(c: MixinConfig) -> list[Alert]:
    """The system alerts in runbook order."""
    q = Q(c.selector)
    w = c.window
    warm = q.warmed_up(c.patience)
    ws, patience = seconds(w), seconds(c.patience)
    never_early = f"Never in the first {human(patience)} of a process (patience)."
    gpu_labels = (*IDENTITY, GPU, HW_ID)
    g = GpuReadings(c)
    used = f"and on ({JOB}, {RANK}, {GPU}) max_over_time({g.current(sc.GPU_UTILIZATION)}[{w}]) > 0"

    def bottleneck(short: str, counter: sc.MetricSpec, threshold: float, what: str, original: str,
                   todo: str, high: str, *, panel: int, section: str, knobs: tuple[str, ...]) -> Alert:
        key = "cpu_bottleneck_ratio" if counter is sc.SAMPLER_CPU_BOTTLENECK else "io_bottleneck_ratio"
        ratio = reuse(c, key, f"{q.delta(counter, w)} / {q.delta(sc.SAMPLER_SAMPLES, w)}")
        expr = f"{ratio} > {number(threshold)}\n{warm}"
        return Alert(
            short=short, group=NAME, expr=expr, for_=c.bottleneck_for, severity="warning",
            summary=f"GPUs wait while the CPUs are {what}.",
            description=f"{PCT} of the samples of the last {w} on node {L_NODE} (job {L_JOB}) had {high} while a GPU "
                        f"was below {pct(c.gpu_threshold)} utilization.",
            dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(*IDENTITY, *c.target_labels),
            runbook=Runbook(
                meaning=f"In more than {pct(threshold)} of the node's telemetry samples of the last {w}, {high} "
                        f"while at least one GPU was below {pct(c.gpu_threshold)} utilization: the GPUs are "
                        f"starved by work on the {'CPUs' if short.startswith('CPU') else 'storage'}.",
                thresholds=params(("window", w), ("patience", c.patience),
                                   (f"{short.replace('Bottleneck', '').lower()}_threshold (in process)",
                                    pct(c.cpu_threshold if 'CPU' in short else c.io_threshold)),
                                   ("gpu_threshold (in process)", pct(c.gpu_threshold)),
                                   ("threshold", pct(threshold)), ("for", c.bottleneck_for)),
                limit=f"A bottleneck in more than {pct(threshold)} of the node's samples. One in every sample "
                      f"fires {human(ws * threshold + seconds(c.bottleneck_for))} after it starts (the window's "
                      f"share passes {pct(threshold)} after {human(ws * threshold)}, then `for` "
                      f"{c.bottleneck_for}); one in a share s of the samples after {w} x {threshold:g} / s + "
                      f"{c.bottleneck_for}. {never_early}",
                todo=todo,
                deviations="The original judged the share of bottleneck samples since the job started; this "
                           f"alert judges the last {w} (500 samples at 500 ms), so it resolves once the "
                           "bottleneck is gone instead of latching. The per-sample coincidence is counted "
                           "in the training process (otelprof_sampler_*_total), so the fraction is exact "
                           "whatever the scrape interval; change the sample thresholds with "
                           "OTELPROF_CPU_HIGH_THRESHOLD / OTELPROF_IOWAIT_HIGH_THRESHOLD / "
                           "OTELPROF_GPU_LOW_THRESHOLD in the training job.",
                original=original,
            ),
            panel=panel, section=section, kind=CAUSE, knobs=knobs, offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))

    cpu = bottleneck(
        "CPUBottleneck", sc.SAMPLER_CPU_BOTTLENECK, c.cpu_bottleneck_threshold, "busy",
        "CPUBottleneck",
        "Look at the data-loading and preprocessing path first: raise the DataLoader's num_workers (see "
        "OtelprofTooFewDataLoaderWorkers), prefetch batches (prefetch_factor, pin_memory), move augmentation "
        "to the GPU or do it once offline. The captured profiling window (action `capture`) shows which "
        "operators keep the CPUs busy; the per-core view on the GPU/system dashboard shows whether one core "
        "(a single-threaded loader) or all of them are saturated.",
        f"a CPU above {pct(c.cpu_threshold)} busy",
        panel=ids.SYSTEM_CPU_BOTTLENECK, section="cpu-bottleneck",
        knobs=("window", "patience", "cpu_threshold", "gpu_threshold", "cpu_bottleneck_threshold", "bottleneck_for"))
    io = bottleneck(
        "IOBottleneck", sc.SAMPLER_IO_BOTTLENECK, c.io_bottleneck_threshold, "waiting on I/O",
        "IOBottleneck",
        "The input pipeline waits on storage. Read fewer, larger files (sharded binary formats instead of "
        "many small images), cache the data set on local disk or in memory, prefetch with more workers, and "
        "check the volume's throughput limits (network file systems and cloud disks cap IOPS per volume).",
        f"a CPU above {pct(c.io_threshold)} in iowait",
        panel=ids.SYSTEM_IO_BOTTLENECK, section="io-bottleneck",
        knobs=("window", "patience", "gpu_threshold", "io_threshold", "io_bottleneck_threshold", "bottleneck_for"))

    # the window's quantiles and means as the recording group computed them (the same expressions)
    util_p95 = reuse(c, "gpu_utilization_p95", g.quantile(0.95, sc.GPU_UTILIZATION, w))
    util_p5 = reuse(c, "gpu_utilization_p5", g.quantile(0.05, sc.GPU_UTILIZATION, w))
    low_runbook_dev = (f"The original used numpy quantiles over the last 500 samples; here the quantiles come "
                       f"from the per-sample utilization histogram (buckets every 5 %, linear interpolation "
                       f"inside a bucket, as histogram_quantile does), over the last {w}, so a GPU sitting "
                       f"exactly on a threshold may count as below it. It resolves when utilization recovers "
                       f"instead of latching. As in the original, a GPU that was never busy in the window "
                       f"(an unused device) is not reported.")
    low = Alert(
        short="GPUUnderutilized", group=NAME,
        expr=f"{util_p95} < {number(c.low_gpu_threshold_p95)}\n{used}\n{warm}",
        for_=c.low_gpu_for, severity="warning",
        summary="A GPU is underutilized.",
        description=f"{AT_GPU}: 95th percentile utilization over the last {w} is {PCT}, below "
                    f"{pct(c.low_gpu_threshold_p95)}.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=gpu_labels,
        runbook=Runbook(
            meaning=f"Even the busiest 5 % of this GPU's samples over the last {w} are below "
                    f"{pct(c.low_gpu_threshold_p95)} utilization: the device is mostly idle.",
            thresholds=params(("window", w), ("patience", c.patience),
                               ("threshold_p95", pct(c.low_gpu_threshold_p95)), ("for", c.low_gpu_for)),
            limit=f"A GPU busier than {pct(c.low_gpu_threshold_p95)} in fewer than 5 % of its samples. A GPU that "
                  f"drops from busy to idle fires about {human(0.95 * ws + seconds(c.low_gpu_for))} later (95 % "
                  f"of the {w} window must be idle, then `for` {c.low_gpu_for}). {never_early}",
            todo="Find what the GPU waits for: the bottleneck alerts and OtelprofInputBound point at the input "
                 "pipeline; long collective times on the ranks dashboard point at communication; otherwise "
                 "the model is too small for the device — raise the batch size or use a smaller GPU.",
            deviations=low_runbook_dev, original="LowGPUUtilization"),
        panel=ids.SYSTEM_GPU_QUANTILES, section="gpu", kind=SYMPTOM,
        knobs=("gpu_source", "window", "patience", "low_gpu_threshold_p95", "low_gpu_for"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))
    fluctuating = Alert(
        short="GPUUtilizationFluctuating", group=NAME,
        expr=f"{util_p5} < {number(c.low_gpu_threshold_p5)}\n"
             f"and on ({JOB}, {RANK}, {GPU}) {util_p95} > {number(c.low_gpu_threshold_p95)}\n{warm}",
        for_=c.low_gpu_for, severity="warning",
        summary="A GPU's utilization swings between busy and idle.",
        description=f"{AT_GPU}: 5th percentile utilization over the last {w} is {PCT} while the 95th percentile is "
                    f"above {pct(c.low_gpu_threshold_p95)}.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=gpu_labels,
        runbook=Runbook(
            meaning=f"Over the last {w} the GPU was often busy (95th percentile above "
                    f"{pct(c.low_gpu_threshold_p95)}) and often idle (5th percentile below "
                    f"{pct(c.low_gpu_threshold_p5)}): work arrives in bursts.",
            thresholds=params(("window", w), ("patience", c.patience),
                               ("threshold_p95", pct(c.low_gpu_threshold_p95)),
                               ("threshold_p5", pct(c.low_gpu_threshold_p5)), ("for", c.low_gpu_for)),
            limit=f"A GPU below {pct(c.low_gpu_threshold_p5)} in more than 5 % of its samples and above "
                  f"{pct(c.low_gpu_threshold_p95)} in more than 5 %. Idle gaps appearing in a steadily busy GPU "
                  f"fire about {human(0.05 * ws + seconds(c.low_gpu_for))} after they start (5 % of the {w} "
                  f"window, then `for` {c.low_gpu_for}). {never_early}",
            todo="Typical causes are blocking calls between steps (synchronizing .item()/.cpu() calls, logging, "
                 "checkpointing), a data loader that delivers in bursts, or ranks waiting for each other. "
                 "Compare the timeline of a captured window with the step-time panel; prefetch data and "
                 "remove host synchronizations from the step.",
            deviations=low_runbook_dev, original="LowGPUUtilization"),
        panel=ids.SYSTEM_GPU_QUANTILES, section="gpu", kind=SYMPTOM,
        knobs=("window", "patience", "low_gpu_threshold_p95", "low_gpu_threshold_p5", "low_gpu_for"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))

    mem_p95 = reuse(c, "gpu_memory_utilization_p95", g.quantile(0.95, sc.GPU_MEMORY_UTILIZATION, w))
    cpu_p95 = reuse(c, "node_cpu_utilization_p95", q.window_quantile(0.95, sc.NODE_CPU_UTILIZATION, w))
    batch = Alert(
        short="BatchSizeTooSmall", group=NAME,
        expr=f"{util_p95} < {number(c.batch_size_gpu_threshold_p95)}\n"
             f"and on ({JOB}, {RANK}, {GPU}) {mem_p95} < {number(c.batch_size_gpu_memory_threshold_p95)}\n"
             f"and on ({JOB}, {RANK}) {cpu_p95} < {number(c.batch_size_cpu_threshold_p95)}\n{used}\n{warm}",
        for_=c.batch_size_for, severity="info",
        summary="GPU, GPU memory and CPUs are all lightly used: the batch may be too small.",
        description=f"{AT_GPU}: over the last {w} the 95th percentiles of GPU utilization ({PCT}), GPU memory and the "
                    f"node's mean CPU utilization are all below their thresholds.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=gpu_labels,
        runbook=Runbook(
            meaning="Nothing is busy: GPU utilization, GPU memory and the node's average CPU utilization all "
                    f"stay below their thresholds at the 95th percentile over the last {w}.",
            thresholds=params(("window", w), ("patience", c.patience),
                               ("gpu_threshold_p95", pct(c.batch_size_gpu_threshold_p95)),
                               ("gpu_memory_threshold_p95", pct(c.batch_size_gpu_memory_threshold_p95)),
                               ("cpu_threshold_p95", pct(c.batch_size_cpu_threshold_p95)),
                               ("for", c.batch_size_for)),
            limit=f"GPU utilization, GPU memory and the node's mean CPU utilization each above their threshold "
                  f"({pct(c.batch_size_gpu_threshold_p95)}, {pct(c.batch_size_gpu_memory_threshold_p95)}, "
                  f"{pct(c.batch_size_cpu_threshold_p95)}) in fewer than 5 % of the samples. A job whose load "
                  f"drops fires about {human(0.95 * ws + seconds(c.batch_size_for))} later (95 % of the {w} "
                  f"window, then `for` {c.batch_size_for}). {never_early}",
            todo="Raise the per-device batch size (scale the learning rate accordingly) or run on a smaller, "
                 "cheaper GPU. If the batch size is fixed by the recipe, pack several jobs per GPU (MIG, MPS).",
            deviations=f"Same conjunction as the original over the last {w}, with quantiles from the per-sample "
                       "histograms (5 % buckets). Unused GPUs are skipped, as in LowGPUUtilization. Severity "
                       "info: it is advice on cost, not a fault.",
            original="BatchSize"),
        panel=ids.SYSTEM_BATCH_SIZE, section="batch", kind=SYMPTOM,
        knobs=("gpu_source", "window", "patience", "batch_size_cpu_threshold_p95", "batch_size_gpu_threshold_p95",
               "batch_size_gpu_memory_threshold_p95", "batch_size_for"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))

    m = c.gpu_memory_increase_window
    now_mean = g.mean(sc.GPU_MEMORY_UTILIZATION, m)
    before_mean = g.mean(sc.GPU_MEMORY_UTILIZATION, m, offset=m)
    increase = Alert(
        short="GPUMemoryIncrease", group=NAME,
        expr=f"(\n  {now_mean}\n  -\n  {before_mean}\n) > {number(c.gpu_memory_increase)}\n{warm}",
        for_="0s", severity="warning",
        summary="GPU memory use jumped.",
        description=f"{AT_GPU}: mean memory use over the last {m} is {PCT} of the device above the {m} before.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(*gpu_labels, *c.target_labels),
        runbook=Runbook(
            meaning=f"The GPU's mean memory use over the last {m} is more than {pct(c.gpu_memory_increase)} of "
                    f"the device's memory above its mean over the {m} before: memory is growing.",
            thresholds=params(("window", m), ("patience", c.patience), ("increase", pct(c.gpu_memory_increase))),
            limit=f"A jump of more than {pct(c.gpu_memory_increase)} of the device's memory: a jump of J points "
                  f"fires {m} x {pct(c.gpu_memory_increase)} / J after it (within {m}). Steady growth faster than "
                  f"{pct(c.gpu_memory_increase)} of the device per {m} fires within {human(2 * seconds(m))} of "
                  f"its start (both windows in the growth). No `for`. {never_early}",
            todo="Growth that repeats step after step is a leak: tensors kept alive across steps (accumulating "
                 "losses without .item()/.detach(), lists of outputs, autograd graphs held by metrics). A one-off "
                 "jump at the start of evaluation or at a larger input shape is expected. Check "
                 "OtelprofGPUMemoryNearCapacity and the CUDA allocator's reserved vs allocated memory.",
            deviations="The original compared moving averages of 10 samples (5 s) shifted by one sample, on "
                       f"every sample; 5 s is below common scrape intervals, so this compares the exact mean of "
                       f"the samples of the last {m} with the {m} before (from the per-sample histogram's "
                       "sum and count). Absolute percentage points of device memory, as in the original.",
            original="GPUMemoryIncrease"),
        no_for="the expression already compares two whole windows of per-sample means; the jump it names is the "
               "fault, and a `for` as long as a window would hide a single jump for good.",
        panel=ids.SYSTEM_GPU_MEMORY, section="gpu-memory", kind=RISK,
        knobs=("gpu_source", "patience", "gpu_memory_increase", "gpu_memory_increase_window"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))

    cap_w = c.gpu_memory_capacity_window
    capacity = Alert(
        short="GPUMemoryNearCapacity", group=NAME,
        expr=f"{reuse(c, 'gpu_memory_utilization_mean', g.mean(sc.GPU_MEMORY_UTILIZATION, cap_w))} > "
             f"{number(c.gpu_memory_capacity_threshold)}",
        for_="0s", severity="warning",
        summary="A GPU's memory is nearly full.",
        description=f"{AT_GPU}: mean memory use over the last {cap_w} is {PCT} of the device.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(*gpu_labels, *c.target_labels),
        runbook=Runbook(
            meaning=f"The GPU's memory was on average more than {pct(c.gpu_memory_capacity_threshold)} full "
                    f"over the last {cap_w}. The next larger batch, sequence or evaluation pass may fail "
                    "with an out-of-memory error.",
            thresholds=params(("window", cap_w), ("threshold", pct(c.gpu_memory_capacity_threshold))),
            limit=f"A GPU more than {pct(c.gpu_memory_capacity_threshold)} full on average over {cap_w}. A GPU that "
                  f"fills up from a share L to 100 % fires {cap_w} x ({pct(c.gpu_memory_capacity_threshold)} - L) "
                  f"/ (100 % - L) later, within {cap_w}. No `for`, no patience.",
            todo="If this follows OtelprofGPUMemoryIncrease, look for a leak. Otherwise make room: activation "
                 "checkpointing, mixed precision, a smaller micro-batch with gradient accumulation, or sharded "
                 "optimizer states (ZeRO/FSDP). PyTorch's caching allocator keeps freed memory reserved: "
                 "compare otelprof_cuda_memory_allocated_bytes with _reserved_bytes before blaming the model.",
            deviations="No original: SageMaker Debugger only watched growth, not the ceiling."),
        no_for="one evaluation judges the mean of every sample of the window: a checkpoint or eval spike moves it by "
               "its share of the window only, and a GPU that full is one allocation from an out-of-memory error.",
        panel=ids.SYSTEM_GPU_MEMORY, section="gpu-memory", kind=RISK,
        knobs=("gpu_source", "gpu_memory_capacity_threshold", "gpu_memory_capacity_window"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))

    spread_mean = reuse(c, "gpu_utilization_mean", g.mean(sc.GPU_UTILIZATION, w))
    load = Alert(
        short="GPULoadImbalance", group=NAME,
        expr=f"(\n  max by ({JOB}) ({spread_mean})\n  -\n  min by ({JOB}) ({spread_mean})\n)"
             f" > {number(c.load_balancing_threshold)}\n"
             f"and on ({JOB}) min by ({JOB}) {q.age()} > {int(seconds(c.patience))}",
        for_=c.load_balancing_for, severity="warning",
        summary="The job's GPUs carry unequal load.",
        description=f"Job {L_JOB}: mean utilization of its busiest and idlest GPU over the last {w} differ by {PCT}.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(JOB,),
        runbook=Runbook(
            meaning=f"Over the last {w}, the mean utilization of the job's busiest GPU is more than "
                    f"{pct(c.load_balancing_threshold)} (absolute) above that of its idlest GPU, across all "
                    "nodes of the job.",
            thresholds=params(("window", w), ("patience", c.patience),
                               ("threshold", pct(c.load_balancing_threshold)), ("for", c.load_balancing_for)),
            limit=f"Two GPUs of the job whose mean utilization differs by more than "
                  f"{c.load_balancing_threshold * 100:g} points. A difference of D points that appears at once fires "
                  f"after {w} x {c.load_balancing_threshold * 100:g} / D + {c.load_balancing_for} (D = 50: "
                  f"{human(ws * c.load_balancing_threshold / 0.5 + seconds(c.load_balancing_for))}). Never before "
                  f"every process of the job has run {human(patience)}.",
            todo="With torch.nn.DataParallel the first GPU gathers outputs and gradients: switch to "
                 "DistributedDataParallel. With DDP/FSDP, look for uneven shards of data (variable sequence "
                 "lengths: bucket by length), a rank doing extra work (logging, evaluation, checkpointing on "
                 "rank 0), or GPUs that are visible but unused.",
            deviations="The original meant to compare the utilization histograms of every pair of GPUs on a node "
                       "by Jensen-Shannon distance (threshold 0.5 in the SDK config) but never fired (a loop "
                       "bug) and dropped samples above 98 %. PromQL cannot pair histograms, so this alert "
                       "compares the exact window means of the GPUs' utilization (from the per-sample "
                       "histograms) across the whole job, not per node.",
            original="LoadBalancing"),
        panel=ids.SYSTEM_GPU_BALANCE, section="balance", kind=RISK,
        knobs=("window", "patience", "load_balancing_threshold", "load_balancing_for"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))
    return [cpu, io, low, fluctuating, batch, increase, capacity, *_host_memory(c), load]


def _host_memory(c: MixinConfig) -> list[Alert]:
    q = Q(c.selector)
    hw = c.host_memory_increase_window
    hws, patience = seconds(hw), seconds(c.patience)
    rss = q.sel(sc.PROCESS_MEMORY_USAGE)
    now, before = f"avg_over_time({rss}[{hw}])", f"avg_over_time({rss}[{hw}] offset {hw})"
    ratio, least = c.host_memory_increase, c.host_memory_increase_min_bytes
    warm = int(patience + 2 * hws)
    training = f"(time() - {q.sel(sc.STEP_FIRST_TIMESTAMP)})"
    increase = Alert(
        short="HostMemoryIncrease", group=NAME,
        expr=f"(\n  {now}\n  -\n  {before}\n  > {number(ratio)} * {before}\n)\n> {number(least)}\n"
             f"and on ({JOB}, {RANK}) {training} > {warm}",
        for_=c.host_memory_increase_for, severity="warning",
        summary="A training process's memory keeps growing.",
        description=f"{AT_RANK}: mean resident memory over the last {hw} is {NUM}B above the {hw} before.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(*IDENTITY, *c.target_labels),
        runbook=Runbook(
            meaning=f"The process's mean resident memory (RSS) over the last {hw} exceeds its mean over the {hw} "
                    f"before by more than {pct(ratio)} of that and by more than {nbytes(least)}, and kept doing "
                    f"so for {c.host_memory_increase_for}, while training steps run: host memory is leaking. Left "
                    "alone the process ends in an out-of-memory kill. Judged from patience + two windows after the "
                    "first step, so loading data and models before training, and the first steps' allocations, "
                    "do not count.",
            thresholds=params(("window", hw), ("increase", pct(ratio)), ("min_increase", nbytes(least)),
                               ("for", c.host_memory_increase_for),
                               ("patience", f"{c.patience} + 2 x {hw} after the first step")),
            limit=f"Growth per {hw} of more than {pct(ratio)} of the resident memory and more than "
                  f"{nbytes(least)}: for a process below {nbytes(least / ratio)} a leak faster than "
                  f"{nbytes(least / hws * 60)} per minute, for a larger one faster than {pct(ratio)} per {hw}. "
                  f"A steady leak fires at the latest "
                  f"{human(2 * hws + seconds(c.host_memory_increase_for))} after it starts (both windows in the "
                  f"growth, then `for` {c.host_memory_increase_for}), sooner the faster it grows. Never in the first "
                  f"{human(warm)} after the first step: the growth while a job starts up is no leak.",
            todo="Typical leaks in training code: a list that keeps every step's loss or outputs (append "
                 "loss.item(), not the tensor), metrics objects that accumulate predictions, a cache keyed by "
                 "batch, tensors kept alive by a closure or a logging handler, or torch.compile recompiling "
                 "for ever-new shapes. tracemalloc snapshots a few minutes apart (or memray) show which line "
                 "allocates. Data-loader workers are processes of their own: their growth shows in "
                 "OtelprofHostMemoryNearLimit, not here.",
            deviations="No original: SageMaker Debugger only watched GPU memory. Means of the scraped RSS gauge "
                       "(not per sample): memory moves slowly, and a single spike does not move a mean much."),
        panel=ids.SYSTEM_PROCESS_MEMORY, section="gpu-memory", kind=RISK,
        knobs=("patience", "host_memory_increase_window", "host_memory_increase", "host_memory_increase_min_bytes",
               "host_memory_increase_for"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))

    lw = c.host_memory_limit_window
    working_set, limit = q.sel(sc.CONTAINER_MEMORY_WORKING_SET), q.sel(sc.CONTAINER_MEMORY_LIMIT)
    host = q.sel(sc.SYSTEM_MEMORY_UTILIZATION)
    threshold = c.host_memory_limit_threshold
    near = Alert(
        short="HostMemoryNearLimit", group=NAME,
        expr=f"(\n  avg_over_time({working_set}[{lw}])\n  / max_over_time({limit}[{lw}])\nor\n"
             f"  avg_over_time({host}[{lw}])\n  unless on ({JOB}, {NODE}) {limit}\n) > {number(threshold)}",
        for_="0s", severity="warning",
        summary="A node's memory is nearly exhausted.",
        description=f"Node {L_NODE} (job {L_JOB}): {PCT} of the container's memory limit (or, without a limit, of the "
                    f"host's memory) in use on average over the last {lw}.",
        dashboard=mc.DASHBOARD_GPU_SYSTEM, labels=(*IDENTITY, *c.target_labels),
        runbook=Runbook(
            meaning=f"On average over the last {lw}, the container's working set (memory charged to it less "
                    f"inactive file cache, which the kernel reclaims) is above {pct(threshold)} of its cgroup "
                    f"memory limit; in a container without a limit, the host's used memory is above "
                    f"{pct(threshold)} of its total. The next allocation may end in an out-of-memory kill of the "
                    "training process or one of its data-loader workers.",
            thresholds=params(("window", lw), ("threshold", pct(threshold))),
            limit=f"A working set above {pct(threshold)} of the limit on average over {lw}. A container that "
                  f"fills up from a share L to 100 % fires {lw} x ({pct(threshold)} - L) / (100 % - L) later, "
                  f"within {lw}. No `for`, no patience.",
            todo="If OtelprofHostMemoryIncrease fired before, look for the leak. Otherwise: fewer data-loader "
                 "workers (each holds its own copy of whatever the dataset object references; keep large "
                 "lookups in numpy arrays, not Python lists, to avoid copy-on-access), a smaller "
                 "prefetch_factor, or a larger memory limit for the pod.",
            deviations="No original. Measured like the kubelet's eviction signal (working set, not usage with page "
                       "cache), from the node's sampling process."),
        no_for="one evaluation judges the working set's mean over the window, and past the limit the kernel kills "
               "the process: a `for` would report it after the OOM kill.",
        panel=ids.SYSTEM_CONTAINER_MEMORY, section="gpu-memory", kind=RISK,
        knobs=("host_memory_limit_threshold", "host_memory_limit_window"),
        offline=OFFLINE_SYSTEM, cases=("system_test.yaml",))
    return [increase, near]


GROUP = AlertGroup(NAME, alerts)
