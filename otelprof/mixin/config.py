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
    # ---- selectors
    selector: str = ""
    """Extra label matchers on every otelprof series, e.g. ``namespace="ml"``."""
    up_selector: str = ""
    """Extra label matchers on ``up`` (the target-down alert only looks at targets that exposed otelprof)."""
    target_labels: tuple[str, str] = ("job", "instance")
    """Labels Prometheus gives a scrape target (joined with ``up``)."""
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
    eval_phase: str = "eval"

    # ---- the common time base of the sampled checks (500 samples / 1000 samples at 500 ms)
    window: str = "250s"
    patience: str = "500s"
    """Warm-up after process start before the sampled checks judge (the originals' 1000-sample patience)."""

    # ---- CPUBottleneck / IOBottleneck (thresholds of the in-process coincidence counters)
    cpu_threshold: float = thresholds.CPU_HIGH
    gpu_threshold: float = thresholds.GPU_LOW
    io_threshold: float = thresholds.IOWAIT_HIGH
    cpu_bottleneck_threshold: float = 0.5
    io_bottleneck_threshold: float = 0.5
    bottleneck_for: str = "1m"

    # ---- LowGPUUtilization
    low_gpu_threshold_p95: float = 0.7
    low_gpu_threshold_p5: float = 0.1
    low_gpu_for: str = "1m"

    # ---- BatchSize
    batch_size_cpu_threshold_p95: float = 0.7
    batch_size_gpu_threshold_p95: float = 0.7
    batch_size_gpu_memory_threshold_p95: float = 0.7
    batch_size_for: str = "5m"

    # ---- GPUMemoryIncrease (mean of one window vs the window before)
    gpu_memory_increase: float = 0.05
    gpu_memory_increase_window: str = "1m"

    # ---- GPU memory near capacity (beyond the originals)
    gpu_memory_capacity_threshold: float = 0.95
    gpu_memory_capacity_window: str = "5m"

    # ---- host memory (beyond the originals): a process's resident memory growing, the container near its limit
    host_memory_increase_window: str = "5m"
    host_memory_increase: float = 0.1
    """The mean resident memory of one window must exceed the window before by this share of it..."""
    host_memory_increase_min_bytes: float = 64 * 2**20
    """...and by this many bytes."""
    host_memory_increase_for: str = "2m"
    host_memory_limit_threshold: float = 0.9
    """The container's working set over its memory limit (without a limit: the host's used memory ratio)."""
    host_memory_limit_window: str = "2m"

    # ---- LoadBalancing (spread of window-mean utilization across the job's GPUs)
    load_balancing_threshold: float = 0.2
    load_balancing_for: str = "5m"

    # ---- rank straggler (beyond the originals)
    straggler_window: str = "5m"
    straggler_ratio: float = 1.2
    straggler_for: str = "2m"

    # ---- StepOutlier. The training process flags each outlier step (OTELPROF_OUTLIER_SIGMA, _MIN_RATIO,
    # _MIN_EXCESS_MS); the next three fields state those settings for the runbook, and the offline twin
    # flags a recording's steps with the settings the recording carries, else with these.
    step_outlier_sigma: float = thresholds.OUTLIER_SIGMA
    step_outlier_min_ratio: float = thresholds.OUTLIER_MIN_RATIO
    """An outlier step also takes at least this many times the median of its phase's recent steps."""
    step_outlier_min_excess: float = thresholds.OUTLIER_MIN_EXCESS
    """...and at least this many seconds more than that median."""
    step_outlier_window: str = "10m"
    step_outlier_n_outliers: int = 10
    step_outlier_min_steps: int = 100
    step_outlier_min_cost: float = 0.05
    """...and the outlier steps must have lost more than this share of the window's step time (their time above
    the median step); below it the outliers stay in the report's list and the traces, without an alert."""

    # ---- MaxInitializationTime
    max_initialization_time: str = "20m"

    # ---- Dataloader (workers vs the CPUs the container may use)
    dataloader_min_threshold: float = 0.7
    dataloader_max_threshold: float = 2.0
    dataloader_for: str = "1m"

    # ---- input-bound steps (beyond the originals)
    input_bound_threshold: float = 0.5
    input_bound_window: str = "5m"
    input_bound_for: str = "1m"

    # ---- training rules
    loss_window: str = "15m"
    loss_diff_percent: float = 0.1
    """LossNotDecreasing: the mean loss must fall by at least this percentage per window..."""
    loss_noise_sigmas: float = 2.0
    """...and it fires only when the later mean exceeds that mark by more than this many standard errors of the
    difference of the two windows' means (their noise, from the per-step sums of squares): a shortfall within
    the noise is no evidence of a plateau."""
    loss_for: str = "5m"
    # ---- LossSpike: the training process flags a loss above ratio x the median and mean + sigma x stddev of
    # its phase's recent losses (otelprof.thresholds); the fields state those settings for the runbook.
    loss_spike_ratio: float = thresholds.LOSS_SPIKE_RATIO
    loss_spike_sigma: float = thresholds.LOSS_SPIKE_SIGMA
    loss_spike_window: str = "10m"
    nonfinite_window: str = "10m"
    vanishing_gradient_threshold: float = 1e-7
    vanishing_gradient_window: str = "5m"
    stalled_training_threshold: str = "30m"
    overfit_ratio_threshold: float = 0.1
    overfit_window: str = "15m"
    overfit_for: str = "5m"
    # ---- per-layer tensor checks: the training process judges each saved step with the offline rules'
    # conditions and thresholds (otelprof.tensor_checks) and counts the flags; the alerts read the counts.
    tensor_window: str = "1h"
    """A per-layer alert fires while a flag was counted within this window (make it longer than the time between
    two saved steps, OTELPROF_SAVE_INTERVAL steps)."""
    overtraining_delta: float = tensor_checks.OVERTRAINING_DELTA
    overtraining_window: str = "15m"
    """Overtraining: the evaluation loss's per-step mean over this window (it must hold an evaluation pass)..."""
    overtraining_lookback: str = "3h"
    """...against its lowest such mean over this lookback."""
    overtraining_for: str = "15m"
    custom_rules: str = ""
    """A JSON/YAML file of your own alert rules (PromQL with runbook text) added to the generated files
    (:mod:`otelprof.mixin.custom_alerts`)."""

    # ---- telemetry absent
    absent_lookback: str = "1h"
    absent_for: str = "1m"
    sampler_window: str = "2m"
    dropped_window: str = "10m"
    rules_missing_for: str = "15m"
    """RecordingRulesMissing: how long processes are scraped while a recording group records nothing before it
    fires (longer than a Prometheus or a rule file takes to load and evaluate a group)."""

    # ---- dashboard pre-aggregation (otelprof.mixin.recording_rules)
    dashboard_rate_window: str = "1m"
    """Window of the per-interval recording rules the dashboards read instead of ``$__rate_interval``: Grafana's
    rate interval at the default 15 s scrape (4 x scrape). Set 4 x your scrape interval."""
    recording_interval: str = "30s"
    """Evaluation interval of the recording groups ``otelprof-recording`` and ``otelprof-recording-system``, whose
    windows are all 250 s or longer (empty: Prometheus's global one). At a thousand ranks each costs 2-3 s of a
    core per evaluation (docs/scale.md); the alerts that read them judge values up to this much older."""

    # ---- routing and links
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
        elif isinstance(current, int):
            value = int(raw)
        elif isinstance(current, float):
            value = float(raw)
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
