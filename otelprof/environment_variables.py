"""Every environment variable otelprof reads, in one place.

Standard ``OTEL_*`` variables keep their OpenTelemetry meaning; otelprof's own
settings all start with ``OTELPROF_``. ``otelprof env`` and the
configuration table in ``docs/configuration.md`` are generated from :data:`ENV_VARS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, the Config field it sets, default and meaning."""

    name: str
    field: str | None
    default: str
    description: str
    secret: bool = False
    """A credential: never printed (``otelprof env``) nor recorded (the manifest's config)."""


OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
OTEL_EXPORTER_OTLP_TIMEOUT = "OTEL_EXPORTER_OTLP_TIMEOUT"
OTEL_METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"
OTEL_EXPORTER_PROMETHEUS_HOST = "OTEL_EXPORTER_PROMETHEUS_HOST"
OTEL_EXPORTER_PROMETHEUS_PORT = "OTEL_EXPORTER_PROMETHEUS_PORT"
OTEL_METRICS_EXEMPLAR_FILTER = "OTEL_METRICS_EXEMPLAR_FILTER"

OTELPROF_JOB_NAME = "OTELPROF_JOB_NAME"
OTELPROF_RUN_ID = "OTELPROF_RUN_ID"
OTELPROF_RECORD = "OTELPROF_RECORD"
OTELPROF_RECORD_DIR = "OTELPROF_RECORD_DIR"
OTELPROF_RECORD_SPOOL_DIR = "OTELPROF_RECORD_SPOOL_DIR"
OTELPROF_RECORD_SPOOL_MAX_BYTES = "OTELPROF_RECORD_SPOOL_MAX_BYTES"
OTELPROF_RECORD_UPLOAD_INTERVAL = "OTELPROF_RECORD_UPLOAD_INTERVAL"
OTELPROF_STORAGE_TIMEOUT_SECONDS = "OTELPROF_STORAGE_TIMEOUT_SECONDS"
OTELPROF_FLUSH_INTERVAL = "OTELPROF_FLUSH_INTERVAL"
OTELPROF_SHUTDOWN_TIMEOUT = "OTELPROF_SHUTDOWN_TIMEOUT"
OTELPROF_EXPORT_WARNING_INTERVAL = "OTELPROF_EXPORT_WARNING_INTERVAL"
OTELPROF_QUEUE_SIZE = "OTELPROF_QUEUE_SIZE"
OTELPROF_SPAN_BUDGET = "OTELPROF_SPAN_BUDGET"
OTELPROF_SPAN_FIRST_STEPS = "OTELPROF_SPAN_FIRST_STEPS"
OTELPROF_SPAN_EVERY = "OTELPROF_SPAN_EVERY"
OTELPROF_SPAN_WINDOWS = "OTELPROF_SPAN_WINDOWS"
OTELPROF_PROFILE_EVERY = "OTELPROF_PROFILE_EVERY"
OTELPROF_PROFILE_STEPS = "OTELPROF_PROFILE_STEPS"
OTELPROF_PROFILE_WARMUP = "OTELPROF_PROFILE_WARMUP"
OTELPROF_PROFILE_WARMUP_STEPS = "OTELPROF_PROFILE_WARMUP_STEPS"
OTELPROF_PROFILE_BUDGET = "OTELPROF_PROFILE_BUDGET"
OTELPROF_PROFILE_MAX_SPANS = "OTELPROF_PROFILE_MAX_SPANS"
OTELPROF_PROFILE_TOP_K = "OTELPROF_PROFILE_TOP_K"
OTELPROF_PROFILE_FLOPS = "OTELPROF_PROFILE_FLOPS"
OTELPROF_PROFILE_MEMORY = "OTELPROF_PROFILE_MEMORY"
OTELPROF_PROFILE_MAX_EVENTS = "OTELPROF_PROFILE_MAX_EVENTS"
OTELPROF_PEAK_FLOPS = "OTELPROF_PEAK_FLOPS"
OTELPROF_OUTLIER_SIGMA = "OTELPROF_OUTLIER_SIGMA"
OTELPROF_OUTLIER_MIN_STEPS = "OTELPROF_OUTLIER_MIN_STEPS"
OTELPROF_OUTLIER_MIN_RATIO = "OTELPROF_OUTLIER_MIN_RATIO"
OTELPROF_OUTLIER_MIN_EXCESS_MS = "OTELPROF_OUTLIER_MIN_EXCESS_MS"
OTELPROF_MAX_LABEL_VALUES = "OTELPROF_MAX_LABEL_VALUES"
OTELPROF_MAX_SERIES = "OTELPROF_MAX_SERIES"
OTELPROF_HANDLE_SIGTERM = "OTELPROF_HANDLE_SIGTERM"
OTELPROF_SYSTEM_METRICS = "OTELPROF_SYSTEM_METRICS"
OTELPROF_SAMPLE_INTERVAL_MS = "OTELPROF_SAMPLE_INTERVAL_MS"
OTELPROF_NODE_SAMPLER_LOCAL_RANK = "OTELPROF_NODE_SAMPLER_LOCAL_RANK"
OTELPROF_GPU_METRICS = "OTELPROF_GPU_METRICS"
OTELPROF_GPU_SAMPLING = "OTELPROF_GPU_SAMPLING"
OTELPROF_PER_CPU_MAX = "OTELPROF_PER_CPU_MAX"
OTELPROF_TORCH_NATIVE = "OTELPROF_TORCH_NATIVE"
OTELPROF_DDP_COLLECTIVES = "OTELPROF_DDP_COLLECTIVES"
OTELPROF_CPU_HIGH_THRESHOLD = "OTELPROF_CPU_HIGH_THRESHOLD"
OTELPROF_GPU_LOW_THRESHOLD = "OTELPROF_GPU_LOW_THRESHOLD"
OTELPROF_IOWAIT_HIGH_THRESHOLD = "OTELPROF_IOWAIT_HIGH_THRESHOLD"
OTELPROF_CONTROL_PORT = "OTELPROF_CONTROL_PORT"
OTELPROF_CONTROL_HOST = "OTELPROF_CONTROL_HOST"
OTELPROF_CONTROL_TOKEN = "OTELPROF_CONTROL_TOKEN"
OTELPROF_STOP_RAISES = "OTELPROF_STOP_RAISES"
OTELPROF_STOP_GRACE_SECONDS = "OTELPROF_STOP_GRACE_SECONDS"
OTELPROF_RULE_TIMEOUT_SECONDS = "OTELPROF_RULE_TIMEOUT_SECONDS"
OTELPROF_QUIET = "OTELPROF_QUIET"
OTELPROF_RUN_LAUNCH_ID = "OTELPROF_RUN_LAUNCH_ID"
OTELPROF_RUN_SPAWNER = "OTELPROF_RUN_SPAWNER"
OTELPROF_WEBHOOK_TOKEN = "OTELPROF_WEBHOOK_TOKEN"
OTELPROF_POD_NAME = "OTELPROF_POD_NAME"
OTELPROF_POD_NAMESPACE = "OTELPROF_POD_NAMESPACE"
OTELPROF_NODE_NAME = "OTELPROF_NODE_NAME"
OTELPROF_CONTAINER_NAME = "OTELPROF_CONTAINER_NAME"
OTELPROF_POD_UID = "OTELPROF_POD_UID"
OTELPROF_K8S_JOB_NAME = "OTELPROF_K8S_JOB_NAME"
OTELPROF_COLLECTIONS = "OTELPROF_COLLECTIONS"
OTELPROF_SAVE_INTERVAL = "OTELPROF_SAVE_INTERVAL"
OTELPROF_TENSOR_HISTOGRAM_BINS = "OTELPROF_TENSOR_HISTOGRAM_BINS"
OTELPROF_TENSOR_SERIES_MAX = "OTELPROF_TENSOR_SERIES_MAX"
OTELPROF_TENSOR_SAVE = "OTELPROF_TENSOR_SAVE"
OTELPROF_TENSOR_SAVE_MAX_BYTES = "OTELPROF_TENSOR_SAVE_MAX_BYTES"
OTELPROF_TENSOR_SAVE_TOTAL_BYTES = "OTELPROF_TENSOR_SAVE_TOTAL_BYTES"

# Read, never written: torchrun's process-group variables and Kubernetes' in-cluster marker.
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
WORLD_SIZE = "WORLD_SIZE"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
KUBERNETES_SERVICE_HOST = "KUBERNETES_SERVICE_HOST"

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(OTEL_SDK_DISABLED, "disabled", "false",
           "`true` turns every otelprof call into a no-op (nothing recorded or exported)."),
    EnvVar(OTELPROF_JOB_NAME, "job_name", "(script name)",
           "Training job name: `service.name` and the `job_name` label. Falls back to "
           "`OTEL_SERVICE_NAME`, then the script's file name."),
    EnvVar(OTEL_SERVICE_NAME, None, "",
           "Standard OpenTelemetry service name; used as the job name when `OTELPROF_JOB_NAME` is unset."),
    EnvVar(OTEL_RESOURCE_ATTRIBUTES, None, "",
           "Extra resource attributes, `key=value,...` (e.g. `k8s.pod.name=...`); they win over detected values."),
    EnvVar(OTELPROF_RUN_ID, "run_id", "(TORCHELASTIC_RUN_ID or a new id)",
           "Identifies one run; shared by all ranks. torchrun's `TORCHELASTIC_RUN_ID` is used when set."),
    EnvVar(OTELPROF_RECORD, "record", "true",
           "Write the local run recording (the embedded default, needs no server)."),
    EnvVar(OTELPROF_RECORD_DIR, "record_dir", "./otelprof-runs",
           "Where recordings go: `<dir>/<run-id>/rank-<rank>/`."),
    EnvVar(OTELPROF_RECORD_SPOOL_DIR, "record_spool_dir", "(temp dir)/otelprof-spool",
           "With an object-storage `OTELPROF_RECORD_DIR` (`s3://`, `gs://`, `az://`): the local directory the "
           "recording is written to before it is uploaded (see docs/storage.md)."),
    EnvVar(OTELPROF_RECORD_SPOOL_MAX_BYTES, "record_spool_max_bytes", "1073741824",
           "Most bytes of not-yet-uploaded recording kept in the spool; past it the oldest parts are deleted "
           "and their lines counted as dropped (`exporter=\"recording_upload\"`); 65536-1e12."),
    EnvVar(OTELPROF_RECORD_UPLOAD_INTERVAL, "record_upload_interval", "30",
           "Seconds between background uploads of the recording to object storage (also at exit and on "
           "SIGTERM); 0.2-3600."),
    EnvVar(OTELPROF_STORAGE_TIMEOUT_SECONDS, "storage_timeout", "10",
           "Bound in seconds on each object-storage request (connect and read timeouts; 2 attempts) of the "
           "upload and of `otelprof report|check|timeline|compare URL`; see docs/storage.md; 0.1-600."),
    EnvVar(OTELPROF_FLUSH_INTERVAL, "flush_interval", "0.5",
           "Seconds between background flushes of the recording (a SIGKILL loses at most this much); 0.05-10."),
    EnvVar(OTELPROF_SHUTDOWN_TIMEOUT, "shutdown_timeout", "3",
           "Upper bound in seconds on `shutdown()` (exporters that are still busy are abandoned); 0.1-60."),
    EnvVar(OTELPROF_EXPORT_WARNING_INTERVAL, "export_warning_interval", "300",
           "Seconds between the one-line summaries (batches dropped, retries, the last reason) of an exporter "
           "that keeps failing, after its first warning; the SDK's own per-export log lines are held back; "
           "1-86400."),
    EnvVar(OTELPROF_QUEUE_SIZE, "queue_size", "65536",
           "Most step/annotation records waiting for the background thread; beyond it records are dropped "
           "and counted. Also bounds the OTLP export queues."),
    EnvVar(OTEL_TRACES_EXPORTER, "traces_exporters", "(otlp if an OTLP endpoint is set, else none)",
           "Comma list of `otlp`, `console`, `none`. The local recording is controlled by `OTELPROF_RECORD`."),
    EnvVar(OTEL_METRICS_EXPORTER, "metrics_exporters",
           "(prometheus in Kubernetes; plus otlp if an OTLP endpoint is set; else none)",
           "Comma list of `otlp`, `prometheus`, `console`, `none`."),
    EnvVar(OTEL_EXPORTER_OTLP_PROTOCOL, "otlp_protocol", "http/protobuf",
           "`grpc` or `http/protobuf`. Endpoint, headers, TLS, compression and timeout follow the "
           "standard `OTEL_EXPORTER_OTLP_*` variables."),
    EnvVar(OTEL_EXPORTER_OTLP_ENDPOINT, None, "",
           "OTLP endpoint (collector). Setting it (or a per-signal endpoint) turns OTLP export on by default."),
    EnvVar(OTEL_METRIC_EXPORT_INTERVAL, "metric_export_interval", "10000",
           "Milliseconds between OTLP metric exports and metric snapshots in the recording "
           "(the spec's default is 60000; training problems need fresher data); 1000-600000."),
    EnvVar(OTEL_EXPORTER_PROMETHEUS_HOST, "prometheus_host",
           "(0.0.0.0 in Kubernetes, else 127.0.0.1)",
           "Address `/metrics` binds to. In a pod Prometheus scrapes the pod IP, so all interfaces; "
           "on a laptop loopback keeps the endpoint private."),
    EnvVar(OTEL_EXPORTER_PROMETHEUS_PORT, "prometheus_port", "9464",
           "Base port of `/metrics`; each process listens on base + `LOCAL_RANK`, so ranks in one pod "
           "never collide (0: any free port). A port in use gives one warning and no endpoint for that process."),
    EnvVar(OTEL_METRICS_EXEMPLAR_FILTER, "exemplars", "trace_based",
           "`trace_based` (or `always_on`): the step and region duration buckets carry a `trace_id` exemplar "
           "of the last traced step in them, an outlier's first, on `/metrics` in OpenMetrics and over OTLP; "
           "`always_off`: none."),
    EnvVar(OTELPROF_SPAN_BUDGET, "span_budget", "0.001",
           "Share of step time the background thread may spend building spans for sampled steps "
           "(0-1). First steps, every-Kth steps, windows and outliers are always traced."),
    EnvVar(OTELPROF_SPAN_FIRST_STEPS, "span_first_steps", "10",
           "The first N steps of each phase always become spans."),
    EnvVar(OTELPROF_SPAN_EVERY, "span_every", "0",
           "Every K-th step becomes a span (0 = off; the budget samples instead)."),
    EnvVar(OTELPROF_SPAN_WINDOWS, "span_windows", "",
           "Profiling windows whose every step becomes a span: `start_step:num_steps[,...]`, e.g. `100:20`."),
    EnvVar(OTELPROF_PROFILE_EVERY, "profile_every", "600",
           "Seconds between periodic operator-profiling windows of a PyTorch job (`torch.profiler` for "
           "`OTELPROF_PROFILE_STEPS` steps); 0 turns periodic windows off (captures and `profile_window` still work). "
           "The interval grows when a window costs more than `OTELPROF_PROFILE_BUDGET` of it."),
    EnvVar(OTELPROF_PROFILE_STEPS, "profile_steps", "3", "Steps in each periodic profiling window; 1-1000."),
    EnvVar(OTELPROF_PROFILE_WARMUP, "profile_warmup", "5",
           "Seconds after `init()` before the first periodic window may start."),
    EnvVar(OTELPROF_PROFILE_WARMUP_STEPS, "profile_warmup_steps", "10",
           "Step number before which no periodic window starts (warm-up steps are not typical)."),
    EnvVar(OTELPROF_PROFILE_BUDGET, "profile_budget", "0.01",
           "Share of training time periodic windows may cost (0-1): a window that cost X seconds more than its "
           "steps' usual time delays the next by at least X / budget."),
    EnvVar(OTELPROF_PROFILE_MAX_SPANS, "profile_max_spans", "500",
           "Operator spans per profiled step, the longest first (and as many kernel spans); the rest are counted "
           "as dropped (`exporter=\"operator_spans\"`). 0: no operator spans."),
    EnvVar(OTELPROF_PROFILE_TOP_K, "profile_top_k", "10",
           "Operators and kernels per window with series of their own on the operator metrics; the rest are "
           "summed as `other`; 1-100."),
    EnvVar(OTELPROF_PROFILE_FLOPS, "profile_flops", "true",
           "Count the model FLOPs of the step after each profiling window (`torch.utils.flop_counter`; skipped "
           "under `torch.compile`) for achieved FLOP/s and MFU; its cost counts as the window's."),
    EnvVar(OTELPROF_PROFILE_MEMORY, "profile_memory", "true",
           "Profiling windows record allocations (`torch.profiler` `profile_memory`): the top allocating "
           "operators and each window's memory curve."),
    EnvVar(OTELPROF_PROFILE_MAX_EVENTS, "profile_max_events", "100000",
           "Profiler events a window may hold (1000-10000000): about 2 kB of memory and 20 us of work each. Windows "
           "are planned short enough from the events per step measured before, and stop early (mid-step if need "
           "be) when their memory growth or their time at the measured event rate says the cap is reached; a longer "
           "capture goes on in further windows."),
    EnvVar(OTELPROF_PEAK_FLOPS, "peak_flops", "0",
           "Peak FLOP/s of the device for MFU, replacing the built-in table of GPU models and dtypes (0: the table; "
           "a CPU run has no utilization unless this is set)."),
    EnvVar(OTELPROF_OUTLIER_SIGMA, "outlier_sigma", "3",
           "A step slower than mean + sigma x stddev of the last 256 steps of its phase, and materially slower "
           "than their median (`OTELPROF_OUTLIER_MIN_RATIO`, `OTELPROF_OUTLIER_MIN_EXCESS_MS`), is an outlier: "
           "counted (OtelprofStepOutliers) and traced retroactively. 0 turns outlier detection off."),
    EnvVar(OTELPROF_OUTLIER_MIN_STEPS, "outlier_min_steps", "20",
           "Steps of a phase needed before outliers are judged."),
    EnvVar(OTELPROF_OUTLIER_MIN_RATIO, "outlier_min_ratio", "1.5",
           "An outlier step also takes at least this many times the median of the recent steps of its phase "
           "(1-100): scheduler jitter on steady steps passes mean + 3 sigma but is no outlier."),
    EnvVar(OTELPROF_OUTLIER_MIN_EXCESS_MS, "outlier_min_excess", "20",
           "An outlier step also takes at least this many milliseconds more than that median (a loaded machine's "
           "scheduler delays a thread by up to ~20 ms). Where a step records `tokens` (else `samples`), it must also "
           "be an outlier per token; steps of a profiling window and the 2 after it are never judged."),
    EnvVar(OTELPROF_MAX_LABEL_VALUES, "max_label_values", "64",
           "Distinct phase / annotation names kept as metric labels; further names are counted as `other`."),
    EnvVar(OTELPROF_MAX_SERIES, "max_series", "500",
           "Series one metric may have for its phase / annotation label sets (e.g. phases x annotation names), "
           "16-1000000; observations of further ones are counted under `other` and in `otelprof.series.folded`. "
           "Bounds a scrape of /metrics."),
    EnvVar(OTELPROF_HANDLE_SIGTERM, "handle_sigterm", "true",
           "Flush the recording and exporters on SIGTERM (pod deletion), then let the signal take its own "
           "course: an application handler runs as it would (otelprof records until exit), without one the "
           "process dies of SIGTERM; nothing is installed over SIG_IGN."),
    EnvVar(OTELPROF_SYSTEM_METRICS, "system_metrics", "true",
           "Sample host, container, process and GPU telemetry on a background thread."),
    EnvVar(OTELPROF_SAMPLE_INTERVAL_MS, "sample_interval", "500",
           "Milliseconds between telemetry samples, 100-60000 (out of range: a warning and the default)."),
    EnvVar(OTELPROF_NODE_SAMPLER_LOCAL_RANK, "node_sampler_local_rank", "0",
           "The local rank that samples node-wide series (host, container, GPUs), so a multi-rank pod does "
           "not count them twice; -1 = every rank. Every rank samples its own process."),
    EnvVar(OTELPROF_GPU_METRICS, "gpu_metrics", "true",
           "Read GPUs through NVML (nvidia-ml-py) when available. Honours `CUDA_VISIBLE_DEVICES` and "
           "`NVIDIA_VISIBLE_DEVICES`."),
    EnvVar(OTELPROF_GPU_SAMPLING, "gpu_sampling", "true",
           "Sample the GPUs' readings (utilization, memory, power, ...). false where dcgm-exporter already "
           "samples them (mixin `gpu_source=dcgm`): NVML is then only asked once, for the GPU's identity "
           "(`otelprof_gpu_info`, the join to dcgm-exporter's series)."),
    EnvVar(OTELPROF_PER_CPU_MAX, "per_cpu_max", "64",
           "Export `system.cpu.utilization` per logical CPU on nodes with at most this many CPUs; on larger "
           "nodes only the busiest CPU's modes (`cpu` = `busiest`), so per-core series do not dominate a node's "
           "budget (no alert uses them: the CPU-bottleneck counters are judged per sample, on every CPU). "
           "0: always the busiest CPU only. The recording keeps every CPU either way."),
    EnvVar(OTELPROF_TORCH_NATIVE, "torch_native", "true",
           "The PyTorch integration's per-step hooks in C where the extension was built (false: the same hooks "
           "in Python, e.g. to compare). Read when `instrument()` is first called."),
    EnvVar(OTELPROF_DDP_COLLECTIVES, "ddp_collectives", "true",
           "Time DDP's gradient all-reduce per bucket (`collective` regions: communication time, stragglers, "
           "overlap) with a communication hook. false: DDP keeps its built-in C++ reduction and the C step hooks, "
           "at the price of no collective regions (see the performance page for the cost)."),
    EnvVar(OTELPROF_CPU_HIGH_THRESHOLD, "cpu_high_threshold", "0.9",
           "A CPU busier than this ratio counts as high in the CPU-bottleneck coincidence counter."),
    EnvVar(OTELPROF_GPU_LOW_THRESHOLD, "gpu_low_threshold", "0.1",
           "A GPU below this utilization ratio counts as low in the coincidence counters."),
    EnvVar(OTELPROF_IOWAIT_HIGH_THRESHOLD, "iowait_high_threshold", "0.5",
           "A CPU with more iowait than this ratio counts as waiting in the I/O-bottleneck counter."),
    EnvVar(OTELPROF_CONTROL_PORT, "control_port", "0",
           "Base port of the control endpoint (`POST /v1/stop`, `POST /v1/capture`, `GET /v1/status`) used by "
           "`otelprof webhook` and `otelprof capture`; each process listens on base + `LOCAL_RANK`. 0 = off."),
    EnvVar(OTELPROF_CONTROL_HOST, "control_host", "(0.0.0.0 in Kubernetes, else 127.0.0.1)",
           "Address the control endpoint binds to."),
    EnvVar(OTELPROF_CONTROL_TOKEN, "control_token", "",
           "Bearer token the control endpoint requires; without one it only starts on loopback. Never recorded, "
           "and `otelprof env` shows it as `(set, hidden)`.",
           secret=True),
    EnvVar(OTELPROF_STOP_RAISES, "stop_raises", "false",
           "After a stop request, raise `otelprof.StopTraining` at the next step boundary (after the `on_stop` "
           "callbacks) instead of only setting `session.should_stop()`."),
    EnvVar(OTELPROF_STOP_GRACE_SECONDS, "stop_grace", "300",
           "`otelprof run` only, where a stop request ends the program at the next step boundary with exit status 3: "
           "seconds to wait for that boundary before ending the process from otelprof's thread (the recording "
           "finished first, as on SIGTERM), with the same status. 0: wait for ever. From 0 to 86400."),
    EnvVar(OTELPROF_RULE_TIMEOUT_SECONDS, "rule_timeout", "10",
           "`otelprof check --rules` only: seconds each check rule may run in all (its every step of every rank), "
           "and the rules file may take to load; past it the rule is killed and reported as timed out (exit status "
           "2, the other checks' verdicts still printed). `--rule-timeout` wins over it. From 0.1 to 86400."),
    EnvVar(OTELPROF_QUIET, "quiet", "false",
           "`true`: `otelprof run` prints no start and exit lines (the run id, where the recording goes, the "
           "report command); warnings are still printed. `otelprof run --quiet` sets it."),
    EnvVar(OTELPROF_RUN_LAUNCH_ID, None, "",
           "Set under `otelprof run` by a launcher (torchrun, `accelerate launch`, ...) for the processes it "
           "starts: their run id when neither `OTELPROF_RUN_ID` nor torchrun's `TORCHELASTIC_RUN_ID` gives one, so "
           "all ranks of `otelprof run -- torchrun ...` share one run."),
    EnvVar(OTELPROF_RUN_SPAWNER, None, "",
           "Set under `otelprof run` by the process it starts, when no launcher gave that one a rank, for its "
           "multiprocessing children (JSON: its pid, run id, recording directory, job name, handover path): a child "
           "that calls `init_process_group` (`mp.spawn` DDP scripts) becomes that rank of its run."),
    EnvVar(OTELPROF_WEBHOOK_TOKEN, None, "",
           "`otelprof webhook` only: the bearer token Alertmanager must send (or `--token-file`); required. "
           "`otelprof env` shows it as `(set, hidden)`.",
           secret=True),
    EnvVar(OTELPROF_POD_NAME, "pod_name", "(HOSTNAME in Kubernetes)",
           "`k8s.pod.name`; set from the downward API `metadata.name`."),
    EnvVar(OTELPROF_POD_NAMESPACE, "pod_namespace", "(service-account namespace file)",
           "`k8s.namespace.name`; set from the downward API `metadata.namespace`."),
    EnvVar(OTELPROF_NODE_NAME, "node_name", "(host name)",
           "`k8s.node.name` and the `node` label; set from the downward API `spec.nodeName`."),
    EnvVar(OTELPROF_CONTAINER_NAME, "container_name", "",
           "`k8s.container.name`; the downward API cannot give it, set it literally."),
    EnvVar(OTELPROF_POD_UID, "pod_uid", "", "`k8s.pod.uid`; set from the downward API `metadata.uid`."),
    EnvVar(OTELPROF_K8S_JOB_NAME, "k8s_job_name", "",
           "`k8s.job.name`: the Kubernetes Job owning the pod; set from the downward API "
           "`metadata.labels['batch.kubernetes.io/job-name']`."),
    EnvVar(RANK, "rank", "0", "Global rank (set by torchrun)."),
    EnvVar(LOCAL_RANK, "local_rank", "0", "Rank within the node (set by torchrun); offsets the /metrics port."),
    EnvVar(WORLD_SIZE, "world_size", "1", "Number of ranks (set by torchrun)."),
    EnvVar(OTELPROF_COLLECTIONS, "collections", "",
           "Tensor collections reduced to statistics at saved steps (PyTorch; `tensors.jsonl` in the recording): "
           "comma list of `NAME[=INCLUDE][!EXCLUDE][@EVERY][#START-END]`, NAME a built-in (`weights`, `biases`, "
           "`gradients`, `outputs`, `inputs`, `optimizer`, `losses`) or a custom name with an INCLUDE regex over "
           "tensor names. Empty: off. See docs/tensors.md."),
    EnvVar(OTELPROF_SAVE_INTERVAL, "save_interval", "500",
           "Collections save every this many optimizer steps unless one sets its own `@EVERY`; 1-1e9."),
    EnvVar(OTELPROF_TENSOR_HISTOGRAM_BINS, "tensor_histogram_bins", "0",
           "Bins of the fixed-bin histogram (between the tensor's min and max) saved with each tensor's "
           "reductions; 0 = none; 0-256."),
    EnvVar(OTELPROF_TENSOR_SERIES_MAX, "tensor_series_max", "64",
           "Tensors per collection with series of their own in the tensor metrics (otelprof.tensor.*, for the "
           "live per-layer alerts); the collection's further tensors are summed as `tensor=\"other\"` (counted in "
           "otelprof.series.folded); 0 = no tensor metrics; 0-4096."),
    EnvVar(OTELPROF_TENSOR_SAVE, "tensor_save", "",
           "Regex over tensor names (as in the collections: `fc1.weight`, `gradients/fc1.weight`, `fc1/output`) "
           "whose full values are saved (float32) at the saved steps of the collections that select them, to "
           "`tensors-full.bin` beside `tensors.jsonl`. Empty: none (only the reductions)."),
    EnvVar(OTELPROF_TENSOR_SAVE_MAX_BYTES, "tensor_save_max_bytes", "4194304",
           "Bytes of full tensors saved per saved step at most; a tensor that does not fit is dropped and "
           "counted (4 MiB)."),
    EnvVar(OTELPROF_TENSOR_SAVE_TOTAL_BYTES, "tensor_save_total_bytes", "268435456",
           "Bytes of full tensors saved per process at most (256 MiB); later ones are dropped and counted."),
)

INTERNAL = frozenset({"OTELPROF_RUN", "OTELPROF_RUN_TORCH", "OTELPROF_RUN_GRAD_NORM", "OTELPROF_SCREENSHOTS",
                      "OTELPROF_DASHBOARD_PREVIEW"})
"""``OTELPROF_*`` names that are not settings: what ``otelprof run`` tells the processes it starts, and the test
suite's switches. Known, so not reported as misspellings."""


def known(name: str) -> bool:
    """Whether otelprof reads the variable ``name``."""
    return name in INTERNAL or any(var.name == name for var in ENV_VARS)


def closest(name: str) -> str | None:
    """The setting whose name is closest to ``name`` (a misspelling of it), or None when none is close."""
    import difflib

    names = [var.name for var in ENV_VARS if var.name.startswith("OTELPROF_")]
    found = difflib.get_close_matches(name.upper(), names, n=1, cutoff=0.75)
    return found[0] if found else None
