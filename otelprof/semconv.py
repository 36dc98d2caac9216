"""The catalog of every metric, span and attribute name otelprof emits.

Rules, dashboards, the report, the docs and the tests take names from here and
nowhere else. OpenTelemetry semantic conventions are used where they exist
(``service.*``, ``host.*``, ``k8s.*``, ``process.*``); training concepts live
under ``otelprof.*``. Units are base units (seconds, bytes, ratio 0-1).
:func:`prometheus_name` gives the name each metric has on ``/metrics``,
following the OpenTelemetry-to-Prometheus compatibility rules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


# ---------------------------------------------------------------- labels (metric point attributes)
# Identity labels: on every otelprof series, so the same selectors work whether
# Prometheus scraped /metrics or received OTLP through a collector.
LABEL_JOB = "job_name"
LABEL_RANK = "rank"
LABEL_LOCAL_RANK = "local_rank"
LABEL_NODE = "node"
IDENTITY_LABELS: tuple[str, ...] = (LABEL_JOB, LABEL_RANK, LABEL_LOCAL_RANK, LABEL_NODE)

LABEL_PHASE = "phase"
LABEL_ANNOTATION = "annotation"
LABEL_SCALAR = "scalar"
LABEL_EXPORTER = "exporter"
LABEL_REASON = "reason"

OTHER_LABEL_VALUE = "other"
"""Value of ``phase``/``annotation`` once ``OTELPROF_MAX_LABEL_VALUES`` names are in use."""
NO_PHASE = "none"
"""``phase`` of an annotation made outside any step (initialization, checkpointing)."""

# ---------------------------------------------------------------- resource attributes
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"
SERVICE_VERSION = "service.version"
HOST_NAME = "host.name"
PROCESS_PID = "process.pid"
K8S_POD_NAME = "k8s.pod.name"
K8S_NAMESPACE_NAME = "k8s.namespace.name"
K8S_NODE_NAME = "k8s.node.name"
K8S_CONTAINER_NAME = "k8s.container.name"
OTELPROF_RUN_ID = "otelprof.run.id"
OTELPROF_RANK = "otelprof.rank"
OTELPROF_LOCAL_RANK = "otelprof.local_rank"
OTELPROF_WORLD_SIZE = "otelprof.world_size"
OTELPROF_VERSION = "otelprof.version"

# ---------------------------------------------------------------- span names and attributes
SPAN_STEP = "otelprof.step"
"""Root span of one training step; its children are the step's annotations (named as annotated)."""
ATTR_STEP_NUMBER = "otelprof.step.number"
ATTR_STEP_PHASE = "otelprof.step.phase"
ATTR_STEP_OUTLIER = "otelprof.step.outlier"
ATTR_SPAN_REASON = "otelprof.span.reason"
ATTR_ANNOTATION = "otelprof.annotation"
ATTR_ERROR = "otelprof.error"
ATTR_SCALAR_PREFIX = "otelprof.scalar."
"""Recorded scalars become span attributes ``otelprof.scalar.<name>``."""

SPAN_REASONS: tuple[str, ...] = ("first", "every", "window", "outlier", "budget", "annotation")


@dataclass(frozen=True)
class AttributeSpec:
    name: str
    where: str
    description: str


ATTRIBUTES: tuple[AttributeSpec, ...] = (
    AttributeSpec(SERVICE_NAME, "resource", "Training job name (`OTELPROF_JOB_NAME`)."),
    AttributeSpec(SERVICE_INSTANCE_ID, "resource", "`<run id>-rank<rank>`: one process of one run."),
    AttributeSpec(SERVICE_VERSION, "resource", "Not set by otelprof; give it via `OTEL_RESOURCE_ATTRIBUTES`."),
    AttributeSpec(HOST_NAME, "resource", "Host (container) name."),
    AttributeSpec(PROCESS_PID, "resource", "Process id of the rank."),
    AttributeSpec(K8S_POD_NAME, "resource", "Pod name (downward API, `OTELPROF_POD_NAME`)."),
    AttributeSpec(K8S_NAMESPACE_NAME, "resource", "Pod namespace (`OTELPROF_POD_NAMESPACE`)."),
    AttributeSpec(K8S_NODE_NAME, "resource", "Kubernetes node (`OTELPROF_NODE_NAME`)."),
    AttributeSpec(K8S_CONTAINER_NAME, "resource", "Container name (`OTELPROF_CONTAINER_NAME`)."),
    AttributeSpec(OTELPROF_RUN_ID, "resource", "Run id, shared by all ranks of one run."),
    AttributeSpec(OTELPROF_RANK, "resource", "Global rank (`RANK`)."),
    AttributeSpec(OTELPROF_LOCAL_RANK, "resource", "Rank within the node (`LOCAL_RANK`)."),
    AttributeSpec(OTELPROF_WORLD_SIZE, "resource", "Number of ranks (`WORLD_SIZE`)."),
    AttributeSpec(OTELPROF_VERSION, "resource", "otelprof version."),
    AttributeSpec(ATTR_STEP_NUMBER, "span", "Step number (per phase, from 0 unless given)."),
    AttributeSpec(ATTR_STEP_PHASE, "span", "Phase of the step: train, eval, ..."),
    AttributeSpec(ATTR_STEP_OUTLIER, "span", "True when the step was slower than mean + sigma x stddev."),
    AttributeSpec(ATTR_SPAN_REASON, "span", "Why this step was traced: " + ", ".join(SPAN_REASONS) + "."),
    AttributeSpec(ATTR_ANNOTATION, "span", "True on spans made from `annotate()`."),
    AttributeSpec(ATTR_ERROR, "span", "The exception type when user code raised inside the step or annotation."),
    AttributeSpec(ATTR_SCALAR_PREFIX + "<name>", "span", "A scalar recorded with `record()` during the step."),
    AttributeSpec(LABEL_JOB, "metric", "Training job name (same as `service.name`)."),
    AttributeSpec(LABEL_RANK, "metric", "Global rank."),
    AttributeSpec(LABEL_LOCAL_RANK, "metric", "Rank within the node."),
    AttributeSpec(LABEL_NODE, "metric", "Kubernetes node name, else host name."),
    AttributeSpec(LABEL_PHASE, "metric", "train, eval, ... (`none` outside steps); bounded."),
    AttributeSpec(LABEL_ANNOTATION, "metric", "Annotated region name; bounded by `OTELPROF_MAX_LABEL_VALUES`."),
    AttributeSpec(LABEL_SCALAR, "metric", "Which recorded scalar (loss, grad_norm)."),
    AttributeSpec(LABEL_EXPORTER, "metric", "queue, otlp_traces, otlp_metrics, recording."),
    AttributeSpec(LABEL_REASON, "metric", "Why a span was built (see `otelprof.span.reason`)."),
)

# ---------------------------------------------------------------- metrics

DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
"""Explicit buckets in seconds, 100 us to 10 min (the SDK's defaults assume milliseconds)."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric: OTel name, kind, unit, description and labels beyond the identity labels."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def prometheus_name(self) -> str:
        """The metric family name on ``/metrics`` (counters gain ``_total`` in the samples)."""
        return prometheus_name(self.name, self.unit, self.kind)

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        return IDENTITY_LABELS + self.labels


STEP_DURATION = MetricSpec(
    "otelprof.step.duration", Kind.HISTOGRAM, "s",
    "Wall time of each training step, from entering step() to leaving it.", (LABEL_PHASE,), DURATION_BUCKETS)
STEPS = MetricSpec(
    "otelprof.steps", Kind.COUNTER, "{step}", "Steps finished.", (LABEL_PHASE,))
STEP_OUTLIERS = MetricSpec(
    "otelprof.step.outliers", Kind.COUNTER, "{step}",
    "Steps slower than mean + OTELPROF_OUTLIER_SIGMA x stddev of the recent steps of their phase.", (LABEL_PHASE,))
STEP_LAST_TIMESTAMP = MetricSpec(
    "otelprof.step.last_timestamp", Kind.GAUGE, "s", "Unix time the last step of the phase ended.", (LABEL_PHASE,))
STEP_FIRST_TIMESTAMP = MetricSpec(
    "otelprof.step.first_timestamp", Kind.GAUGE, "s",
    "Unix time the first step of the process started (absent until then).")
STEP_NUMBER = MetricSpec(
    "otelprof.step.number", Kind.GAUGE, "{step}", "Number of the last finished step of the phase.", (LABEL_PHASE,))
PROCESS_START_TIME = MetricSpec(
    "otelprof.process.start_time", Kind.GAUGE, "s", "Unix time the training process started.")
PHASE_ACTIVE = MetricSpec(
    "otelprof.phase.active", Kind.GAUGE, "",
    "1 for the phase the process is in now, 0 for phases it was in before.", (LABEL_PHASE,))
ANNOTATION_DURATION = MetricSpec(
    "otelprof.annotation.duration", Kind.HISTOGRAM, "s",
    "Wall time of annotated regions (annotate(), annotation_begin/end).",
    (LABEL_PHASE, LABEL_ANNOTATION), DURATION_BUCKETS)
SAMPLES = MetricSpec(
    "otelprof.samples", Kind.COUNTER, "{sample}",
    "Samples processed, from record('samples', n); rate() is throughput.", (LABEL_PHASE,))
TOKENS = MetricSpec(
    "otelprof.tokens", Kind.COUNTER, "{token}",
    "Tokens processed, from record('tokens', n); rate() is throughput.", (LABEL_PHASE,))
LOSS = MetricSpec("otelprof.loss", Kind.GAUGE, "", "Last recorded loss.", (LABEL_PHASE,))
LEARNING_RATE = MetricSpec("otelprof.learning_rate", Kind.GAUGE, "", "Last recorded learning rate.", (LABEL_PHASE,))
GRAD_NORM = MetricSpec("otelprof.grad_norm", Kind.GAUGE, "", "Last recorded global gradient norm.", (LABEL_PHASE,))
NONFINITE = MetricSpec(
    "otelprof.nonfinite", Kind.COUNTER, "{value}", "Recorded loss or gradient-norm values that were NaN or infinite.",
    (LABEL_PHASE, LABEL_SCALAR))
EXPORTER_DROPPED = MetricSpec(
    "otelprof.exporter.dropped", Kind.COUNTER, "{item}",
    "Records, spans or metric exports otelprof dropped instead of blocking training "
    "(queue full, collector down, disk full).", (LABEL_EXPORTER,))
SPANS_BUILT = MetricSpec(
    "otelprof.spans", Kind.COUNTER, "{span}", "Spans built, by the reason they were selected.", (LABEL_REASON,))
SPAN_BUILD_TIME = MetricSpec(
    "otelprof.span.build_time", Kind.COUNTER, "s",
    "Background-thread time spent building and exporting spans (what the span budget limits).")
RECORDING_BYTES = MetricSpec(
    "otelprof.recording.bytes", Kind.COUNTER, "By", "Bytes written to the local run recording.")

METRICS: tuple[MetricSpec, ...] = (
    STEP_DURATION, STEPS, STEP_OUTLIERS, STEP_LAST_TIMESTAMP, STEP_FIRST_TIMESTAMP, STEP_NUMBER,
    PROCESS_START_TIME, PHASE_ACTIVE, ANNOTATION_DURATION, SAMPLES, TOKENS, LOSS, LEARNING_RATE,
    GRAD_NORM, NONFINITE, EXPORTER_DROPPED, SPANS_BUILT, SPAN_BUILD_TIME, RECORDING_BYTES,
)

# record(name, value): names with a metric of their own. Other names go to spans and the recording only.
SCALAR_GAUGES: dict[str, MetricSpec] = {"loss": LOSS, "learning_rate": LEARNING_RATE, "lr": LEARNING_RATE,
                                        "grad_norm": GRAD_NORM}
SCALAR_COUNTERS: dict[str, MetricSpec] = {"samples": SAMPLES, "tokens": TOKENS}
NONFINITE_CHECKED: tuple[str, ...] = ("loss", "grad_norm")

# ---------------------------------------------------------------- OTel -> Prometheus names

_UNIT_WORDS = {
    "s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds",
    "min": "minutes", "h": "hours", "d": "days",
    "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
    "W": "watts", "J": "joules", "V": "volts", "A": "amperes", "Hz": "hertz", "MHz": "megahertz",
    "Cel": "celsius", "%": "percent", "1": "",
}
_PER_WORDS = {"s": "second", "min": "minute", "h": "hour"}


def _unit_suffix(unit: str) -> str:
    unit = re.sub(r"\{[^}]*\}", "", unit).strip()
    if not unit:
        return ""
    main, _, per = unit.partition("/")
    word = _UNIT_WORDS.get(main, main)
    if per:
        per_word = _PER_WORDS.get(per, _UNIT_WORDS.get(per, per))
        return f"{word}_per_{per_word}" if word else f"per_{per_word}"
    return word


def prometheus_name(name: str, unit: str, kind: Kind) -> str:
    """Prometheus metric family name for an OTel metric (without the counter's ``_total``)."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    base = re.sub(r"__+", "_", base)
    suffix = _unit_suffix(unit)
    if unit == "1" and kind is Kind.GAUGE:
        suffix = "ratio"
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base


def by_prometheus_name() -> dict[str, MetricSpec]:
    return {m.prometheus_name: m for m in METRICS}
