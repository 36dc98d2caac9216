"""A region inside one of its own name is counted once: a user's ``annotate("backward")`` around
``loss.backward()`` holds the PyTorch hooks' own ``backward`` region, and the breakdown, the region table,
the forward/backward split, the live region histogram and the rendered report all see one backward per step;
regions holding others show their self time. ``profile_window()`` runs its window without turning the
PyTorch hooks on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

import otelprof
from otelprof import semconv as sc
from otelprof.analysis.framework import framework_summary
from otelprof.analysis.report import build_report
from otelprof.analysis.run import RunView
from otelprof.integrations import torch as otorch
from otelprof.recording.ranks import RankRecording
from otelprof.recording.reader import read_recording
from otelprof.report.html import render
from otelprof.shared import nesting

STEPS = 12


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _recorded(session: otelprof.Session) -> RankRecording:
    run_dir = session.run_dir
    otelprof.shutdown()
    return read_recording(run_dir).ranks[0]


def test_a_backward_annotated_around_the_hooks_backward_counts_once(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer = _model()
    otorch.instrument(model=model, optimizer=optimizer)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    outer: list[int] = []
    for _ in range(STEPS):
        with otelprof.step():
            with otelprof.annotate("train_step"):
                loss = ((model(x) - y) ** 2).mean()
                optimizer.zero_grad()
                began = time.perf_counter_ns()
                with otelprof.annotate(sc.REGION_BACKWARD):
                    loss.backward()
                    time.sleep(0.002)  # the user's region is longer than the hooks' one inside it
                outer.append(time.perf_counter_ns() - began)
            optimizer.step()
    session.flush()
    [live] = [s for k, s in session.registry.histogram(sc.ANNOTATION_DURATION).series.items()
              if k[1] == sc.REGION_BACKWARD]
    rank = _recorded(session)

    # the recording holds both records of the backward pass: the user's and the hooks' inside it
    first = rank.steps[0]
    backwards = sorted((a for a in first.annotations if a.name == sc.REGION_BACKWARD), key=lambda a: a.depth)
    assert [a.depth for a in backwards] == [1, 2]
    assert backwards[0].start_ns <= backwards[1].start_ns and \
        backwards[1].start_ns + backwards[1].duration_ns <= backwards[0].start_ns + backwards[0].duration_ns

    recording = read_recording(rank.path.parent)
    summary = framework_summary(RunView(recording))
    regions = {r.name: r for r in summary.regions}
    backward = regions[sc.REGION_BACKWARD]
    assert backward.count == STEPS  # once per step, not twice
    user = sum(a.duration_ns for s in rank.steps for a in s.annotations if a.name == sc.REGION_BACKWARD
               and a.depth == 1) / 1e9
    assert backward.total == pytest.approx(user, rel=1e-9)  # the outer (user's) region's time
    assert backward.total <= sum(outer) / 1e9  # within what the loop measured around it
    assert summary.backward == backward.total
    assert backward.self_time == pytest.approx(backward.total, rel=1e-9)  # the hooks' backward is itself
    # the region holding forward and backward: its self time is what they leave
    step_region = regions["train_step"]
    assert step_region.self_time < step_region.total - backward.total
    assert step_region.self_time >= 0
    for r in summary.regions:
        assert r.self_time <= r.total + 1e-12

    # the breakdown splits the step into its top-level region (train_step) and the rest; the table's shares of
    # the regions at one depth add up to at most the step time
    [b] = summary.breakdowns
    assert b.part("train_step") == pytest.approx(step_region.total, rel=1e-9)
    assert sum(r.total for r in summary.regions if r.depth == 1) <= b.step_time
    assert backward.share <= 1.0

    # live: the region histogram saw one backward per step, with the user's durations
    assert sum(live.counts) == STEPS and live.sum == pytest.approx(user, rel=1e-6)

    page = render(build_report(recording))
    assert "<th>Self</th>" in page and "is counted once" in page


def test_the_breakdown_and_the_region_table_of_one_report_agree(tmp_path: Path) -> None:
    """The user's backward directly inside the step: the breakdown's backward part is the region table's
    backward total, and the page says so with a self-time column."""
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False)
    model, optimizer = _model()
    otorch.instrument(model=model, optimizer=optimizer)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    for _ in range(STEPS):
        with otelprof.step():
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            with otelprof.annotate(sc.REGION_BACKWARD):
                loss.backward()
            optimizer.step()
    run_dir = session.run_dir
    otelprof.shutdown()
    report = build_report(read_recording(run_dir))
    backward = next(r for r in report.framework.regions if r.name == sc.REGION_BACKWARD)
    [b] = report.framework.breakdowns
    assert backward.count == STEPS
    assert b.part(sc.REGION_BACKWARD) == pytest.approx(backward.total, rel=1e-9)
    assert backward.share == pytest.approx(b.part(sc.REGION_BACKWARD) / b.step_time, rel=1e-9)
    assert b.overlap == 0.0
    page = render(report)
    assert "Self</th>" not in page  # no region holds another of a different name: total is self


def test_step_regions_nesting() -> None:
    """Codes 0 (outer backward, depth 0), 0 again inside it (depth 1), two overlapping all-reduces (code 1,
    apart) and a child of another name (code 2)."""
    counts, self_ns = nesting.step_regions([0, 0, 1, 1, 2], [0, 1, 10, 40, 60], [100, 98, 40, 80, 20],
                                           [0, 1, 1, 1, 1], apart=1)
    assert counts == [True, False, True, True, True]
    assert self_ns == [80, 0, 40, 80, 20]
    assert nesting.repeats([("b", 0, 100, 0, None), ("b", 1, 99, 1, None), ("c", 10, 50, 1, None)]) == {1}
    assert nesting.repeats([("c", 0, 10, 1, None), ("c", 5, 20, 1, None), ("f", 0, 30, 0, None)]) is None


def test_profile_window_turns_no_hook_on(tmp_path: Path) -> None:
    original = torch.Tensor.backward
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0)
    assert otorch.profile_window(1, 2)["armed"] is True
    assert torch.Tensor.backward is original and not otorch._active
    model, optimizer = _model()
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    for _ in range(5):
        with otelprof.step():
            loss = ((model(x) - y) ** 2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(read_recording(session.run_dir).ranks[0].profiles()):
        session.flush()
        time.sleep(0.1)
    assert torch.Tensor.backward is original and not otorch._active
    rank = _recorded(session)
    [window] = list(rank.profiles())
    assert window["start_step"] == 1 and window["num_steps"] == 2
    assert not any(s.annotations for s in rank.steps)  # no forward/backward/optimizer regions of any hook


def test_device_time_beside_the_backward_counted_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a (fake) GPU the hooks' backward has a device time; the host time beside it is the user's backward
    around it, once per step, not the two records added up."""
    from tests.test_cuda_timing import BACKWARD_MS, OPTIMIZER_MS, FakeGPU, _fake_cuda, _init, _parts

    gpu = FakeGPU()
    _fake_cuda(monkeypatch, gpu)
    session = _init(tmp_path)
    model, optimizer, loader = _parts(gpu)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        with otelprof.annotate(sc.REGION_BACKWARD):
            loss.backward()
        optimizer.step(lambda: gpu.kernel(OPTIMIZER_MS))
        gpu.finish()
    otorch.uninstrument()
    run_dir = session.run_dir
    otelprof.shutdown()
    recording = read_recording(run_dir)
    [rank] = recording.ranks
    outer = [a.duration_ns for s in rank.steps for a in s.annotations if a.name == sc.REGION_BACKWARD and a.depth == 0]
    report = build_report(recording, checks=False)
    row = next(x for x in report.device.regions if x.region == sc.REGION_BACKWARD)
    assert row.steps == len(outer) > 0
    assert row.device_mean == pytest.approx(BACKWARD_MS / 1e3)
    assert row.host_mean == pytest.approx(sum(outer) / len(outer) / 1e9)
