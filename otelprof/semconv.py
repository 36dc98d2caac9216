"""The catalog of every metric, span and attribute name otelprof emits.

Rules, dashboards, the report, the docs and the tests take names from here and
nowhere else. OpenTelemetry semantic conventions are used where they exist
(``service.*``, ``host.*``, ``k8s.*``, ``process.*``, ``system.*``, ``container.*``, ``hw.*``); training
concepts live under ``otelprof.*``. Units are base units (seconds, bytes, ratio 0-1).
:func:`prometheus_name` gives the name each metric has on ``/metrics``,
following the OpenTelemetry-to-Prometheus compatibility rules. Where each attribute appears and what it means:
:mod:`otelprof.semconv_attributes`; the series of NVIDIA's dcgm-exporter the mixin can read instead of
otelprof's GPU series: :mod:`otelprof.dcgm_series`.
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
LABEL_GPU = "gpu"
LABEL_HW_ID = "hw.id"
LABEL_HW_TYPE = "hw.type"
HW_TYPE_GPU = "gpu"
"""The one value of ``hw.type``: the semantic conventions' generic ``hw.*`` metrics (``hw.power``, ``hw.energy``,
``hw.errors``) serve any hardware component and require it to say which; otelprof reports GPUs only."""
LABEL_CPU = "cpu.logical_number"
LABEL_CPU_MODE = "cpu.mode"
LABEL_DISK_DIRECTION = "disk.io.direction"
LABEL_NETWORK_DIRECTION = "network.io.direction"
LABEL_ERROR_TYPE = "error.type"
LABEL_SOURCE = "source"
LABEL_ENDPOINT = "endpoint"
LABEL_METRIC = "metric"
LABEL_DEVICE_KIND = "device"
LABEL_OPERATOR = "operator"
LABEL_CATEGORY = "category"
LABEL_PRECISION = "precision"
LABEL_COST_PART = "part"
PROFILE_COST_PARTS: tuple[str, ...] = ("steps", "flop_step", "processing")
LABEL_EVENT_OUTCOME = "outcome"
LABEL_COLLECTION = "collection"
LABEL_TENSOR = "tensor"
LABEL_REDUCTION = "reduction"
LABEL_CHECK = "check"
OPERATOR_CATEGORIES: tuple[str, ...] = ("matmul", "convolution", "attention", "normalization", "elementwise",
                                        "memory_copy", "communication", "other")
GPU_LABELS: tuple[str, ...] = (LABEL_GPU, LABEL_HW_ID)
LABEL_HW_PARENT = "hw.parent"
"""A MIG instance's GPU: its UUID (OTel ``hw.parent``); empty on a whole GPU."""
LABEL_GPU_INSTANCE = "gpu.instance"
"""A MIG instance's GPU instance id (dcgm-exporter's ``GPU_I_ID``); empty on a whole GPU."""
LABEL_GPU_PROFILE = "gpu.profile"
"""A MIG instance's profile, e.g. ``1g.10gb`` (dcgm-exporter's ``GPU_I_PROFILE``); empty on a whole GPU."""
HW_GPU_LABELS: tuple[str, ...] = (*GPU_LABELS, LABEL_HW_TYPE)
"""Labels of a GPU's series under a generic ``hw.*`` name: ``hw.type`` is always ``gpu`` (:data:`HW_TYPE_GPU`)."""
SCRAPE_LABEL_POD_IP = "pod_ip"
"""Not emitted by otelprof: the PodMonitor / scrape config add the pod IP under this label, so an
alert names the pod the webhook must reach."""
SCRAPE_LABEL_NAMESPACE = "namespace"
"""Added by the PodMonitor / scrape config: the pod's namespace."""
SCRAPE_LABEL_CLUSTER = "cluster"
"""Not emitted by otelprof: the cluster a series came from, an external label of the Prometheus (or agent) that
scraped it when several write to one store (Thanos, Mimir, VictoriaMetrics)."""

OTHER_LABEL_VALUE = "other"
CPU_BUSIEST = "busiest"  # the `cpu` label of the busiest CPU's modes on nodes past OTELPROF_PER_CPU_MAX
"""Value of ``phase``/``annotation`` once ``OTELPROF_MAX_LABEL_VALUES`` names are in use, or once a metric has
``OTELPROF_MAX_SERIES`` series."""
PROGRAM_NAMED_LABELS: tuple[str, ...] = (LABEL_PHASE, LABEL_ANNOTATION)
"""Labels whose values the training program names: the series cap folds them (the others are bounded by the
machine or by otelprof)."""
ENDPOINT_METRICS = "metrics"
ENDPOINT_CONTROL = "control"
# ``reason`` values of ``otelprof.endpoint.errors``.
REASON_DISCONNECT = "disconnect"
"""The client went away (reset, broken pipe) before its answer was written."""
REASON_TIMEOUT = "timeout"
"""The connection was still open at its deadline (idle, slow, or a body that never came)."""
REASON_OVERLOAD = "overload"
"""An idle connection closed to make room for a new one (the connection limit was reached)."""
REASON_BAD_REQUEST = "bad_request"
"""Malformed: request line, headers, Content-Length, JSON or values (answered 400)."""
REASON_UNAUTHORIZED = "unauthorized"
"""Missing or wrong bearer token (answered 401)."""
REASON_NOT_FOUND = "not_found"
"""No such path or method (answered 404 or 405)."""
REASON_TOO_LARGE = "too_large"
"""Body, request line or headers over the limit (answered 413, 414 or 431)."""
REASON_INTERNAL = "internal"
"""A bug: the request raised inside otelprof (answered 500 if still possible; counted, never printed)."""
ENDPOINT_ERROR_REASONS: tuple[str, ...] = (
    REASON_DISCONNECT, REASON_TIMEOUT, REASON_OVERLOAD, REASON_BAD_REQUEST, REASON_UNAUTHORIZED, REASON_NOT_FOUND,
    REASON_TOO_LARGE, REASON_INTERNAL)
NO_PHASE = "none"
"""``phase`` of an annotation made outside any step (initialization, checkpointing)."""

# ---------------------------------------------------------------- instrumentation scope
SCOPE_NAME = "otelprof"
"""The instrumentation scope of every span and metric otelprof emits; its version is ``otelprof.__version__``."""

# ---------------------------------------------------------------- exemplars
EXEMPLAR_TRACE_ID = "trace_id"
"""Exemplar label of the trace a histogram bucket's exemplar belongs to (32 hex digits), on ``/metrics`` in
OpenMetrics; the name Grafana's Prometheus data source links to Tempo (``exemplarTraceIdDestinations``)."""
EXEMPLAR_SPAN_ID = "span_id"
"""Exemplar label of the exemplar's span (16 hex digits): the step's root span, or the region's."""

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
K8S_POD_UID = "k8s.pod.uid"
K8S_JOB_NAME = "k8s.job.name"
SERVICE_NAMESPACE = "service.namespace"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
"""The semantic-conventions version otelprof's names follow; on the Resource and the instrumentation scope."""
OTELPROF_RUN_ID = "otelprof.run.id"
OTELPROF_RANK = "otelprof.rank"
OTELPROF_LOCAL_RANK = "otelprof.local_rank"
OTELPROF_WORLD_SIZE = "otelprof.world_size"
OTELPROF_VERSION = "otelprof.version"
# What the process runs on (read once in init(), otelprof.runtime.collectors.environment).
PROCESS_RUNTIME_NAME = "process.runtime.name"
PROCESS_RUNTIME_VERSION = "process.runtime.version"
OS_TYPE = "os.type"
OS_VERSION = "os.version"
HOST_ARCH = "host.arch"
HOST_TYPE = "host.type"
HOST_CPU_MODEL = "host.cpu.model.name"
CLOUD_PROVIDER = "cloud.provider"
OTELPROF_TORCH_VERSION = "otelprof.torch.version"
OTELPROF_TORCH_CUDA = "otelprof.torch.cuda_version"
OTELPROF_GPU_MODEL = "otelprof.gpu.model"
OTELPROF_GPU_COUNT = "otelprof.gpu.count"
OTELPROF_GPU_DRIVER = "otelprof.gpu.driver_version"
OTELPROF_CUDA_DRIVER = "otelprof.cuda.driver_version"

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

# Region (annotation) names the integrations use; the recorder derives per-step series from some.
REGION_DATALOADER = "dataloader"
"""Waiting for the next batch: from asking the data loader for it to getting it."""
REGION_FORWARD = "forward"
REGION_BACKWARD = "backward"
REGION_OPTIMIZER = "optimizer"
REGION_COLLECTIVE = "collective"
"""Time a gradient all-reduce was in flight (DDP communication hook)."""
REGION_COMPILE = "compile"
"""torch.compile compiling (Dynamo tracing, the backend, a backward compiled at its first run, a CUDA graph
recorded): a step with one is never judged as an outlier."""
# ``exporter`` label values of ``otelprof.exporter.dropped`` besides the exporters' own names.
DROPPED_QUEUE = "queue"
"""Records the hot path could not queue (the recorder's queue was full)."""
DROPPED_RECORDING = "recording"
"""Lines the run recording could not write (disk full, I/O error)."""
DROPPED_RECORDING_UPLOAD = "recording_upload"
"""Lines of a recording bound for object storage deleted from the local spool before they could be uploaded
(``OTELPROF_RECORD_SPOOL_MAX_BYTES`` reached while the storage was unreachable)."""
DROPPED_CUDA_EVENTS = "cuda_events"
"""CUDA event pairs that waited too long for the GPU (device times dropped)."""
DROPPED_STEP_REGIONS = "step_regions"
"""Regions past the per-step cap (a step that never ends)."""
DROPPED_INVALID = "invalid_argument"
"""API arguments otelprof could not use (a name that is not a string, a value that is not a number, ...)."""
DROPPED_RECORD_ERROR = "record_error"
"""Records the recorder failed to process (the others go on)."""
DROPPED_OPERATOR_SPANS = "operator_spans"
"""Operators and kernels of a profiling window left out of its spans: past ``OTELPROF_PROFILE_MAX_SPANS`` per
step, between steps, or in a step whose span was not kept."""
DEVICE_TIMED_REGIONS: tuple[str, ...] = (REGION_FORWARD, REGION_BACKWARD, REGION_OPTIMIZER)
"""Regions that also get a device time from CUDA events when the model is on a CUDA device."""

SPAN_PROFILE = "otelprof.profile"
"""One span per operator-profiling window; its events are the top operators."""
ATTR_PROFILE_START = "otelprof.profile.start_step"
ATTR_PROFILE_STEPS = "otelprof.profile.num_steps"
ATTR_PROFILE_TRIGGER = "otelprof.profile.trigger"
"""Why a window ran: periodic, capture (on demand or on an alert) or api (``profile_window``)."""
PROFILE_TRIGGERS: tuple[str, ...] = ("periodic", "capture", "api")
# Operator and kernel spans: children of the span of the step they ran in (profiling windows only).
ATTR_OP_KIND = "otelprof.op.kind"
"""cpu (a host operator), kernel, memcpy or memset (device events, children of their launching operator)."""
ATTR_OP_CATEGORY = "otelprof.op.category"
ATTR_OP_THREAD = "thread.id"
ATTR_OP_DEVICE = "otelprof.op.device"
ATTR_OP_NAME = "otelprof.op.name"
ATTR_OP_CALLS = "otelprof.op.calls"
ATTR_OP_SELF_TIME = "otelprof.op.self_time"
ATTR_OP_TOTAL_TIME = "otelprof.op.total_time"
ATTR_KERNEL_DEVICE = "otelprof.kernel.device"
ATTR_KERNEL_STREAM = "otelprof.kernel.stream"
ATTR_KERNEL_CORRELATION = "otelprof.kernel.correlation"
ATTR_KERNEL_GRID = "otelprof.kernel.grid"
ATTR_KERNEL_BLOCK = "otelprof.kernel.block"
ATTR_KERNEL_BYTES = "otelprof.kernel.bytes"

SPAN_REASONS: tuple[str, ...] = ("first", "every", "window", "outlier", "budget", "annotation", "operator")


# ---------------------------------------------------------------- metrics

DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
"""Explicit buckets in seconds, 100 us to 10 min (the SDK's defaults assume milliseconds)."""

RATIO_BUCKETS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))
"""Utilization buckets 0.05 ... 1.0: exact at every threshold the rules use (0.1, 0.5, 0.7, 0.9)."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric: OTel name, kind, unit, description and labels beyond the identity labels."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    updown: bool = False
    """A gauge the semantic conventions define as an UpDownCounter (a level that adds up across series: memory
    in use, threads): over OTLP a cumulative non-monotonic Sum, on ``/metrics`` a gauge, set like any gauge."""

    @property
    def instrument(self) -> str:
        """The OTel instrument: Counter, UpDownCounter, Gauge or Histogram."""
        return "UpDownCounter" if self.updown else self.kind.value.capitalize()

    @property
    def prometheus_name(self) -> str:
        """The metric family name on ``/metrics`` (counters gain ``_total`` in the samples)."""
        return prometheus_name(self.name, self.unit, self.kind)

    @property
    def query_name(self) -> str:
        """The name to query in PromQL: counters' samples carry ``_total``, every other family its own name."""
        return self.prometheus_name + ("_total" if self.kind is Kind.COUNTER else "")

    @property
    def prometheus_labels(self) -> tuple[str, ...]:
        """Label names on ``/metrics``: identity labels, then this metric's own."""
        return tuple(prometheus_label(k) for k in IDENTITY_LABELS + self.labels)


STEP_DURATION = MetricSpec(
    "otelprof.step.duration", Kind.HISTOGRAM, "s",
    "Wall time of each training step, from entering step() to leaving it.", (LABEL_PHASE,), DURATION_BUCKETS)
STEPS = MetricSpec(
    "otelprof.steps", Kind.COUNTER, "{step}", "Steps finished.", (LABEL_PHASE,))
STEP_OUTLIERS = MetricSpec(
    "otelprof.step.outliers", Kind.COUNTER, "{step}",
    "Steps slower than mean + OTELPROF_OUTLIER_SIGMA x stddev of the recent steps of their phase (and materially "
    "slower than their median, and per token or sample where recorded; steps a profiling window slowed and steps "
    "during which torch.compile compiled are not judged).", (LABEL_PHASE,))
STEP_OUTLIER_EXCESS = MetricSpec(
    "otelprof.step.outliers.excess", Kind.COUNTER, "s",
    "Time outlier steps took beyond the median of their phase's recent steps: what the outliers cost.",
    (LABEL_PHASE,))
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
LOSS_SUMMED = MetricSpec(
    "otelprof.loss.summed", Kind.GAUGE, "", "Sum of the finite losses recorded in steps, spikes left out (a "
    "running total that falls with negative losses); its growth over a window divided by otelprof.loss.recorded's "
    "is the window's mean loss per step.", (LABEL_PHASE,), updown=True)
LOSS_SQUARED = MetricSpec(
    "otelprof.loss.squared", Kind.COUNTER, "", "Sum of the squares of the finite losses recorded in steps, spikes "
    "left out (the noise of a window's mean loss).", (LABEL_PHASE,))
LOSS_RECORDED = MetricSpec(
    "otelprof.loss.recorded", Kind.COUNTER, "{value}", "Finite losses recorded in steps, spikes left out.",
    (LABEL_PHASE,))
LOSS_SPIKES = MetricSpec(
    "otelprof.loss.spikes", Kind.COUNTER, "{step}",
    "Steps whose loss jumped: above OTELPROF_LOSS_SPIKE_RATIO x the median and mean + OTELPROF_LOSS_SPIKE_SIGMA x "
    "stddev of the phase's recent losses.", (LABEL_PHASE,))
GRAD_NORM_SUMMED = MetricSpec(
    "otelprof.grad_norm.summed", Kind.COUNTER, "", "Sum of the finite gradient norms recorded in steps.",
    (LABEL_PHASE,))
GRAD_NORM_RECORDED = MetricSpec(
    "otelprof.grad_norm.recorded", Kind.COUNTER, "{value}", "Finite gradient norms recorded in steps.",
    (LABEL_PHASE,))
NONFINITE = MetricSpec(
    "otelprof.nonfinite", Kind.COUNTER, "{value}", "Recorded loss or gradient-norm values that were NaN or infinite.",
    (LABEL_PHASE, LABEL_SCALAR))
DATALOADER_WAIT = MetricSpec(
    "otelprof.dataloader.wait", Kind.HISTOGRAM, "s",
    "Per step: time spent waiting for the next batch (the step's dataloader regions summed).",
    (LABEL_PHASE,), DURATION_BUCKETS)
DATALOADER_WAIT_RATIO = MetricSpec(
    "otelprof.dataloader.wait_ratio", Kind.HISTOGRAM, "1",
    "Per step: share of the step spent waiting for data (input-bound steps sit near 1).", (LABEL_PHASE,),
    (0.01, 0.02, 0.05, *(round(0.05 * i, 2) for i in range(2, 21))))
COLLECTIVE_DURATION = MetricSpec(
    "otelprof.collective.duration", Kind.HISTOGRAM, "s",
    "Per step: time at least one gradient all-reduce was in flight (the union of the step's collective regions).",
    (LABEL_PHASE,), DURATION_BUCKETS)
COLLECTIVE_EXPOSED = MetricSpec(
    "otelprof.collective.exposed", Kind.HISTOGRAM, "s",
    "Per step: collective time not overlapped by the backward pass's compute (the rank only waited for it).",
    (LABEL_PHASE,), DURATION_BUCKETS)
DATALOADER_WORKERS = MetricSpec(
    "otelprof.dataloader.workers", Kind.GAUGE, "{worker}", "Worker processes of the instrumented data loader.")
DATALOADER_PIN_MEMORY = MetricSpec(
    "otelprof.dataloader.pin_memory", Kind.GAUGE, "", "1 when the instrumented data loader pins memory, else 0.")
CUDA_MEMORY_ALLOCATED = MetricSpec(
    "otelprof.cuda.memory.allocated", Kind.GAUGE, "By", "Memory held by tensors (torch.cuda), per device.",
    (LABEL_GPU,))
CUDA_MEMORY_RESERVED = MetricSpec(
    "otelprof.cuda.memory.reserved", Kind.GAUGE, "By", "Memory reserved by the caching allocator (torch.cuda).",
    (LABEL_GPU,))
CUDA_MEMORY_PEAK = MetricSpec(
    "otelprof.cuda.memory.peak", Kind.GAUGE, "By", "Peak memory held by tensors since start (torch.cuda).",
    (LABEL_GPU,))
CUDA_MEMORY_FRAGMENTATION = MetricSpec(
    "otelprof.cuda.memory.fragmentation", Kind.GAUGE, "By",
    "Reserved minus allocated (torch.cuda): memory the caching allocator holds that no tensor uses (cached and "
    "split blocks), per device.", (LABEL_GPU,))
REGION_DEVICE_DURATION = MetricSpec(
    "otelprof.region.device.duration", Kind.HISTOGRAM, "s",
    "Device time of the forward, backward and optimizer regions on CUDA, from CUDA events read once the GPU got "
    "there: from the stream reaching the region to it finishing the region's work.", (LABEL_PHASE, LABEL_ANNOTATION),
    DURATION_BUCKETS)
INTEGRATION_ERRORS = MetricSpec(
    "otelprof.integration.errors", Kind.COUNTER, "{error}",
    "Framework hooks that failed and were removed (training went on without them).", ("hook",))
PROFILE_WINDOWS = MetricSpec(
    "otelprof.profile.windows", Kind.COUNTER, "{window}", "Operator-profiling windows completed.")
PROFILE_OVERHEAD = MetricSpec(
    "otelprof.profile.overhead", Kind.COUNTER, "s",
    "Time the profiling windows added to training: each window's steps (and starting/stopping the profiler) "
    "beyond the same number of steps just before it, plus the window's processing time.")
PROFILE_COST = MetricSpec(
    "otelprof.profile.cost", Kind.COUNTER, "s",
    "What the profiling windows cost training, by part: steps (the window's steps, with starting and stopping the "
    "profiler, beyond as many steps at the pace just before it), flop_step (the FLOP-counted step after it beyond "
    "one step) and processing (CPU time of the thread summarising it, which holds the interpreter's lock while it "
    "runs). The parts add up to otelprof.profile.overhead; the periodic schedule keeps it within "
    "OTELPROF_PROFILE_BUDGET of its interval.", (LABEL_COST_PART,))
PROFILE_EVENTS = MetricSpec(
    "otelprof.profile.events", Kind.COUNTER, "{event}",
    "Profiler events of the profiling windows: kept (summarised) or dropped (past OTELPROF_PROFILE_MAX_EVENTS in "
    "a window).", (LABEL_EVENT_OUTCOME,))
PROFILE_TRUNCATED = MetricSpec(
    "otelprof.profile.truncated", Kind.COUNTER, "{window}",
    "Profiling windows that stopped before their planned steps, by reason: events (the window reached "
    "OTELPROF_PROFILE_MAX_EVENTS).", (LABEL_REASON,))
PROFILE_INTERVAL = MetricSpec(
    "otelprof.profile.interval", Kind.GAUGE, "s",
    "Seconds from the end of the last periodic profiling window to the next: OTELPROF_PROFILE_EVERY, or the last "
    "window's cost divided by OTELPROF_PROFILE_BUDGET when that is longer.")
OPERATOR_SELF_TIME = MetricSpec(
    "otelprof.operator.self_time", Kind.GAUGE, "s",
    "Per profiled step in the last profiling window: self time of each of the top operators (cpu) and kernels "
    "(gpu), the rest as `other`.", (LABEL_DEVICE_KIND, LABEL_OPERATOR))
OPERATOR_TOTAL_TIME = MetricSpec(
    "otelprof.operator.total_time", Kind.GAUGE, "s",
    "Per profiled step in the last window: total time (self plus children) of the top operators and kernels.",
    (LABEL_DEVICE_KIND, LABEL_OPERATOR))
OPERATOR_CALLS = MetricSpec(
    "otelprof.operator.calls", Kind.GAUGE, "{call}",
    "Per profiled step in the last window: calls of the top operators and kernels.",
    (LABEL_DEVICE_KIND, LABEL_OPERATOR))
OPERATOR_LAUNCHES = MetricSpec(
    "otelprof.operator.launches", Kind.GAUGE, "{launch}",
    "Per profiled step in the last window: GPU kernel/memcpy launches by each top host operator.",
    (LABEL_OPERATOR,))
OPERATOR_CATEGORY_TIME = MetricSpec(
    "otelprof.operator.category.time", Kind.GAUGE, "s",
    "Per profiled step in the last window: operator self time (cpu) or kernel time (gpu) by category.",
    (LABEL_DEVICE_KIND, LABEL_CATEGORY))
OPERATOR_HOST_RATIO = MetricSpec(
    "otelprof.operator.host_ratio", Kind.GAUGE, "1",
    "Last window: host operator self time over host plus device operator time (1 on a CPU-only run; near 0 "
    "when the GPU is busy while the host only launches).")
KERNEL_PRECISION = MetricSpec(
    "otelprof.kernel.precision", Kind.GAUGE, "1",
    "Last window: share of GPU kernel time by arithmetic precision (from kernel names; GPU runs only).",
    (LABEL_PRECISION,))
OPERATOR_ALLOCATED = MetricSpec(
    "otelprof.operator.allocated", Kind.GAUGE, "By",
    "Per profiled step in the last window: bytes allocated by each of the top allocating operators (their own "
    "allocations, torch.profiler profile_memory), on the host (cpu) or GPU (gpu), the rest as `other`.",
    (LABEL_DEVICE_KIND, LABEL_OPERATOR))
PROFILE_MEMORY_PEAK = MetricSpec(
    "otelprof.profile.memory.peak", Kind.GAUGE, "By",
    "Last profiling window: the most memory the allocator held (tensors) at any moment, host (cpu) or GPU.",
    (LABEL_DEVICE_KIND,))
COMM_OVERLAP = MetricSpec(
    "otelprof.communication.overlap", Kind.GAUGE, "1",
    "Last profiling window: share of the time collective kernels (NCCL) ran during which compute kernels ran "
    "too on the same GPU (communication hidden behind computation). GPU runs with collectives only.")
COMM_EXPOSED = MetricSpec(
    "otelprof.communication.exposed", Kind.GAUGE, "s",
    "Per profiled step in the last window: time collective kernels ran with no compute kernel beside them on the "
    "same GPU (exposed communication the step waits for).")
TENSOR_SAVES = MetricSpec(
    "otelprof.tensor.saves", Kind.COUNTER, "{step}",
    "Saved steps at which a tensor of the collections was reduced (and read back).", (LABEL_COLLECTION, LABEL_TENSOR))
TENSOR_SUMMED = MetricSpec(
    "otelprof.tensor.summed", Kind.GAUGE, "",
    "Sum over saved steps of a tensor's finite reduction; its growth over a window divided by "
    "otelprof.tensor.saves's is the window's mean per saved step.", (LABEL_COLLECTION, LABEL_TENSOR, LABEL_REDUCTION),
    updown=True)
TENSOR_FLAGGED = MetricSpec(
    "otelprof.tensor.flagged", Kind.COUNTER, "{step}",
    "Saved steps at which a per-layer check's condition held for a tensor as the offline check counts it (for 2 "
    "consecutive saved steps; once for a poor initialization).", (LABEL_CHECK, LABEL_COLLECTION, LABEL_TENSOR))
MODEL_FLOPS = MetricSpec(
    "otelprof.model.flops", Kind.GAUGE, "{flop}",
    "FLOPs of one training step (forward, backward, optimizer), counted by torch.utils.flop_counter in the step "
    "after the last profiling window.")
MODEL_FLOPS_ACHIEVED = MetricSpec(
    "otelprof.model.flops.achieved", Kind.GAUGE, "{flop}/s",
    "FLOPs per step times steps per second (the pace of the steps before the last profiling window).")
MODEL_FLOPS_UTILIZATION = MetricSpec(
    "otelprof.model.flops.utilization", Kind.GAUGE, "1",
    "Model FLOPs utilization (MFU): achieved FLOP/s over the GPU's dense peak for the dtype in use (GPU model "
    "from NVML, or OTELPROF_PEAK_FLOPS). Absent on a CPU run.")
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
RECORDING_ADOPTED_PARTS = MetricSpec(
    "otelprof.recording.adopted_parts", Kind.COUNTER, "{part}",
    "Parts of recordings a previous process left in the upload spool (killed before it could upload them) that "
    "this process uploaded to their own run's destination.")
ENDPOINT_ERRORS = MetricSpec(
    "otelprof.endpoint.errors", Kind.COUNTER, "{request}",
    "Connections and requests this process's /metrics and control endpoint refused or lost, by reason: "
    + ", ".join(ENDPOINT_ERROR_REASONS) + ".", (LABEL_ENDPOINT, LABEL_REASON))
SERIES_FOLDED = MetricSpec(
    "otelprof.series.folded", Kind.COUNTER, "{observation}",
    "Observations counted under phase/annotation `other` because their metric already had OTELPROF_MAX_SERIES "
    "series.", (LABEL_METRIC,))

# ---- system telemetry, sampled every OTELPROF_SAMPLE_INTERVAL_MS. Node-wide series (host, container,
# GPUs, coincidences) come from one process per node; process series from every rank.
CPU_MODES: tuple[str, ...] = ("user", "nice", "system", "idle", "iowait", "interrupt", "steal")

SYSTEM_CPU_UTILIZATION = MetricSpec(
    "system.cpu.utilization", Kind.GAUGE, "1", "Share of the last sample interval each logical CPU spent "
    "in each mode.", (LABEL_CPU, LABEL_CPU_MODE))
NODE_CPU_UTILIZATION = MetricSpec(
    "otelprof.node.cpu.utilization", Kind.HISTOGRAM, "1",
    "Per sample: busy share averaged over all logical CPUs (not idle, not iowait).", (), RATIO_BUCKETS)
CPU_AVAILABLE = MetricSpec(
    "otelprof.cpu.available", Kind.GAUGE, "{cpu}",
    "CPUs this container may use: the cgroup quota if set, else the CPUs in the affinity mask.")
SYSTEM_MEMORY_USAGE = MetricSpec("system.memory.usage", Kind.GAUGE, "By", "Host memory in use.", updown=True)
SYSTEM_MEMORY_LIMIT = MetricSpec("system.memory.limit", Kind.GAUGE, "By", "Host memory in total.", updown=True)
SYSTEM_MEMORY_UTILIZATION = MetricSpec("system.memory.utilization", Kind.GAUGE, "1", "Host memory in use, ratio.")
SYSTEM_DISK_IO = MetricSpec(
    "system.disk.io", Kind.COUNTER, "By", "Bytes read from and written to all disks.", (LABEL_DISK_DIRECTION,))
SYSTEM_DISK_OPERATIONS = MetricSpec(
    "system.disk.operations", Kind.COUNTER, "{operation}", "Disk reads and writes.", (LABEL_DISK_DIRECTION,))
SYSTEM_NETWORK_IO = MetricSpec(
    "system.network.io", Kind.COUNTER, "By", "Bytes received and transmitted on all interfaces but loopback.",
    (LABEL_NETWORK_DIRECTION,))
CONTAINER_CPU_LIMIT = MetricSpec(
    "otelprof.container.cpu.limit", Kind.GAUGE, "{cpu}", "The container's CPU quota in cores (absent: no quota).")
CONTAINER_CPU_TIME = MetricSpec("container.cpu.time", Kind.COUNTER, "s", "CPU time used by the container (cgroup).")
CONTAINER_CPU_PERIODS = MetricSpec(
    "otelprof.container.cpu.periods", Kind.COUNTER, "{period}", "CFS enforcement periods elapsed (cgroup).")
CONTAINER_CPU_THROTTLED_PERIODS = MetricSpec(
    "otelprof.container.cpu.throttled_periods", Kind.COUNTER, "{period}",
    "CFS periods in which the container was throttled: its CPU limit was hit.")
CONTAINER_CPU_THROTTLED_TIME = MetricSpec(
    "otelprof.container.cpu.throttled_time", Kind.COUNTER, "s", "Time the container spent throttled.")
CONTAINER_MEMORY_LIMIT = MetricSpec(
    "otelprof.container.memory.limit", Kind.GAUGE, "By", "The container's memory limit (absent: no limit).")
CONTAINER_MEMORY_USAGE = MetricSpec(
    "container.memory.usage", Kind.GAUGE, "By", "Memory charged to the container.", updown=True)
CONTAINER_MEMORY_WORKING_SET = MetricSpec(
    "otelprof.container.memory.working_set", Kind.GAUGE, "By",
    "Memory charged to the container less its inactive file cache: what counts against the limit when the "
    "kernel must reclaim (the kubelet's working set).")
PROCESS_CPU_TIME = MetricSpec(
    "process.cpu.time", Kind.COUNTER, "s", "CPU time of this training process.", (LABEL_CPU_MODE,))
PROCESS_CPU_UTILIZATION = MetricSpec(
    "process.cpu.utilization", Kind.GAUGE, "1",
    "CPU used by this process over the last interval, divided by the CPUs available to the container.")
PROCESS_MEMORY_USAGE = MetricSpec(
    "process.memory.usage", Kind.GAUGE, "By", "Resident memory of this process.", updown=True)
PROCESS_THREAD_COUNT = MetricSpec(
    "process.thread.count", Kind.GAUGE, "{thread}", "Threads of this process.", updown=True)
PROCESS_GPU_MEMORY = MetricSpec(
    "otelprof.process.gpu.memory", Kind.GAUGE, "By", "GPU memory used by this process, per GPU (NVML).",
    GPU_LABELS)
GPU_INFO = MetricSpec(
    "otelprof.gpu.info", Kind.GAUGE, "", "1 for the GPU this process computes on (NVML; the visible GPU or MIG "
    "instance at `LOCAL_RANK`, or the only one): joins a GPU's series from dcgm-exporter (its `UUID` label = "
    "`hw_id`, or `hw_parent` and `gpu_instance` = `GPU_I_ID` for a MIG instance; its pod = `k8s_pod_name`, which "
    "the series carries for the OTLP path) to the rank. Set once at start, also with OTELPROF_GPU_SAMPLING=false.",
    (*GPU_LABELS, LABEL_HW_PARENT, LABEL_GPU_INSTANCE, LABEL_GPU_PROFILE, K8S_POD_NAME, K8S_NAMESPACE_NAME))
GPU_UNMAPPED = MetricSpec(
    "otelprof.gpu.unmapped", Kind.GAUGE, "", "1 when this process was given a GPU (a GPU-/MIG- UUID in "
    "CUDA/NVIDIA_VISIBLE_DEVICES, or NVML lists GPUs) but cannot tell which one it computes on, so it exports no "
    "otelprof.gpu.info: reason not_found (NVML does not list it), ambiguous (LOCAL_RANK names none of several), "
    "or why NVML failed. OtelprofGPUTelemetryAbsent fires on it.", (LABEL_REASON,))
GPU_UTILIZATION = MetricSpec(
    "hw.gpu.utilization", Kind.GAUGE, "1", "Share of the last sample period a kernel ran on the GPU (NVML).",
    GPU_LABELS)
GPU_MEMORY_COPY_UTILIZATION = MetricSpec(
    "otelprof.gpu.memory_copy.utilization", Kind.GAUGE, "1", "Share of time GPU memory was read or written.",
    GPU_LABELS)
GPU_MEMORY_USAGE = MetricSpec("hw.gpu.memory.usage", Kind.GAUGE, "By", "GPU memory in use.", GPU_LABELS, updown=True)
GPU_MEMORY_LIMIT = MetricSpec("hw.gpu.memory.limit", Kind.GAUGE, "By", "GPU memory in total.", GPU_LABELS, updown=True)
GPU_MEMORY_UTILIZATION = MetricSpec(
    "hw.gpu.memory.utilization", Kind.GAUGE, "1", "GPU memory in use, ratio of total.", GPU_LABELS)
GPU_POWER = MetricSpec("hw.power", Kind.GAUGE, "W", "GPU power draw (NVML).", HW_GPU_LABELS)
GPU_ENERGY = MetricSpec(
    "hw.energy", Kind.COUNTER, "J", "Energy the GPU consumed since the driver loaded (NVML, Volta and newer).",
    HW_GPU_LABELS)
GPU_POWER_LIMIT = MetricSpec("otelprof.gpu.power.limit", Kind.GAUGE, "W", "GPU enforced power limit.", GPU_LABELS)
GPU_TEMPERATURE = MetricSpec(
    "hw.temperature", Kind.GAUGE, "Cel", "GPU core temperature (NVML).", GPU_LABELS)
GPU_SM_CLOCK = MetricSpec("otelprof.gpu.sm.clock", Kind.GAUGE, "Hz", "GPU SM clock.", GPU_LABELS)
GPU_PCIE_THROUGHPUT = MetricSpec(
    "otelprof.gpu.pcie.throughput", Kind.GAUGE, "By/s", "PCIe traffic of the GPU.",
    (*GPU_LABELS, LABEL_NETWORK_DIRECTION))
GPU_THROTTLE = MetricSpec(
    "otelprof.gpu.throttle", Kind.GAUGE, "", "1 while the GPU's clocks are held down for the reason, else 0.",
    (*GPU_LABELS, LABEL_REASON))
GPU_ERRORS = MetricSpec(
    "hw.errors", Kind.COUNTER, "{error}", "GPU ECC memory errors since the driver loaded (volatile).",
    (*HW_GPU_LABELS, LABEL_ERROR_TYPE))
GPU_SM_ACTIVE = MetricSpec(
    "otelprof.gpu.sm.active", Kind.GAUGE, "1", "Share of SMs busy (NVML GPM, Hopper and newer; dcgm-exporter's "
    "DCGM_FI_PROF_SM_ACTIVE): the device-wide view of what PyTorch Profiler calls SM efficiency.", GPU_LABELS)
GPU_SM_OCCUPANCY = MetricSpec(
    "otelprof.gpu.sm.occupancy", Kind.GAUGE, "1", "Warp occupancy of the SMs (NVML GPM; DCGM_FI_PROF_SM_OCCUPANCY): "
    "the device-wide view of PyTorch Profiler's achieved occupancy.", GPU_LABELS)
GPU_XID = MetricSpec(
    "otelprof.gpu.xid", Kind.GAUGE, "", "The last XID error the driver reported for the GPU, 0 for none "
    "(dcgm-exporter's DCGM_FI_DEV_XID_ERRORS; gpu_source=dcgm only: NVML reports XIDs as events).", GPU_LABELS)
GPU_REMAPPED_ROWS = MetricSpec(
    "otelprof.gpu.memory.remapped_rows", Kind.COUNTER, "{row}", "GPU memory rows remapped after ECC errors "
    "(dcgm-exporter's DCGM_FI_DEV_CORRECTABLE/UNCORRECTABLE_REMAPPED_ROWS; gpu_source=dcgm only).",
    (*GPU_LABELS, LABEL_ERROR_TYPE))
DCGM_ONLY_METRICS: tuple[MetricSpec, ...] = (GPU_XID, GPU_REMAPPED_ROWS)
"""GPU series only dcgm-exporter's readings stand for (the otelprof-dcgm records); otelprof's NVML sampler
does not produce them."""
GPU_TENSOR_ACTIVE = MetricSpec(
    "otelprof.gpu.tensor.active", Kind.GAUGE, "1", "Share of time tensor cores were busy (NVML GPM).", GPU_LABELS)
GPU_UTILIZATION_DISTRIBUTION = MetricSpec(
    "otelprof.gpu.utilization", Kind.HISTOGRAM, "1", "Per sample: GPU utilization (distribution between scrapes).",
    GPU_LABELS, RATIO_BUCKETS)
GPU_MEMORY_UTILIZATION_DISTRIBUTION = MetricSpec(
    "otelprof.gpu.memory.utilization", Kind.HISTOGRAM, "1", "Per sample: GPU memory in use, ratio.",
    GPU_LABELS, RATIO_BUCKETS)
SAMPLER_SAMPLES = MetricSpec(
    "otelprof.sampler.samples", Kind.COUNTER, "{sample}", "Node samples taken (denominator of the coincidence "
    "counters).")
SAMPLER_HIGH_CPU = MetricSpec(
    "otelprof.sampler.high_cpu", Kind.COUNTER, "{sample}", "Samples where some CPU was busier than the CPU "
    "threshold.")
SAMPLER_LOW_GPU = MetricSpec(
    "otelprof.sampler.low_gpu", Kind.COUNTER, "{sample}", "Samples where some GPU was below the GPU threshold.")
SAMPLER_CPU_BOTTLENECK = MetricSpec(
    "otelprof.sampler.cpu_bottleneck", Kind.COUNTER, "{sample}",
    "Samples where some CPU was above the CPU threshold while some GPU was below the GPU threshold.")
SAMPLER_IO_BOTTLENECK = MetricSpec(
    "otelprof.sampler.io_bottleneck", Kind.COUNTER, "{sample}",
    "Samples where some CPU's iowait was above the I/O threshold while some GPU was below the GPU threshold.")
SAMPLER_ERRORS = MetricSpec(
    "otelprof.sampler.errors", Kind.COUNTER, "{error}", "Failed telemetry reads, by source and reason.",
    (LABEL_SOURCE, LABEL_REASON))
SAMPLER_OVERRUNS = MetricSpec(
    "otelprof.sampler.overruns", Kind.COUNTER, "{sample}", "Sample ticks skipped because a sample overran its "
    "interval.")
SAMPLER_TIME = MetricSpec(
    "otelprof.sampler.time", Kind.COUNTER, "s", "Time spent taking samples; its rate is the sampler's CPU share.")

SYSTEM_METRICS: tuple[MetricSpec, ...] = (
    SYSTEM_CPU_UTILIZATION, NODE_CPU_UTILIZATION, CPU_AVAILABLE, SYSTEM_MEMORY_USAGE, SYSTEM_MEMORY_LIMIT,
    SYSTEM_MEMORY_UTILIZATION, SYSTEM_DISK_IO, SYSTEM_DISK_OPERATIONS, SYSTEM_NETWORK_IO, CONTAINER_CPU_LIMIT,
    CONTAINER_CPU_TIME, CONTAINER_CPU_PERIODS, CONTAINER_CPU_THROTTLED_PERIODS, CONTAINER_CPU_THROTTLED_TIME,
    CONTAINER_MEMORY_LIMIT, CONTAINER_MEMORY_USAGE, CONTAINER_MEMORY_WORKING_SET, PROCESS_CPU_TIME,
    PROCESS_CPU_UTILIZATION, PROCESS_MEMORY_USAGE, PROCESS_THREAD_COUNT, PROCESS_GPU_MEMORY, GPU_INFO, GPU_UTILIZATION,
    GPU_MEMORY_COPY_UTILIZATION, GPU_MEMORY_USAGE, GPU_MEMORY_LIMIT, GPU_MEMORY_UTILIZATION, GPU_POWER, GPU_ENERGY,
    GPU_POWER_LIMIT, GPU_TEMPERATURE, GPU_SM_CLOCK, GPU_PCIE_THROUGHPUT, GPU_THROTTLE, GPU_ERRORS, GPU_SM_ACTIVE,
    GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVE, GPU_UTILIZATION_DISTRIBUTION, GPU_MEMORY_UTILIZATION_DISTRIBUTION,
    GPU_UNMAPPED, GPU_XID, GPU_REMAPPED_ROWS,
    SAMPLER_SAMPLES, SAMPLER_HIGH_CPU, SAMPLER_LOW_GPU, SAMPLER_CPU_BOTTLENECK, SAMPLER_IO_BOTTLENECK, SAMPLER_ERRORS,
    SAMPLER_OVERRUNS, SAMPLER_TIME,
)

STEP_METRICS: tuple[MetricSpec, ...] = (
    STEP_DURATION, STEPS, STEP_OUTLIERS, STEP_LAST_TIMESTAMP, STEP_FIRST_TIMESTAMP, STEP_NUMBER,
    PROCESS_START_TIME, PHASE_ACTIVE, ANNOTATION_DURATION, SAMPLES, TOKENS, LOSS, LEARNING_RATE,
    GRAD_NORM, NONFINITE, DATALOADER_WAIT, DATALOADER_WAIT_RATIO, COLLECTIVE_DURATION,
    COLLECTIVE_EXPOSED,
    EXPORTER_DROPPED, SPANS_BUILT, SPAN_BUILD_TIME, RECORDING_BYTES,
    STEP_OUTLIER_EXCESS, LOSS_SUMMED, LOSS_SQUARED, LOSS_RECORDED, LOSS_SPIKES, GRAD_NORM_SUMMED, GRAD_NORM_RECORDED,
)
"""From the step/annotation API and the recorder: present whenever steps run."""
FRAMEWORK_METRICS: tuple[MetricSpec, ...] = (
    DATALOADER_WORKERS, DATALOADER_PIN_MEMORY, CUDA_MEMORY_ALLOCATED, CUDA_MEMORY_RESERVED, CUDA_MEMORY_PEAK,
    CUDA_MEMORY_FRAGMENTATION, REGION_DEVICE_DURATION, INTEGRATION_ERRORS, PROFILE_WINDOWS, PROFILE_OVERHEAD,
    PROFILE_COST, PROFILE_EVENTS, PROFILE_TRUNCATED, PROFILE_INTERVAL,
    OPERATOR_SELF_TIME,
    OPERATOR_TOTAL_TIME, OPERATOR_CALLS, OPERATOR_LAUNCHES, OPERATOR_CATEGORY_TIME, OPERATOR_HOST_RATIO,
    KERNEL_PRECISION, OPERATOR_ALLOCATED, PROFILE_MEMORY_PEAK, MODEL_FLOPS, MODEL_FLOPS_ACHIEVED,
    MODEL_FLOPS_UTILIZATION, COMM_OVERLAP, COMM_EXPOSED,
    TENSOR_SAVES, TENSOR_SUMMED, TENSOR_FLAGGED,
)
"""Set by the PyTorch integration when it sees a data loader / CUDA."""
SELF_METRICS: tuple[MetricSpec, ...] = (ENDPOINT_ERRORS, SERIES_FOLDED, RECORDING_ADOPTED_PARTS)
"""About otelprof itself under hostile clients, runaway names and restarts: present once something was refused,
folded or adopted."""

# ---- `otelprof webhook`, a process of its own: on its GET /metrics, without the identity labels of a training
# process (it serves every job).
LABEL_ACTION = "action"
LABEL_OUTCOME = "outcome"
WEBHOOK_OUTCOME_SENT = "sent"
"""The target answered 2xx."""
WEBHOOK_OUTCOME_REFUSED = "refused"
"""The target answered a status that another attempt would not change (4xx but 429): not retried."""
WEBHOOK_OUTCOME_FAILED = "failed"
"""Unreachable, timed out or answered 5xx / 429 until the retry window ended (or once, before a fallback)."""
WEBHOOK_OUTCOME_DUPLICATE = "duplicate"
"""The same action for the same target was already queued or in flight, or already sent for this alert."""
WEBHOOK_OUTCOMES: tuple[str, ...] = (WEBHOOK_OUTCOME_SENT, WEBHOOK_OUTCOME_REFUSED, WEBHOOK_OUTCOME_FAILED,
                                     WEBHOOK_OUTCOME_DUPLICATE)
WEBHOOK_DROP_TARGET_FULL = "target_full"
"""Not queued: its target's queue was full."""
WEBHOOK_DROP_QUEUE_FULL = "queue_full"
"""Not queued, or pushed out of the queue, at the total cap (the payload with the most queued actions loses one)."""
WEBHOOK_DROP_REASONS: tuple[str, ...] = (WEBHOOK_DROP_TARGET_FULL, WEBHOOK_DROP_QUEUE_FULL)
WEBHOOK_ACTIONS = MetricSpec(
    "otelprof.webhook.actions", Kind.COUNTER, "{action}",
    "Actions (stop, capture, suspend) the webhook finished, by outcome: " + ", ".join(WEBHOOK_OUTCOMES) + ".",
    (LABEL_ACTION, LABEL_OUTCOME))
WEBHOOK_DROPPED = MetricSpec(
    "otelprof.webhook.dropped", Kind.COUNTER, "{action}",
    "Actions the webhook dropped because a queue was full, by reason: " + ", ".join(WEBHOOK_DROP_REASONS) + ".",
    (LABEL_REASON,))
WEBHOOK_QUEUE_DEPTH = MetricSpec(
    "otelprof.webhook.queue.depth", Kind.GAUGE, "{action}", "Actions the webhook holds: queued or in flight.")
WEBHOOK_TARGETS_FAILING = MetricSpec(
    "otelprof.webhook.targets.failing", Kind.GAUGE, "{target}",
    "Targets (host:port) whose last attempt failed: their actions wait for a backoff before the next.")
WEBHOOK_METRICS: tuple[MetricSpec, ...] = (WEBHOOK_ACTIONS, WEBHOOK_DROPPED, WEBHOOK_QUEUE_DEPTH,
                                           WEBHOOK_TARGETS_FAILING)
"""On the webhook's ``GET /metrics`` only, with no identity labels; not in :data:`METRICS` (a training process)."""

METRICS: tuple[MetricSpec, ...] = (*STEP_METRICS, *FRAMEWORK_METRICS, *SELF_METRICS, *SYSTEM_METRICS)

# record(name, value): names with a metric of their own. Other names go to spans and the recording only.
SCALAR_LOSS = "loss"
SCALAR_LEARNING_RATE = "learning_rate"
SCALAR_GRAD_NORM = "grad_norm"
SCALAR_SAMPLES = "samples"
"""Per step; summed when a step fetches several batches."""
SCALAR_TOKENS = "tokens"
SCALAR_GAUGES: dict[str, MetricSpec] = {SCALAR_LOSS: LOSS, SCALAR_LEARNING_RATE: LEARNING_RATE, "lr": LEARNING_RATE,
                                        SCALAR_GRAD_NORM: GRAD_NORM}
SCALAR_COUNTERS: dict[str, MetricSpec] = {SCALAR_SAMPLES: SAMPLES, SCALAR_TOKENS: TOKENS}
NONFINITE_CHECKED: tuple[str, ...] = (SCALAR_LOSS, SCALAR_GRAD_NORM)
SCALAR_OPTIMIZER_LOSS = "loss_optimizer_{index}"
"""Per step of a loop with several optimizers (a GAN's discriminator and generator, updated once per batch): the
losses given to ``backward()`` for the update of optimizer ``{index}`` (numbered from 0 in the order they first
step); ``loss`` is the step's losses of all updates."""
MAX_OPTIMIZER_LOSSES = 8
"""Optimizers with a loss of their own (``SCALAR_OPTIMIZER_LOSS``); the others' count in ``loss`` only."""


def optimizer_loss(index: int) -> str:
    """The scalar name of optimizer ``index``'s loss (:data:`SCALAR_OPTIMIZER_LOSS`)."""
    return SCALAR_OPTIMIZER_LOSS.format(index=index)


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


PROMETHEUS_NAMES: dict[str, str] = {
    # The mechanical mapping gives process_thread_count, but Prometheus reserves _count for the sample count of
    # a histogram or summary (`promtool check metrics` rejects it on a gauge); Prometheus names a thread count
    # without it (go_threads), as the semantic conventions once did (process.threads).
    "process.thread.count": "process_threads",
}
"""OTel names whose Prometheus name is not the mechanical mapping: the mapped name breaks a Prometheus rule."""

def prometheus_name(name: str, unit: str, kind: Kind) -> str:
    """Prometheus metric family name for an OTel metric (without the counter's ``_total``)."""
    if name in PROMETHEUS_NAMES:
        return PROMETHEUS_NAMES[name]
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    base = re.sub(r"__+", "_", base)
    suffix = _unit_suffix(unit)
    if unit == "1" and kind is Kind.GAUGE:
        suffix = "ratio"
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base


def prometheus_label(key: str) -> str:
    """Prometheus label name for an attribute key (``cpu.mode`` -> ``cpu_mode``)."""
    name = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return "_" + name if name[:1].isdigit() else name

