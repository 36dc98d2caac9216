"""Memory of profiling windows (torch.profiler profile_memory, real on CPU): the top allocating operators, each
window's allocated-bytes curve and peak; the CUDA allocator's peak and fragmentation over the run (faked)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

import otelprof
from otelprof import semconv as sc
from otelprof.integrations import operators
from otelprof.integrations import torch as otorch
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording

ROWS, COLS = 256, 1024  # one float32 buffer: 1 MiB


class Allocating(torch.nn.Module):
    """Each forward allocates exactly one ROWS x COLS float32 tensor in aten::empty, inside a named range."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("make_buffer"):
            buffer = torch.empty(ROWS, COLS)
        return x + buffer.sum() * 0


def _run(tmp_path: Path, steps: int = 4, **settings: Any) -> RankRecording:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, **settings)
    otorch.profile_window(1, 2)
    model, x = Allocating(), torch.zeros(4)
    for _ in range(steps):
        with otelprof.step():
            model(x)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(read_recording(session.run_dir).ranks[0].profiles()):
        session.flush()
        time.sleep(0.1)
    gauges = {spec: dict(session.registry.gauge(spec).values)
              for spec in (sc.OPERATOR_ALLOCATED, sc.PROFILE_MEMORY_PEAK)}
    run_dir = session.run_dir
    otelprof.shutdown()
    rank = read_recording(run_dir).ranks[0]
    rank.manifest["_gauges"] = gauges
    return rank


def test_a_window_names_the_operators_that_allocated_and_draws_the_memory_curve(tmp_path: Path) -> None:
    rank = _run(tmp_path)
    [window] = list(rank.profiles())
    memory = window["operators"]["memory"]
    by_name = {row["name"]: row for row in memory["top"]}
    empty = by_name["aten::empty"]  # the innermost operator around the allocation, not make_buffer
    assert empty["device"] == "cpu" and empty["allocations"] >= 2  # the buffers, and sum()'s scalar result
    assert 2 * ROWS * COLS * 4 <= empty["bytes"] < 2 * ROWS * COLS * 4 + 1024
    assert memory["top"][0]["name"] == "aten::empty" and "make_buffer" not in by_name
    assert memory["peak_bytes"]["cpu"] >= ROWS * COLS * 4
    curve = memory["curve"]["cpu"]
    assert len(curve) >= 4 and [t for t, _ in curve] == sorted(t for t, _ in curve)
    assert max(v for _, v in curve) == memory["peak_bytes"]["cpu"]
    assert window["t"] <= curve[0][0] and curve[-1][0] <= window["t"] + window["d"]
    gauges = rank.manifest["_gauges"]
    assert gauges[sc.OPERATOR_ALLOCATED][("cpu", "aten::empty")] == empty["bytes"] / 2  # per profiled step
    assert gauges[sc.PROFILE_MEMORY_PEAK][("cpu",)] == memory["peak_bytes"]["cpu"]


def test_memory_profiling_can_be_turned_off(tmp_path: Path) -> None:
    [window] = list(_run(tmp_path, profile_memory=False).profiles())
    assert "memory" not in window["operators"]


def test_gpu_memory_events_attribute_to_their_operator_and_device() -> None:
    base = 1_700_000_000_000_000_000
    trace = {"baseTimeNanoseconds": base, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1, "ts": 10.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 1, "tid": 1, "ts": 12.0, "dur": 5.0},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 13.0,
         "args": {"Total Reserved": 2097152, "Total Allocated": 1048576, "Bytes": 1048576, "Device Id": 0,
                  "Device Type": 1, "Addr": 1}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 30.0,
         "args": {"Total Reserved": 2097152, "Total Allocated": 1572864, "Bytes": 524288, "Device Id": 0,
                  "Device Type": 1, "Addr": 2}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 70.0,
         "args": {"Total Reserved": 2097152, "Total Allocated": 524288, "Bytes": -1048576, "Device Id": 0,
                  "Device Type": 1, "Addr": 1}},
    ]}
    parsed = operators.parse_kineto_trace(json.loads(json.dumps(trace)))
    assert [(m.device, m.bytes, parsed.operators[m.operator].name if m.operator is not None else None)
            for m in parsed.memory] == [("cuda:0", 1048576, "aten::empty"), ("cuda:0", 524288, "aten::linear"),
                                        ("cuda:0", -1048576, None)]
    summary = operators.memory_summary(parsed, 10)
    assert summary["top"] == [{"device": "cuda:0", "name": "aten::empty", "bytes": 1048576, "allocations": 1},
                              {"device": "cuda:0", "name": "aten::linear", "bytes": 524288, "allocations": 1}]
    assert summary["peak_bytes"] == {"cuda:0": 1572864} and summary["reserved_bytes"] == {"cuda:0": 2097152}
    assert summary["curve"]["cuda:0"] == [[base + 13000, 1048576], [base + 30000, 1572864], [base + 70000, 524288]]


def test_the_curve_is_bounded() -> None:
    points = [(i, i % 7) for i in range(10_000)]
    kept = operators._downsample(points, 200)
    assert len(kept) <= 200 and max(v for _, v in kept) == 6


class FakeAllocator:
    """The CUDA caching allocator as the seam sees it: a training loop's allocations with cached blocks."""

    def __init__(self) -> None:
        self.allocated = self.reserved = self.peak = 0

    def step(self, allocated: int, reserved: int) -> None:
        self.allocated, self.reserved = allocated, reserved
        self.peak = max(self.peak, allocated)


def test_allocator_peak_and_fragmentation_over_the_run(tmp_path: Path, monkeypatch: Any) -> None:
    from otelprof.analysis.report import build_report
    from otelprof.integrations import cuda_memory
    from otelprof.report.html import render

    fake = FakeAllocator()
    monkeypatch.setattr(cuda_memory, "backend", cuda_memory.Backend(
        lambda: True, lambda: 0, lambda d: fake.allocated, lambda d: fake.reserved, lambda d: fake.peak))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "_initialized", True)  # the integration's per-step shortcut reads the flag
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0,
                            metric_export_interval=1.0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    otorch.instrument(model=model, optimizer=optimizer)
    mib = 2**20
    usage = [(100, 128), (300, 512), (150, 512), (120, 256)]  # MiB allocated, reserved after each step
    for allocated, reserved in usage:
        fake.step(allocated * mib, reserved * mib)
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        session.flush()
        time.sleep(1.1)  # one metric snapshot per step
    gauges = {spec: dict(session.registry.gauge(spec).values)
              for spec in (sc.CUDA_MEMORY_FRAGMENTATION, sc.CUDA_MEMORY_PEAK)}
    run_dir = session.run_dir
    otorch.uninstrument()
    otelprof.shutdown()
    assert gauges[sc.CUDA_MEMORY_FRAGMENTATION] == {("0",): 136 * mib}
    assert gauges[sc.CUDA_MEMORY_PEAK] == {("0",): 300 * mib}
    report = build_report(read_recording(run_dir.parent), checks=False)
    [allocator] = report.device.allocators
    assert (allocator.gpu, allocator.peak, allocator.reserved_max) == ("0", 300 * mib, 512 * mib)
    assert allocator.fragmentation_max == 362 * mib and allocator.fragmentation_last == 136 * mib
    assert "362.0 MiB" in render(report)
