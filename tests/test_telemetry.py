"""System and GPU telemetry: real psutil and cgroup reads, cgroup fixtures, and the NVML seam's fake."""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
import tracemalloc
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import psutil
import pytest

from otelprof import semconv as sc
from otelprof._log import reset_warnings
from otelprof.config import Config
from otelprof.recording import schema
from otelprof.recording.writer import RecordingWriter
from otelprof.runtime.collectors.cgroup import CgroupReader
from otelprof.runtime.collectors.gpu import GpuCollector, visible_selectors
from otelprof.runtime.collectors.nvml import NvmlCallError, NvmlUnavailable, PynvmlBackend
from otelprof.runtime.collectors.sampler import Sampler
from otelprof.runtime.collectors.system import HostReading, SystemCollector
from otelprof.runtime.metrics import MetricRegistry
from tests.fake_nvml import FIXTURES, FakeNvml
from tests.sample_records import sample_records

IDENTITY = {"job_name": "t", "rank": "0", "local_rank": "0", "node": "n"}
CGROUPS = FIXTURES / "cgroup"


# ---------------------------------------------------------------- cgroup
def test_cgroup_v2_quota_and_throttling() -> None:
    reading = CgroupReader(CGROUPS / "v2_quota", proc_cgroup="0::/\n").read()
    assert reading.version == 2
    assert reading.cpu_limit_cores == 2.0
    assert reading.cpu_usage_seconds == pytest.approx(81.234567)
    assert (reading.periods, reading.throttled_periods) == (5400, 1210)
    assert reading.throttled_seconds == pytest.approx(95.0)
    assert reading.memory_limit_bytes == 16 * 1024**3
    assert reading.memory_usage_bytes == 9 * 1024**3
    assert reading.memory_working_set_bytes == 8 * 1024**3  # less 1 GiB of inactive file cache


def test_cgroup_v2_unlimited() -> None:
    reading = CgroupReader(CGROUPS / "v2_unlimited", proc_cgroup="0::/\n").read()
    assert reading.cpu_limit_cores is None and reading.memory_limit_bytes is None
    assert reading.throttled_periods == 0


def test_cgroup_v2_host_view_follows_the_process_path() -> None:
    own = "0::/kubepods.slice/pod-abc.slice/cri-containerd-123.scope\n"
    reading = CgroupReader(CGROUPS / "v2_nested", proc_cgroup=own).read()
    assert reading.cpu_limit_cores == 4.0
    assert reading.memory_limit_bytes == 8 * 1024**3


def test_cgroup_v1_quota_and_throttling() -> None:
    proc = "4:memory:/\n3:cpu,cpuacct:/\n0::/\n"
    reading = CgroupReader(CGROUPS / "v1_quota", proc_cgroup=proc).read()
    assert reading.version == 1
    assert reading.cpu_limit_cores == 1.5
    assert reading.cpu_usage_seconds == pytest.approx(123.456789)
    assert (reading.periods, reading.throttled_periods) == (3000, 450)
    assert reading.throttled_seconds == pytest.approx(61.0)
    assert reading.memory_limit_bytes == 4 * 1024**3
    assert reading.memory_working_set_bytes == 2 * 1024**3 - 768 * 1024**2  # total_inactive_file: the hierarchy


def test_cgroup_v1_unlimited_and_missing_files() -> None:
    reading = CgroupReader(CGROUPS / "v1_unlimited", proc_cgroup="3:cpu:/\n").read()
    assert reading.cpu_limit_cores is None and reading.memory_limit_bytes is None
    assert reading.cpu_usage_seconds == pytest.approx(5.0)
    empty = CgroupReader(CGROUPS / "does-not-exist", proc_cgroup="").read()
    assert empty.cpu_limit_cores is None and empty.memory_usage_bytes is None
    assert empty.memory_working_set_bytes is None
    no_stat = CgroupReader(CGROUPS / "v2_unlimited", proc_cgroup="0::/\n").read()
    assert no_stat.memory_working_set_bytes == no_stat.memory_usage_bytes  # no memory.stat: usage


def test_cgroup_real_read_on_this_machine() -> None:
    reader = CgroupReader()
    reading = reader.read()
    assert reading.version in (1, 2)
    if reader.available:
        assert reading.memory_usage_bytes is None or reading.memory_usage_bytes > 0


# ---------------------------------------------------------------- psutil
def test_real_per_cpu_ratios() -> None:
    collector = SystemCollector(lambda source, reason: None)
    assert collector.host().cpu_busy == []  # the first read is the baseline
    time.sleep(0.2)
    host = collector.host()
    assert len(host.cpu_busy) == len(host.cpu_modes) == psutil.cpu_count()
    for busy, iowait, modes in zip(host.cpu_busy, host.cpu_iowait, host.cpu_modes):
        assert 0.0 <= busy <= 1.0 and 0.0 <= iowait <= 1.0
        assert sum(modes.values()) == pytest.approx(1.0)
        assert set(modes) == set(sc.CPU_MODES)
    assert host.memory_total and host.memory_used and host.memory_used < host.memory_total
    process = collector.process(2.0, time.time())
    assert process.rss and process.rss > 0 and process.threads and process.threads >= 1


# ---------------------------------------------------------------- GPU seam
@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"CUDA_VISIBLE_DEVICES": "0,2"}, ["0", "2"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, None),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-9a8b"}, ["GPU-9a8b"]),
        ({"CUDA_VISIBLE_DEVICES": "1", "NVIDIA_VISIBLE_DEVICES": "all"}, ["1"]),
    ],
)
def test_visible_device_selectors(env: dict[str, str], expected: list[str] | None) -> None:
    assert visible_selectors(env) == expected


def _collector(fake: FakeNvml, errors: list[tuple[str, str]], env: dict[str, str] | None = None) -> GpuCollector:
    return GpuCollector(lambda s, r: errors.append((s, r)), lambda: fake, env=env or {})


def test_visible_devices_by_index_and_uuid() -> None:
    assert [d.index for d in _collector(FakeNvml(), [], {"CUDA_VISIBLE_DEVICES": "1"}).devices] == [1]
    by_uuid = _collector(FakeNvml(), [], {"NVIDIA_VISIBLE_DEVICES": "GPU-9a8b7c6d"})
    assert [d.index for d in by_uuid.devices] == [1]


def test_unsupported_field_is_absent_counted_once_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    reset_warnings()
    fake, errors = FakeNvml(), []
    fake.errors[(0, "power")] = "not_supported"
    collector = _collector(fake, errors)
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        for _ in range(5):
            readings = collector.sample()
    assert "power" not in readings[0].values and "power" in readings[1].values
    assert fake.calls[(0, "power")] == 1
    assert errors.count(("nvml", "not_supported")) == 1  # GPM, optional, is not an error when unsupported
    assert caplog.text.count("power on GPU 0") == 1


def test_lost_gpu_is_dropped_and_other_errors_only_skip_a_sample() -> None:
    fake, errors = FakeNvml(), []
    collector = _collector(fake, errors)
    fake.errors[(1, "temperature")] = "timeout"
    first = collector.sample()
    assert "temperature" not in first[1].values and "utilization" in first[1].values
    del fake.errors[(1, "temperature")]
    assert "temperature" in collector.sample()[1].values
    fake.errors[(1, "*")] = "gpu_lost"
    assert [r.device.index for r in collector.sample()] == [0]
    assert [r.device.index for r in collector.sample()] == [0]
    assert errors.count(("nvml", "gpu_lost")) == 1
    assert ("nvml", "timeout") in errors


def test_library_not_found_degrades_cleanly(caplog: pytest.LogCaptureFixture) -> None:
    """The real nvidia-ml-py path on a machine without the NVIDIA driver."""
    reset_warnings()
    errors: list[tuple[str, str]] = []
    try:
        PynvmlBackend().shutdown()
        pytest.skip("this machine has a working NVML")
    except NvmlUnavailable as exc:
        assert exc.reason in ("library_not_found", "driver_not_loaded")
    with caplog.at_level(logging.INFO, logger="otelprof"):
        collector = GpuCollector(lambda s, r: errors.append((s, r)))
        assert collector.sample() == []
        assert collector.sample() == []
    assert collector.backend is None and collector.devices == []
    assert len(errors) == 1 and errors[0][0] == "nvml"
    # No NVIDIA GPU here: one info line (shown where logging is configured), no warning on stderr.
    assert [(r.levelno, r.getMessage().count("NVML unavailable")) for r in caplog.records] == [(logging.INFO, 1)]
    assert "no NVIDIA GPU visible" in caplog.text


def _unavailable(reason: str) -> Any:
    def factory() -> Any:
        raise NvmlUnavailable(reason, f"NVML said {reason}")

    return factory


@pytest.mark.parametrize(("reason", "device_nodes", "warn", "level"), [
    ("driver_not_loaded", False, True, logging.INFO),  # no GPU: nothing to warn about
    ("not_installed", False, True, logging.INFO),  # nvidia-ml-py missing on a machine without a GPU
    ("not_installed", True, True, logging.WARNING),  # ... and on one with a GPU: say so
    ("no_permission", True, True, logging.WARNING),  # a GPU NVML cannot read
    ("no_permission", True, False, logging.INFO),  # ... said by the node's sampling rank, not every rank
])
def test_nvml_that_cannot_start_warns_only_where_a_gpu_goes_unmeasured(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, reason: str, device_nodes: bool, warn: bool,
    level: int,
) -> None:
    reset_warnings()
    monkeypatch.setattr("otelprof.runtime.collectors.gpu.nvidia_device_present", lambda: device_nodes)
    errors: list[tuple[str, str]] = []
    with caplog.at_level(logging.INFO, logger="otelprof"):
        collector = GpuCollector(lambda s, r: errors.append((s, r)), _unavailable(reason), warn=warn)
        GpuCollector(lambda s, r: errors.append((s, r)), _unavailable(reason), warn=warn)  # once per process
    assert collector.sample() == []
    assert errors == [("nvml", reason)] * 2  # counted either way
    assert [(r.levelno, f"NVML said {reason}" in r.getMessage()) for r in caplog.records] == [(level, True)]


def test_only_the_node_sampling_rank_warns_about_nvml(tmp_path: Path) -> None:
    def collector(**overrides: Any) -> Any:
        config = Config.from_env({}, **overrides)
        return Sampler(config, MetricRegistry(IDENTITY), None, nvml_factory=_unavailable("no_permission")).gpus

    assert collector(local_rank=0)._warn and not collector(local_rank=1)._warn
    assert collector(local_rank=1, node_sampler_local_rank=-1)._warn


# ---------------------------------------------------------------- sampler
def _values(registry: MetricRegistry, spec: sc.MetricSpec) -> dict[tuple[Any, ...], Any]:
    for metric in registry.collect():
        if metric.name == spec.name:
            out = {}
            for p in metric.data.data_points:
                key = tuple(p.attributes[k] for k in spec.labels)
                out[key] = p.count if spec.kind is sc.Kind.HISTOGRAM else p.value
            return out
    return {}


def _sampler(tmp_path: Path, fake: FakeNvml | None, **overrides: Any) -> tuple[Sampler, MetricRegistry, Path]:
    config = Config.from_env({}, **overrides)
    registry = MetricRegistry(IDENTITY)
    writer = RecordingWriter(tmp_path, {"schema_version": "1.0"}, lambda n: None, lambda n: None)
    sampler = Sampler(config, registry, writer, nvml_factory=(lambda: fake) if fake else None)
    return sampler, registry, tmp_path


def test_sampler_series_histograms_and_coincidences_with_two_gpus(tmp_path: Path) -> None:
    fake = FakeNvml()
    sampler, registry, path = _sampler(tmp_path, fake)
    sampler.sample()  # baseline
    for tick in range(10):
        fake.tick = tick
        time.sleep(0.02)
        sampler.sample()
    uuid0, uuid1 = (d["uuid"] for d in fake.data["devices"])
    util = _values(registry, sc.GPU_UTILIZATION)
    assert util == {("0", uuid0): 0.97, ("1", uuid1): 0.04}  # last tick (9)
    assert _values(registry, sc.GPU_UTILIZATION_DISTRIBUTION) == {("0", uuid0): 11, ("1", uuid1): 11}
    memory = _values(registry, sc.GPU_MEMORY_UTILIZATION)
    assert memory[("1", uuid1)] == pytest.approx(29 / 40)
    last = fake.data["ticks"][9]
    assert _values(registry, sc.GPU_POWER)[("0", uuid0, "gpu")] == pytest.approx(301.5)
    assert _values(registry, sc.GPU_TEMPERATURE) == {("0", uuid0): last["0"]["temperature"],
                                                     ("1", uuid1): last["1"]["temperature"]}
    # hw.energy mirrors NVML's total since the driver loaded (the last reading)
    assert _values(registry, sc.GPU_ENERGY) == {("0", uuid0, "gpu"): last["0"]["energy"],
                                                ("1", uuid1, "gpu"): last["1"]["energy"]}
    throttle = _values(registry, sc.GPU_THROTTLE)
    assert throttle[("1", uuid1, "gpu_idle")] == 1 and throttle[("1", uuid1, "sw_power_cap")] == 0
    assert _values(registry, sc.GPU_PCIE_THROUGHPUT)[("0", uuid0, "receive")] == pytest.approx(2.1e9 * 0.97)
    assert _values(registry, sc.GPU_ERRORS)[("0", uuid0, "gpu", "uncorrected")] == 0
    assert _values(registry, sc.PROCESS_GPU_MEMORY) == {("0", uuid0): 30 * 1024**3}
    assert _values(registry, sc.GPU_SM_ACTIVE) == {}  # GPM not supported: absent, not zero
    # coincidences: GPU 1 is below 10 % on odd ticks, so 5 of the 10 samples after the baseline
    assert _values(registry, sc.SAMPLER_SAMPLES) == {(): 10}
    assert _values(registry, sc.SAMPLER_LOW_GPU) == {(): 5}
    high_cpu = _values(registry, sc.SAMPLER_HIGH_CPU)[()]
    assert _values(registry, sc.SAMPLER_CPU_BOTTLENECK)[()] <= min(high_cpu, 5)
    cores = psutil.cpu_count()
    cpu = _values(registry, sc.SYSTEM_CPU_UTILIZATION)
    assert len(cpu) == cores * len(sc.CPU_MODES)
    assert _values(registry, sc.NODE_CPU_UTILIZATION) == {(): 10}
    assert _values(registry, sc.CPU_AVAILABLE)[()] >= 1
    sampler.writer.flush()  # type: ignore[union-attr]
    lines = sample_records(path / schema.SAMPLES)
    assert len(lines) == 10
    assert 0 <= lines[0]["cpum"] <= lines[0]["cpux"] <= 1 and lines[1]["gpu"]["1"]["u"] == 0.04 \
        and lines[0]["gpu"]["0"]["pm"] > 0
    assert lines[-1]["ncpu"] == 10 and len(lines[-1]["busy"]) == cores  # the per-CPU sums of the block


def test_every_gpu_series_in_the_catalog_is_produced_through_the_seam(tmp_path: Path) -> None:
    fake = FakeNvml()
    fake.data["gpm"] = {"0": {"sm_active": 0.8, "sm_occupancy": 0.4, "tensor_active": 0.3},
                        "1": {"sm_active": 0.1, "sm_occupancy": 0.05, "tensor_active": 0.0}}
    sampler, registry, _ = _sampler(tmp_path, fake)
    sampler.sample()
    sampler.sample()
    produced = {m.name for m in registry.collect()}
    gpu_specs = {m.name for m in sc.SYSTEM_METRICS if sc.LABEL_GPU in m.labels and m not in sc.DCGM_ONLY_METRICS}
    assert gpu_specs <= produced
    assert _values(registry, sc.GPU_TENSOR_ACTIVE)[("0", fake.data["devices"][0]["uuid"])] == 0.3


def test_a_lost_gpus_gauges_go_absent_and_the_others_stay(tmp_path: Path) -> None:
    """Also the gauges under a generic hw.* name, whose series carry hw.type besides the GPU's labels."""
    fake = FakeNvml()
    sampler, registry, _ = _sampler(tmp_path, fake)
    uuid0, uuid1 = (d["uuid"] for d in fake.data["devices"])
    gauges = (sc.GPU_POWER, sc.GPU_TEMPERATURE, sc.GPU_UTILIZATION, sc.GPU_MEMORY_UTILIZATION)
    for _ in range(2):
        sampler.sample()
        for spec in gauges:
            assert {k[:2] for k in _values(registry, spec)} == {("0", uuid0), ("1", uuid1)}, spec.name
    assert _values(registry, sc.GPU_POWER)[("1", uuid1, "gpu")] == fake.data["ticks"][0]["1"]["power"]
    fake.errors[(1, "*")] = "gpu_lost"
    sampler.sample()
    for spec in gauges:
        assert {k[:2] for k in _values(registry, spec)} == {("0", uuid0)}, spec.name


def test_gpu_info_names_the_ranks_gpu_and_sampling_off_reads_nothing_else(tmp_path: Path) -> None:
    """otelprof_gpu_info: the visible GPU at LOCAL_RANK (or the only one); with sampling off NVML is asked only
    who the GPUs are, then shut down, and no GPU reading series appears."""
    uuid0, uuid1 = (d["uuid"] for d in FakeNvml().data["devices"])
    _, registry, _ = _sampler(tmp_path, FakeNvml(), local_rank=1, node_sampler_local_rank=0)
    assert _values(registry, sc.GPU_INFO) == {("1", uuid1, "", "", "", "", ""): 1}
    assert _values(registry, sc.GPU_UNMAPPED) == {}
    _, registry, _ = _sampler(tmp_path, FakeNvml(), local_rank=3)  # more ranks than GPUs: cannot tell
    assert _values(registry, sc.GPU_INFO) == {}
    assert _values(registry, sc.GPU_UNMAPPED) == {("ambiguous",): 1}
    fake = FakeNvml()
    with mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": "1"}):
        sampler, registry, _ = _sampler(tmp_path, fake, local_rank=5, gpu_sampling=False)
    assert _values(registry, sc.GPU_INFO) == {("1", uuid1, "", "", "", "", ""): 1}
    assert fake.shut_down and sampler.gpus is None
    sampler.sample()
    sampler.sample()
    names = {m.name for m in registry.collect()}
    gpu_readings = {m.name for m in sc.SYSTEM_METRICS if sc.LABEL_GPU in m.labels} - {sc.GPU_INFO.name}
    assert not gpu_readings & names and sc.GPU_INFO.name in names
    assert not fake.calls  # no reading at all
    assert uuid0 != uuid1


def test_coincidence_thresholds_are_strict(tmp_path: Path) -> None:
    from otelprof.runtime.collectors.gpu import GpuReading
    from otelprof.runtime.collectors.nvml import DeviceInfo

    sampler, registry, _ = _sampler(tmp_path, None)

    def judge(busy: float, iowait: float, gpu: float | None) -> tuple[int, int]:
        before = (_values(registry, sc.SAMPLER_CPU_BOTTLENECK).get((), 0),
                  _values(registry, sc.SAMPLER_IO_BOTTLENECK).get((), 0))
        gpus = [] if gpu is None else [GpuReading(DeviceInfo(0, "GPU-x", "x"), {"utilization": gpu})]
        host = HostReading(cpu_busy=[0.2, busy], cpu_iowait=[iowait, 0.0])
        with registry.lock:
            sampler._update_coincidences(host, gpus)
        after = (_values(registry, sc.SAMPLER_CPU_BOTTLENECK)[()], _values(registry, sc.SAMPLER_IO_BOTTLENECK)[()])
        return after[0] - before[0], after[1] - before[1]

    assert judge(0.95, 0.6, 0.05) == (1, 1)
    assert judge(0.90, 0.50, 0.05) == (0, 0)  # at the thresholds: not above
    assert judge(0.95, 0.6, 0.10) == (0, 0)  # GPU at the threshold: not below
    assert judge(0.95, 0.6, None) == (0, 0)  # no GPU: no GPU-starved coincidence


def test_only_the_node_sampler_reports_node_series(tmp_path: Path) -> None:
    sampler, registry, _ = _sampler(tmp_path, FakeNvml(), local_rank=1, node_sampler_local_rank=0)
    sampler.sample()
    sampler.sample()
    names = {m.name for m in registry.collect()}
    assert sc.SYSTEM_CPU_UTILIZATION.name not in names and sc.GPU_UTILIZATION.name not in names
    assert sc.SAMPLER_SAMPLES.name not in names
    assert {sc.PROCESS_MEMORY_USAGE.name, sc.PROCESS_CPU_TIME.name, sc.PROCESS_GPU_MEMORY.name} <= names


def test_container_memory_reaches_the_series_the_recording_and_the_reader(tmp_path: Path) -> None:
    """The working set and the limit (what OtelprofHostMemoryNearLimit reads, live and offline)."""
    from otelprof.recording.reader import read_recording

    config = Config.from_env({})
    registry = MetricRegistry(IDENTITY)
    (tmp_path / "rank-0").mkdir()
    writer = RecordingWriter(tmp_path / "rank-0", {"schema_version": "1.1", "rank": 0}, lambda n: None,
                             lambda n: None)
    sampler = Sampler(config, registry, writer, nvml_factory=None,
                      cgroup=CgroupReader(CGROUPS / "v2_quota", proc_cgroup="0::/\n"))
    for _ in range(3):
        sampler.sample()
        time.sleep(0.02)
    assert _values(registry, sc.CONTAINER_MEMORY_WORKING_SET) == {(): 8 * 1024**3}
    assert _values(registry, sc.CONTAINER_MEMORY_LIMIT) == {(): 16 * 1024**3}
    writer.flush()
    lines = sample_records(tmp_path / "rank-0" / schema.SAMPLES)
    assert lines and all(line["cws"] == 8 * 1024**3 and line["cml"] == 16 * 1024**3 for line in lines)
    columns = read_recording(tmp_path / "rank-0", samples=True).ranks[0].sample_columns()
    assert list(columns.container_memory) == [8 * 1024**3] * len(lines)
    assert list(columns.container_limit) == [16 * 1024**3] * len(lines)
    unlimited = Sampler(config, MetricRegistry(IDENTITY), None, nvml_factory=None,
                        cgroup=CgroupReader(CGROUPS / "v2_unlimited", proc_cgroup="0::/\n"))
    unlimited.sample()
    assert _values(unlimited.registry, sc.CONTAINER_MEMORY_LIMIT) == {}  # no limit: absent, not 0


def test_overrunning_ticks_are_skipped_and_counted(tmp_path: Path) -> None:
    class SlowNvml(FakeNvml):
        def read(self, index: int, field: str) -> float:
            if field == "utilization" and index == 0:
                time.sleep(0.25)
            return super().read(index, field)

    sampler, registry, _ = _sampler(tmp_path, SlowNvml(), sample_interval=0.1)
    sampler.start()
    time.sleep(1.2)
    sampler.stop()
    overruns = _values(registry, sc.SAMPLER_OVERRUNS)[()]
    assert overruns >= 2
    assert sampler.samples_taken <= 7  # ~1.2 s / 0.25 s per sample, not 12 queued ticks


def test_a_broken_backend_never_stops_the_sampler(tmp_path: Path) -> None:
    class Broken(FakeNvml):
        def read(self, index: int, field: str) -> float:
            raise RuntimeError("binding bug")

    sampler, registry, _ = _sampler(tmp_path, Broken())
    for _ in range(3):
        sampler.sample()
    assert sampler.samples_taken == 3
    assert _values(registry, sc.SAMPLER_ERRORS)[("nvml", "error")] > 0
    assert _values(registry, sc.GPU_UTILIZATION) == {}


def test_sampler_memory_stays_flat(tmp_path: Path) -> None:
    fake = FakeNvml()
    sampler, _, _ = _sampler(tmp_path, fake)
    for tick in range(200):
        fake.tick = tick
        sampler.sample()
        sampler.writer.flush()  # type: ignore[union-attr]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for tick in range(2000):
        fake.tick = tick
        sampler.sample()
        if tick % 50 == 0:
            sampler.writer.flush()  # type: ignore[union-attr]
    sampler.writer.flush()  # type: ignore[union-attr]
    gc.collect()  # psutil leaves reference cycles that the collector frees later
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    growth = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert growth < 100_000, f"sampler memory grew by {growth} bytes over 2000 samples"


def test_session_runs_the_sampler_and_records_samples(tmp_path: Path) -> None:
    import otelprof
    from otelprof.recording.reader import read_recording

    session = otelprof.init(record_dir=str(tmp_path), sample_interval=0.1)
    assert isinstance(session, otelprof.Session) and session.sampler is not None
    time.sleep(0.5)
    otelprof.shutdown()
    assert session.run_dir is not None
    samples = list(read_recording(session.run_dir).ranks[0].samples())
    assert len(samples) >= 2
    assert samples[-1]["pid"] == os.getpid() and "cpum" in samples[-1] and samples[-1]["ncpu"] >= 1


# ------------------------------------------------------------------ MIG instances

MIG_A100, MIG_A100_HIDDEN, MIG_H100 = ("MIG-b7e2f4a1-6c3d-5e8f-9a0b-1c2d3e4f5a6b",
                                       "MIG-0f1e2d3c-4b5a-5968-8776-a5b4c3d2e1f0",
                                       "MIG-9e8d7c6b-5a49-5382-8170-f6e5d4c3b2a1")
WHOLE_H100 = "GPU-7d2c4e6f-8a1b-4c3d-9e5f-6a7b8c9d0e1f"


def test_mig_instances_are_the_visible_devices_numbered_as_cuda_numbers_them() -> None:
    fake = FakeNvml("nvml_mig.json")
    a100, h100, _ = (d["uuid"] for d in fake.data["devices"])
    everything = _collector(fake, [])
    assert [(d.uuid, d.gpu, d.parent_uuid, d.gpu_instance, d.profile) for d in everything.devices] == [
        (MIG_A100, "0", a100, 2, "3g.20gb"), (MIG_H100, "1", h100, 13, "1g.10gb"), (WHOLE_H100, "2", "", -1, "")]
    given = _collector(FakeNvml("nvml_mig.json"), [], {"NVIDIA_VISIBLE_DEVICES": MIG_H100})
    assert [(d.uuid, d.gpu) for d in given.devices] == [(MIG_H100, "0")]
    # a MIG instance NVML does not enumerate under its GPU in this container is found by its UUID
    hidden = _collector(FakeNvml("nvml_mig.json"), [], {"CUDA_VISIBLE_DEVICES": MIG_A100_HIDDEN})
    assert [(d.uuid, d.gpu, d.gpu_instance, d.profile) for d in hidden.devices] == [
        (MIG_A100_HIDDEN, "0", 9, "1g.5gb")]
    assert [d.uuid for d in _collector(FakeNvml("nvml_mig.json"), [], {"CUDA_VISIBLE_DEVICES": "1"}).devices] == [
        MIG_H100]


def test_a_mig_instance_reads_its_memory_and_gpm_activity_and_nothing_it_cannot(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Per instance: memory from NVML, engine activity from GPM (Hopper); the GPU-wide fields are not asked, so
    nothing is warned about and no error is counted."""
    reset_warnings()
    fake = FakeNvml("nvml_mig.json")
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        sampler, registry, _ = _sampler(tmp_path, fake)
        sampler.sample()
        sampler.sample()
    tick = fake.data["ticks"][0]
    used = _values(registry, sc.GPU_MEMORY_USAGE)
    assert used == {("0", MIG_A100): tick[MIG_A100]["memory_used"], ("1", MIG_H100): tick[MIG_H100]["memory_used"],
                    ("2", WHOLE_H100): tick["2"]["memory_used"]}
    assert _values(registry, sc.GPU_MEMORY_UTILIZATION)[("0", MIG_A100)] == pytest.approx(
        tick[MIG_A100]["memory_used"] / tick[MIG_A100]["memory_total"])
    # the A100 has no GPM: its instance has no utilization; the H100's comes from GPM's graphics activity
    assert _values(registry, sc.GPU_UTILIZATION) == {("1", MIG_H100): 0.62, ("2", WHOLE_H100): 0.88}
    assert _values(registry, sc.GPU_SM_OCCUPANCY) == {("1", MIG_H100): 0.31}
    assert _values(registry, sc.PROCESS_GPU_MEMORY)[("0", MIG_A100)] == fake.data["process_memory"][MIG_A100]
    asked = {index: {f for i, f in fake.calls if i == index} for index, _ in fake.calls}
    mig = {device.index for device in fake.mig.values()}
    assert all(asked[i] == {"memory_used", "memory_total", "process_memory", "gpm"} for i in mig), asked
    assert "utilization" in asked[2] and "power" in asked[2]  # the whole GPU is read in full
    sampler.writer.flush()  # type: ignore[union-attr]
    last = sample_records(tmp_path / schema.SAMPLES)[-1]["gpu"]  # keyed like the series
    assert {gpu: sorted(entry) for gpu, entry in last.items()} == {
        "0": ["mt", "mu", "pm"], "1": ["mt", "mu", "occ", "pm", "sm", "tc", "u"], "2": sorted(last["2"])}
    assert last["1"]["u"] == 0.62 and "p" in last["2"]
    assert _values(registry, sc.SAMPLER_ERRORS) == {} and caplog.text == ""


def test_gpu_info_names_the_mig_instance_and_the_pod(tmp_path: Path) -> None:
    fake = FakeNvml("nvml_mig.json")
    a100 = fake.data["devices"][0]["uuid"]
    with mock.patch.dict(os.environ, {"NVIDIA_VISIBLE_DEVICES": MIG_A100}):
        _, registry, _ = _sampler(tmp_path, fake, local_rank=0, pod_name="trainer-0", pod_namespace="ml")
    assert _values(registry, sc.GPU_INFO) == {("0", MIG_A100, a100, "2", "3g.20gb", "trainer-0", "ml"): 1}
    assert _values(registry, sc.GPU_UNMAPPED) == {}


def test_a_gpu_the_process_was_given_but_nvml_does_not_list_is_unmapped_and_warned_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reset_warnings()
    unknown = "MIG-11111111-2222-5333-8444-555555555555"
    with caplog.at_level(logging.WARNING, logger="otelprof"), \
            mock.patch.dict(os.environ, {"NVIDIA_VISIBLE_DEVICES": unknown}):
        for _ in range(2):
            _, registry, _ = _sampler(tmp_path, FakeNvml("nvml_mig.json"))
    assert _values(registry, sc.GPU_INFO) == {}
    assert _values(registry, sc.GPU_UNMAPPED) == {("not_found",): 1}
    assert caplog.text.count("cannot tell which it computes on (not_found)") == 1 and unknown in caplog.text
    # NVML that cannot start while the runtime gave the process a GPU: unmapped with NVML's reason
    def broken() -> FakeNvml:
        raise NvmlUnavailable("no_permission", "fake: no permission")
    with mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": MIG_A100}):
        registry = MetricRegistry(IDENTITY)
        Sampler(Config.from_env({}), registry, None, nvml_factory=broken)
    assert _values(registry, sc.GPU_UNMAPPED) == {("no_permission",): 1}
    # a CPU machine with CUDA_VISIBLE_DEVICES=0 and no NVIDIA library: nothing is missing
    def absent() -> FakeNvml:
        raise NvmlUnavailable("library_not_found", "fake: no libnvidia-ml")
    with mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": "0"}):
        registry = MetricRegistry(IDENTITY)
        Sampler(Config.from_env({}), registry, None, nvml_factory=absent)
    assert _values(registry, sc.GPU_UNMAPPED) == {}


class _NvmlApi:
    """The part of nvidia-ml-py the seam calls for MIG, over two GPUs: GPU 0 in MIG mode with GPU instances 2 and
    9 in slots 0 and 2 (slot 1 empty) and GPM, GPU 1 a whole GPU. Its names are checked against nvidia-ml-py."""

    NVML_DEVICE_MIG_ENABLE = 1
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_GRAPHICS_UTIL, NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY = 1, 2, 3
    NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5

    class NVMLError(Exception):
        pass

    class NVMLError_NotFound(NVMLError):
        pass

    GPUS = {0: "GPU-aaaaaaaa-0000-4000-8000-000000000000", 1: "GPU-bbbbbbbb-0000-4000-8000-000000000000"}
    MIGS = {(0, 0): ("MIG-cccccccc-0000-5000-8000-000000000000", 2, "3g.20gb"),
            (0, 2): ("MIG-dddddddd-0000-5000-8000-000000000000", 9, "1g.5gb")}
    ACTIVITY = {2: (30.0, 12.0, 8.0, 40.0), 9: (70.0, 35.0, 20.0, 90.0)}  # sm, occupancy, tensor, graphics

    def __init__(self) -> None:
        self.mig_samples: list[tuple[Any, int]] = []

    def __iter__(self) -> Any:  # the names the seam may call, for the check against nvidia-ml-py
        return iter(n for n in dir(self) if n.startswith(("nvml", "NVML", "c_nvml")))

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[Any, ...]:
        return ("gpu", index)

    def nvmlDeviceGetIndex(self, handle: tuple[Any, ...]) -> int:
        return int(handle[1])

    def nvmlDeviceGetUUID(self, handle: tuple[Any, ...]) -> str:
        return self.GPUS[handle[1]] if handle[0] == "gpu" else self.MIGS[handle[1], handle[2]][0]

    def nvmlDeviceGetName(self, handle: tuple[Any, ...]) -> bytes:
        if handle[0] == "gpu":
            return b"NVIDIA H100 80GB HBM3"
        return f"NVIDIA H100 80GB HBM3 MIG {self.MIGS[handle[1], handle[2]][2]}".encode()

    def nvmlDeviceGetMigMode(self, handle: tuple[Any, ...]) -> list[int]:
        return [1, 1] if handle == ("gpu", 0) else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: tuple[Any, ...]) -> int:
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: tuple[Any, ...], slot: int) -> tuple[Any, ...]:
        if (handle[1], slot) not in self.MIGS:
            raise self.NVMLError_NotFound()
        return ("mig", handle[1], slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: tuple[Any, ...]) -> int:
        return self.MIGS[handle[1], handle[2]][1]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[Any, ...]:
        for (gpu, slot), (known, _, _) in self.MIGS.items():
            if known == uuid:
                return ("mig", gpu, slot)
        raise self.NVMLError_NotFound()

    def nvmlDeviceIsMigDeviceHandle(self, handle: tuple[Any, ...]) -> bool:
        return handle[0] == "mig"

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: tuple[Any, ...]) -> tuple[Any, ...]:
        return ("gpu", handle[1])

    def nvmlDeviceGetMemoryInfo(self, handle: tuple[Any, ...]) -> Any:
        used = 1000 * (self.nvmlDeviceGetGpuInstanceId(handle) if handle[0] == "mig" else 1)
        return SimpleNamespace(used=used, total=10_000)

    def nvmlGpmQueryDeviceSupport(self, handle: tuple[Any, ...]) -> Any:
        assert handle[0] == "gpu", "GPM support is asked of the GPU"
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> Any:
        return SimpleNamespace(instance=None)

    def nvmlGpmMigSampleGet(self, handle: tuple[Any, ...], instance: int, sample: Any) -> Any:
        self.mig_samples.append((handle, instance))
        sample.instance = instance
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None: ...

    def c_nvmlGpmMetricsGet_t(self) -> Any:
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=0, value=0.0) for _ in range(210)])

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        assert request.sample1.instance == request.sample2.instance
        sm, occupancy, tensor, graphics = self.ACTIVITY[request.sample2.instance]
        by_id = {self.NVML_GPM_METRIC_SM_UTIL: sm, self.NVML_GPM_METRIC_SM_OCCUPANCY: occupancy,
                 self.NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor, self.NVML_GPM_METRIC_GRAPHICS_UTIL: graphics}
        for metric in request.metrics[:request.numMetrics]:
            metric.value = by_id[metric.metricId]
        return request


def test_the_nvml_seam_lists_mig_instances_reads_them_and_samples_gpm_per_gpu_instance() -> None:
    import pynvml

    api = _NvmlApi()
    missing = [name for name in api if not hasattr(pynvml, name)]
    assert not missing, missing  # the fake calls nvidia-ml-py's own names
    module = ModuleType("pynvml")
    for name in dir(api):
        if not name.startswith("_"):
            setattr(module, name, getattr(api, name))
    with mock.patch.dict(sys.modules, {"pynvml": module}):
        backend = PynvmlBackend()
        collector = GpuCollector(lambda s, r: None, lambda: backend, env={})
        assert [(d.gpu, d.uuid, d.gpu_instance, d.profile, d.parent_uuid) for d in collector.devices] == [
            ("0", api.MIGS[0, 0][0], 2, "3g.20gb", api.GPUS[0]), ("1", api.MIGS[0, 2][0], 9, "1g.5gb", api.GPUS[0]),
            ("1", api.GPUS[1], -1, "", "")]
        small = collector.devices[1]
        assert backend.read(small.index, "memory_used") == 9000.0
        with pytest.raises(NvmlCallError) as first:
            backend.read_gpm(small.index)
        assert first.value.reason == "warming_up"
        assert backend.read_gpm(small.index) == {"sm_active": 0.7, "sm_occupancy": 0.35, "tensor_active": 0.2,
                                                 "utilization": 0.9}
        assert api.mig_samples == [(("gpu", 0), 9), (("gpu", 0), 9)]  # sampled on its GPU, by GPU instance
        by_uuid = PynvmlBackend().device_by_uuid(api.MIGS[0, 2][0])
        assert (by_uuid.gpu_instance, by_uuid.parent_uuid, by_uuid.profile) == (9, api.GPUS[0], "1g.5gb")
