"""The real /metrics output, scraped over HTTP, matches the catalog exactly."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import otelprof
from otelprof import semconv as sc
from tests.servers import require_binary


def _exercise_every_metric() -> None:
    for i in range(40):
        with otelprof.step():
            with otelprof.annotate(sc.REGION_DATALOADER):
                pass
            with otelprof.annotate("forward"):
                pass
            with otelprof.annotate(sc.REGION_COLLECTIVE):
                pass
            otelprof.record("loss", 1.0 / (i + 1))
            otelprof.record("learning_rate", 0.1)
            otelprof.record("grad_norm", 2.0)
            otelprof.record("samples", 32)
            otelprof.record("tokens", 4096)
    with otelprof.step():
        time.sleep(0.05)  # far slower than the 40 steps before it: an outlier
        otelprof.record("loss", float("nan"))
    with otelprof.phase("eval"), otelprof.step():
        pass
    with otelprof.annotate("checkpoint"):
        pass


def _scrape(session: otelprof.Session) -> str:
    assert session.metrics_address is not None
    host, port = session.metrics_address
    session.flush()  # so the recording's byte counter has a value
    if session.prometheus is not None:  # each test scrape sees the registry now, not a rendering reused for 1 s
        session.prometheus.cache_interval = 0.0
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return str(response.read().decode())


def test_metrics_endpoint_matches_catalog(record_dir: Path) -> None:
    session = otelprof.init(job_name="catalog", record_dir=str(record_dir), metrics_exporters=("prometheus",),
                            prometheus_port=0, outlier_min_steps=20, sample_interval=0.1)
    assert isinstance(session, otelprof.Session)
    _exercise_every_metric()
    time.sleep(0.35)  # a few telemetry samples
    text = _scrape(session)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # Prometheus' own linter finds nothing in the scrape (names, suffixes, HELP, TYPE)
    lint = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr

    info = families.pop("target_info")
    [info_sample] = info.samples
    assert info_sample.labels["service_name"] == "catalog"
    assert info_sample.labels["otelprof_run_id"] == session.config.run_id

    expected = {m.prometheus_name: m for m in sc.METRICS}
    assert set(families) <= set(expected), "nothing outside the catalog is exported"
    always = [*sc.STEP_METRICS,
        sc.SYSTEM_CPU_UTILIZATION, sc.NODE_CPU_UTILIZATION, sc.CPU_AVAILABLE, sc.SYSTEM_MEMORY_USAGE,
        sc.SYSTEM_MEMORY_UTILIZATION, sc.PROCESS_CPU_TIME, sc.PROCESS_MEMORY_USAGE, sc.SAMPLER_SAMPLES,
        sc.SAMPLER_CPU_BOTTLENECK, sc.SAMPLER_IO_BOTTLENECK, sc.SAMPLER_TIME]
    missing = {m.prometheus_name for m in always} - set(families)
    assert not missing, "every step metric, and the system metrics any Linux host has, are exported"
    for name, family in families.items():
        spec = expected[name]
        assert family.type == spec.kind.value, name
        assert family.documentation == spec.description, name
        for sample in family.samples:
            labels = set(sample.labels) - {"le"}
            assert labels == set(spec.prometheus_labels), (name, sample.labels)
            assert sample.labels[sc.LABEL_JOB] == "catalog"
            assert sample.labels[sc.LABEL_RANK] == "0"
        if spec.kind is sc.Kind.COUNTER:
            assert all(s.name == name + "_total" for s in family.samples if not s.name.endswith("_created"))
        if spec.kind is sc.Kind.HISTOGRAM:
            bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
            assert bounds == [*spec.buckets, float("inf")]

    def value(name: str, **labels: str) -> float:
        return next(s.value for s in families[name].samples
                    if s.name in (name, name + "_total", name + "_count")
                    and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("otelprof_step_duration_seconds", phase="train") == 41
    assert value("otelprof_steps", phase="eval") == 1
    assert value("otelprof_samples", phase="train") == 40 * 32
    assert value("otelprof_nonfinite", phase="train", scalar="loss") == 1
    assert value("otelprof_step_outliers", phase="train") >= 1  # the slow step (tiny steps may add noise)
    assert value("otelprof_phase_active", phase="train") == 1  # back to train after the eval block
    assert value("otelprof_phase_active", phase="eval") == 0
    assert value("otelprof_annotation_duration_seconds", phase="none", annotation="checkpoint") == 1
    assert value("otelprof_step_number", phase="train") == 40
    assert value("otelprof_recording_bytes") > 0


def test_prometheus_names_follow_otel_translation() -> None:
    assert sc.prometheus_name("otelprof.step.duration", "s", sc.Kind.HISTOGRAM) == "otelprof_step_duration_seconds"
    assert sc.prometheus_name("hw.gpu.memory.usage", "By", sc.Kind.GAUGE) == "hw_gpu_memory_usage_bytes"
    assert sc.prometheus_name("hw.gpu.utilization", "1", sc.Kind.GAUGE) == "hw_gpu_utilization_ratio"
    assert sc.prometheus_name("system.network.io", "By/s", sc.Kind.GAUGE) == "system_network_io_bytes_per_second"
    assert sc.prometheus_name("otelprof.steps", "{step}", sc.Kind.COUNTER) == "otelprof_steps"
    assert sc.prometheus_name("process.cpu.time_seconds", "s", sc.Kind.COUNTER) == "process_cpu_time_seconds"


def test_catalog_names_are_unique_and_documented() -> None:
    names = [m.name for m in sc.METRICS]
    assert len(names) == len(set(names))
    assert len({m.prometheus_name for m in sc.METRICS}) == len(names)
    for m in sc.METRICS:
        assert m.description
        assert m.name.startswith(("otelprof.", "system.", "process.", "container.", "hw."))
        assert (m.kind is sc.Kind.HISTOGRAM) == bool(m.buckets)


def test_a_scalar_is_a_gauge_or_a_counter_never_both() -> None:
    """The recorder feeds a scalar into one series: its gauge (last value) or its counter (a total)."""
    assert sc.SCALAR_GAUGES.keys().isdisjoint(sc.SCALAR_COUNTERS.keys())


def test_prometheus_names_keep_the_suffix_rules() -> None:
    """No family name ends in what Prometheus reserves for other types (promtool check metrics' naming lint)."""
    reserved = {sc.Kind.COUNTER: ("_count", "_sum", "_bucket", "_created"),
                sc.Kind.GAUGE: ("_count", "_sum", "_bucket", "_created", "_total"),
                sc.Kind.HISTOGRAM: ("_count", "_sum", "_bucket", "_created", "_total")}
    for spec in sc.METRICS:
        assert not spec.prometheus_name.endswith(reserved[spec.kind]), spec.name
    assert sc.PROCESS_THREAD_COUNT.name == "process.thread.count"  # the OTel name stays the semantic convention's
    assert sc.PROCESS_THREAD_COUNT.prometheus_name == "process_threads"

