"""The report's GPU operator table, its GPU activity and kernel precision pies and the MFU row, fed end to end from
a Kineto-format GPU trace: a real PyTorch loop with a profiling window whose trace (the profiler seam,
``parse_kineto_trace``) is the GPU fixture, as a CUDA run would export it. A window is summarised from its
trace alone (no profiler averages), so everything GPU-side in the report comes from the trace: the same kernels
the timeline and the overlap figures read."""

from __future__ import annotations

import collections
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import otelprof
from otelprof.analysis.report import build_report
from otelprof.integrations import operators, torch_profiler
from otelprof.integrations import torch as otorch
from otelprof.recording.reader import read_recording
from otelprof.report.html import render
from otelprof.report.timeline import build_timeline
from otelprof.runtime.collectors.sampler import Sampler
from tests.fake_nvml import FakeNvml

FIXTURE = Path(__file__).parent / "fixtures" / "kineto_gpu_trace.json"
PEAK = 1e12
"""A configured peak (OTELPROF_PEAK_FLOPS): the model runs on the CPU here, so the table's GPU peak does not apply."""


def expected_device_time() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per device-event name, per kind and per precision: seconds, summed from the parsed fixture."""
    parsed = operators.parse_kineto_trace(json.loads(FIXTURE.read_text()))
    names: dict[str, float] = {}
    kinds: dict[str, float] = {}
    precision: dict[str, float] = {}
    for d in parsed.device:
        seconds = (d.end_ns - d.start_ns) / 1e9
        names[d.name] = names.get(d.name, 0.0) + seconds
        kinds[d.kind] = kinds.get(d.kind, 0.0) + seconds
        if d.kind == "kernel":
            label = torch_profiler.kernel_precision(d.name)
            precision[label] = precision.get(label, 0.0) + seconds
    return names, kinds, precision


def test_gpu_operator_tables_pies_and_mfu_come_from_the_kineto_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = json.loads(FIXTURE.read_text())

    def gpu_trace(window: Any, keep: str | None) -> dict[str, Any]:
        return {**fixture, "baseTimeNanoseconds": window.started_ns}

    monkeypatch.setattr(torch_profiler, "_kineto_trace", gpu_trace)
    # A test earlier in this process may have run torch.compile: otelprof then counts no FLOPs (a dispatch mode
    # would make compiled frames recompile), for the rest of the process. This job compiles nothing.
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is not None:
        monkeypatch.setitem(dynamo.counters, "frames", collections.Counter())
    fake = FakeNvml()
    monkeypatch.setattr(otelprof.runtime.session, "Sampler", functools.partial(Sampler, nvml_factory=lambda: fake))
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    session = otelprof.init(record_dir=str(tmp_path), profile_every=0, peak_flops=PEAK)
    otorch.profile_window(2, 1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    for _ in range(8):
        with otelprof.step():
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
            time.sleep(0.005)
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing: the loop ends when the window is in
    while time.monotonic() < deadline and not any("flops" in w for w in read_recording(session.run_dir)
                                                  .ranks[0].profiles()):
        session.flush()
        time.sleep(0.1)
    run_dir = session.run_dir
    otelprof.shutdown()
    [window] = list(read_recording(run_dir).ranks[0].profiles())
    names, kinds, precision = expected_device_time()
    # the window's tables are read from its trace (no profiler averages): its kernels and time per kind
    assert window["gpu_ops"] and {op["name"] for op in window["gpu_ops"]} <= set(names)
    assert window["operators"]["device_kinds_s"] == pytest.approx(kinds)

    report = build_report(read_recording(run_dir.parent), checks=False)
    f = report.framework
    assert {o.name: o.self_time for o in f.gpu_operators} == pytest.approx(names)
    assert {o.name: o.calls for o in f.gpu_operators} == {name: 2 for name in names}  # two steps in the fixture
    assert f.gpu_operator_time == pytest.approx(sum(names.values()))
    assert dict(f.gpu_activity) == pytest.approx(kinds) and set(kinds) == {"kernel", "memcpy"}
    assert dict(f.kernel_precision) == pytest.approx(precision) and precision
    top = max(names, key=names.__getitem__)
    assert f.gpu_operators[0].name == top
    assert f.gpu_operators[0].share == pytest.approx(names[top] / sum(names.values()))
    [row] = report.device.flops
    assert row.peak == PEAK and row.utilization == pytest.approx(row.achieved / PEAK) and row.utilization > 0

    html = render(report)
    assert "No GPU operators were recorded" not in html
    gpu = html[html.index("<h3>GPU operators</h3>"):]
    assert f"The most expensive GPU operator was {top}" in gpu
    for name in names:
        assert name.replace("<", "&lt;").replace(">", "&gt;") in gpu
    assert "<title>GPU activity</title>" in html and "<title>Kernel precision</title>" in html
    assert "<title>GPU operators</title>" in html
    assert f"reached {row.utilization * 100:.1f} %" in html
    # the same kernels as the timeline's device tracks
    trace = build_timeline(read_recording(run_dir))
    timeline_kernels = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "gpu"}
    assert timeline_kernels and timeline_kernels <= set(names)
