"""The real /metrics output, scraped over HTTP, matches the catalog exactly."""

from __future__ import annotations

import functools
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

import otelprof
import otelprof.runtime.session
from otelprof import semconv as sc
from otelprof.runtime.collectors.sampler import Sampler
from tests.fake_nvml import FakeNvml
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


# The OpenTelemetry hardware semantic conventions (v1.44.0, model/hardware/*.yaml), transcribed for every hw.* metric
# otelprof might emit: name -> (instrument, unit, required attributes, attributes whose value they fix).
# hw.power, hw.energy and hw.errors are the generic metrics of any component: hw.type is required, and the GPU
# refinement of hw.errors says it MUST be "gpu". The hw.gpu.* metrics imply the type; hw.temperature is a
# temperature sensor's metric (hw.id required, hw.type not asked for).
SEMCONV_HW: dict[str, tuple[str, str, frozenset[str], dict[str, str]]] = {
    "hw.power": ("Gauge", "W", frozenset({"hw.id", "hw.type"}), {"hw.type": "gpu"}),
    "hw.energy": ("Counter", "J", frozenset({"hw.id", "hw.type"}), {"hw.type": "gpu"}),
    "hw.errors": ("Counter", "{error}", frozenset({"hw.id", "hw.type"}), {"hw.type": "gpu"}),
    "hw.temperature": ("Gauge", "Cel", frozenset({"hw.id"}), {}),
    "hw.gpu.utilization": ("Gauge", "1", frozenset({"hw.id"}), {}),
    "hw.gpu.memory.usage": ("UpDownCounter", "By", frozenset({"hw.id"}), {}),
    "hw.gpu.memory.limit": ("UpDownCounter", "By", frozenset({"hw.id"}), {}),
    "hw.gpu.memory.utilization": ("Gauge", "1", frozenset({"hw.id"}), {}),
    "hw.gpu.io": ("Counter", "By", frozenset({"hw.id", "network.io.direction"}), {}),
}
# otelprof.* GPU metrics whose reading the conventions name, kept apart on purpose (docs/catalog.md says why).
NOT_SEMCONV = {"otelprof.gpu.pcie.throughput": "hw.gpu.io"}


def test_hw_metrics_are_the_semantic_conventions() -> None:
    """Every hw.* name in the catalog is one the conventions define, with their instrument, unit and required
    attributes; and the GPU readings they define are under their hw.* name, not an otelprof.* one."""
    hw = [m for m in sc.METRICS if m.name.startswith("hw.")]
    assert {m.name for m in hw} == set(SEMCONV_HW) - set(NOT_SEMCONV.values())
    for spec in hw:
        instrument, unit, required, fixed = SEMCONV_HW[spec.name]
        assert (spec.instrument, spec.unit) == (instrument, unit), spec.name
        assert required <= set(spec.labels), (spec.name, required - set(spec.labels))
        assert set(fixed) <= set(spec.labels), spec.name
        if sc.LABEL_HW_TYPE in spec.labels:
            assert fixed == {sc.LABEL_HW_TYPE: sc.HW_TYPE_GPU}, spec.name  # no hw.type where none is asked for
    for name, semconv_name in NOT_SEMCONV.items():
        [spec] = [m for m in sc.METRICS if m.name == name]
        assert spec.instrument != SEMCONV_HW[semconv_name][0]  # a different instrument: no rename


def test_gpu_series_on_metrics_carry_what_the_semantic_conventions_require(
        record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real /metrics of a process sampling two GPUs (the NVML seam's fake): every GPU family of the catalog
    is there with the catalog's labels, hw_id is each GPU's UUID, hw_type is "gpu" wherever the conventions fix it,
    values are the readings, and promtool finds nothing to lint."""
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    fakes: list[FakeNvml] = []

    def factory() -> FakeNvml:
        fakes.append(FakeNvml())
        return fakes[-1]

    monkeypatch.setattr(otelprof.runtime.session, "Sampler", functools.partial(Sampler, nvml_factory=factory))
    session = otelprof.init(job_name="catalog", record_dir=str(record_dir), metrics_exporters=("prometheus",),
                            prometheus_port=0, sample_interval=0.1)
    assert isinstance(session, otelprof.Session)
    with otelprof.step():
        pass
    time.sleep(0.35)  # a few telemetry samples
    text = _scrape(session)
    lint = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [fake] = fakes
    uuids = {str(i): d["uuid"] for i, d in enumerate(fake.data["devices"])}
    reading = fake.data["ticks"][0]  # the fake stays at tick 0
    gpm = {sc.GPU_SM_ACTIVE, sc.GPU_SM_OCCUPANCY, sc.GPU_TENSOR_ACTIVE}  # the fixture's GPUs have no GPM
    gpu_specs = [m for m in sc.METRICS
                 if sc.LABEL_HW_ID in m.labels and m not in gpm and m not in sc.DCGM_ONLY_METRICS]
    assert sc.GPU_POWER in gpu_specs and sc.GPU_ENERGY in gpu_specs and sc.GPU_TEMPERATURE in gpu_specs
    for spec in gpu_specs:
        family = families[spec.prometheus_name]
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        assert samples, spec.name
        fixed = SEMCONV_HW.get(spec.name, ("", "", frozenset(), {}))[3]
        for sample in samples:
            assert set(sample.labels) - {"le"} == set(spec.prometheus_labels), (spec.name, sample.labels)
            assert sample.labels["hw_id"] == uuids[sample.labels["gpu"]]
            for key, value in fixed.items():
                assert sample.labels[sc.prometheus_label(key)] == value, (spec.name, sample.labels)
    readings = {(sc.GPU_POWER, "power"), (sc.GPU_ENERGY, "energy"), (sc.GPU_TEMPERATURE, "temperature")}
    for spec, field in readings:
        got = {s.labels["gpu"]: s.value for s in families[spec.prometheus_name].samples
               if not s.name.endswith("_created")}
        assert got == {gpu: reading[gpu][field] for gpu in uuids}, spec.name
    errors = {(s.labels["gpu"], s.labels["error_type"]) for s in families[sc.GPU_ERRORS.prometheus_name].samples
              if s.name.endswith("_total")}
    assert errors == {(gpu, kind) for gpu in uuids for kind in ("corrected", "uncorrected")}
    # the OpenMetrics exposition (what Prometheus asks for) of the same process: the strict parser takes it, and
    # it holds the GPU series the text format holds
    assert session.prometheus is not None
    strict = list(openmetrics_families(session.prometheus.render(openmetrics=True)))
    assert {spec.prometheus_name for spec in gpu_specs} <= {f.name for f in strict if f.samples}


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

