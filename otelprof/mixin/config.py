"""The mixin's one config: selectors, thresholds, windows, ``for`` durations, actions and URLs.

Parameter names follow SageMaker Debugger's rules where one exists (``cpu_threshold``,
``threshold_p95``, ``patience``, ``window``, ``n_outliers``, ...), prefixed with the check
they belong to. Defaults come from :mod:`otelprof.thresholds` and the design's rule definitions:
the 500-sample window and 1000-sample patience of the originals become 250 s and 500 s
at the sampler's 500 ms. Override any field with :func:`dataclasses.replace`, or on the
command line with ``otelprof mixin --set name=value``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from otelprof import tensor_checks, thresholds

ALERT_PREFIX = "Otelprof"
PROJECT_URL = "https://github.com/otelprof/otelprof/"
"""The project's home: the default runbook link and the package metadata point here."""

# Dashboard UIDs; the dashboards are generated with exactly these.
DASHBOARD_TRAINING_REPORT = "otelprof-training-report"
DASHBOARD_GPU_SYSTEM = "otelprof-gpu-system"
DASHBOARD_RANKS = "otelprof-ranks"
DASHBOARD_TIMELINE = "otelprof-timeline"

ACTION_STOP = "stop"
ACTION_CAPTURE = "capture"
ACTIONS = (ACTION_STOP, ACTION_CAPTURE)

SEVERITIES = ("critical", "warning", "info")

GPU_SOURCE_OTELPROF = "otelprof"
GPU_SOURCE_DCGM = "dcgm"
GPU_SOURCES = (GPU_SOURCE_OTELPROF, GPU_SOURCE_DCGM)


@dataclass(frozen=True)
class MixinConfig:
    # ---- Selectors and phases
    selector: str = ""
    """Extra label matchers on every otelprof series, e.g. ``namespace="ml"``."""
    up_selector: str = ""
    """Extra label matchers on ``up`` in TargetDown (which only looks at targets that exposed otelprof)."""
    target_labels: tuple[str, str] = ("job", "instance")
    """Labels Prometheus gives a scrape target: TargetDown joins ``up`` to the ranks' series on them."""
    gpu_source: str = GPU_SOURCE_OTELPROF
    """Where the GPU alerts, recording rules and dashboard panels read GPU readings: ``otelprof`` (its own NVML
    sampling) or ``dcgm`` (NVIDIA dcgm-exporter's ``DCGM_FI_DEV_*`` series, joined to the ranks through the pod
    and the GPU UUID in ``otelprof_gpu_info``; run the job with ``OTELPROF_GPU_SAMPLING=false``)."""
    dcgm_selector: str = ""
    """Extra label matchers on dcgm-exporter's series, e.g. ``job="nvidia-dcgm-exporter"``."""
    dcgm_pod_label: str = "exported_pod"
    """The label of dcgm-exporter's series holding the training pod: ``exported_pod`` when its ServiceMonitor
    keeps ``honorLabels: false`` (the chart's default; ``pod`` is then dcgm-exporter's own pod), ``pod`` with
    ``honorLabels: true``."""
    dcgm_namespace_label: str = "exported_namespace"
    """The label of dcgm-exporter's series holding the training pod's namespace (``namespace`` with
    ``honorLabels: true``)."""
    train_phase: str = "train"
    """The ``phase`` label value of training steps: the loss, gradient-norm and overfitting checks and the
    dashboards' training panels read this phase's steps."""
    eval_phase: str = "eval"
    """The ``phase`` label value of evaluation steps, whose loss Overfitting and Overtraining compare with the
    training phase's."""

    # ---- The common time base of the sampled checks
    # The originals' 500 samples and 1000 samples at the sampler's 500 ms.
    window: str = "250s"
    """Window (a Prometheus duration) of the sampled checks: CPU and I/O bottleneck shares, GPU utilization and
    memory percentiles, batch size and load balance are judged over the samples of this long."""
    patience: str = "500s"
    """Warm-up after process start before the sampled checks judge (the originals' 1000-sample patience)."""

    # ---- CPUBottleneck, IOBottleneck
    # The training process counts each sample where a CPU was busy (or in iowait) while a GPU was idle, with its
    # own OTELPROF_CPU_HIGH_THRESHOLD, OTELPROF_IOWAIT_HIGH_THRESHOLD and OTELPROF_GPU_LOW_THRESHOLD; the first
    # three fields state those for the texts and panels, and the offline checks count a recording's samples with
    # them.
    cpu_threshold: float = thresholds.CPU_HIGH
    """A sample counts as CPU-busy when a CPU's utilization (share, 0-1) is above this (in the process:
    OTELPROF_CPU_HIGH_THRESHOLD)."""
    gpu_threshold: float = thresholds.GPU_LOW
    """A sample counts as GPU-idle when a GPU's utilization (share, 0-1) is below this (in the process:
    OTELPROF_GPU_LOW_THRESHOLD)."""
    io_threshold: float = thresholds.IOWAIT_HIGH
    """A sample counts as I/O-bound when a CPU's iowait share (0-1) is above this (in the process:
    OTELPROF_IOWAIT_HIGH_THRESHOLD)."""
    cpu_bottleneck_threshold: float = 0.5
    """CPUBottleneck fires when more than this share (0-1) of the node's samples of the last ``window`` were
    CPU-busy while a GPU was idle."""
    io_bottleneck_threshold: float = 0.5
    """IOBottleneck fires when more than this share (0-1) of the node's samples of the last ``window`` were
    I/O-bound while a GPU was idle."""
    bottleneck_for: str = "1m"
    """``for`` of CPUBottleneck and IOBottleneck: how long the share stays above its threshold before they fire."""

    # ---- GPUUnderutilized, GPUUtilizationFluctuating
    # SageMaker Debugger's LowGPUUtilization.
    low_gpu_threshold_p95: float = 0.7
    """GPUUnderutilized fires when a GPU's 95th-percentile utilization (share, 0-1) over ``window`` is below
    this; GPUUtilizationFluctuating needs the 95th percentile above it."""
    low_gpu_threshold_p5: float = 0.1
    """GPUUtilizationFluctuating fires when a GPU's 5th-percentile utilization (share, 0-1) over ``window`` is
    below this (while its 95th percentile is above ``low_gpu_threshold_p95``)."""
    low_gpu_for: str = "1m"
    """``for`` of GPUUnderutilized and GPUUtilizationFluctuating."""

    # ---- BatchSizeTooSmall
    # SageMaker Debugger's BatchSize.
    batch_size_cpu_threshold_p95: float = 0.7
    """BatchSizeTooSmall: the node's 95th-percentile mean CPU utilization (share, 0-1) over ``window`` must be
    below this."""
    batch_size_gpu_threshold_p95: float = 0.7
    """BatchSizeTooSmall: the GPU's 95th-percentile utilization (share, 0-1) over ``window`` must be below this."""
    batch_size_gpu_memory_threshold_p95: float = 0.7
    """BatchSizeTooSmall: the GPU's 95th-percentile memory use (share of the device, 0-1) over ``window`` must
    be below this."""
    batch_size_for: str = "5m"
    """``for`` of BatchSizeTooSmall."""

    # ---- GPUMemoryIncrease
    # The mean of one window against the window before.
    gpu_memory_increase: float = 0.05
    """GPUMemoryIncrease fires when a GPU's mean memory use over the last window exceeds the window before's by
    more than this share of the device's memory (0-1, absolute points)."""
    gpu_memory_increase_window: str = "1m"
    """The length of each of GPUMemoryIncrease's two compared windows."""

    # ---- GPUMemoryNearCapacity
    gpu_memory_capacity_threshold: float = 0.95
    """GPUMemoryNearCapacity fires when a GPU's mean memory use over ``gpu_memory_capacity_window`` is above this
    share (0-1) of the device."""
    gpu_memory_capacity_window: str = "5m"
    """The window of GPUMemoryNearCapacity's mean memory use."""

    # ---- HostMemoryIncrease, HostMemoryNearLimit
    # A process's resident memory growing; the container near its limit.
    host_memory_increase_window: str = "5m"
    """The length of each of HostMemoryIncrease's two compared windows of mean resident memory."""
    host_memory_increase: float = 0.1
    """HostMemoryIncrease: the mean resident memory of one window must exceed the window before's by more than
    this share (0-1) of it (and by ``host_memory_increase_min_bytes``)."""
    host_memory_increase_min_bytes: float = 64 * 2**20
    """HostMemoryIncrease: the growth of the mean resident memory must also exceed this many bytes."""
    host_memory_increase_for: str = "2m"
    """``for`` of HostMemoryIncrease."""
    host_memory_limit_threshold: float = 0.9
    """HostMemoryNearLimit fires when the container's mean working set is above this share (0-1) of its memory
    limit (without a limit: when the host's used memory is above this share of its total)."""
    host_memory_limit_window: str = "2m"
    """The window of HostMemoryNearLimit's mean working set (or host memory use)."""

    # ---- GPULoadImbalance
    # SageMaker Debugger's LoadBalancing: the spread of window-mean utilization across the job's GPUs.
    load_balancing_threshold: float = 0.2
    """GPULoadImbalance fires when the window-mean utilization of the job's busiest GPU exceeds its idlest's by
    more than this (share, 0-1, absolute points)."""
    load_balancing_for: str = "5m"
    """``for`` of GPULoadImbalance."""

    # ---- RankStraggler
    straggler_window: str = "5m"
    """The window of each rank's mean compute time per step that RankStraggler compares (also the step-time
    percentile rules' window)."""
    straggler_ratio: float = 1.2
    """RankStraggler fires when a rank's mean compute time per step is more than this many times the median of
    its peers'."""
    straggler_for: str = "2m"
    """``for`` of RankStraggler."""

    # ---- StepOutliers
    # The training process flags each outlier step (OTELPROF_OUTLIER_SIGMA, _MIN_RATIO, _MIN_EXCESS_MS); the next
    # three fields state those settings for the runbook, and the offline twin flags a recording's steps with the
    # settings the recording carries, else with these.
    step_outlier_sigma: float = thresholds.OUTLIER_SIGMA
    """An outlier step takes longer than the mean plus this many standard deviations of its phase's recent
    steps (in the process: OTELPROF_OUTLIER_SIGMA)."""
    step_outlier_min_ratio: float = thresholds.OUTLIER_MIN_RATIO
    """An outlier step also takes at least this many times the median of its phase's recent steps (in the
    process: OTELPROF_OUTLIER_MIN_RATIO)."""
    step_outlier_min_excess: float = thresholds.OUTLIER_MIN_EXCESS
    """An outlier step also takes at least this many seconds more than that median (in the process:
    OTELPROF_OUTLIER_MIN_EXCESS_MS, in milliseconds)."""
    step_outlier_window: str = "10m"
    """The window over which StepOutliers counts outlier steps and weighs their cost."""
    step_outlier_n_outliers: int = 10
    """StepOutliers needs more than this many outlier steps in ``step_outlier_window``."""
    step_outlier_min_steps: int = 100
    """StepOutliers needs more than this many steps of the phase in ``step_outlier_window``."""
    step_outlier_min_cost: float = 0.05
    """StepOutliers fires when the outlier steps lost more than this share (0-1) of the window's step time (their
    time above the median step); below it the outliers stay in the report's list and the traces, without an
    alert."""

    # ---- SlowInitialization
    # SageMaker Debugger's MaxInitializationTime.
    max_initialization_time: str = "20m"
    """SlowInitialization fires when a process started this long ago and has not begun its first step."""

    # ---- TooFewDataLoaderWorkers, TooManyDataLoaderWorkers
    # SageMaker Debugger's Dataloader: data-loader workers against the CPUs the container may use.
    dataloader_min_threshold: float = 0.7
    """TooFewDataLoaderWorkers fires when a node's data-loader workers are fewer than this many per CPU the
    container may use (0.7: 70 % of the CPUs)."""
    dataloader_max_threshold: float = 2.0
    """TooManyDataLoaderWorkers fires when a node's data-loader workers are more than this many per CPU the
    container may use (2.0: 200 % of the CPUs)."""
    dataloader_for: str = "1m"
    """``for`` of TooFewDataLoaderWorkers and TooManyDataLoaderWorkers."""

    # ---- InputBound
    input_bound_threshold: float = 0.5
    """InputBound fires when steps spent on average more than this share (0-1) of their time waiting for the
    next batch over ``input_bound_window``."""
    input_bound_window: str = "5m"
    """The window of InputBound's mean data-wait share per step."""
    input_bound_for: str = "1m"
    """``for`` of InputBound."""

    # ---- LossNotDecreasing
    loss_window: str = "15m"
    """The length of each of LossNotDecreasing's two compared windows of mean training loss per step."""
    loss_diff_percent: float = 0.1
    """LossNotDecreasing: the mean training loss must fall by at least this percentage (0.1: 0.1 %) per
    ``loss_window``."""
    loss_noise_sigmas: float = 2.0
    """LossNotDecreasing fires only when the later mean exceeds that mark by more than this many standard errors
    of the difference of the two windows' means (their noise, from the per-step sums of squares): a shortfall
    within the noise is no evidence of a plateau."""
    loss_for: str = "5m"
    """``for`` of LossNotDecreasing."""

    # ---- LossSpike
    # The training process flags a loss above ratio x the median and mean + sigma x stddev of its phase's recent
    # losses (otelprof.thresholds); the fields state those settings for the runbook.
    loss_spike_ratio: float = thresholds.LOSS_SPIKE_RATIO
    """A loss spike is a finite loss above this many times the median of its phase's recent losses (judged in the
    training process)."""
    loss_spike_sigma: float = thresholds.LOSS_SPIKE_SIGMA
    """A loss spike is also above the mean plus this many standard deviations of the recent losses (judged in the
    training process)."""
    loss_spike_window: str = "10m"
    """LossSpike fires while a spike was flagged within this window."""

    # ---- NonFiniteValues, VanishingGradients, TrainingStalled, Overfitting
    nonfinite_window: str = "10m"
    """NonFiniteValues fires while a NaN or infinite loss or gradient norm was recorded within this window."""
    vanishing_gradient_threshold: float = 1e-7
    """VanishingGradients fires when the mean recorded gradient norm of the training steps of
    ``vanishing_gradient_window`` is below this (the norm's own unit)."""
    vanishing_gradient_window: str = "5m"
    """The window of VanishingGradients' mean gradient norm."""
    stalled_training_threshold: str = "30m"
    """TrainingStalled fires when no step of any phase of a scraped process has ended for this long (a
    duration)."""
    overfit_ratio_threshold: float = 0.1
    """Overfitting fires when (mean eval loss - mean train loss) / mean train loss over ``overfit_window`` is
    above this (0.1: 10 %)."""
    overfit_window: str = "15m"
    """The window of Overfitting's mean evaluation and training losses per step."""
    overfit_for: str = "5m"
    """``for`` of Overfitting."""

    # ---- Per-layer tensor checks, Overtraining
    # The training process judges each saved step with the offline rules' conditions and thresholds
    # (otelprof.tensor_checks) and counts the flags; the alerts read the counts.
    tensor_window: str = "1h"
    """A per-layer alert fires while a flag was counted within this window (make it longer than the time between
    two saved steps, OTELPROF_SAVE_INTERVAL steps)."""
    overtraining_delta: float = tensor_checks.OVERTRAINING_DELTA
    """Overtraining fires when the evaluation loss's window mean is more than this share (0.1: 10 %) above its
    lowest window mean within ``overtraining_lookback``."""
    overtraining_window: str = "15m"
    """Overtraining: the window of the evaluation loss's per-step mean (it must hold an evaluation pass)."""
    overtraining_lookback: str = "3h"
    """Overtraining: how far back it looks for the lowest window mean of the evaluation loss."""
    overtraining_for: str = "15m"
    """``for`` of Overtraining."""

    # ---- Custom rules
    custom_rules: str = ""
    """A JSON/YAML file of your own alert rules (PromQL with runbook text) added to the generated files
    (:mod:`otelprof.mixin.custom_alerts`)."""

    # ---- Missing telemetry
    # TargetDown, TelemetryAbsent, SystemTelemetryAbsent, GPUTelemetryAbsent, TelemetryDropped, RecordingRulesMissing.
    absent_lookback: str = "1h"
    """TargetDown, TelemetryAbsent and GPUTelemetryAbsent look this far back for a target, rank or GPU that
    reported before and is gone."""
    absent_for: str = "1m"
    """``for`` of the alerts on missing telemetry (target down, rank, node sampler or GPU absent)."""
    sampler_window: str = "2m"
    """SystemTelemetryAbsent fires when the node's sampler took no sample for this long (GPUTelemetryAbsent judges
    only nodes that sampled within it)."""
    dropped_window: str = "10m"
    """TelemetryDropped fires while otelprof dropped a record, span or metric export within this window."""
    rules_missing_for: str = "15m"
    """RecordingRulesMissing: how long processes are scraped while a recording group records nothing before it
    fires (longer than a Prometheus or a rule file takes to load and evaluate a group)."""

    # ---- Recording rules
    dashboard_rate_window: str = "1m"
    """Window of the per-interval recording rules the dashboards read instead of ``$__rate_interval``: Grafana's
    rate interval at the default 15 s scrape (4 x scrape). Set 4 x your scrape interval."""
    recording_interval: str = "30s"
    """Evaluation interval of the recording groups ``otelprof-recording`` and ``otelprof-recording-system``, whose
    windows are all 250 s or longer (empty: Prometheus's global one). At a thousand ranks each costs 2-3 s of a
    core per evaluation (docs/scale.md); the alerts that read them judge values up to this much older, and
    RecordingRulesMissing looks back three intervals (at least 5m) for a group's last evaluation."""

    # ---- Routing, links and deployment
    actions: tuple[tuple[str, str], ...] = field(default=(
        ("NonFiniteValues", ACTION_STOP),
        ("CPUBottleneck", ACTION_CAPTURE),
        ("IOBottleneck", ACTION_CAPTURE),
        ("InputBound", ACTION_CAPTURE),
        ("StepOutliers", ACTION_CAPTURE),
        ("RankStraggler", ACTION_CAPTURE),
    ))
    """``action`` label per alert (name without prefix); the webhook acts on it."""
    disabled_alerts: tuple[str, ...] = ()
    """Alerts (names without prefix) left out of the generated files."""
    runbook_url: str = PROJECT_URL + "blob/main/deploy/prometheus/runbook.md"
    """Where the runbook is, for each alert's ``runbook_url`` annotation (``<runbook_url>#<alert>``). The default is
    the project's runbook for the default settings; with your own settings, serve the ``runbook.md`` written
    beside the rules (a wiki, your repository) and set its URL, so the thresholds it states are yours."""
    grafana_url: str = "http://localhost:3000"
    """Grafana's base URL, for each alert's ``dashboard_url`` annotation and the generated values' ``root_url``
    (default: Grafana's own default address, e.g. behind ``kubectl port-forward``; set the URL your users open)."""
    webhook_url: str = "http://otelprof-webhook.ml.svc:9095/v1/alerts"
    """Where Alertmanager sends alerts with an ``action`` label (``otelprof webhook``) in the generated
    AlertmanagerConfig: the webhook Service's full name, since Alertmanager runs in another namespace."""
    prometheus_url: str = "http://prometheus:9090"
    """The Prometheus data source's URL in the generated Grafana provisioning."""
    tempo_url: str = "http://tempo:3200"
    """The Tempo data source's URL in the generated Grafana provisioning."""
    prometheus_rule_name: str = "otelprof"
    """``metadata.name`` of the generated PrometheusRule (prometheus-operator)."""
    prometheus_rule_release: str = "kube-prometheus-stack"
    """``release`` label of the PrometheusRule: kube-prometheus-stack only loads rules carrying its release name."""

    def action_for(self, short_name: str) -> str | None:
        for name, action in self.actions:
            if name == short_name:
                return action
        return None


_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def seconds(duration: str) -> float:
    """Seconds of a Prometheus duration such as ``250s``, ``5m``, ``1h30m``."""
    match = _DURATION.match(duration)
    if not duration or match is None:
        raise ValueError(f"not a duration: {duration!r} (use e.g. 250s, 5m, 1h)")
    hours, minutes, secs = (int(g) if g else 0 for g in match.groups())
    return float(hours * 3600 + minutes * 60 + secs)


MAX_SECONDS = (2**63 - 1) // 10**9
"""The longest duration Prometheus accepts (its durations are int64 nanoseconds)."""


def _duration(name: str, value: str) -> None:
    length = seconds(value)
    if length > MAX_SECONDS:
        raise ValueError(f"{name}={value} is longer than Prometheus accepts (at most {MAX_SECONDS // 3600}h)")
    if length <= 0 and not name.endswith("_for"):
        raise ValueError(f"{name} must be a positive duration, not {value!r}")


def validate(config: MixinConfig) -> None:
    """Raise ValueError for a config that would generate broken rules."""
    from otelprof.mixin.promql_check import check_label_name, check_label_value, check_selector

    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name.endswith(("window", "_for", "patience", "lookback", "_time", "stalled_training_threshold")) \
                and isinstance(value, str):
            _duration(f.name, value)
    if config.recording_interval:
        _duration("recording_interval", config.recording_interval)
    for name in ("selector", "up_selector", "dcgm_selector"):
        check_selector(getattr(config, name), name)
    for name in ("train_phase", "eval_phase"):
        check_label_value(getattr(config, name), name)
    for name in ("dcgm_pod_label", "dcgm_namespace_label"):
        check_label_name(getattr(config, name), name)
    for label in config.target_labels:
        check_label_name(label, "target_labels")
    if config.gpu_source not in GPU_SOURCES:
        raise ValueError(f"gpu_source must be one of {', '.join(GPU_SOURCES)}, not {config.gpu_source!r}")
    for name, action in config.actions:
        if action not in ACTIONS:
            raise ValueError(f"action of {name} must be one of {', '.join(ACTIONS)}, not {action!r}")


def with_overrides(config: MixinConfig, assignments: list[str]) -> MixinConfig:
    """``config`` with ``name=value`` assignments applied (typed by the field's default)."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    changes: dict[str, object] = {}
    for item in assignments:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise ValueError(f"unknown mixin setting {name!r} (settings: {', '.join(sorted(fields))})")
        current = getattr(config, name)
        value: object
        if isinstance(current, bool):
            value = raw.strip().lower() in ("1", "true", "yes")
        elif isinstance(current, (int, float)):
            try:
                value = type(current)(raw)
            except ValueError:
                raise ValueError(f"{name} must be a number, not {raw.strip()!r}") from None
        elif name == "actions":
            value = tuple(tuple(part.split(":", 1)) for part in raw.split(",") if part)
        elif isinstance(current, tuple):
            value = tuple(part.strip() for part in raw.split(",") if part.strip())
        else:
            value = raw
        changes[name] = value
    result = dataclasses.replace(config, **changes)  # type: ignore[arg-type]
    validate(result)
    return result


def settings_file(path: str) -> list[str]:
    """``name=value`` assignments from a JSON or YAML mapping of MixinConfig fields (lists: comma lists;
    ``actions``: a mapping of alert to action). YAML needs PyYAML; JSON needs nothing. Raises ValueError with
    one line for a file that cannot be read or is not such a mapping."""
    import json

    from otelprof._log import escape as one_line

    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
        if path.endswith(".json"):
            data = json.loads(text)
        else:
            try:
                import yaml
            except ImportError:
                raise ValueError(f"{path}: a YAML config file needs PyYAML (pip install pyyaml); "
                                 "or give a .json file") from None
            data = yaml.safe_load(text)
    except ValueError as exc:  # json.JSONDecodeError too
        raise ValueError(f"cannot read the config file {path}: {one_line(str(exc))}") from None
    except Exception as exc:  # OSError, UnicodeDecodeError, yaml.YAMLError
        raise ValueError(f"cannot read the config file {path}: {one_line(str(exc))}") from None
    if data is None:
        return []
    if not isinstance(data, dict):
        raise ValueError(f"{path} must be a mapping of mixin settings (name: value)")
    assignments = []
    for name, value in data.items():
        if isinstance(value, dict):
            value = ",".join(f"{k}:{v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "true" if value else "false"
        elif value is None or isinstance(value, (int, float, str)):
            value = "" if value is None else value
        else:
            raise ValueError(f"{path}: {name} must be a scalar, a list or a mapping")
        assignments.append(f"{name}={value}")
    return assignments


def from_settings(path: str | None, assignments: list[str] | None) -> MixinConfig:
    """The default config with the settings of the file ``path`` (:func:`settings_file`, when given) and then the
    ``name=value`` ``assignments`` applied: ``--config FILE`` and ``--set`` of ``otelprof mixin``, ``check`` and
    ``report``, the later winning. Raises ValueError with one line."""
    from_file = settings_file(path) if path else []
    return with_overrides(MixinConfig(), from_file + list(assignments or []))
