"""The alert rules as Python data: expression, ``for``, severity, texts and runbook entry.

:func:`alerts` builds them from a :class:`MixinConfig`; :func:`alert_groups` turns them
into Prometheus rule groups. Every alert carries ``severity``, an ``action`` label when the
config gives it one, and ``summary`` / ``description`` / ``runbook_url`` / ``dashboard_url``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from otelprof import semconv as sc
from otelprof.mixin import config as mc
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.promql import (
    GPU,
    HW_ID,
    IDENTITY,
    JOB,
    NODE,
    PHASE,
    RANK,
    Q,
    by,
    number,
)

PCT = "{{ $value | humanizePercentage }}"
DUR = "{{ $value | humanizeDuration }}"
NUM = "{{ $value | humanize }}"
VAL = '{{ printf "%.4g" $value }}'
L_JOB = "{{ $labels.job_name }}"
L_RANK = "{{ $labels.rank }}"
L_NODE = "{{ $labels.node }}"
L_GPU = "{{ $labels.gpu }}"
L_PHASE = "{{ $labels.phase }}"
AT_RANK = f"job {L_JOB} rank {L_RANK} on node {L_NODE}"
AT_GPU = f"GPU {L_GPU} on node {L_NODE} (job {L_JOB})"

GROUP_SYSTEM = "otelprof-system"
GROUP_STEPS = "otelprof-steps"
GROUP_TRAINING = "otelprof-training"
GROUP_TELEMETRY = "otelprof-telemetry"
GROUPS = (GROUP_SYSTEM, GROUP_STEPS, GROUP_TRAINING, GROUP_TELEMETRY)


@dataclass(frozen=True)
class Runbook:
    meaning: str
    thresholds: tuple[tuple[str, str], ...]
    todo: str
    deviations: str
    original: str = ""
    """SageMaker Debugger rule it stands for ("" when otelprof adds it)."""


@dataclass(frozen=True)
class Alert:
    short: str
    """Name without the prefix; the config's ``actions`` and ``disabled_alerts`` use it."""
    group: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    dashboard: str
    labels: tuple[str, ...]
    """Labels the alert carries (from its expression), besides alertname/severity/action."""
    runbook: Runbook
    action: str | None = None

    @property
    def name(self) -> str:
        return mc.ALERT_PREFIX + self.short

    @property
    def anchor(self) -> str:
        return self.name.lower()

    def runbook_url(self, config: MixinConfig) -> str:
        return f"{config.runbook_url}#{self.anchor}"

    def dashboard_url(self, config: MixinConfig) -> str:
        """The dashboard (and its panel for this alert) with the alert's job/rank/node/GPU selected."""
        from otelprof.dashboards import ids as dashboard_ids

        variables = {dashboard_ids.VAR_JOB: L_JOB}
        for label, var, template in ((RANK, dashboard_ids.VAR_RANK, L_RANK), (NODE, dashboard_ids.VAR_NODE, L_NODE),
                                     (GPU, dashboard_ids.VAR_GPU, L_GPU)):
            if label in self.labels:
                variables[var] = template
        panel = dashboard_ids.alert_panel(self.short)
        return dashboard_ids.dashboard_url(config.grafana_url, self.dashboard, variables, panel[1] if panel else None)

    def rule(self, config: MixinConfig) -> dict[str, Any]:
        """The Prometheus alerting rule."""
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if seconds(self.for_) > 0:
            rule["for"] = self.for_
        labels = {"severity": self.severity}
        if self.action:
            labels["action"] = self.action
        rule["labels"] = labels
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": self.runbook_url(config),
            "dashboard_url": self.dashboard_url(config),
        }
        return rule


def _params(*pairs: tuple[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple((name, str(value)) for name, value in pairs)


def _pct(value: float) -> str:
    return f"{value * 100:g} %"


def alerts(config: MixinConfig) -> list[Alert]:
    """Every alert of the mixin, in runbook order (disabled ones left out)."""
    built = [*_system(config), *_steps(config), *_training(config), *_telemetry(config)]
    result = []
    for alert in built:
        if alert.short in config.disabled_alerts:
            continue
        action = config.action_for(alert.short)
        result.append(dataclasses.replace(alert, action=action))
    return result


def alert_groups(config: MixinConfig) -> list[dict[str, Any]]:
    """Rule groups for the alerts file (one group per topic)."""
    groups = []
    all_alerts = alerts(config)
    for group in GROUPS:
        rules = [a.rule(config) for a in all_alerts if a.group == group]
        if rules:
            groups.append({"name": group, "rules": rules})
    return groups


# ---------------------------------------------------------------------------------------------- system

def _system(c: MixinConfig) -> list[Alert]:
    q = Q(c.selector)
    w = c.window
    warm = q.warmed_up(c.patience)
    gpu_labels = (*IDENTITY, GPU, HW_ID)
    used = f"and on ({JOB}, {RANK}, {GPU}) max_over_time({q.sel(sc.GPU_UTILIZATION)}[{w}]) > 0"

    def bottleneck(short: str, counter: sc.MetricSpec, threshold: float, what: str, original: str,
                   todo: str, high: str) -> Alert:
        expr = (f"(\n  {q.delta(counter, w)}\n  /\n  {q.delta(sc.SAMPLER_SAMPLES, w)}\n)"
                f" > {number(threshold)}\n{warm}")
        return Alert(
            short, GROUP_SYSTEM, expr, c.bottleneck_for, "warning",
            f"GPUs wait while the CPUs are {what}.",
            f"{PCT} of the samples of the last {w} on node {L_NODE} (job {L_JOB}) had {high} while a GPU "
            f"was below {_pct(c.gpu_threshold)} utilization.",
            mc.DASHBOARD_GPU_SYSTEM, (*IDENTITY, *c.target_labels),
            Runbook(
                meaning=f"In more than {_pct(threshold)} of the node's telemetry samples of the last {w}, {high} "
                        f"while at least one GPU was below {_pct(c.gpu_threshold)} utilization: the GPUs are "
                        f"starved by work on the {'CPUs' if short.startswith('CPU') else 'storage'}.",
                thresholds=_params(("window", w), ("patience", c.patience),
                                   (f"{short.replace('Bottleneck', '').lower()}_threshold (in process)",
                                    _pct(c.cpu_threshold if 'CPU' in short else c.io_threshold)),
                                   ("gpu_threshold (in process)", _pct(c.gpu_threshold)),
                                   ("threshold", _pct(threshold)), ("for", c.bottleneck_for)),
                todo=todo,
                deviations="The original judged the share of bottleneck samples since the job started; this "
                           f"alert judges the last {w} (500 samples at 500 ms), so it resolves once the "
                           "bottleneck is gone instead of latching. The per-sample coincidence is counted "
                           "in the training process (otelprof_sampler_*_total), so the fraction is exact "
                           "whatever the scrape interval; change the sample thresholds with "
                           "OTELPROF_CPU_HIGH_THRESHOLD / OTELPROF_IOWAIT_HIGH_THRESHOLD / "
                           "OTELPROF_GPU_LOW_THRESHOLD in the training job.",
                original=original,
            ))

    cpu = bottleneck(
        "CPUBottleneck", sc.SAMPLER_CPU_BOTTLENECK, c.cpu_bottleneck_threshold, "busy",
        "CPUBottleneck",
        "Look at the data-loading and preprocessing path first: raise the DataLoader's num_workers (see "
        "OtelprofTooFewDataLoaderWorkers), prefetch batches (prefetch_factor, pin_memory), move augmentation "
        "to the GPU or do it once offline. The captured profiling window (action `capture`) shows which "
        "operators keep the CPUs busy; the per-core view on the GPU/system dashboard shows whether one core "
        "(a single-threaded loader) or all of them are saturated.",
        f"a CPU above {_pct(c.cpu_threshold)} busy")
    io = bottleneck(
        "IOBottleneck", sc.SAMPLER_IO_BOTTLENECK, c.io_bottleneck_threshold, "waiting on I/O",
        "IOBottleneck",
        "The input pipeline waits on storage. Read fewer, larger files (sharded binary formats instead of "
        "many small images), cache the data set on local disk or in memory, prefetch with more workers, and "
        "check the volume's throughput limits (network file systems and cloud disks cap IOPS per volume).",
        f"a CPU above {_pct(c.io_threshold)} in iowait")

    util_p95 = q.window_quantile(0.95, sc.GPU_UTILIZATION_DISTRIBUTION, w)
    util_p5 = q.window_quantile(0.05, sc.GPU_UTILIZATION_DISTRIBUTION, w)
    low_runbook_dev = (f"The original used numpy quantiles over the last 500 samples; here the quantiles come "
                       f"from the per-sample utilization histogram (buckets every 5 %, linear interpolation "
                       f"inside a bucket, as histogram_quantile does), over the last {w}, so a GPU sitting "
                       f"exactly on a threshold may count as below it. It resolves when utilization recovers "
                       f"instead of latching. As in the original, a GPU that was never busy in the window "
                       f"(an unused device) is not reported.")
    low = Alert(
        "GPUUnderutilized", GROUP_SYSTEM,
        f"{util_p95} < {number(c.low_gpu_threshold_p95)}\n{used}\n{warm}",
        c.low_gpu_for, "warning",
        "A GPU is underutilized.",
        f"{AT_GPU}: 95th percentile utilization over the last {w} is {PCT}, below "
        f"{_pct(c.low_gpu_threshold_p95)}.",
        mc.DASHBOARD_GPU_SYSTEM, gpu_labels,
        Runbook(
            meaning=f"Even the busiest 5 % of this GPU's samples over the last {w} are below "
                    f"{_pct(c.low_gpu_threshold_p95)} utilization: the device is mostly idle.",
            thresholds=_params(("window", w), ("patience", c.patience),
                               ("threshold_p95", _pct(c.low_gpu_threshold_p95)), ("for", c.low_gpu_for)),
            todo="Find what the GPU waits for: the bottleneck alerts and OtelprofInputBound point at the input "
                 "pipeline; long collective times on the ranks dashboard point at communication; otherwise "
                 "the model is too small for the device — raise the batch size or use a smaller GPU.",
            deviations=low_runbook_dev, original="LowGPUUtilization"))
    fluctuating = Alert(
        "GPUUtilizationFluctuating", GROUP_SYSTEM,
        f"{util_p5} < {number(c.low_gpu_threshold_p5)}\n"
        f"and on ({JOB}, {RANK}, {GPU}) {util_p95} > {number(c.low_gpu_threshold_p95)}\n{warm}",
        c.low_gpu_for, "warning",
        "A GPU's utilization swings between busy and idle.",
        f"{AT_GPU}: 5th percentile utilization over the last {w} is {PCT} while the 95th percentile is above "
        f"{_pct(c.low_gpu_threshold_p95)}.",
        mc.DASHBOARD_GPU_SYSTEM, gpu_labels,
        Runbook(
            meaning=f"Over the last {w} the GPU was often busy (95th percentile above "
                    f"{_pct(c.low_gpu_threshold_p95)}) and often idle (5th percentile below "
                    f"{_pct(c.low_gpu_threshold_p5)}): work arrives in bursts.",
            thresholds=_params(("window", w), ("patience", c.patience),
                               ("threshold_p95", _pct(c.low_gpu_threshold_p95)),
                               ("threshold_p5", _pct(c.low_gpu_threshold_p5)), ("for", c.low_gpu_for)),
            todo="Typical causes are blocking calls between steps (synchronizing .item()/.cpu() calls, logging, "
                 "checkpointing), a data loader that delivers in bursts, or ranks waiting for each other. "
                 "Compare the timeline of a captured window with the step-time panel; prefetch data and "
                 "remove host synchronizations from the step.",
            deviations=low_runbook_dev, original="LowGPUUtilization"))

    mem_p95 = q.window_quantile(0.95, sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, w)
    cpu_p95 = q.window_quantile(0.95, sc.NODE_CPU_UTILIZATION, w)
    batch = Alert(
        "BatchSizeTooSmall", GROUP_SYSTEM,
        f"{util_p95} < {number(c.batch_size_gpu_threshold_p95)}\n"
        f"and on ({JOB}, {RANK}, {GPU}) {mem_p95} < {number(c.batch_size_gpu_memory_threshold_p95)}\n"
        f"and on ({JOB}, {RANK}) {cpu_p95} < {number(c.batch_size_cpu_threshold_p95)}\n{used}\n{warm}",
        c.batch_size_for, "info",
        "GPU, GPU memory and CPUs are all lightly used: the batch may be too small.",
        f"{AT_GPU}: over the last {w} the 95th percentiles of GPU utilization ({PCT}), GPU memory and the "
        f"node's mean CPU utilization are all below their thresholds.",
        mc.DASHBOARD_GPU_SYSTEM, gpu_labels,
        Runbook(
            meaning="Nothing is busy: GPU utilization, GPU memory and the node's average CPU utilization all "
                    f"stay below their thresholds at the 95th percentile over the last {w}.",
            thresholds=_params(("window", w), ("patience", c.patience),
                               ("gpu_threshold_p95", _pct(c.batch_size_gpu_threshold_p95)),
                               ("gpu_memory_threshold_p95", _pct(c.batch_size_gpu_memory_threshold_p95)),
                               ("cpu_threshold_p95", _pct(c.batch_size_cpu_threshold_p95)),
                               ("for", c.batch_size_for)),
            todo="Raise the per-device batch size (scale the learning rate accordingly) or run on a smaller, "
                 "cheaper GPU. If the batch size is fixed by the recipe, pack several jobs per GPU (MIG, MPS).",
            deviations=f"Same conjunction as the original over the last {w}, with quantiles from the per-sample "
                       "histograms (5 % buckets). Unused GPUs are skipped, as in LowGPUUtilization. Severity "
                       "info: it is advice on cost, not a fault.",
            original="BatchSize"))

    m = c.gpu_memory_increase_window
    now_mean = q.window_mean(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, m)
    before_mean = q.window_mean(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, m, offset=m)
    increase = Alert(
        "GPUMemoryIncrease", GROUP_SYSTEM,
        f"(\n  {now_mean}\n  -\n  {before_mean}\n) > {number(c.gpu_memory_increase)}\n{warm}",
        "0s", "warning",
        "GPU memory use jumped.",
        f"{AT_GPU}: mean memory use over the last {m} is {PCT} of the device above the {m} before.",
        mc.DASHBOARD_GPU_SYSTEM, (*gpu_labels, *c.target_labels),
        Runbook(
            meaning=f"The GPU's mean memory use over the last {m} is more than {_pct(c.gpu_memory_increase)} of "
                    f"the device's memory above its mean over the {m} before: memory is growing.",
            thresholds=_params(("window", m), ("patience", c.patience), ("increase", _pct(c.gpu_memory_increase))),
            todo="Growth that repeats step after step is a leak: tensors kept alive across steps (accumulating "
                 "losses without .item()/.detach(), lists of outputs, autograd graphs held by metrics). A one-off "
                 "jump at the start of evaluation or at a larger input shape is expected. Check "
                 "OtelprofGPUMemoryNearCapacity and the CUDA allocator's reserved vs allocated memory.",
            deviations="The original compared moving averages of 10 samples (5 s) shifted by one sample, on "
                       f"every sample; 5 s is below common scrape intervals, so this compares the exact mean of "
                       f"the samples of the last {m} with the {m} before (from the per-sample histogram's "
                       "sum and count). Absolute percentage points of device memory, as in the original.",
            original="GPUMemoryIncrease"))

    cap_w = c.gpu_memory_capacity_window
    capacity = Alert(
        "GPUMemoryNearCapacity", GROUP_SYSTEM,
        f"{q.window_mean(sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, cap_w)} > "
        f"{number(c.gpu_memory_capacity_threshold)}",
        "0s", "warning",
        "A GPU's memory is nearly full.",
        f"{AT_GPU}: mean memory use over the last {cap_w} is {PCT} of the device.",
        mc.DASHBOARD_GPU_SYSTEM, (*gpu_labels, *c.target_labels),
        Runbook(
            meaning=f"The GPU's memory was on average more than {_pct(c.gpu_memory_capacity_threshold)} full "
                    f"over the last {cap_w}. The next larger batch, sequence or evaluation pass may fail "
                    "with an out-of-memory error.",
            thresholds=_params(("window", cap_w), ("threshold", _pct(c.gpu_memory_capacity_threshold))),
            todo="If this follows OtelprofGPUMemoryIncrease, look for a leak. Otherwise make room: activation "
                 "checkpointing, mixed precision, a smaller micro-batch with gradient accumulation, or sharded "
                 "optimizer states (ZeRO/FSDP). PyTorch's caching allocator keeps freed memory reserved: "
                 "compare otelprof_cuda_memory_allocated_bytes with _reserved_bytes before blaming the model.",
            deviations="No original: SageMaker Debugger only watched growth, not the ceiling."))

    spread_mean = q.window_mean(sc.GPU_UTILIZATION_DISTRIBUTION, w)
    load = Alert(
        "GPULoadImbalance", GROUP_SYSTEM,
        f"(\n  max by ({JOB}) ({spread_mean})\n  -\n  min by ({JOB}) ({spread_mean})\n)"
        f" > {number(c.load_balancing_threshold)}\n"
        f"and on ({JOB}) min by ({JOB}) {q.age()} > {int(seconds(c.patience))}",
        c.load_balancing_for, "warning",
        "The job's GPUs carry unequal load.",
        f"Job {L_JOB}: mean utilization of its busiest and idlest GPU over the last {w} differ by {PCT}.",
        mc.DASHBOARD_GPU_SYSTEM, (JOB,),
        Runbook(
            meaning=f"Over the last {w}, the mean utilization of the job's busiest GPU is more than "
                    f"{_pct(c.load_balancing_threshold)} (absolute) above that of its idlest GPU, across all "
                    "nodes of the job.",
            thresholds=_params(("window", w), ("patience", c.patience),
                               ("threshold", _pct(c.load_balancing_threshold)), ("for", c.load_balancing_for)),
            todo="With torch.nn.DataParallel the first GPU gathers outputs and gradients: switch to "
                 "DistributedDataParallel. With DDP/FSDP, look for uneven shards of data (variable sequence "
                 "lengths: bucket by length), a rank doing extra work (logging, evaluation, checkpointing on "
                 "rank 0), or GPUs that are visible but unused.",
            deviations="The original meant to compare the utilization histograms of every pair of GPUs on a node "
                       "by Jensen-Shannon distance (threshold 0.5 in the SDK config) but never fired (a loop "
                       "bug) and dropped samples above 98 %. PromQL cannot pair histograms, so this alert "
                       "compares the exact window means of the GPUs' utilization (from the per-sample "
                       "histograms) across the whole job, not per node.",
            original="LoadBalancing"))
    return [cpu, io, low, fluctuating, batch, increase, capacity, load]


# ---------------------------------------------------------------------------------------------- steps

def _steps(c: MixinConfig) -> list[Alert]:
    q = Q(c.selector)
    sw = c.straggler_window
    step_sum = q.delta(sc.STEP_DURATION, sw, "sum")
    coll_sum = q.delta(sc.COLLECTIVE_DURATION, sw, "sum")
    step_count = q.delta(sc.STEP_DURATION, sw, "count")
    compute = f"(({step_sum} - ({coll_sum} or {step_sum} * 0)) / {step_count})"
    straggler = Alert(
        "RankStraggler", GROUP_STEPS,
        f"{compute}\n/ on ({JOB}, {PHASE}) group_left\nquantile by ({JOB}, {PHASE}) (0.5, {compute})\n"
        f"> {number(c.straggler_ratio)}\n"
        f"and on ({JOB}, {PHASE}) count by ({JOB}, {PHASE}) ({compute}) > 1",
        c.straggler_for, "warning",
        "One rank is slower than the others.",
        f"{AT_RANK}: its {L_PHASE} steps take {NUM} times the job's median of compute time per step "
        f"(step time less collective time) over the last {sw}.",
        mc.DASHBOARD_RANKS, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"This rank's mean compute time per step (step time minus the time its gradient all-reduces "
                    f"were in flight) over the last {sw} is more than {c.straggler_ratio:g} times the median "
                    "over the job's ranks. In synchronous data parallel training every rank waits for the "
                    "slowest, so one straggler slows the whole job.",
            thresholds=_params(("window", sw), ("ratio", c.straggler_ratio), ("for", c.straggler_for)),
            todo="Compare the node's telemetry with the other nodes': CPU throttling "
                 "(otelprof_container_cpu_throttled_periods_total), a GPU at a lower clock or thermally "
                 "throttled (otelprof_gpu_throttle), a slower data path on that node, or uneven input sizes. "
                 "The captured window (action `capture`, sent to this rank only) shows where its time goes. "
                 "On GPUs, the \"Communication/computation overlap\" panel of the training report (and the "
                 "report's section of that name) gives each rank's exposed communication per step from its "
                 "profiling windows' kernels: the ranks that wait for the straggler show the most exposed "
                 "all-reduce time, the straggler itself the least.",
            deviations="No original. With two ranks the median is their mean, so the straggler must be 1.5 times "
                       "slower for a ratio of 1.2; with more ranks the median is robust. The collective time "
                       "comes from the DDP integration; without it the plain step time is compared."))

    ow = c.step_outlier_window
    outliers = Alert(
        "StepOutliers", GROUP_STEPS,
        f"{q.delta(sc.STEP_OUTLIERS, ow)} > {c.step_outlier_n_outliers}\n"
        f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEPS, ow)} > {c.step_outlier_min_steps}\n"
        f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEP_OUTLIERS, ow)}\n"
        f"  > on ({JOB}, {RANK}, {PHASE}) {number(c.step_outlier_min_share)} * {q.delta(sc.STEPS, ow)}",
        "0s", "warning",
        "Many steps were much slower than usual.",
        f"{AT_RANK}: {NUM} {L_PHASE} steps in the last {ow} were slower than mean + sigma x stddev of the "
        "steps before them.",
        mc.DASHBOARD_TIMELINE, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"More than {c.step_outlier_n_outliers} steps of the last {ow} (of more than "
                    f"{c.step_outlier_min_steps}), and more than {_pct(c.step_outlier_min_share)} of them, were "
                    "outliers: slower than the mean plus "
                    "OTELPROF_OUTLIER_SIGMA (3) standard deviations of the recent steps of their phase. Every "
                    "outlier step is traced, so its spans show where the time went.",
            thresholds=_params(("window", ow), ("n_outliers", c.step_outlier_n_outliers),
                               ("min_steps", c.step_outlier_min_steps),
                               ("min_share", _pct(c.step_outlier_min_share)), ("stddev (in process)", 3)),
            todo="Open the outlier steps on the timeline dashboard (they are always traced) and look for the "
                 "region that grew: data loading (see the bottleneck alerts), checkpointing or evaluation "
                 "inside the loop, garbage collection, or interference from other processes on the node.",
            deviations="The original counted outliers over all steps since the start (and latched once it "
                       f"had more than 10); this counts them over the last {ow}. The outlier test runs in the "
                       "training process against the last 256 steps of the phase (population standard "
                       "deviation, upward only, as in the original) after OTELPROF_OUTLIER_MIN_STEPS steps, "
                       "instead of all steps. New: the outliers must also exceed "
                       f"{_pct(c.step_outlier_min_share)} of the window's steps — with very steady steps (a "
                       "standard deviation of a fraction of a millisecond) scheduler noise alone makes 1-2 % of "
                       "the steps 3-sigma outliers, which is no bottleneck.",
            original="StepOutlier"))

    init_limit = int(seconds(c.max_initialization_time))
    slow_init = Alert(
        "SlowInitialization", GROUP_STEPS,
        f"{q.age()} > {init_limit}\nunless on ({JOB}, {RANK}) {q.sel(sc.STEP_FIRST_TIMESTAMP)}",
        "0s", "warning",
        "Training has not started its first step.",
        f"{AT_RANK}: started {DUR} ago and has not begun its first step.",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, *c.target_labels),
        Runbook(
            meaning=f"The process started more than {c.max_initialization_time} ago and no training step has "
                    "begun yet.",
            thresholds=_params(("threshold", c.max_initialization_time)),
            todo="Look at the annotated initialization regions (otelprof_annotation_duration_seconds with "
                 "phase none) and the process's CPU and I/O: data set download or indexing, model weight "
                 "loading, compilation (torch.compile), or a distributed rendezvous waiting for missing "
                 "ranks (check that every rank's pod is running).",
            deviations="The original measured from the first system sample and never fired inside the "
                       "profiler report (a bug); this measures from the process start time and fires while "
                       "the first step is still missing, then resolves.",
            original="MaxInitializationTime"))

    workers = f"sum by ({JOB}, {NODE}) ({q.sel(sc.DATALOADER_WORKERS)})"
    cores = f"max by ({JOB}, {NODE}) ({q.sel(sc.CPU_AVAILABLE)})"
    loader_dev = ("The original counted data-loader worker processes seen in the framework trace per second "
                  "and compared the median with the node's logical cores. Here the PyTorch integration "
                  "reports the configured workers of each rank's loader (summed per node) and the sampler "
                  "reports the CPUs the container may use (the cgroup quota, else the affinity mask), so a "
                  "pod limited to 8 of 64 cores is judged against 8.")
    too_few = Alert(
        "TooFewDataLoaderWorkers", GROUP_STEPS,
        f"{workers}\n< {number(c.dataloader_min_threshold)} * {cores}",
        c.dataloader_for, "info",
        "Few data-loader workers for the CPUs available.",
        f"Node {L_NODE} (job {L_JOB}) runs {NUM} data-loader workers in total, fewer than "
        f"{_pct(c.dataloader_min_threshold)} of the CPUs the container may use.",
        mc.DASHBOARD_GPU_SYSTEM, (JOB, NODE),
        Runbook(
            meaning=f"The data loaders of the node's ranks together run fewer worker processes than "
                    f"{_pct(c.dataloader_min_threshold)} of the CPUs the container may use.",
            thresholds=_params(("min_threshold", _pct(c.dataloader_min_threshold)), ("for", c.dataloader_for)),
            todo="If steps are input-bound (OtelprofInputBound, OtelprofCPUBottleneck) raise num_workers "
                 "towards the available CPUs divided by the ranks on the node; otherwise this is harmless.",
            deviations=loader_dev, original="Dataloader"))
    too_many = Alert(
        "TooManyDataLoaderWorkers", GROUP_STEPS,
        f"{workers}\n> {number(c.dataloader_max_threshold)} * {cores}",
        c.dataloader_for, "info",
        "More data-loader workers than the CPUs can run.",
        f"Node {L_NODE} (job {L_JOB}) runs {NUM} data-loader workers in total, more than "
        f"{_pct(c.dataloader_max_threshold)} of the CPUs the container may use.",
        mc.DASHBOARD_GPU_SYSTEM, (JOB, NODE),
        Runbook(
            meaning=f"The data loaders of the node's ranks together run more than "
                    f"{_pct(c.dataloader_max_threshold)} of the container's CPUs in worker processes: they "
                    "compete for cores (and memory) with each other and the training processes.",
            thresholds=_params(("max_threshold", _pct(c.dataloader_max_threshold)), ("for", c.dataloader_for)),
            todo="Lower num_workers; with a CPU limit on the pod, size workers to the limit, not to the node's "
                 "cores (os.cpu_count() reports the node). Watch CPU throttling after the change.",
            deviations=loader_dev, original="Dataloader"))

    iw = c.input_bound_window
    input_bound = Alert(
        "InputBound", GROUP_STEPS,
        f"{q.window_mean(sc.DATALOADER_WAIT_RATIO, iw)} > {number(c.input_bound_threshold)}",
        c.input_bound_for, "warning",
        "Steps spend most of their time waiting for data.",
        f"{AT_RANK}: {L_PHASE} steps spent on average {PCT} of their time waiting for the next batch over the "
        f"last {iw}.",
        mc.DASHBOARD_RANKS, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"Averaged over the steps of the last {iw}, more than {_pct(c.input_bound_threshold)} of "
                    "each step was spent waiting for the data loader to hand over the next batch.",
            thresholds=_params(("window", iw), ("threshold", _pct(c.input_bound_threshold)),
                               ("for", c.input_bound_for)),
            todo="Make the input pipeline faster than the model: more loader workers, prefetching, "
                 "pin_memory, persistent_workers, cheaper decoding or preprocessing done once offline, faster "
                 "storage. The CPU and I/O bottleneck alerts tell which resource the loader lacks.",
            deviations="No original (SageMaker's Dataloader rule only counted workers). Measured per step from "
                       "the time spent inside the data-loader region, so it is exact for every step."))
    return [straggler, outliers, slow_init, too_few, too_many, input_bound]


# ---------------------------------------------------------------------------------------------- training

def _training(c: MixinConfig) -> list[Alert]:
    q = Q(c.selector)
    train = f'{PHASE}="{c.train_phase}"'
    evl = f'{PHASE}="{c.eval_phase}"'
    lw = c.loss_window
    loss_now = f"avg_over_time({q.sel(sc.LOSS, matchers=train)}[{lw}])"
    loss_before = f"avg_over_time({q.sel(sc.LOSS, matchers=train)}[{lw}] offset {lw})"
    diff = number(c.loss_diff_percent / 100)
    steps_moving = f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEPS, lw, matchers=train)} > 0"
    not_decreasing = Alert(
        "LossNotDecreasing", GROUP_TRAINING,
        f"{loss_now}\n> {loss_before} - {diff} * abs({loss_before})\n{steps_moving}\n"
        f"{q.warmed_up(f'{2 * int(seconds(lw))}s')}",
        "0s", "warning",
        "The training loss stopped decreasing.",
        f"{AT_RANK}: mean training loss over the last {lw} is {VAL}, not lower than over the {lw} before.",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"The mean of the recorded training loss over the last {lw} did not fall by at least "
                    f"{c.loss_diff_percent:g} % of its value compared with the {lw} before, while steps "
                    "were running. Judged once the process has run for two windows.",
            thresholds=_params(("window", lw), ("diff_percent", f"{c.loss_diff_percent:g} %")),
            todo="Expected near convergence: then stop or lower the learning rate. Early in training it "
                 "points at a learning rate that is too high or too low, a data pipeline that repeats the "
                 "same batches, or frozen parameters. Check OtelprofVanishingGradients and the learning-rate "
                 "panel.",
            deviations="The original compared the loss at step s with the loss at step s - num_steps (10). "
                       "Prometheus sees the loss gauge at each scrape, not at every step, so this compares the "
                       f"mean of the scraped values over the last {lw} with the {lw} before — less sensitive "
                       "to batch-to-batch noise, slower to react.",
            original="LossNotDecreasing"))

    nonfinite = Alert(
        "NonFiniteValues", GROUP_TRAINING,
        f"{q.delta(sc.NONFINITE, c.nonfinite_window)} > 0",
        "0s", "critical",
        "The loss or the gradient norm became NaN or infinite.",
        f"{AT_RANK}: {NUM} non-finite {{{{ $labels.scalar }}}} values recorded in {L_PHASE} steps over the "
        f"last {c.nonfinite_window}.",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, PHASE, sc.prometheus_label(sc.LABEL_SCALAR), *c.target_labels),
        Runbook(
            meaning=f"record('loss', ...) or record('grad_norm', ...) received NaN or an infinity in the last "
                    f"{c.nonfinite_window}. Training rarely recovers: every further step wastes compute.",
            thresholds=_params(("window", c.nonfinite_window)),
            todo="With the default action `stop` the job ends at the next step boundary after your on_stop "
                 "callbacks. Resume from the last good checkpoint with a lower learning rate, gradient "
                 "clipping, loss scaling for fp16 (or bf16), and check the inputs of the failing steps for "
                 "NaNs or extreme values.",
            deviations="The original (ExplodingTensor) inspected saved tensors; otelprof checks the recorded "
                       "loss and gradient norm of every step, counted in the process (so a NaN between "
                       "scrapes is never missed).",
            original="ExplodingTensor"))

    vw = c.vanishing_gradient_window
    vanishing = Alert(
        "VanishingGradients", GROUP_TRAINING,
        f"max_over_time({q.sel(sc.GRAD_NORM, matchers=train)}[{vw}]) < "
        f"{number(c.vanishing_gradient_threshold)}\n"
        f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEPS, vw, matchers=train)} > 0",
        "0s", "warning",
        "Gradients vanished.",
        f"{AT_RANK}: the gradient norm stayed below {c.vanishing_gradient_threshold:g} for the last {vw} "
        f"(largest {VAL}).",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"Every recorded global gradient norm of the last {vw} was below "
                    f"{c.vanishing_gradient_threshold:g} while steps were running: the parameters barely "
                    "change.",
            thresholds=_params(("window", vw), ("threshold", f"{c.vanishing_gradient_threshold:g}")),
            todo="Check for saturated activations, a loss that is detached from the parameters, parameters "
                 "accidentally frozen, or a learning-rate schedule that has decayed to zero; use normalization "
                 "layers, residual connections or a different initialization.",
            deviations="The original compared the mean absolute value of each gradient tensor with 1e-7; "
                       "otelprof sees the global gradient norm (record('grad_norm', ...)), which is larger "
                       "than any mean absolute value, so with the same threshold it fires later.",
            original="VanishingGradient"))

    stalled_limit = int(seconds(c.stalled_training_threshold))
    stalled = Alert(
        "TrainingStalled", GROUP_TRAINING,
        f"time() - max by ({by(*IDENTITY)}) ({q.sel(sc.STEP_LAST_TIMESTAMP)}) > {stalled_limit}",
        "0s", "critical",
        "No training step finished for a long time.",
        f"{AT_RANK}: the last step ended {DUR} ago.",
        mc.DASHBOARD_RANKS, IDENTITY,
        Runbook(
            meaning=f"The process is alive (its metrics are scraped) but no step of any phase has finished for "
                    f"more than {c.stalled_training_threshold}.",
            thresholds=_params(("threshold", c.stalled_training_threshold)),
            todo="A hung collective is the usual cause in distributed jobs: check whether another rank died "
                 "(OtelprofTelemetryAbsent) and run py-spy dump on the process. Otherwise look for a dead "
                 "data-loader worker, a full disk during checkpointing, or a very long evaluation outside "
                 "steps (raise the threshold if that is expected). A stop request cannot reach a loop that "
                 "is stuck inside a step: restart the job from its last checkpoint.",
            deviations="The original watched for new tensors being saved (default 1800 s); this watches the "
                       "end time of the last step of any phase.",
            original="StalledTrainingRule"))

    ow = c.overfit_window
    eval_mean = f"avg_over_time({q.sel(sc.LOSS, matchers=evl)}[{ow}])"
    train_mean = f"avg_over_time({q.sel(sc.LOSS, matchers=train)}[{ow}])"
    overfit = Alert(
        "Overfitting", GROUP_TRAINING,
        f"(\n  {eval_mean}\n  - ignoring ({PHASE})\n  {train_mean}\n)\n/ ignoring ({PHASE})\n"
        f"{train_mean} > {number(c.overfit_ratio_threshold)}\n"
        f"and ignoring ({PHASE}) {train_mean} > 0",
        c.overfit_for, "warning",
        "The evaluation loss pulls away from the training loss.",
        f"{AT_RANK}: mean evaluation loss over the last {ow} is {PCT} above the mean training loss.",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, *c.target_labels),
        Runbook(
            meaning=f"(mean eval loss - mean train loss) / mean train loss over the last {ow} exceeds "
                    f"{c.overfit_ratio_threshold:g}. Only jobs that record a loss in an `{c.eval_phase}` phase "
                    "are checked.",
            thresholds=_params(("window", ow), ("ratio_threshold", c.overfit_ratio_threshold),
                               ("for", c.overfit_for)),
            todo="Stop at the best checkpoint (early stopping), add regularization (weight decay, dropout, "
                 "augmentation) or more data. A gap that is there from the start usually means the two "
                 "losses are computed differently (e.g. dropout, label smoothing or a different reduction).",
            deviations="The original compared the means of saved train and eval losses per step; this "
                       f"compares the means of the scraped loss gauges over {ow} and waits {c.overfit_for} "
                       "instead of a step-count patience.",
            original="Overfit"))
    return [not_decreasing, nonfinite, vanishing, stalled, overfit]


# ---------------------------------------------------------------------------------------------- telemetry

def _telemetry(c: MixinConfig) -> list[Alert]:
    q = Q(c.selector)
    lb = c.absent_lookback
    job_label, instance_label = c.target_labels
    up_inner = ", ".join(m for m in (c.up_selector.strip(),) if m)
    up = f"up{{{up_inner}}}" if up_inner else "up"
    start = q.sel(sc.PROCESS_START_TIME)
    target_down = Alert(
        "TargetDown", GROUP_TELEMETRY,
        f"({up} == 0)\n+ on ({job_label}, {instance_label}) group_left ({JOB}, {RANK}, {NODE})\n"
        f"(0 * topk by ({job_label}, {instance_label}) (1, last_over_time({start}[{lb}])))",
        c.absent_for, "warning",
        "A training process's metrics endpoint cannot be scraped.",
        f"Prometheus cannot scrape {{{{ $labels.{instance_label} }}}} ({AT_RANK}), which served otelprof "
        f"metrics within the last {lb}.",
        mc.DASHBOARD_RANKS, (job_label, instance_label, JOB, RANK, NODE),
        Runbook(
            meaning=f"A scrape target that exposed otelprof metrics within the last {lb} is down: the training "
                    "process died or hangs, or its /metrics endpoint is unreachable. Every other alert about "
                    "this process is blind meanwhile — absence never counts as healthy.",
            thresholds=_params(("lookback", lb), ("for", c.absent_for)),
            todo="Check the pod (kubectl describe/logs): OOM kill, crash, eviction. A process that is alive but "
                 "does not answer scrapes is usually stuck holding the GIL; py-spy dump shows where.",
            deviations="No original: the SageMaker rules ran on files and treated missing data as no data."))

    present = f"group by ({JOB}, {RANK}, {NODE}) ({start})"
    absent = Alert(
        "TelemetryAbsent", GROUP_TELEMETRY,
        f"(\n  group by ({JOB}, {RANK}, {NODE}) (last_over_time({start}[{lb}]))\n"
        f"  unless on ({JOB}, {RANK}) {present}\n)\n"
        f"and on ({JOB}) group by ({JOB}) ({start})",
        c.absent_for, "critical",
        "A rank stopped reporting while the rest of its job goes on.",
        f"{AT_RANK} reported within the last {lb} but its series are gone, while other ranks of the job still "
        "report.",
        mc.DASHBOARD_RANKS, (JOB, RANK, NODE),
        Runbook(
            meaning=f"This rank's series existed within the last {lb} and vanished while other ranks of the "
                    "same job still report. A rank that died leaves the others hanging in their next "
                    "collective operation.",
            thresholds=_params(("lookback", lb), ("for", c.absent_for)),
            todo="Find why the rank ended (pod events, OOM kills, the process's last log lines, NCCL errors). "
                 "The remaining ranks will not make progress: restart the job from its last checkpoint; "
                 "torchrun's elastic restarts (max_restarts) can do this automatically.",
            deviations="No original. A job whose ranks all end at the same time (normal completion) does not "
                       "fire; a single-process job that dies is caught by OtelprofTargetDown while its pod "
                       "is still there."))

    sampling = f"{q.delta(sc.SAMPLER_SAMPLES, c.sampler_window)} > 0"
    system_absent = Alert(
        "SystemTelemetryAbsent", GROUP_TELEMETRY,
        f"group by ({JOB}, {NODE}) ({start})\nunless on ({JOB}, {NODE}) ({sampling})",
        c.absent_for, "warning",
        "No system telemetry from a node of a running job.",
        f"Node {L_NODE} of job {L_JOB}: training processes report but the node's telemetry sampler took no "
        f"sample in the last {c.sampler_window}.",
        mc.DASHBOARD_GPU_SYSTEM, (JOB, NODE),
        Runbook(
            meaning=f"Training processes of the job report from this node, but no process there took a "
                    f"system sample in the last {c.sampler_window}. The CPU, I/O and GPU alerts cannot judge "
                    "this node.",
            thresholds=_params(("window", c.sampler_window), ("for", c.absent_for)),
            todo="The node's sampler runs in the process whose LOCAL_RANK equals "
                 "OTELPROF_NODE_SAMPLER_LOCAL_RANK (0): check that this process runs, that "
                 "OTELPROF_SYSTEM_METRICS is not false, and otelprof_sampler_errors_total. If system metrics "
                 "are off on purpose, disable this alert (disabled_alerts).",
            deviations="No original."))

    gpu_util = q.sel(sc.GPU_UTILIZATION)
    gpu_absent = Alert(
        "GPUTelemetryAbsent", GROUP_TELEMETRY,
        f"(\n  group by ({JOB}, {NODE}, {GPU}) (last_over_time({gpu_util}[{lb}]))\n"
        f"  unless on ({JOB}, {NODE}, {GPU}) group by ({JOB}, {NODE}, {GPU}) ({gpu_util})\n)\n"
        f"and on ({JOB}, {NODE}) ({sampling})",
        c.absent_for, "warning",
        "A GPU stopped reporting.",
        f"{AT_GPU}: utilization was reported within the last {lb} and is gone, while the node's sampler runs.",
        mc.DASHBOARD_GPU_SYSTEM, (JOB, NODE, GPU),
        Runbook(
            meaning=f"A GPU's series existed within the last {lb} and vanished while the node's sampler still "
                    "samples: NVML stopped answering for this device (GPU lost, XID error, driver trouble).",
            thresholds=_params(("lookback", lb), ("for", c.absent_for)),
            todo="Check otelprof_sampler_errors_total{source=\"nvml\"} and the node's kernel log (dmesg) for XID "
                 "errors; a GPU that fell off the bus needs the node drained and the job moved.",
            deviations="No original."))

    dropped = Alert(
        "TelemetryDropped", GROUP_TELEMETRY,
        f"{q.delta(sc.EXPORTER_DROPPED, c.dropped_window)} > 0",
        "0s", "info",
        "otelprof dropped telemetry instead of blocking training.",
        f"{AT_RANK}: {NUM} items dropped by the {{{{ $labels.exporter }}}} exporter in the last "
        f"{c.dropped_window}.",
        mc.DASHBOARD_RANKS, (*IDENTITY, sc.prometheus_label(sc.LABEL_EXPORTER), *c.target_labels),
        Runbook(
            meaning=f"In the last {c.dropped_window} otelprof dropped records, spans or metric exports "
                    "(queue full, collector down, disk full) rather than slow the training loop down. Reports "
                    "and traces of this period are incomplete.",
            thresholds=_params(("window", c.dropped_window)),
            todo="exporter=otlp_*: the OTel collector is down or slow. exporter=recording: the disk is full or "
                 "slow. exporter=queue: raise OTELPROF_QUEUE_SIZE or trace fewer steps (OTELPROF_SPAN_BUDGET). "
                 "exporter=cuda_events: the GPU ran far behind the training loop or no forward ran to read the "
                 "CUDA events; only device times (otelprof_region_device_duration_seconds) are missing.",
            deviations="No original."))
    return [target_down, absent, system_absent, gpu_absent, dropped]

