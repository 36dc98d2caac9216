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
from otelprof import thresholds
from otelprof.mixin import config as mc
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.gpu_source import GpuReadings
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
    limit: str
    """Detection limit: the smallest fault the alert catches and how long it takes, computed from the config."""
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


_NOT_OPERATOR_SPANS = f'{sc.prometheus_label(sc.LABEL_EXPORTER)}!="{sc.DROPPED_OPERATOR_SPANS}"'


def _params(*pairs: tuple[str, object]) -> tuple[tuple[str, str], ...]:
    return tuple((name, str(value)) for name, value in pairs)


def _pct(value: float) -> str:
    return f"{value * 100:g} %"


def _human(secs: float) -> str:
    """A duration for the runbook's detection limits: ``45 s``, ``2 min 5 s``, ``1 h 30 min``."""
    secs = round(secs)
    hours, rest = divmod(secs, 3600)
    minutes, s = divmod(rest, 60)
    parts = [f"{hours} h" if hours else "", f"{minutes} min" if minutes else "", f"{s} s" if s else ""]
    return " ".join(p for p in parts if p) or "0 s"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value:g} B"


@dataclass(frozen=True)
class _WindowStats:
    """PromQL for the per-step mean of a value over a window and the squared standard error of that mean, from
    its running sum, sum of squares and count."""

    count: str
    mean: str
    se2: str


def _window_stats(q: Q, summed: sc.MetricSpec, squared: sc.MetricSpec, recorded: sc.MetricSpec, window: str,
                  matchers: str, offset: str = "") -> _WindowStats:
    total = q.delta(summed, window, matchers=matchers, offset=offset)
    squares = q.delta(squared, window, matchers=matchers, offset=offset)
    count = q.delta(recorded, window, matchers=matchers, offset=offset)
    variance = f"clamp_min(({squares} - {total} ^ 2 / {count}) / ({count} - 1), 0)"  # sample variance
    return _WindowStats(count, f"({total} / {count})", f"{variance} / {count}")


def alerts(config: MixinConfig) -> list[Alert]:
    """Every alert of the mixin, in runbook order (disabled ones left out)."""
    from otelprof.mixin.tensor_alerts import tensor_alerts  # it builds on this module's Alert
    built = [*_system(config), *_steps(config), *_training(config), *tensor_alerts(config), *_telemetry(config)]
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
    ws, patience = seconds(w), seconds(c.patience)
    never_early = f"Never in the first {_human(patience)} of a process (patience)."
    gpu_labels = (*IDENTITY, GPU, HW_ID)
    g = GpuReadings(c)
    used = f"and on ({JOB}, {RANK}, {GPU}) max_over_time({g.current(sc.GPU_UTILIZATION)}[{w}]) > 0"

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
                limit=f"A bottleneck in more than {_pct(threshold)} of the node's samples. One in every sample "
                      f"fires {_human(ws * threshold + seconds(c.bottleneck_for))} after it starts (the window's "
                      f"share passes {_pct(threshold)} after {_human(ws * threshold)}, then `for` "
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

    util_p95 = g.quantile(0.95, sc.GPU_UTILIZATION, w)
    util_p5 = g.quantile(0.05, sc.GPU_UTILIZATION, w)
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
            limit=f"A GPU busier than {_pct(c.low_gpu_threshold_p95)} in fewer than 5 % of its samples. A GPU that "
                  f"drops from busy to idle fires about {_human(0.95 * ws + seconds(c.low_gpu_for))} later (95 % "
                  f"of the {w} window must be idle, then `for` {c.low_gpu_for}). {never_early}",
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
            limit=f"A GPU below {_pct(c.low_gpu_threshold_p5)} in more than 5 % of its samples and above "
                  f"{_pct(c.low_gpu_threshold_p95)} in more than 5 %. Idle gaps appearing in a steadily busy GPU "
                  f"fire about {_human(0.05 * ws + seconds(c.low_gpu_for))} after they start (5 % of the {w} "
                  f"window, then `for` {c.low_gpu_for}). {never_early}",
            todo="Typical causes are blocking calls between steps (synchronizing .item()/.cpu() calls, logging, "
                 "checkpointing), a data loader that delivers in bursts, or ranks waiting for each other. "
                 "Compare the timeline of a captured window with the step-time panel; prefetch data and "
                 "remove host synchronizations from the step.",
            deviations=low_runbook_dev, original="LowGPUUtilization"))

    mem_p95 = g.quantile(0.95, sc.GPU_MEMORY_UTILIZATION, w)
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
            limit=f"GPU utilization, GPU memory and the node's mean CPU utilization each above their threshold "
                  f"({_pct(c.batch_size_gpu_threshold_p95)}, {_pct(c.batch_size_gpu_memory_threshold_p95)}, "
                  f"{_pct(c.batch_size_cpu_threshold_p95)}) in fewer than 5 % of the samples. A job whose load "
                  f"drops fires about {_human(0.95 * ws + seconds(c.batch_size_for))} later (95 % of the {w} "
                  f"window, then `for` {c.batch_size_for}). {never_early}",
            todo="Raise the per-device batch size (scale the learning rate accordingly) or run on a smaller, "
                 "cheaper GPU. If the batch size is fixed by the recipe, pack several jobs per GPU (MIG, MPS).",
            deviations=f"Same conjunction as the original over the last {w}, with quantiles from the per-sample "
                       "histograms (5 % buckets). Unused GPUs are skipped, as in LowGPUUtilization. Severity "
                       "info: it is advice on cost, not a fault.",
            original="BatchSize"))

    m = c.gpu_memory_increase_window
    now_mean = g.mean(sc.GPU_MEMORY_UTILIZATION, m)
    before_mean = g.mean(sc.GPU_MEMORY_UTILIZATION, m, offset=m)
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
            limit=f"A jump of more than {_pct(c.gpu_memory_increase)} of the device's memory: a jump of J points "
                  f"fires {m} x {_pct(c.gpu_memory_increase)} / J after it (within {m}). Steady growth faster than "
                  f"{_pct(c.gpu_memory_increase)} of the device per {m} fires within {_human(2 * seconds(m))} of "
                  f"its start (both windows in the growth). No `for`. {never_early}",
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
        f"{g.mean(sc.GPU_MEMORY_UTILIZATION, cap_w)} > "
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
            limit=f"A GPU more than {_pct(c.gpu_memory_capacity_threshold)} full on average over {cap_w}. A GPU that "
                  f"fills up from a share L to 100 % fires {cap_w} x ({_pct(c.gpu_memory_capacity_threshold)} - L) "
                  f"/ (100 % - L) later, within {cap_w}. No `for`, no patience.",
            todo="If this follows OtelprofGPUMemoryIncrease, look for a leak. Otherwise make room: activation "
                 "checkpointing, mixed precision, a smaller micro-batch with gradient accumulation, or sharded "
                 "optimizer states (ZeRO/FSDP). PyTorch's caching allocator keeps freed memory reserved: "
                 "compare otelprof_cuda_memory_allocated_bytes with _reserved_bytes before blaming the model.",
            deviations="No original: SageMaker Debugger only watched growth, not the ceiling."))

    spread_mean = g.mean(sc.GPU_UTILIZATION, w)
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
            limit=f"Two GPUs of the job whose mean utilization differs by more than "
                  f"{c.load_balancing_threshold * 100:g} points. A difference of D points that appears at once fires "
                  f"after {w} x {c.load_balancing_threshold * 100:g} / D + {c.load_balancing_for} (D = 50: "
                  f"{_human(ws * c.load_balancing_threshold / 0.5 + seconds(c.load_balancing_for))}). Never before "
                  f"every process of the job has run {_human(patience)}.",
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
        "HostMemoryIncrease", GROUP_SYSTEM,
        f"(\n  {now}\n  -\n  {before}\n  > {number(ratio)} * {before}\n)\n> {number(least)}\n"
        f"and on ({JOB}, {RANK}) {training} > {warm}",
        c.host_memory_increase_for, "warning",
        "A training process's memory keeps growing.",
        f"{AT_RANK}: mean resident memory over the last {hw} is {NUM}B above the {hw} before.",
        mc.DASHBOARD_GPU_SYSTEM, (*IDENTITY, *c.target_labels),
        Runbook(
            meaning=f"The process's mean resident memory (RSS) over the last {hw} exceeds its mean over the {hw} "
                    f"before by more than {_pct(ratio)} of that and by more than {_bytes(least)}, and kept doing "
                    f"so for {c.host_memory_increase_for}, while training steps run: host memory is leaking. Left "
                    "alone the process ends in an out-of-memory kill. Judged from patience + two windows after the "
                    "first step, so loading data and models before training, and the first steps' allocations, "
                    "do not count.",
            thresholds=_params(("window", hw), ("increase", _pct(ratio)), ("min_increase", _bytes(least)),
                               ("for", c.host_memory_increase_for),
                               ("patience", f"{c.patience} + 2 x {hw} after the first step")),
            limit=f"Growth per {hw} of more than {_pct(ratio)} of the resident memory and more than "
                  f"{_bytes(least)}: for a process below {_bytes(least / ratio)} a leak faster than "
                  f"{_bytes(least / hws * 60)} per minute, for a larger one faster than {_pct(ratio)} per {hw}. "
                  f"A steady leak fires at the latest "
                  f"{_human(2 * hws + seconds(c.host_memory_increase_for))} after it starts (both windows in the "
                  f"growth, then `for` {c.host_memory_increase_for}), sooner the faster it grows. Never in the first "
                  f"{_human(warm)} after the first step: the growth while a job starts up is no leak.",
            todo="Typical leaks in training code: a list that keeps every step's loss or outputs (append "
                 "loss.item(), not the tensor), metrics objects that accumulate predictions, a cache keyed by "
                 "batch, tensors kept alive by a closure or a logging handler, or torch.compile recompiling "
                 "for ever-new shapes. tracemalloc snapshots a few minutes apart (or memray) show which line "
                 "allocates. Data-loader workers are processes of their own: their growth shows in "
                 "OtelprofHostMemoryNearLimit, not here.",
            deviations="No original: SageMaker Debugger only watched GPU memory. Means of the scraped RSS gauge "
                       "(not per sample): memory moves slowly, and a single spike does not move a mean much."))

    lw = c.host_memory_limit_window
    working_set, limit = q.sel(sc.CONTAINER_MEMORY_WORKING_SET), q.sel(sc.CONTAINER_MEMORY_LIMIT)
    host = q.sel(sc.SYSTEM_MEMORY_UTILIZATION)
    threshold = c.host_memory_limit_threshold
    near = Alert(
        "HostMemoryNearLimit", GROUP_SYSTEM,
        f"(\n  avg_over_time({working_set}[{lw}])\n  / max_over_time({limit}[{lw}])\nor\n"
        f"  avg_over_time({host}[{lw}])\n  unless on ({JOB}, {NODE}) {limit}\n) > {number(threshold)}",
        "0s", "warning",
        "A node's memory is nearly exhausted.",
        f"Node {L_NODE} (job {L_JOB}): {PCT} of the container's memory limit (or, without a limit, of the "
        f"host's memory) in use on average over the last {lw}.",
        mc.DASHBOARD_GPU_SYSTEM, (*IDENTITY, *c.target_labels),
        Runbook(
            meaning=f"On average over the last {lw}, the container's working set (memory charged to it less "
                    f"inactive file cache, which the kernel reclaims) is above {_pct(threshold)} of its cgroup "
                    f"memory limit; in a container without a limit, the host's used memory is above "
                    f"{_pct(threshold)} of its total. The next allocation may end in an out-of-memory kill of the "
                    "training process or one of its data-loader workers.",
            thresholds=_params(("window", lw), ("threshold", _pct(threshold))),
            limit=f"A working set above {_pct(threshold)} of the limit on average over {lw}. A container that "
                  f"fills up from a share L to 100 % fires {lw} x ({_pct(threshold)} - L) / (100 % - L) later, "
                  f"within {lw}. No `for`, no patience.",
            todo="If OtelprofHostMemoryIncrease fired before, look for the leak. Otherwise: fewer data-loader "
                 "workers (each holds its own copy of whatever the dataset object references; keep large "
                 "lookups in numpy arrays, not Python lists, to avoid copy-on-access), a smaller "
                 "prefetch_factor, or a larger memory limit for the pod.",
            deviations="No original. Measured like the kubelet's eviction signal (working set, not usage with page "
                       "cache), from the node's sampling process."))
    return [increase, near]


# ---------------------------------------------------------------------------------------------- steps

def _steps(c: MixinConfig) -> list[Alert]:
    q = Q(c.selector)
    sw = c.straggler_window
    step_sum = q.delta(sc.STEP_DURATION, sw, "sum")
    coll_sum = q.delta(sc.COLLECTIVE_EXPOSED, sw, "sum")  # all-reduce time the backward pass did not overlap
    step_count = q.delta(sc.STEP_DURATION, sw, "count")
    compute = f"(({step_sum} - ({coll_sum} or {step_sum} * 0)) / ({step_count} > 0))"  # ranks with steps in it
    g = f"on ({JOB}, {PHASE})"
    ranks = f"count by ({JOB}, {PHASE}) ({compute})"
    # A rank against the median of the *other* ranks. PromQL cannot leave a series out of its own group's
    # aggregation, so: with 2-3 ranks that median is the mean of the others, (sum - x) / (n - 1); with 4 or
    # more, a rank that can be slower than its peers sits above the job's median, and the median of the others
    # is then the largest value not above the job's median (exact for every even n; for odd n >= 5 the job's
    # median itself, at most one rank's worth above the exact one, so the alert errs on the quiet side).
    peers_few = (f"{compute}\n  * {g} group_left () ({ranks} - 1)\n"
                 f"  / (sum by ({JOB}, {PHASE}) ({compute}) - {g} group_right () {compute} > 0)\n"
                 f"  and {g} {ranks} < 4")
    peers_many = (f"{compute}\n  / {g} group_left ()\n  (max by ({JOB}, {PHASE}) ({compute} <= {g} group_left () "
                  f"quantile by ({JOB}, {PHASE}) (0.5, {compute})) > 0)\n  and {g} {ranks} > 3")
    sws, sfor = seconds(sw), seconds(c.straggler_for)
    straggler = Alert(
        "RankStraggler", GROUP_STEPS,
        f"(\n  {peers_few}\nor\n  {peers_many}\n)\n> {number(c.straggler_ratio)}\n"
        f"and {g} {ranks} > 1",
        c.straggler_for, "warning",
        "One rank is slower than the others.",
        f"{AT_RANK}: its {L_PHASE} steps take {NUM} times the median of its peers' compute time per step "
        f"(step time less exposed collective time) over the last {sw}.",
        mc.DASHBOARD_RANKS, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"This rank's mean compute time per step (step time minus its exposed communication: the time "
                    f"its gradient all-reduces were in flight and its backward pass had nothing left to compute) "
                    f"over the last {sw} is more than {c.straggler_ratio:g} times the median "
                    "over the job's other ranks. In synchronous data parallel training every rank waits for the "
                    "slowest, so one straggler slows the whole job.",
            thresholds=_params(("window", sw), ("ratio", c.straggler_ratio), ("for", c.straggler_for)),
            limit=f"A rank more than {(c.straggler_ratio - 1) * 100:g} % slower than the median of its peers, at "
                  f"any world size from 2. A rank that slows down to k times its peers' step fires once more than "
                  f"{c.straggler_ratio - 1:g} / (k - 1) of its steps in the {sw} window are slow, then `for` "
                  f"{c.straggler_for}: at the latest {_human(sws + sfor)} after the slowdown.",
            todo="Compare the node's telemetry with the other nodes': CPU throttling "
                 "(otelprof_container_cpu_throttled_periods_total), a GPU at a lower clock or thermally "
                 "throttled (otelprof_gpu_throttle), a slower data path on that node, or uneven input sizes. "
                 "The captured window (action `capture`, sent to this rank only) shows where its time goes. "
                 "On GPUs, the \"Communication/computation overlap\" panel of the training report (and the "
                 "report's section of that name) gives each rank's exposed communication per step from its "
                 "profiling windows' kernels: the ranks that wait for the straggler show the most exposed "
                 "all-reduce time, the straggler itself the least.",
            deviations="No original. The peers' median is exact for 2, 3 and 4 ranks and any even number; with "
                       "an odd number of 5 or more ranks it is the job's median, which is at most one rank's "
                       "compute time above the exact one (the alert errs on the quiet side). The collective "
                       "time comes from the DDP integration; without it the plain step time is compared."))

    ow = c.step_outlier_window
    outlier_rule = (f"slower than the mean + {c.step_outlier_sigma:g} standard deviations of its phase's last "
                    f"{thresholds.OUTLIER_WINDOW} steps, and at least {c.step_outlier_min_ratio:g} times and "
                    f"{c.step_outlier_min_excess * 1000:g} ms more than their median; where the step recorded its "
                    "tokens (else its samples), also slower per token than those steps by the same tests")
    cost = f"{q.delta(sc.STEP_OUTLIER_EXCESS, ow)}\n/ {q.delta(sc.STEP_DURATION, ow, 'sum')}"
    outliers = Alert(
        "StepOutliers", GROUP_STEPS,
        f"{cost}\n> {number(c.step_outlier_min_cost)}\n"
        f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEP_OUTLIERS, ow)} > {c.step_outlier_n_outliers}\n"
        f"and on ({JOB}, {RANK}, {PHASE}) {q.delta(sc.STEPS, ow)} > {c.step_outlier_min_steps}",
        "0s", "warning",
        "Outlier steps cost a material share of training time.",
        f"{AT_RANK}: outlier {L_PHASE} steps lost {PCT} of the last {ow}'s step time (their time above the "
        "median step). Open them on the timeline: each is traced.",
        mc.DASHBOARD_TIMELINE, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"Over the last {ow}, the outlier steps' time above the median step was more than "
                    f"{_pct(c.step_outlier_min_cost)} of the phase's step time, over more than "
                    f"{c.step_outlier_n_outliers} outliers (of more than {c.step_outlier_min_steps} steps). An "
                    f"outlier is a step {outlier_rule}. Steps of an operator-profiling window and the "
                    f"{thresholds.AFTER_WINDOW_STEPS} steps after it (which otelprof itself slows: the profiler, "
                    "the FLOP count) are never judged. Every outlier step is traced, so its spans show where the "
                    "time went.",
            thresholds=_params(("window", ow), ("min_cost", _pct(c.step_outlier_min_cost)),
                               ("n_outliers", c.step_outlier_n_outliers),
                               ("min_steps", c.step_outlier_min_steps),
                               ("stddev (in process, OTELPROF_OUTLIER_SIGMA)", f"{c.step_outlier_sigma:g}"),
                               ("min_ratio (in process, OTELPROF_OUTLIER_MIN_RATIO)", f"{c.step_outlier_min_ratio:g}"),
                               ("min_excess (in process, OTELPROF_OUTLIER_MIN_EXCESS_MS)",
                                f"{c.step_outlier_min_excess * 1000:g} ms")),
            limit=f"Outliers that lose more than {_pct(c.step_outlier_min_cost)} of the step time: one step in m "
                  f"that takes x times the median step costs (x - 1) / m, so a stall of 3 times the step every "
                  f"{int(2 / c.step_outlier_min_cost)} steps or more often, a stall of 10 times every "
                  f"{int(9 / c.step_outlier_min_cost)} steps. Fires at the evaluation after the window holds "
                  f"more than {c.step_outlier_n_outliers} such outliers (no `for`): at the latest {ow} after "
                  "they start. A long batch that is not slower per token, scheduler delays below "
                  f"{c.step_outlier_min_excess * 1000:g} ms, and outliers that cost the job less never fire.",
            todo="Open the outlier steps on the timeline dashboard (they are always traced) and look for the "
                 "region that grew: data loading (see the bottleneck alerts), checkpointing or evaluation "
                 "inside the loop, garbage collection, or interference from other processes on the node. The "
                 "alert's value is the share of step time they cost: what fixing them gains.",
            deviations="The original counted outliers over all steps since the start (and latched once it "
                       f"had more than 10); this judges the last {ow}, by what the outliers cost. The outlier test "
                       f"runs in the training process against the last {thresholds.OUTLIER_WINDOW} steps of the "
                       "phase (population standard deviation, upward only, as in the original) after "
                       "OTELPROF_OUTLIER_MIN_STEPS steps. New: an outlier must also be materially slower than the "
                       f"median step ({c.step_outlier_min_ratio:g} times and "
                       f"{c.step_outlier_min_excess * 1000:g} ms: scheduler jitter on a busy machine passes mean + "
                       "3 sigma every few dozen steps), slower per token or sample where those are recorded "
                       "(variable-length batches keep ~2 % of the steps above mean + 3 sigma for good), and the "
                       f"outliers must cost more than {_pct(c.step_outlier_min_cost)} of the step time; steps "
                       "otelprof's own profiling slowed are left out.",
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
            limit=f"A process whose first step has not begun {c.max_initialization_time} after it started; fires "
                  f"exactly then (no `for`).",
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
            limit=f"Fewer workers than {_pct(c.dataloader_min_threshold)} of the container's CPUs; fires "
                  f"{c.dataloader_for} after the loaders report their workers.",
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
            limit=f"More workers than {_pct(c.dataloader_max_threshold)} of the container's CPUs; fires "
                  f"{c.dataloader_for} after the loaders report their workers.",
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
            limit=f"Steps waiting for data more than {_pct(c.input_bound_threshold)} of their time on average. When "
                  f"the loader slows so that steps wait a share s of their time, fires once more than "
                  f"{c.input_bound_threshold:g} / s of the window's steps are slow, then `for` {c.input_bound_for}: "
                  f"at the latest {_human(seconds(iw) + seconds(c.input_bound_for))} after the slowdown.",
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
    lws = seconds(lw)
    diff = number(c.loss_diff_percent / 100)
    now, before = _window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, lw, train), \
        _window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, lw, train, offset=lw)
    noise = f"{number(c.loss_noise_sigmas)} * sqrt({now.se2} + {before.se2})"
    # Losses in both windows (2 or more: a noise), and no loss was NaN in them (NonFiniteValues speaks then).
    steps_moving = (f"and on ({JOB}, {RANK}, {PHASE}) {now.count} > 1\n"
                    f"and on ({JOB}, {RANK}, {PHASE}) {before.count} > 1\n"
                    f"unless on ({JOB}, {RANK}, {PHASE}) "
                    f"{q.delta(sc.NONFINITE, f'{2 * int(lws)}s', matchers=train)} > 0")
    not_decreasing = Alert(
        "LossNotDecreasing", GROUP_TRAINING,
        f"{now.mean}\n> {before.mean}\n  - {diff} * abs({before.mean})\n  + {noise}\n{steps_moving}\n"
        # both windows inside training (from the first step on), so the earlier mean is not one early loss
        f"and on ({JOB}, {RANK}) (time() - {q.sel(sc.STEP_FIRST_TIMESTAMP)}) > {2 * int(lws)}",
        c.loss_for, "warning",
        "The training loss stopped decreasing.",
        f"{AT_RANK}: mean training loss per step over the last {lw} is {VAL}, clearly not {c.loss_diff_percent:g} % "
        f"lower than over the {lw} before (beyond the noise of both means). Training has converged or stalled.",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"The mean of the training losses recorded in the steps of the last {lw} is higher than their "
                    f"mean over the {lw} before less {c.loss_diff_percent:g} % of it, by more than "
                    f"{c.loss_noise_sigmas:g} standard errors of the difference (the noise of the two means, from "
                    "the steps' sums of squares): the loss surely did not fall by that much. It holds for "
                    f"{c.loss_for}, while losses were recorded in both windows and every loss was finite; judged "
                    "once training has run for two windows. The means are per step (from otelprof_loss_summed, "
                    "_squared_total and _recorded_total), so a checkpoint or an evaluation pass (no training "
                    "steps) weighs no loss more than another, and loss spikes (OtelprofLossSpike) are left out.",
            thresholds=_params(("window", lw), ("diff_percent", f"{c.loss_diff_percent:g} %"),
                               ("noise_sigmas", f"{c.loss_noise_sigmas:g}"), ("for", c.loss_for)),
            limit=f"A loss whose {lw} mean falls by less than {c.loss_diff_percent:g} % less "
                  f"{c.loss_noise_sigmas:g} standard errors per {lw}, or rises. With per-step noise s (relative "
                  f"standard deviation) and n steps per window the standard error of the difference is s x "
                  f"sqrt(2 / n): a flat loss fires when {c.loss_noise_sigmas:g} s sqrt(2 / n) < "
                  f"{c.loss_diff_percent:g} %, e.g. s = 1 % with n = 1000 "
                  f"({c.loss_noise_sigmas * (2 / 1000) ** 0.5:.2g} %); a noisier loss only once it rises by "
                  f"more than its noise (s = 10 %, n = 1000: "
                  f"{c.loss_noise_sigmas * 10 * (2 / 1000) ** 0.5 - c.loss_diff_percent:.2g} %); raise "
                  "diff_percent (or the window) to catch flat noisy losses. A loss that stops falling fires at the "
                  f"latest {_human(2 * lws + seconds(c.loss_for))} after it flattens (both windows flat, then `for` "
                  f"{c.loss_for}), and never before training (the first step) has run {_human(2 * lws)}.",
            todo="Expected near convergence: then stop or lower the learning rate. Early in training it "
                 "points at a learning rate that is too high or too low, a data pipeline that repeats the "
                 "same batches, or frozen parameters. Check OtelprofVanishingGradients and the learning-rate "
                 "panel.",
            deviations="The original compared the loss at step s with the loss at step s - num_steps (10), one "
                       f"value each. This compares the per-step means of the last {lw} and the {lw} before, and "
                       "fires only when the shortfall is beyond the noise of those means: a healthy loss that falls "
                       "more slowly than its noise can show stays quiet (scraped values of a last-loss gauge "
                       "weighed one batch per scrape, and the same batch 10-15 times through an evaluation pass or "
                       "a checkpoint, and fired on 38-40 of 40 scrape phasings of a healthy run).",
            original="LossNotDecreasing"))

    sw = c.loss_spike_window
    spike = Alert(
        "LossSpike", GROUP_TRAINING,
        f"{q.delta(sc.LOSS_SPIKES, sw, matchers=train)} > 0",
        "0s", "warning",
        "The training loss jumped.",
        f"{AT_RANK}: {NUM} training steps of the last {sw} had a loss of more than "
        f"{c.loss_spike_ratio:g} times the recent median.",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"In the last {sw}, a training step recorded a finite loss above {c.loss_spike_ratio:g} times "
                    f"the median and above the mean + {c.loss_spike_sigma:g} standard deviations of the phase's "
                    f"last {thresholds.OUTLIER_WINDOW} losses (judged in the training process after "
                    f"{thresholds.LOSS_SPIKE_MIN_STEPS} losses, while the median is positive). Severity warning, "
                    "not info: a jump of that size is a large, wrong update (a bad batch, a learning rate too high "
                    "for the current curvature, an fp16 overflow just short of inf) that the optimizer's state "
                    "keeps; repeated spikes are how training starts to diverge, and a run that recovers has still "
                    "lost progress. Not critical: training often recovers by itself.",
            thresholds=_params(("window", sw), ("ratio (in process)", f"{c.loss_spike_ratio:g}"),
                               ("stddev (in process)", f"{c.loss_spike_sigma:g}")),
            limit=f"A single step whose loss is {c.loss_spike_ratio:g} times the recent median (and beyond "
                  f"{c.loss_spike_sigma:g} sigma of the recent losses); fires at the first scrape and rule "
                  f"evaluation after it (no `for`) and stays firing for {sw}. Jumps below {c.loss_spike_ratio:g} "
                  "times the median (noise, a harder batch) never fire; nor do the first "
                  f"{thresholds.LOSS_SPIKE_MIN_STEPS} losses of a process.",
            todo="Look at the spiking steps' inputs (log the batch ids of steps whose loss jumped) and the "
                 "gradient norm around them (record('grad_norm', ...)). Common fixes: gradient clipping, a lower "
                 "peak learning rate or a longer warm-up, skipping or cleaning bad samples, bf16 instead of "
                 "fp16, a larger Adam epsilon. If spikes repeat and the loss does not come back, restart from "
                 "the checkpoint before the first spike.",
            deviations="No original: SageMaker Debugger watched for NaN/inf (ExplodingTensor) and a flat loss, "
                       "not a transient jump. The spike test runs in the training process on every step's loss "
                       "(otelprof_loss_spikes_total), so a spike between two scrapes is never missed."))

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
            limit=f"A single NaN or infinite loss or gradient norm; fires at the first scrape and rule evaluation "
                  f"after it (no `for`) and stays firing for {c.nonfinite_window}.",
            todo="With the default action `stop` the job ends at the next step boundary after your on_stop "
                 "callbacks. Resume from the last good checkpoint with a lower learning rate, gradient "
                 "clipping, loss scaling for fp16 (or bf16), and check the inputs of the failing steps for "
                 "NaNs or extreme values.",
            deviations="The original (ExplodingTensor) inspected saved tensors; otelprof checks the recorded "
                       "loss and gradient norm of every step, counted in the process (so a NaN between "
                       "scrapes is never missed).",
            original="ExplodingTensor"))

    vw = c.vanishing_gradient_window
    norm_mean = (f"{q.delta(sc.GRAD_NORM_SUMMED, vw, matchers=train)}\n  / "
                 f"{q.delta(sc.GRAD_NORM_RECORDED, vw, matchers=train)}")
    vanishing = Alert(
        "VanishingGradients", GROUP_TRAINING,
        f"(\n  {norm_mean}\n) < {number(c.vanishing_gradient_threshold)}",
        "0s", "warning",
        "Gradients vanished.",
        f"{AT_RANK}: the mean gradient norm of the training steps of the last {vw} is {VAL}, below "
        f"{c.vanishing_gradient_threshold:g}.",
        mc.DASHBOARD_TRAINING_REPORT, (*IDENTITY, PHASE, *c.target_labels),
        Runbook(
            meaning=f"The mean of the global gradient norms recorded in the training steps of the last {vw} was "
                    f"below {c.vanishing_gradient_threshold:g}: the parameters barely change.",
            thresholds=_params(("window", vw), ("threshold", f"{c.vanishing_gradient_threshold:g}")),
            limit=f"A mean gradient norm below {c.vanishing_gradient_threshold:g} over {vw} of training steps; "
                  f"norms that collapse at once fire within {vw} (no `for`).",
            todo="Check for saturated activations, a loss that is detached from the parameters, parameters "
                 "accidentally frozen, or a learning-rate schedule that has decayed to zero; use normalization "
                 "layers, residual connections or a different initialization.",
            deviations="The original compared the mean absolute value of each gradient tensor with 1e-7; "
                       "otelprof sees the global gradient norm (record('grad_norm', ...)), which is larger "
                       "than any mean absolute value, so with the same threshold it fires later. The mean over "
                       "every step of the window comes from per-step sums and counts "
                       "(otelprof_grad_norm_summed_total, _recorded_total), not from scraped last values.",
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
            limit=f"No step of any phase ending for {c.stalled_training_threshold}; fires "
                  f"{c.stalled_training_threshold} after the last step ended (no `for`).",
            todo="A hung collective is the usual cause in distributed jobs: check whether another rank died "
                 "(OtelprofTelemetryAbsent) and run py-spy dump on the process. Otherwise look for a dead "
                 "data-loader worker, a full disk during checkpointing, or a very long evaluation outside "
                 "steps (raise the threshold if that is expected). A stop request cannot reach a loop that "
                 "is stuck inside a step: restart the job from its last checkpoint.",
            deviations="The original watched for new tensors being saved (default 1800 s); this watches the "
                       "end time of the last step of any phase.",
            original="StalledTrainingRule"))

    ow = c.overfit_window
    eval_mean = _window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, ow, evl).mean
    train_mean = _window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, ow, train).mean
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
            meaning=f"(mean eval loss - mean train loss) / mean train loss over the steps of the last {ow} exceeds "
                    f"{c.overfit_ratio_threshold:g}. Only jobs that record a loss in an `{c.eval_phase}` phase "
                    f"are checked, at times when both phases ran steps within {ow} (evaluate at least that often, "
                    "or widen the window).",
            thresholds=_params(("window", ow), ("ratio_threshold", c.overfit_ratio_threshold),
                               ("for", c.overfit_for)),
            limit=f"A mean eval loss more than {_pct(c.overfit_ratio_threshold)} above the mean training loss over "
                  f"{ow}, with an evaluation pass in the window. A gap of g that opens at once fires once the "
                  f"window's evaluation steps are mostly past it, then `for` {c.overfit_for}: at the latest "
                  f"{_human(seconds(ow) + seconds(c.overfit_for))} with an evaluation pass every {ow}.",
            todo="Stop at the best checkpoint (early stopping), add regularization (weight decay, dropout, "
                 "augmentation) or more data. A gap that is there from the start usually means the two "
                 "losses are computed differently (e.g. dropout, label smoothing or a different reduction).",
            deviations="The original compared the means of saved train and eval losses per step; this "
                       f"compares the per-step means of the two phases' losses over {ow} (from per-step sums and "
                       f"counts, never scraped last values) and waits {c.overfit_for} instead of a step-count "
                       "patience.",
            original="Overfit"))
    return [not_decreasing, spike, nonfinite, vanishing, stalled, overfit]


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
            limit=f"A target that served otelprof metrics within {lb} and fails its scrapes for {c.absent_for}; "
                  f"fires {c.absent_for} after the first failed scrape.",
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
            limit=f"One rank's series gone (Prometheus marks them stale at the first failed scrape of its "
                  f"target) while other ranks of the job report; fires {c.absent_for} later.",
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
            limit=f"A node sampler that takes no sample for {c.sampler_window}; fires "
                  f"{_human(seconds(c.sampler_window) + seconds(c.absent_for))} after its last sample.",
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
        f"and on ({JOB}, {NODE}) ({sampling})\nor {_unmapped(q)}",
        c.absent_for, "warning",
        "A GPU stopped reporting.",
        f"{AT_GPU}: utilization was reported within the last {lb} and is gone, while the node's sampler runs.",
        mc.DASHBOARD_GPU_SYSTEM, (JOB, NODE, GPU),
        Runbook(
            meaning=f"A GPU's series existed within the last {lb} and vanished while the node's sampler still "
                    "samples: NVML stopped answering for this device (GPU lost, XID error, driver trouble). "
                    f"Or (gpu=\"{UNMAPPED_GPU}\") a rank was given a GPU or MIG instance but cannot tell which "
                    "(otelprof_gpu_unmapped, its reason label says why), so no GPU series names its GPU.",
            thresholds=_params(("lookback", lb), ("for", c.absent_for)),
            limit=f"One GPU's series gone while the node's sampler samples; fires {c.absent_for} later.",
            todo="Check otelprof_sampler_errors_total{source=\"nvml\"} and the node's kernel log (dmesg) for XID "
                 "errors; a GPU that fell off the bus needs the node drained and the job moved. "
                 f"gpu=\"{UNMAPPED_GPU}\": otelprof_gpu_unmapped{{reason}} — not_found: NVML in the container "
                 "does not list the UUID in NVIDIA_VISIBLE_DEVICES (driver older than R470 for MIG); ambiguous: "
                 "several GPUs visible and LOCAL_RANK names none; otherwise NVML could not start "
                 "(install otelprof[gpu], check the device permissions).",
            deviations="No original."))

    if GpuReadings(c).dcgm:
        gpu_absent = _dcgm_absent(c)

    dropped = Alert(
        "TelemetryDropped", GROUP_TELEMETRY,
        # the operator-span cap per profiled step is a designed bound (the window's statistics count every
        # operator), not lost telemetry
        f"{q.delta(sc.EXPORTER_DROPPED, c.dropped_window, matchers=_NOT_OPERATOR_SPANS)} > 0",
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
            limit=f"A single dropped item; fires at the next scrape and rule evaluation and stays firing for "
                  f"{c.dropped_window}.",
            todo="exporter=otlp_*: the OTel collector is down or slow. exporter=recording: the disk is full or "
                 "slow. exporter=queue: raise OTELPROF_QUEUE_SIZE or trace fewer steps (OTELPROF_SPAN_BUDGET). "
                 "exporter=cuda_events: the GPU ran far behind the training loop or no forward ran to read the "
                 "CUDA events; only device times (otelprof_region_device_duration_seconds) are missing.",
            deviations="No original."))
    return [target_down, absent, system_absent, gpu_absent, dropped]



NO_FOR: dict[str, str] = {
    "GPUMemoryIncrease": "the expression already compares two whole windows of per-sample means; the jump it "
                         "names is the fault, and a `for` as long as a window would hide a single jump for good.",
    "GPUMemoryNearCapacity": "one evaluation judges the mean of every sample of the window: a checkpoint or eval "
                             "spike moves it by its share of the window only, and a GPU that full is one "
                             "allocation from an out-of-memory error.",
    "HostMemoryNearLimit": "one evaluation judges the working set's mean over the window, and past the limit the "
                           "kernel kills the process: a `for` would report it after the OOM kill.",
    "StepOutliers": "one evaluation weighs every outlier step of the window by its time above the median "
                    "against all the window's step time (a share, over more than 10 outliers): the window "
                    "is the `for`.",
    "SlowInitialization": "the condition is itself a duration (no first step that long after start); a `for` "
                          "would only add to it.",
    "LossSpike": "each counted spike was already judged in the training process against the recent "
                 "losses (ratio to the median and sigma): one is the fault, and a `for` would let "
                 "a transient jump expire unseen.",
    "NonFiniteValues": "one NaN or infinite loss or gradient norm is conclusive: the run's weights are likely "
                       "already corrupted.",
    "VanishingGradients": "one evaluation takes the largest gradient norm of the whole window while steps run: "
                          "the window is the `for`.",
    "TrainingStalled": "the condition is itself a duration (no step ended for that long); a `for` would only "
                       "add to it.",
    "TelemetryDropped": "one dropped item is a fact, not a trend: reports and traces of the period are "
                        "incomplete (severity info).",
}
"""Why an alert without ``for`` needs none: one evaluation is conclusive (stated in its runbook entry)."""

UNMAPPED_GPU = "unmapped"
"""The ``gpu`` label of GPUTelemetryAbsent for a rank whose GPU cannot be told (``otelprof_gpu_unmapped``)."""


def _unmapped(q: Q) -> str:
    """The nodes of ranks given a GPU they cannot name, as GPUTelemetryAbsent's ``gpu="unmapped"``."""
    return (f'label_replace(group by ({JOB}, {NODE}) ({q.sel(sc.GPU_UNMAPPED)}), "{GPU}", "{UNMAPPED_GPU}", "", '
            '"")')


def _dcgm_absent(c: MixinConfig) -> Alert:
    """GPUTelemetryAbsent with ``gpu_source=dcgm``: a rank's GPU that dcgm-exporter's joined series lack."""
    from otelprof.mixin import gpu_source

    q = Q(c.selector)
    info = q.sel(sc.GPU_INFO)
    record = gpu_source.record_name(sc.GPU_UTILIZATION)
    return Alert(
        "GPUTelemetryAbsent", GROUP_TELEMETRY,
        f"group by ({JOB}, {NODE}, {GPU}) (\n  {info}\n  unless on ({JOB}, {RANK}, {HW_ID}) {record}\n)\n"
        f"or {_unmapped(q)}",
        c.absent_for, "warning",
        "No dcgm-exporter series for a GPU of the job.",
        f"{AT_GPU}: a rank computes on this GPU (otelprof_gpu_info) but no dcgm-exporter utilization joins to it.",
        mc.DASHBOARD_GPU_SYSTEM, (JOB, NODE, GPU),
        Runbook(
            meaning="A training process names the GPU it computes on (otelprof_gpu_info, with the GPU's UUID and "
                    f"its pod), and no {sc.DCGM_GPU_UTIL} series with that UUID and pod is there "
                    f"({sc.DCGM_GR_ENGINE_ACTIVE} for a MIG instance, with its GPU_I_ID): dcgm-exporter "
                    "does not run on the node, is not scraped, lost the GPU, or its pod labels do not name the "
                    "training pod, so every GPU alert of this job has nothing to judge. "
                    f"gpu=\"{UNMAPPED_GPU}\": a rank was given a GPU or MIG instance but cannot tell which "
                    "(otelprof_gpu_unmapped{reason}), so it exports no otelprof_gpu_info to join.",
            thresholds=_params(("for", c.absent_for), ("dcgm_pod_label", c.dcgm_pod_label),
                               ("dcgm_namespace_label", c.dcgm_namespace_label)),
            limit=f"One GPU of the job without a joined dcgm-exporter series; fires {c.absent_for} after the "
                  "recording rule otelprof-dcgm last joined it (at once when it never did).",
            todo=f"Query {sc.DCGM_GPU_UTIL}{{UUID=\"<hw_id of the alert>\"}}: absent -> dcgm-exporter or its "
                 "scrape; present -> compare its pod/namespace labels (exported_pod with the ServiceMonitor's "
                 "honorLabels: false) with the mixin's dcgm_pod_label / dcgm_namespace_label, and check that "
                 "dcgm-exporter's pod attribution (kubelet pod-resources socket) is on.",
            deviations="No original."))
