"""The frozen :class:`Config`, built once in ``init()``: explicit argument > env var > default.

Bad values never raise into a training job: :meth:`Config.from_env` warns once and
keeps the default. The CLI (every subcommand but ``run``, whose program warns from its own
``init()``) builds it with ``strict=True`` and turns :class:`ConfigError` into a clear message
and exit status 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from otelprof import environment_variables as ev
from otelprof import thresholds
from otelprof._arguments import encodable
from otelprof._log import escape, redact, warn_once

EXPORTERS_TRACES = ("otlp", "console", "none")
EXPORTERS_METRICS = ("otlp", "prometheus", "console", "none")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")


class ConfigError(ValueError):
    """A setting has a value otelprof cannot use."""


@dataclass(frozen=True)
class Config:
    """Every setting of one otelprof session. Field names are ``init()``'s keyword arguments."""

    disabled: bool = False
    job_name: str = "training"
    run_id: str = ""
    record: bool = True
    record_dir: str = "otelprof-runs"
    record_spool_dir: str = ""
    record_spool_max_bytes: int = 2**30
    record_upload_interval: float = 30.0
    storage_timeout: float = 10.0
    flush_interval: float = 0.5
    shutdown_timeout: float = 3.0
    export_warning_interval: float = 300.0
    queue_size: int = 65536
    traces_exporters: tuple[str, ...] = ()
    metrics_exporters: tuple[str, ...] = ()
    otlp_protocol: str = "http/protobuf"
    metric_export_interval: float = 10.0
    prometheus_host: str = "127.0.0.1"
    prometheus_port: int = 9464
    exemplars: bool = True
    span_budget: float = 0.001
    span_first_steps: int = 10
    span_every: int = 0
    span_windows: tuple[tuple[int, int], ...] = ()
    profile_every: float = 600.0
    profile_steps: int = 3
    profile_warmup: float = 5.0
    profile_warmup_steps: int = 10
    profile_budget: float = 0.01
    profile_max_spans: int = 500
    profile_top_k: int = 10
    profile_flops: bool = True
    profile_memory: bool = True
    profile_max_events: int = 100_000
    peak_flops: float = 0.0
    outlier_sigma: float = thresholds.OUTLIER_SIGMA
    outlier_min_steps: int = 20
    outlier_min_ratio: float = thresholds.OUTLIER_MIN_RATIO
    outlier_min_excess: float = thresholds.OUTLIER_MIN_EXCESS
    max_label_values: int = 64
    max_series: int = 500
    handle_sigterm: bool = True
    system_metrics: bool = True
    sample_interval: float = 0.5
    node_sampler_local_rank: int = 0
    gpu_metrics: bool = True
    gpu_sampling: bool = True
    torch_native: bool = True
    ddp_collectives: bool = True
    cpu_high_threshold: float = thresholds.CPU_HIGH
    gpu_low_threshold: float = thresholds.GPU_LOW
    iowait_high_threshold: float = thresholds.IOWAIT_HIGH
    control_port: int = 0
    control_host: str = "127.0.0.1"
    control_token: str = ""
    stop_raises: bool = False
    stop_grace: float = 300.0
    rule_timeout: float = 10.0
    quiet: bool = False
    pod_name: str = ""
    pod_namespace: str = ""
    node_name: str = ""
    container_name: str = ""
    pod_uid: str = ""
    k8s_job_name: str = ""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    collections: str = ""
    save_interval: int = 500
    tensor_histogram_bins: int = 0
    tensor_series_max: int = 64
    tensor_save: str = ""
    tensor_save_max_bytes: int = 4 * 2**20
    tensor_save_total_bytes: int = 256 * 2**20
    per_cpu_max: int = 64

    @property
    def samples_node(self) -> bool:
        """Whether this process samples the node-wide series (host, container, GPUs)."""
        return self.node_sampler_local_rank in (-1, self.local_rank)

    @property
    def prometheus_rank_port(self) -> int:
        """The port this process serves ``/metrics`` on: base port + local rank (0: any free port)."""
        return self.prometheus_port + self.local_rank if self.prometheus_port else 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly view (the recording's manifest keeps it); secrets are redacted."""
        values = {k: list(v) if isinstance(v, tuple) else encodable(v) if isinstance(v, str) else v
                  for k, v in asdict(self).items()}
        for var in ev.ENV_VARS:
            if var.secret and var.field is not None and values.get(var.field):
                values[var.field] = "(set)"
        return {k: redact(v) if isinstance(v, str) else v for k, v in values.items()}  # s3://user:***@...

    @property
    def control_rank_port(self) -> int:
        """The port of this process's control endpoint: base + local rank (0: off)."""
        return self.control_port + self.local_rank if self.control_port else 0

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        strict: bool = False,
        **overrides: Any,
    ) -> Config:
        """Build the config from ``overrides`` > ``env`` (default ``os.environ``) > defaults."""
        env = os.environ if env is None else env
        builder = _Builder(env, strict)
        values = builder.build()
        known = {f.name for f in fields(cls)}
        for key, value in overrides.items():
            if key not in known:
                builder.problem(key, f"init() got an unknown setting {key!r}; ignored")
                continue
            if value is None:
                continue
            try:
                values[key] = _coerce_override(key, value)
            except Exception as exc:  # whatever the value does (an int too large for a float, a raising __int__)
                fallback = values.get(key, getattr(cls, key))
                builder.problem(key, f"init({key}={_show(value)}) is invalid ({_reason(exc)}); using {fallback!r}")
        _check_rank_ports(values, builder)
        _check_unknown_variables(env)
        for key in _TEXT_FIELDS:
            if isinstance(values.get(key), str):
                values[key] = encodable(values[key])
        return cls(**values)


def rule_timeout(argument: str | None, env: Mapping[str, str] | None = None) -> float:
    """``otelprof check``'s time limit on each check rule: ``--rule-timeout`` > ``OTELPROF_RULE_TIMEOUT_SECONDS`` >
    10 s; a value it cannot use is a :class:`ConfigError`."""
    env = os.environ if env is None else env
    variable = env.get(ev.OTELPROF_RULE_TIMEOUT_SECONDS)
    for text, where in ((argument, "--rule-timeout"), (variable, ev.OTELPROF_RULE_TIMEOUT_SECONDS)):
        if text is None or (where != "--rule-timeout" and not text.strip()):
            continue
        try:
            return float(_PARSERS["rule_timeout"](text))
        except ValueError as exc:
            raise ConfigError(f"{where} {_show(text)} is invalid ({_reason(exc)}): a number of seconds from 0.1 to "
                              "86400") from None
    return Config.rule_timeout


_TEXT_FIELDS = ("job_name", "run_id", "pod_name", "pod_namespace", "node_name", "container_name")
"""Settings that become resource attributes and labels: they must encode to UTF-8 (a byte that is not UTF-8 in
an environment variable reaches Python as a lone surrogate)."""


def _check_rank_ports(values: dict[str, Any], builder: _Builder) -> None:
    """Base port + local rank must be a port: past 65535 the endpoint is not started (one warning)."""
    local_rank = values.get("local_rank", Config.local_rank)
    for key, variable, what in (("prometheus_port", ev.OTEL_EXPORTER_PROMETHEUS_PORT, "/metrics"),
                                ("control_port", ev.OTELPROF_CONTROL_PORT, "the control endpoint")):
        base = values.get(key, getattr(Config, key))
        if base and base + local_rank > 65535:
            builder.problem(key, f"{variable}={base} + local rank {local_rank} is port {base + local_rank}, above "
                                 f"65535; {what} is not served by this process (lower {variable})")
            values[key] = 0
            if key == "prometheus_port":
                values["metrics_exporters"] = tuple(e for e in values.get("metrics_exporters", ())
                                                    if e != "prometheus")


def _check_unknown_variables(env: Mapping[str, str]) -> None:
    """An ``OTELPROF_*`` variable otelprof does not know (a misspelling) is named once, with the closest one."""
    for name in unknown_variables(env):
        close = ev.closest(name)
        hint = f"; did you mean {close}?" if close else ""
        warn_once(f"config:unknown:{name}", "otelprof: %s is not an otelprof setting and is ignored%s "
                  "(otelprof env lists them)", escape(name, 80), hint)


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """The ``OTELPROF_*`` variables in ``env`` that otelprof does not read."""
    return sorted(name for name in env if name.startswith("OTELPROF_") and not ev.known(name))


def _coerce_override(key: str, value: Any) -> Any:
    parser = _PARSERS.get(key)
    if parser is not None and isinstance(value, str):
        return parser(value)
    if key in ("traces_exporters", "metrics_exporters") and not isinstance(value, str):
        return _parse_exporters(",".join(value), EXPORTERS_METRICS if key == "metrics_exporters" else EXPORTERS_TRACES)
    if key == "span_windows" and not isinstance(value, str):
        return _parse_windows(",".join(f"{int(a)}:{int(b)}" for a, b in value))
    default = getattr(Config, key, None)
    if isinstance(default, str):
        if not isinstance(value, str):
            raise TypeError("expected a string")
        value = str.__str__(value)
    elif isinstance(default, bool):
        if not isinstance(value, bool):
            raise TypeError("expected a bool")
        return value
    if isinstance(default, float):
        value = float(value)
    elif isinstance(default, int):
        value = int(value)
    check = _CHECKS.get(key)
    if check is not None:
        check(value)
    return value


def _show(value: Any) -> str:
    """A refused value for the warning: numbers, booleans and short strings as written, else the type."""
    if type(value) in (bool, int, float) and len(text := repr(value)) <= 40:
        return text
    if type(value) is str and len(value) <= 40 and value.isprintable():
        return repr(value)
    return f"<{type(value).__qualname__}>"


def _reason(exc: Exception) -> str:
    """Why a value was refused, for the one warning: the message, cut (it may quote the value)."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    text = text or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def _check_run_id(value: str) -> None:
    """A run id names one directory of the recording: one path component, no separators."""
    if len(value) > 200 or value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ValueError("a run id must be one directory name of at most 200 characters")


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _ranged(kind: Callable[[str], Any], low: float, high: float) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text.strip())
        _in_range(value, low, high)
        return value

    return parse


def _in_range(value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"{value} is outside {low:g}..{high:g}")


def _parse_exporters(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in allowed]
    if bad:
        raise ValueError(f"unknown exporter {', '.join(bad)} (allowed: {', '.join(allowed)})")
    return tuple(n for n in names if n != "none")


def _parse_windows(text: str) -> tuple[tuple[int, int], ...]:
    windows = []
    for part in text.split(","):
        if not part.strip():
            continue
        start, sep, count = part.partition(":")
        if not sep:
            raise ValueError(f"window {part!r} is not start_step:num_steps")
        window = (int(start), int(count))
        if window[0] < 0 or window[1] < 1:
            raise ValueError(f"window {part!r} needs start >= 0 and num_steps >= 1")
        windows.append(window)
    return tuple(windows)


def _parse_exemplar_filter(text: str) -> bool:
    """OTEL_METRICS_EXEMPLAR_FILTER: otelprof's exemplars always come from traced steps, so ``always_on`` is
    ``trace_based``."""
    value = text.strip().lower()
    if value not in ("trace_based", "always_on", "always_off"):
        raise ValueError("expected trace_based, always_on or always_off")
    return value != "always_off"


def _parse_protocol(text: str) -> str:
    value = text.strip().lower()
    if value == "http/json":
        raise ValueError("http/json is not supported by the Python exporters; use grpc or http/protobuf")
    if value not in OTLP_PROTOCOLS:
        raise ValueError(f"expected one of {', '.join(OTLP_PROTOCOLS)}")
    return value


def _parse_regex(text: str) -> str:
    import re

    try:
        re.compile(text.strip())
    except re.error as exc:
        raise ValueError(f"bad regex {text.strip()!r} ({exc})") from None
    return text.strip()


def _parse_collections(text: str) -> str:
    from otelprof.tensor_collections import parse_collections

    parse_collections(text)  # ValueError names the bad item
    return text.strip()


_PARSERS: dict[str, Callable[[str], Any]] = {
    "disabled": _parse_bool,
    "record": _parse_bool,
    "handle_sigterm": _parse_bool,
    "flush_interval": _ranged(float, 0.05, 10.0),
    "shutdown_timeout": _ranged(float, 0.1, 60.0),
    "record_spool_dir": str,
    "record_spool_max_bytes": _ranged(int, 65536, 10**12),
    "record_upload_interval": _ranged(float, 0.2, 3600.0),
    "storage_timeout": _ranged(float, 0.1, 600.0),
    "export_warning_interval": _ranged(float, 1.0, 86400.0),
    "queue_size": _ranged(int, 64, 10_000_000),
    "traces_exporters": lambda t: _parse_exporters(t, EXPORTERS_TRACES),
    "metrics_exporters": lambda t: _parse_exporters(t, EXPORTERS_METRICS),
    "otlp_protocol": _parse_protocol,
    "metric_export_interval": lambda t: _ranged(float, 1000, 600_000)(t) / 1000.0,
    "prometheus_port": _ranged(int, 0, 65535),
    "exemplars": _parse_exemplar_filter,
    "span_budget": _ranged(float, 0.0, 1.0),
    "span_first_steps": _ranged(int, 0, 1_000_000),
    "span_every": _ranged(int, 0, 1_000_000_000),
    "span_windows": _parse_windows,
    "profile_every": _ranged(float, 0.0, 1e7),
    "profile_steps": _ranged(int, 1, 1000),
    "profile_warmup": _ranged(float, 0.0, 1e6),
    "profile_warmup_steps": _ranged(int, 0, 1_000_000),
    "profile_budget": _ranged(float, 0.0, 1.0),
    "profile_max_spans": _ranged(int, 0, 100_000),
    "profile_top_k": _ranged(int, 1, 100),
    "profile_flops": _parse_bool,
    "profile_memory": _parse_bool,
    "profile_max_events": _ranged(int, 1000, 10_000_000),
    "peak_flops": _ranged(float, 0.0, 1e20),
    "outlier_sigma": _ranged(float, 0.0, 100.0),
    "outlier_min_steps": _ranged(int, 2, 1_000_000),
    "outlier_min_ratio": _ranged(float, 1.0, 100.0),
    "outlier_min_excess": lambda t: _ranged(float, 0.0, 3_600_000.0)(t) / 1000.0,
    "max_label_values": _ranged(int, 1, 10_000),
    "max_series": _ranged(int, 16, 1_000_000),
    "system_metrics": _parse_bool,
    "stop_raises": _parse_bool,
    "stop_grace": _ranged(float, 0.0, 86400.0),
    "rule_timeout": _ranged(float, 0.1, 86400.0),
    "quiet": _parse_bool,
    "control_port": _ranged(int, 0, 65535),
    "gpu_metrics": _parse_bool,
    "gpu_sampling": _parse_bool,
    "torch_native": _parse_bool,
    "ddp_collectives": _parse_bool,
    "sample_interval": lambda t: _ranged(float, 100, 60_000)(t) / 1000.0,
    "node_sampler_local_rank": _ranged(int, -1, 65535),
    "cpu_high_threshold": _ranged(float, 0.0, 1.0),
    "gpu_low_threshold": _ranged(float, 0.0, 1.0),
    "iowait_high_threshold": _ranged(float, 0.0, 1.0),
    "rank": _ranged(int, 0, 1_000_000),
    "local_rank": _ranged(int, 0, 65535),
    "world_size": _ranged(int, 1, 1_000_000),
    "collections": _parse_collections,
    "save_interval": _ranged(int, 1, 1_000_000_000),
    "tensor_histogram_bins": _ranged(int, 0, 256),
    "tensor_series_max": _ranged(int, 0, 4096),
    "tensor_save": _parse_regex,
    "tensor_save_max_bytes": _ranged(int, 0, 2**34),
    "tensor_save_total_bytes": _ranged(int, 0, 2**40),
    "per_cpu_max": _ranged(int, 0, 1_000_000),
}

_CHECKS: dict[str, Callable[[Any], None]] = {
    "run_id": _check_run_id,
    "span_first_steps": lambda v: _in_range(v, 0, 1_000_000),
    "span_every": lambda v: _in_range(v, 0, 1_000_000_000),
    "outlier_min_steps": lambda v: _in_range(v, 2, 1_000_000),
    "node_sampler_local_rank": lambda v: _in_range(v, -1, 65535),
    "rank": lambda v: _in_range(v, 0, 1_000_000),
    "local_rank": lambda v: _in_range(v, 0, 65535),
    "world_size": lambda v: _in_range(v, 1, 1_000_000),
    "save_interval": lambda v: _in_range(v, 1, 1_000_000_000),
    "tensor_histogram_bins": lambda v: _in_range(v, 0, 256),
    "tensor_series_max": lambda v: _in_range(v, 0, 4096),
    "tensor_save_max_bytes": lambda v: _in_range(v, 0, 2**34),
    "tensor_save_total_bytes": lambda v: _in_range(v, 0, 2**40),
    "per_cpu_max": lambda v: _in_range(v, 0, 1_000_000),
    "flush_interval": lambda v: _in_range(v, 0.05, 10.0),
    "shutdown_timeout": lambda v: _in_range(v, 0.1, 60.0),
    "stop_grace": lambda v: _in_range(v, 0.0, 86400.0),
    "rule_timeout": lambda v: _in_range(v, 0.1, 86400.0),
    "record_spool_max_bytes": lambda v: _in_range(v, 65536, 10**12),
    "record_upload_interval": lambda v: _in_range(v, 0.2, 3600.0),
    "storage_timeout": lambda v: _in_range(v, 0.1, 600.0),
    "export_warning_interval": lambda v: _in_range(v, 1.0, 86400.0),
    "queue_size": lambda v: _in_range(v, 64, 10_000_000),
    "metric_export_interval": lambda v: _in_range(v, 1.0, 600.0),
    "prometheus_port": lambda v: _in_range(v, 0, 65535),
    "span_budget": lambda v: _in_range(v, 0.0, 1.0),
    "profile_every": lambda v: _in_range(v, 0.0, 1e7),
    "profile_steps": lambda v: _in_range(v, 1, 1000),
    "profile_warmup": lambda v: _in_range(v, 0.0, 1e6),
    "profile_warmup_steps": lambda v: _in_range(v, 0, 1_000_000),
    "profile_budget": lambda v: _in_range(v, 0.0, 1.0),
    "profile_max_spans": lambda v: _in_range(v, 0, 100_000),
    "profile_top_k": lambda v: _in_range(v, 1, 100),
    "profile_max_events": lambda v: _in_range(v, 1000, 10_000_000),
    "peak_flops": lambda v: _in_range(v, 0.0, 1e20),
    "outlier_sigma": lambda v: _in_range(v, 0.0, 100.0),
    "outlier_min_ratio": lambda v: _in_range(v, 1.0, 100.0),
    "outlier_min_excess": lambda v: _in_range(v, 0.0, 3600.0),
    "max_label_values": lambda v: _in_range(v, 1, 10_000),
    "max_series": lambda v: _in_range(v, 16, 1_000_000),
    "sample_interval": lambda v: _in_range(v, 0.1, 60.0),
    "control_port": lambda v: _in_range(v, 0, 65535),
    "cpu_high_threshold": lambda v: _in_range(v, 0.0, 1.0),
    "gpu_low_threshold": lambda v: _in_range(v, 0.0, 1.0),
    "iowait_high_threshold": lambda v: _in_range(v, 0.0, 1.0),
}


class _Builder:
    """Reads every variable of :data:`ENV_VARS` that maps to a field, with documented fallbacks."""

    def __init__(self, env: Mapping[str, str], strict: bool) -> None:
        self.env = env
        self.strict = strict

    def problem(self, key: str, message: str) -> None:
        if self.strict:
            raise ConfigError(message)
        warn_once(f"config:{key}", "otelprof: %s", message)

    def build(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for var in ev.ENV_VARS:
            if var.field is None or var.field not in _PARSERS:
                continue
            raw = self.env.get(var.name)
            if raw is None or raw.strip() == "":
                continue
            try:
                values[var.field] = _PARSERS[var.field](raw)
            except ValueError as exc:
                default = getattr(Config, var.field)
                self.problem(var.field, f"{var.name}={raw!r} is invalid ({exc}); using the default {default!r}")
        env = self.env
        in_k8s = bool(env.get(ev.KUBERNETES_SERVICE_HOST))
        values["job_name"] = (
            env.get(ev.OTELPROF_JOB_NAME) or env.get(ev.OTEL_SERVICE_NAME) or _script_name() or "training"
        )
        values["run_id"] = (env.get(ev.OTELPROF_RUN_ID) or _torchelastic_run_id(env)
                            or env.get(ev.OTELPROF_RUN_LAUNCH_ID) or "")
        try:
            _check_run_id(values["run_id"])
        except ValueError as exc:
            self.problem("run_id", f"the run id {values['run_id'][:40]!r} is invalid ({exc}); using a new one")
            values["run_id"] = ""
        if env.get(ev.OTELPROF_RECORD_DIR):
            values["record_dir"] = env[ev.OTELPROF_RECORD_DIR]
        otlp_endpoint = any(
            env.get(name)
            for name in (
                ev.OTEL_EXPORTER_OTLP_ENDPOINT,
                ev.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
                ev.OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
            )
        )
        if "traces_exporters" not in values:
            values["traces_exporters"] = ("otlp",) if otlp_endpoint else ()
        if "metrics_exporters" not in values:
            values["metrics_exporters"] = (("prometheus",) if in_k8s else ()) + (("otlp",) if otlp_endpoint else ())
        values["prometheus_host"] = env.get(ev.OTEL_EXPORTER_PROMETHEUS_HOST) or ("0.0.0.0" if in_k8s else "127.0.0.1")
        values["control_host"] = env.get(ev.OTELPROF_CONTROL_HOST) or ("0.0.0.0" if in_k8s else "127.0.0.1")
        values["control_token"] = env.get(ev.OTELPROF_CONTROL_TOKEN, "")
        values["pod_name"] = (
            env.get(ev.OTELPROF_POD_NAME)
            or env.get("OTEL_RESOURCE_ATTRIBUTES_POD_NAME")
            or (env.get("HOSTNAME", "") if in_k8s else "")
        )
        values["pod_namespace"] = env.get(ev.OTELPROF_POD_NAMESPACE) or (_namespace_file() if in_k8s else "")
        values["node_name"] = env.get(ev.OTELPROF_NODE_NAME) or env.get("OTEL_RESOURCE_ATTRIBUTES_NODE_NAME") or ""
        values["container_name"] = env.get(ev.OTELPROF_CONTAINER_NAME, "")
        values["pod_uid"] = env.get(ev.OTELPROF_POD_UID, "")
        values["k8s_job_name"] = env.get(ev.OTELPROF_K8S_JOB_NAME, "")
        return values


def _script_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else ""
    if not argv0 or argv0 == "-c":
        return ""
    name = Path(argv0).name
    return name[:-3] if name.endswith(".py") else name


def _torchelastic_run_id(env: Mapping[str, str]) -> str:
    value = env.get(ev.TORCHELASTIC_RUN_ID, "")
    return "" if value in ("", "none") else value


def _namespace_file() -> str:
    try:
        return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
    except OSError:
        return ""
