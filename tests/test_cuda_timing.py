"""Device-side region times from CUDA events, resolved lazily: a fake GPU behind the timer's seam.

The fake events behave like ``torch.cuda.Event``: ``record()`` marks the end of the work queued so far,
``query()`` is False until the GPU got there, ``elapsed_time()`` raises before that, and ``synchronize()``
always raises (otelprof must never call it). The GPU finishes its work only when a test says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from torch.utils.data import DataLoader, TensorDataset

import otelprof
from otelprof import semconv as sc
from otelprof._log import reset_warnings
from otelprof.integrations import cuda_timing
from otelprof.integrations import torch as otorch
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from tests.test_catalog import _scrape

torch.set_num_threads(1)
FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS = 5.0, 10.0, 2.0
HOST_REGIONS = [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER]


class FakeGPU:
    """One stream. Kernels extend the queued timeline; the GPU reaches it only at :meth:`finish`."""

    def __init__(self, fail: str | None = None, fail_after: int = 0) -> None:
        self.queued_ms = 0.0
        self.reached_ms = 0.0
        self.created = 0
        self.calls = {"record": 0, "query": 0, "elapsed_time": 0}
        self.blocking: list[str] = []
        self.fail, self.fail_after = fail, fail_after

    def kernel(self, ms: float) -> None:
        self.queued_ms += ms

    def finish(self) -> None:
        self.reached_ms = self.queued_ms

    def event(self) -> FakeEvent:
        self.created += 1
        return FakeEvent(self)

    def call(self, name: str) -> None:
        self.calls[name] += 1
        if name == self.fail and self.calls[name] > self.fail_after:
            raise RuntimeError(f"CUDA error: unspecified launch failure ({name})")


class FakeEvent:
    def __init__(self, gpu: FakeGPU) -> None:
        self.gpu = gpu
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        self.gpu.call("record")
        self.at = self.gpu.queued_ms

    def query(self) -> bool:
        self.gpu.call("query")
        return self.at is None or self.at <= self.gpu.reached_ms

    def elapsed_time(self, end: FakeEvent) -> float:
        self.gpu.call("elapsed_time")
        if self.at is None or end.at is None or max(self.at, end.at) > self.gpu.reached_ms:
            self.gpu.blocking.append("elapsed_time")  # a real one would block or raise "device not ready"
            raise RuntimeError("CUDA error: device not ready")
        return end.at - self.at

    def synchronize(self) -> None:
        self.gpu.blocking.append("synchronize")
        raise AssertionError("synchronize() must never be called")


class GpuNet(torch.nn.Module):
    """A CPU model whose forward and backward also queue work on the fake GPU."""

    def __init__(self, gpu: FakeGPU) -> None:
        super().__init__()
        self.gpu = gpu
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.body(x)
        return queue_forward(self.gpu, out)


def queue_forward(gpu: FakeGPU, output: torch.Tensor) -> torch.Tensor:
    """A forward's work on the fake GPU, and its backward's once autograd reaches ``output``."""
    gpu.kernel(FORWARD_MS)
    if output.requires_grad:
        output.register_hook(lambda grad: gpu.kernel(BACKWARD_MS))
    return output


@pytest.fixture(autouse=True)
def _uninstrument() -> Iterator[None]:
    reset_warnings()
    yield
    otorch.uninstrument()


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, gpu: FakeGPU, *, capturing: bool = False,
               on_cuda: Any = lambda module: True) -> None:
    monkeypatch.setattr(cuda_timing, "backend", cuda_timing.Backend(
        on_cuda=on_cuda, available=lambda: True, capturing=lambda: capturing, new_event=gpu.event))


def _parts(gpu: FakeGPU) -> tuple[GpuNet, torch.optim.Optimizer, DataLoader[Any]]:
    torch.manual_seed(0)
    model = GpuNet(gpu)
    loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
    return model, torch.optim.SGD(model.parameters(), lr=0.05), loader


def _train(model: GpuNet, optimizer: torch.optim.Optimizer, loader: DataLoader[Any], steps: int,
           finish: bool = False) -> int:
    """``steps`` iterations; with ``finish`` the GPU catches up after each (as a loss.item() would make it)."""
    gpu = model.gpu
    done = 0
    while done < steps:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step(lambda: gpu.kernel(OPTIMIZER_MS))  # the closure runs inside step(): its "kernels"
            if finish:
                gpu.finish()
            done += 1
            if done == steps:
                break
    return done


def _init(tmp_path: Path) -> otelprof.Session:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, metrics_exporters=("prometheus",),
                            prometheus_port=0)
    assert isinstance(session, otelprof.Session)
    return session


def _samples(session: otelprof.Session, spec: sc.MetricSpec) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The real /metrics samples of one family: (sample name, labels without identity ones) -> value."""
    identity = {sc.prometheus_label(k) for k in sc.IDENTITY_LABELS}
    out = {}
    for family in text_string_to_metric_families(_scrape(session)):
        if family.name == spec.prometheus_name:
            for s in family.samples:
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k not in identity and k != "le"))
                if not s.name.endswith("_bucket"):
                    out[(s.name, labels)] = s.value
    return out


def _recording(session: otelprof.Session) -> RankRecording:
    run_dir = session.run_dir
    otelprof.shutdown()
    assert run_dir is not None
    return read_recording(run_dir).ranks[0]


def device_times_by_step(rank: RankRecording) -> dict[tuple[str, int | None], dict[str, int]]:
    """The recording's device times: (phase, step number) -> region -> nanoseconds."""
    by_step: dict[tuple[str, int | None], dict[str, int]] = {}
    for d in rank.device_times:
        by_step.setdefault((d.phase, d.number), {})[d.name] = d.duration_ns
    return by_step


def train_device_times(steps: int, optimizer_ms: float = OPTIMIZER_MS) -> dict[tuple[str, int], dict[str, int]]:
    """What :func:`device_times_by_step` gives for ``steps`` training steps on the fake GPU."""
    times = {sc.REGION_FORWARD: FORWARD_MS, sc.REGION_BACKWARD: BACKWARD_MS, sc.REGION_OPTIMIZER: optimizer_ms}
    return {("train", n): {region: int(ms * 1e6) for region, ms in times.items()} for n in range(steps)}


def _device(phase: str, region: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(((sc.LABEL_PHASE, phase), (sc.LABEL_ANNOTATION, region))))


def test_device_times_land_in_the_histogram_and_the_recording_without_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)
    session = _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader, 8, finish=True)
    model.eval()
    with torch.no_grad():
        for x, _ in loader:
            model(x)
            if gpu.queued_ms - gpu.reached_ms >= 2 * FORWARD_MS:
                break
    assert isinstance(inst.device_timer, cuda_timing.DeviceTimer)
    assert inst.device_timer.pending == 2  # the GPU has not finished the eval forwards: never waited for
    gpu.finish()
    otorch.uninstrument()  # a last poll resolves them

    dur = sc.REGION_DEVICE_DURATION.prometheus_name
    samples = _samples(session, sc.REGION_DEVICE_DURATION)
    expected = {("train", sc.REGION_FORWARD): (8, FORWARD_MS), ("train", sc.REGION_BACKWARD): (8, BACKWARD_MS),
                ("train", sc.REGION_OPTIMIZER): (8, OPTIMIZER_MS), ("eval", sc.REGION_FORWARD): (2, FORWARD_MS)}
    assert {k: v for k, v in samples.items() if k[0] == dur + "_count"} == {
        (dur + "_count", _device(phase, region)): count for (phase, region), (count, _) in expected.items()}
    for (phase, region), (count, ms) in expected.items():
        assert samples[(dur + "_sum", _device(phase, region))] == pytest.approx(count * ms / 1e3)
    assert gpu.blocking == []  # no synchronize(), no elapsed_time() before the GPU got there
    assert gpu.created <= 2 * 4  # resolved pairs are reused

    rank = _recording(session)
    assert len(rank.steps) == 10
    assert all([a.name for a in s.annotations] == HOST_REGIONS for s in rank.steps[:8])  # host times unchanged
    assert device_times_by_step(rank) == {**train_device_times(8),
                                          **{("eval", n): {sc.REGION_FORWARD: 5_000_000} for n in range(2)}}
    assert rank.skipped_lines == 0


def test_pending_pairs_are_bounded_and_drops_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)
    session = _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        _train(model, optimizer, loader, 50)  # the GPU never catches up: 150 pairs for 128 places
        _train(model, optimizer, loader, 1)  # the forward polls and reports the drops
    timer = inst.device_timer
    assert isinstance(timer, cuda_timing.DeviceTimer)
    assert timer.pending == cuda_timing.PENDING_PAIRS
    dropped = 51 * 3 - cuda_timing.PENDING_PAIRS
    assert timer.dropped == dropped and gpu.calls["elapsed_time"] == 0 and gpu.blocking == []
    assert caplog.text.count("CUDA event pairs waited for the GPU") == 1
    name = sc.EXPORTER_DROPPED.prometheus_name + "_total"
    counts = _samples(session, sc.EXPORTER_DROPPED)
    # Drops are reported at the next poll (a forward): the last step's three are not counted yet.
    assert counts[(name, ((sc.LABEL_EXPORTER, cuda_timing.DROPPED_LABEL),))] == 50 * 3 - cuda_timing.PENDING_PAIRS

    gpu.finish()
    _train(model, optimizer, loader, 1)
    assert timer.pending == 3 and gpu.blocking == []  # everything finished resolved; this step's pairs wait
    count = _samples(session, sc.REGION_DEVICE_DURATION)
    assert sum(v for (n, _), v in count.items() if n.endswith("_count")) == cuda_timing.PENDING_PAIRS


@pytest.mark.parametrize("failing", ["record", "query", "elapsed_time"])
def test_an_event_api_error_turns_device_timing_off_once_and_training_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failing: str) -> None:
    gpu = FakeGPU(fail=failing, fail_after=7)
    _fake_cuda(monkeypatch, gpu)
    session = _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    with caplog.at_level(logging.WARNING, logger="otelprof"):
        assert _train(model, optimizer, loader, 16, finish=True) == 16
    assert inst.device_timer is None
    assert caplog.text.count("CUDA event timing failed") == 1
    name = sc.INTEGRATION_ERRORS.prometheus_name + "_total"
    assert _samples(session, sc.INTEGRATION_ERRORS) == {(name, (("hook", otorch.HOOK_CUDA_EVENTS),)): 1}
    calls = dict(gpu.calls)
    _train(model, optimizer, loader, 2, finish=True)
    assert gpu.calls == calls  # off for good
    rank = _recording(session)
    assert len(rank.steps) == 18
    assert all([a.name for a in s.annotations] == HOST_REGIONS for s in rank.steps)


def test_a_removed_forward_hook_stops_the_timer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)
    _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader, 2, finish=True)
    assert isinstance(inst.device_timer, cuda_timing.DeviceTimer)
    records = gpu.calls["record"]

    def broken(region: str) -> None:
        raise RuntimeError("hook bug")

    monkeypatch.setattr(inst.device_timer, "begin", broken)  # the forward pre-hook is the first to fail
    assert _train(model, optimizer, loader, 3, finish=True) == 3
    assert inst.device_timer is None and gpu.calls["record"] == records  # nothing would read the events


def test_cpu_models_get_host_times_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu, on_cuda=cuda_timing.CUDA.on_cuda)  # CUDA "available", parameters on the CPU
    session = _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader, 8, finish=True)
    assert inst.device_timer is None
    assert gpu.created == 0
    assert _samples(session, sc.REGION_DEVICE_DURATION) == {}
    rank = _recording(session)
    assert len(rank.steps) == 8 and rank.device_times == []
    assert all([a.name for a in s.annotations] == HOST_REGIONS for s in rank.steps)


def test_the_decision_waits_for_a_module_with_parameters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    def on_cuda(module: Any) -> bool | None:
        seen.append(module)
        return cuda_timing.CUDA.on_cuda(module)

    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu, on_cuda=on_cuda)
    _init(tmp_path)
    relu, model = torch.nn.ReLU(), torch.nn.Linear(4, 2)
    inst = otorch.instrument(model=relu)
    otorch.instrument(model=model)
    relu(torch.randn(2, 4))
    assert seen == [relu] and inst.device_timer is not None  # no parameters, no buffers: still undecided
    model(relu(torch.randn(2, 4)))
    model(torch.randn(2, 4))
    assert seen == [relu, relu, model] and inst.device_timer is None  # on the CPU: decided once, for good


def test_uninstrument_stops_the_timer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)
    session = _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader, 3)
    timer = inst.device_timer
    assert isinstance(timer, cuda_timing.DeviceTimer) and timer.pending == 9
    gpu.finish()
    otorch.uninstrument()
    assert inst.device_timer is None and timer.disabled and timer.pending == 0
    records = gpu.calls["record"]
    _train(model, optimizer, loader, 3, finish=True)
    assert gpu.calls["record"] == records
    rank = _recording(session)
    assert len(rank.device_times) == 9 and len(rank.steps) == 3


def test_nothing_is_recorded_while_a_cuda_graph_is_captured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu, capturing=True)
    _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader, 4, finish=True)
    assert isinstance(inst.device_timer, cuda_timing.DeviceTimer)
    assert gpu.calls == {"record": 0, "query": 0, "elapsed_time": 0}


def test_device_times_in_the_report_and_the_timeline_beside_host_times(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from otelprof.analysis.report import build_report
    from otelprof.report.html import render
    from otelprof.report.timeline import build_timeline

    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)
    session = _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    _train(model, optimizer, loader, 6, finish=True)
    otorch.uninstrument()
    run_dir = session.run_dir
    assert run_dir is not None
    rank = _recording(session)
    host: dict[str, list[int]] = {}
    for step in rank.steps:
        for a in step.annotations:
            host.setdefault(a.name, []).append(a.duration_ns)
    recording = read_recording(run_dir.parent)
    report = build_report(recording, checks=False)
    rows = {(x.phase, x.region): x for x in report.device.regions}
    assert set(rows) == {("train", sc.REGION_FORWARD), ("train", sc.REGION_BACKWARD), ("train", sc.REGION_OPTIMIZER)}
    for region, ms in ((sc.REGION_FORWARD, FORWARD_MS), (sc.REGION_BACKWARD, BACKWARD_MS),
                       (sc.REGION_OPTIMIZER, OPTIMIZER_MS)):
        row = rows[("train", region)]
        assert row.steps == 6 and row.device_mean == pytest.approx(ms / 1e3)
        assert row.host_mean == pytest.approx(sum(host[region]) / 6 / 1e9)
        assert row.gap_mean == pytest.approx(row.host_mean - row.device_mean)
    html = render(report)
    assert "Device time vs host time" in html and 'id="device"' in html
    trace = build_timeline(recording)
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    device = [e for e in trace["traceEvents"] if e["ph"] == "X"
              and tracks.get((e["pid"], e["tid"])) == "device time (CUDA events)"]
    assert len(device) == 18 and {e["args"]["step"] for e in device} == set(range(6))
    assert sorted({e["args"]["device_ms"] for e in device}) == [OPTIMIZER_MS, FORWARD_MS, BACKWARD_MS]
