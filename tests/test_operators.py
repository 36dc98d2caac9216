"""Profiling windows become operator spans under their steps, bounded operator metrics, and a periodic schedule.

CPU windows run the real torch.profiler; GPU kernels come from a Kineto-format fixture (tests/fixtures)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace import TracerProvider

import otelprof
from otelprof import semconv as sc
from otelprof.config import Config
from otelprof.integrations import operators
from otelprof.integrations import torch as otorch
from otelprof.integrations.profile_summary import kernel_precision
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from otelprof.recording.records import Span
from otelprof.runtime import profile_schedule
from otelprof.runtime.metrics import MetricRegistry
from otelprof.runtime.profile_schedule import PeriodicWindows
from otelprof.runtime.span_builder import SpanBuilder

FIXTURE = Path(__file__).parent / "fixtures" / "kineto_gpu_trace.json"
BASE_NS = 1700000000000000000


class Block(torch.nn.Module):
    """forward: one named range holding exactly one aten::mm and one aten::relu."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(32, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("block"):
            return torch.relu(torch.mm(x, self.weight))


def _train(steps: int, model: torch.nn.Module) -> None:
    x = torch.randn(8, 32)
    for _ in range(steps):
        with otelprof.step():
            model(x).sum()


def _finish(session: Any) -> RankRecording:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(read_recording(session.run_dir).ranks[0].profiles()):
        session.flush()
        time.sleep(0.1)
    run_dir = session.run_dir
    otelprof.shutdown()
    return read_recording(run_dir).ranks[0]


def _children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id]


def test_window_operators_become_spans_nested_under_their_steps(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, span_budget=0.0,
                            span_first_steps=0)
    otorch.profile_window(4, 2)
    _train(8, Block())
    rank = _finish(session)
    spans = list(rank.spans())
    steps = {s.attributes[sc.ATTR_STEP_NUMBER]: s for s in spans if s.name == sc.SPAN_STEP}
    assert sorted(steps) == [4, 5]  # no other step sampled; the window's steps always are
    [window] = list(rank.profiles())
    assert window["operator_spans"] > 0 and window["operators"]["operators"] > 0
    for number, step in steps.items():
        blocks = [s for s in _children(spans, step) if s.name == "block"]
        assert len(blocks) == 1, number  # the loop ran one forward per step
        [block] = blocks
        assert block.attributes[sc.ATTR_OP_KIND] == "cpu" and block.attributes[sc.ATTR_STEP_NUMBER] == number
        assert step.start_ns <= block.start_ns <= block.end_ns <= step.end_ns
        inside = _children(spans, block)
        assert [s.name for s in inside if s.name in ("aten::mm", "aten::relu")] == ["aten::mm", "aten::relu"]
        for child in inside:
            assert block.start_ns <= child.start_ns <= child.end_ns <= block.end_ns
        [relu] = [s for s in inside if s.name == "aten::relu"]
        assert {s.name for s in _children(spans, relu)} == {"aten::clamp_min"}  # relu's own nesting
    assert not any(s.attributes.get(sc.ATTR_OP_KIND) for s in spans
                   if s.name != sc.SPAN_STEP and s.trace_id not in {t.trace_id for t in steps.values()}
                   and s.name != sc.SPAN_PROFILE)


def test_operator_spans_are_bounded_per_step_and_the_rest_counted(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_max_spans=2)
    otorch.profile_window(1, 1)
    _train(3, Block())
    rank = _finish(session)
    [window] = list(rank.profiles())
    assert window["operator_spans"] == 2 and window["operator_spans_dropped"] == window["operators"]["operators"] - 2
    names = [s.name for s in rank.spans() if s.attributes.get(sc.ATTR_OP_KIND) == "cpu"]
    assert names[:1] == ["block"] or "block" in names  # the longest (outermost) first


def test_kineto_fixture_kernels_hang_under_their_launching_operators() -> None:
    trace = json.loads(FIXTURE.read_text())
    parsed = operators.parse_kineto_trace(trace)
    by_name = {}
    for index, op in enumerate(parsed.operators):
        by_name.setdefault(op.name, []).append(index)
    assert len(parsed.operators) == 10 and len(parsed.device) == 6
    addmm = parsed.operators[by_name["aten::addmm"][0]]
    assert parsed.operators[addmm.parent or 0].name == "aten::linear" and addmm.depth == 2
    assert addmm.launches == 1 and addmm.start_ns == BASE_NS + 1_040_000
    for event in parsed.device:
        launcher = parsed.operators[event.launcher or 0]
        expected = {"kernel": ("aten::addmm", "aten::relu"), "memcpy": ("aten::copy_",)}[event.kind]
        assert event.launcher is not None and launcher.name in expected
        assert launcher.start_ns <= event.launch_ns <= launcher.end_ns  # type: ignore[operator]
    sgemm = parsed.device[0]
    assert (sgemm.device, sgemm.stream, sgemm.grid, sgemm.block) == (0, 7, (16, 4, 1), (128, 1, 1))
    copy = next(d for d in parsed.device if d.kind == "memcpy")
    assert (copy.stream, copy.bytes) == (13, 262144)

    builder = SpanBuilder(TracerProvider())
    steps = []
    for number, start_us in ((0, 1000), (1, 1500)):
        context = builder.new_trace(sc.SPAN_STEP, {})
        assert context is not None
        steps.append(operators.StepSpan(context, number, BASE_NS + start_us * 1000, BASE_NS + (start_us + 400) * 1000))
    spans, dropped = operators.operator_spans(builder, parsed, steps, 100)
    assert dropped == 0 and len(spans) == 16
    ids = {s.context.span_id: s for s in spans}
    for span in spans:
        kind = span.attributes[sc.ATTR_OP_KIND]  # type: ignore[index]
        parent = ids.get(span.parent.span_id) if span.parent is not None else None
        if kind == "kernel" and "sgemm" in span.name:
            assert parent is not None and parent.name == "aten::addmm"
            assert list(span.attributes[sc.ATTR_KERNEL_GRID]) == [16, 4, 1]  # type: ignore[index]
            assert span.attributes[sc.ATTR_OP_CATEGORY] == "matmul"  # type: ignore[index]
        elif kind == "memcpy":
            assert parent is not None and parent.name == "aten::copy_"
            assert span.attributes[sc.ATTR_KERNEL_BYTES] == 262144  # type: ignore[index]
        elif span.name == "forward_block":
            assert parent is None and span.parent is not None
            assert span.parent.span_id in {s.context.span_id for s in steps}
    summary = operators.window_summary(parsed, 10, kernel_precision)
    assert summary["kernels"][0]["name"] == "ampere_sgemm_64x32_sliced1x4_tn"
    assert summary["kernels"][0]["calls"] == 2 and summary["kernels"][0]["self_s"] == pytest.approx(180e-6)
    assert summary["kernel_precision_s"]["fp32"] == pytest.approx(180e-6)
    assert summary["device_op_s"] > 0 and summary["categories_s"]["gpu"]["memory_copy"] == pytest.approx(60e-6)
    addmm_row = next(r for r in summary["ops"] if r["name"] == "aten::addmm")
    assert addmm_row["launches"] == 2 and addmm_row["calls"] == 2


def test_a_malformed_trace_gives_nothing_rather_than_an_error() -> None:
    assert operators.parse_kineto_trace({}).operators == []
    bad: dict[str, Any] = {"traceEvents": [None, 3, {"ph": "X", "cat": "cpu_op"}, {"ph": "X", "cat": "kernel",
                                                                                  "ts": "x", "args": []}]}
    parsed = operators.parse_kineto_trace(bad)
    assert parsed.operators == [] and parsed.device == []


def test_operator_metrics_keep_the_top_k_and_fold_the_rest_into_other() -> None:
    parsed = operators.ParsedTrace([operators.Operator(f"aten::op{i}", i * 1000, i * 1000 + 10 + i, 1)
                                    for i in range(50)])
    for op in parsed.operators:
        op.self_ns = op.end_ns - op.start_ns
    stats = operators.window_summary(parsed, 5)
    assert [r["name"] for r in stats["ops"]] == ["aten::op49", "aten::op48", "aten::op47", "aten::op46",
                                                 "aten::op45", sc.OTHER_LABEL_VALUE]
    assert stats["ops"][-1]["calls"] == 45
    assert sum(r["self_s"] for r in stats["ops"]) == pytest.approx(sum(10 + i for i in range(50)) / 1e9)
    registry = MetricRegistry({k: "x" for k in sc.IDENTITY_LABELS})
    operators.set_metrics(registry, stats, 5)
    parsed.operators = [operators.Operator(f"aten::new{i}", 0, 100, 1, self_ns=100) for i in range(20)]
    operators.set_metrics(registry, operators.window_summary(parsed, 5), 1)
    labels = set(registry.gauge(sc.OPERATOR_SELF_TIME).values)
    assert len(labels) == 6 and all(device == "cpu" for device, _ in labels)  # the last window's, bounded
    assert registry.gauge(sc.OPERATOR_HOST_RATIO).values[()] == 1.0  # CPU only


def test_categories_by_name() -> None:
    assert operators.categorize("aten::addmm") == "matmul"
    assert operators.categorize("aten::mkldnn_convolution") == "convolution"
    assert operators.categorize("aten::_scaled_dot_product_flash_attention") == "attention"
    assert operators.categorize("aten::native_layer_norm") == "normalization"
    assert operators.categorize("aten::add_") == "elementwise"
    assert operators.categorize("Memcpy HtoD (Pageable -> Device)") == "memory_copy"
    assert operators.categorize("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "communication"
    assert operators.categorize("Optimizer.step#SGD.step") == "other"
    assert set(sc.OPERATOR_CATEGORIES) == {c for c, _ in operators.CATEGORIES} | {"other"}


def test_the_schedule_stretches_its_interval_to_stay_within_the_budget() -> None:
    schedule = PeriodicWindows(Config(profile_every=600.0, profile_budget=0.01))
    assert schedule.interval_after(0.5) == 600.0
    assert schedule.interval_after(30.0) == pytest.approx(3000.0)  # 30 s / 3000 s = 1 %


def test_a_default_session_profiles_a_window_after_warmup(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_warmup=0.2,
                            profile_warmup_steps=12)
    model = Block()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not profile_schedule.of(session).windows_run:
        _train(5, model)
        time.sleep(0.02)
    rank = _finish(session)
    [window] = list(rank.profiles())
    assert window["trigger"] == "periodic" and window["start_step"] >= 12 and window["num_steps"] == 3
    assert window["overhead_s"] > 0 and window["operator_spans"] > 0
    assert profile_schedule.of(session).next_delay == pytest.approx(600.0)
    from otelprof.cli.report import write_demo_outputs

    report, _ = write_demo_outputs(rank.path.parent)
    html = report.read_text()
    assert "No operator-profiling window was recorded" not in html and "aten::mm" in html


def test_periodic_windows_can_be_switched_off(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_warmup=0)
    _train(30, Block())
    time.sleep(0.3)
    assert profile_schedule.of(session)._thread is None
    run_dir = session.run_dir
    otelprof.shutdown()
    assert list(read_recording(run_dir).ranks[0].profiles()) == []


def test_a_window_leaves_the_jobs_stderr_alone(tmp_path: Path) -> None:
    """Kineto prints USDT lines on fd 2 as the profiler starts and stops; a window hides them."""
    import subprocess
    import sys

    script = ("import time, torch, otelprof\n"
              "from otelprof.integrations import torch as ot\n"
              f"otelprof.init(record_dir={str(tmp_path)!r}, system_metrics=False, profile_every=0)\n"
              "ot.profile_window(1, 2)\n"
              "for _ in range(5):\n"
              "    with otelprof.step():\n"
              "        torch.mm(torch.randn(4, 4), torch.randn(4, 4))\n"
              "time.sleep(0.5)\n"
              "otelprof.shutdown()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert result.returncode == 0 and result.stderr == ""


def test_what_other_threads_write_while_a_window_starts_reaches_the_jobs_stderr(tmp_path: Path) -> None:
    """Kineto's lines are hidden by holding fd 2 aside while the profiler starts and stops: a line the job's
    other threads write meanwhile is written back afterwards, not lost."""
    import subprocess
    import sys

    script = ("import os, threading, time, torch, otelprof\n"
              "from otelprof.integrations import torch as ot\n"
              f"otelprof.init(record_dir={str(tmp_path)!r}, system_metrics=False, profile_every=0)\n"
              "done = threading.Event()\n"
              "def chatter():\n"
              "    n = 0\n"
              "    while not done.is_set():\n"
              "        os.write(2, b'line %d\\n' % n)\n"
              "        n += 1\n"
              "        time.sleep(0.0002)\n"
              "    os.write(2, b'total %d\\n' % n)\n"
              "thread = threading.Thread(target=chatter)\n"
              "thread.start()\n"
              "for i in range(6):\n"
              "    ot.profile_window(1, 1)\n"
              "    for _ in range(3):\n"
              "        with otelprof.step():\n"
              "            torch.mm(torch.randn(64, 64), torch.randn(64, 64))\n"
              "    time.sleep(0.2)\n"
              "done.set()\n"
              "thread.join()\n"
              "otelprof.shutdown()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    total = int(lines[-1].split()[1])
    assert sorted(int(x.split()[1]) for x in lines[:-1] if x.startswith("line ")) == list(range(total))
    assert not [x for x in lines if not x.startswith(("line ", "total "))], [x for x in lines if "line" not in x]
