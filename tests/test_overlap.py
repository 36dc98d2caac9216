"""Communication/computation overlap from a window's kernels: collective (NCCL) kernels vs compute kernels on the
device timeline. The GPU trace is a Kineto-format fixture (a DDP backward with two bucketed all-reduces: the first
partly hidden behind the gradient matmuls, the second exposed) routed through the profiler seam."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import otelprof
from otelprof import semconv as sc
from otelprof.analysis.report import build_report
from otelprof.integrations import operators, torch_profiler
from otelprof.integrations import torch as otorch
from otelprof.recording.reader import read_recording
from otelprof.report.html import render

FIXTURE = Path(__file__).parent / "fixtures" / "kineto_nccl_overlap.json"
# stream 7: sgemm 1020-1320 us, sgemm 1330-1400 us; stream 20: all-reduce 1200-1500 us, all-reduce 1500-1600 us
COMMUNICATION_US = 400  # 1200-1600
OVERLAPPED_US = (1320 - 1200) + (1400 - 1330)
COMPUTE_US = 300 + 70


def test_overlap_of_collective_and_compute_kernels() -> None:
    parsed = operators.parse_kineto_trace(json.loads(FIXTURE.read_text()))
    assert [operators.categorize(d.name) for d in parsed.device] == ["matmul", "communication", "matmul",
                                                                     "communication"]
    overlap = operators.overlap_summary(parsed)
    assert overlap["communication_s"] == pytest.approx(COMMUNICATION_US / 1e6)
    assert overlap["overlapped_s"] == pytest.approx(OVERLAPPED_US / 1e6)
    assert overlap["exposed_s"] == pytest.approx((COMMUNICATION_US - OVERLAPPED_US) / 1e6)
    assert overlap["compute_s"] == pytest.approx(COMPUTE_US / 1e6)
    assert overlap["overlap_ratio"] == pytest.approx(OVERLAPPED_US / COMMUNICATION_US)
    # the collectives hang under the host operator that launched them
    launchers = {parsed.operators[d.launcher].name for d in parsed.device  # type: ignore[index]
                 if operators.categorize(d.name) == "communication"}
    assert launchers == {"record_param_comms"}


def test_no_collectives_no_overlap_figures() -> None:
    parsed = operators.parse_kineto_trace(json.loads(FIXTURE.read_text()))
    parsed.device = [d for d in parsed.device if "nccl" not in d.name]
    assert operators.overlap_summary(parsed) == {}
    other = operators.parse_kineto_trace(json.loads((FIXTURE.parent / "kineto_gpu_trace.json").read_text()))
    assert operators.overlap_summary(other) == {}


def test_a_window_with_collectives_reaches_the_recording_the_gauges_and_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = json.loads(FIXTURE.read_text())

    def gpu_trace(window: Any, keep: str | None) -> dict[str, Any]:  # the fixture 1-1.6 ms into the window
        return {**fixture, "baseTimeNanoseconds": window.started_ns}

    monkeypatch.setattr(torch_profiler, "_kineto_trace", gpu_trace)
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0)
    otorch.profile_window(1, 1)
    for _ in range(4):
        with otelprof.step():
            torch.ones(4).sum()
            time.sleep(0.005)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(read_recording(session.run_dir).ranks[0].profiles()):
        session.flush()
        time.sleep(0.1)
    ratio = dict(session.registry.gauge(sc.COMM_OVERLAP).values)
    exposed = dict(session.registry.gauge(sc.COMM_EXPOSED).values)
    run_dir = session.run_dir
    otelprof.shutdown()
    assert ratio[()] == pytest.approx(OVERLAPPED_US / COMMUNICATION_US)
    assert exposed[()] == pytest.approx((COMMUNICATION_US - OVERLAPPED_US) / 1e6)  # one profiled step
    [window] = list(read_recording(run_dir).ranks[0].profiles())
    assert window["operators"]["overlap"]["overlapped_s"] == pytest.approx(OVERLAPPED_US / 1e6)
    report = build_report(read_recording(run_dir.parent), checks=False)
    [row] = report.device.overlap
    assert (row.rank, row.windows) == (0, 1)
    assert row.overlap == pytest.approx(OVERLAPPED_US / COMMUNICATION_US)
    assert row.exposed == pytest.approx((COMMUNICATION_US - OVERLAPPED_US) / 1e6)
    html = render(report)
    assert "Communication/computation overlap" in html and "47.5 %" in html
    spans = [s for s in read_recording(run_dir).ranks[0].spans() if "nccl" in s.name]
    assert len(spans) == 2 and all(s.attributes[sc.ATTR_OP_CATEGORY] == "communication" for s in spans)


def test_the_straggler_runbook_points_to_the_overlap_panel() -> None:
    from otelprof.mixin import MixinConfig
    from otelprof.mixin.alerts import alerts

    [straggler] = [a for a in alerts(MixinConfig()) if a.short == "RankStraggler"]
    assert "Communication/computation overlap" in straggler.runbook.todo
    runbook = (Path(__file__).parent.parent / "deploy" / "prometheus" / "runbook.md").read_text()
    assert "Communication/computation overlap" in runbook  # the generated runbook carries it
