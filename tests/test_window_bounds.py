"""Profiling windows stay within an event cap whatever the step does, and their cost to training is measured.

A step here is hundreds of tiny module calls (each a few aten ops, their allocations and frees): tens of
thousands of profiler events per step, the shape of an LBFGS closure or a Python loop over a sequence. The
caps are checked by counts in the recording and by the process's resident memory read from /proc, never by
wall-clock thresholds."""

from __future__ import annotations

import itertools
import json
import logging
import mmap
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

import otelprof
from otelprof import semconv as sc
from otelprof.analysis.report import build_report, load
from otelprof.integrations import operators, window_bounds
from otelprof.integrations import torch as otorch
from otelprof.recording.reader import read_recording
from otelprof.report.html import render
from otelprof.runtime import hotpath as hot
from otelprof.runtime import profile_schedule
from tests.servers import free_port

FIXTURE = Path(__file__).parent / "fixtures" / "kineto_gpu_trace.json"
REPO = Path(__file__).parent.parent


class Tiny(torch.nn.Module):
    """Eight aten ops a call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = x.add(1.0).mul(0.5)
        return x


def _steps(model: torch.nn.Module, steps: int, calls: int) -> None:
    x = torch.randn(4)
    for _ in range(steps):
        with otelprof.step():
            y = x
            for _ in range(calls):
                y = model(y)


def _profiles(session: Any, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        session.flush()
        found = list(read_recording(session.run_dir).ranks[0].profiles())
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} profiling windows recorded")


def _check_cost(window: dict[str, Any]) -> None:
    """The recorded cost parts are non-negative and add up to the overhead the schedule budgets."""
    cost = window["cost"]
    assert set(cost) == {"steps_s", "flop_step_s", "processing_s"}
    assert all(value >= 0 for value in cost.values())
    assert cost["processing_s"] > 0  # reading and summarising the trace always takes CPU time
    assert sum(cost.values()) == pytest.approx(window["overhead_s"], abs=1e-9)


# ---------------------------------------------------------------- parsing in bounded memory
def test_a_trace_file_read_as_a_stream_gives_what_json_load_gives(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        Tiny()(torch.randn(4))
    profiler.export_chrome_trace(str(path))
    whole = json.loads(path.read_text())
    monkeypatch.setattr(operators, "READ_BYTES", 7)  # every value straddles reads
    header: dict[str, Any] = {}
    events = list(operators.read_trace_file(str(path), header))
    assert events == whole["traceEvents"] and len(events) > 50
    assert header == {k: v for k, v in whole.items() if k != "traceEvents"}
    assert header["baseTimeNanoseconds"] > 0

    streamed = operators.TraceCollector()
    for event in events:
        streamed.add(event)
    parsed = streamed.finish(header["baseTimeNanoseconds"])
    assert parsed == operators.parse_kineto_trace(whole)
    assert [op.name for op in parsed.operators].count("aten::add") == 4 and parsed.memory


def test_a_collector_keeps_at_most_its_cap_and_counts_the_rest() -> None:
    trace = json.loads(FIXTURE.read_text())
    whole = operators.parse_kineto_trace(trace)
    total = len(whole.operators) + len(whole.device) + sum(
        1 for e in trace["traceEvents"] if e.get("cat") in operators.LAUNCH_CATEGORIES and e.get("ph") == "X")
    collector = operators.TraceCollector(max_events=5)
    for event in trace["traceEvents"]:
        collector.add(event)
    parsed = collector.finish()
    assert (collector.kept, collector.dropped) == (5, total - 5)
    assert len(parsed.operators) + len(parsed.device) <= 5


def test_not_a_trace_file_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    for text in ("[1, 2]", '{"traceEvents": [{"ph": "X"}, {', '{"a" 1}', ""):
        path.write_text(text)
        with pytest.raises(ValueError):
            list(operators.read_trace_file(str(path), {}))


def test_windows_are_planned_from_the_events_per_step_measured_before() -> None:
    costs = window_bounds.EventCosts()
    assert costs.plan(10, "train", 1000) == 10  # nothing measured: as asked (the heap watch bounds it)
    costs.learn("train", 900, 3, 900 * 200)
    assert costs.events_per_step["train"] == 300 and costs.live_bytes_per_event == 200
    assert costs.plan(10, "train", 1000) == 3 and costs.plan(2, "train", 1000) == 2
    costs.learn("train", 5000, 0, -1)  # stopped within its first step: a step makes at least 5000 events
    assert costs.plan(10, "train", 1000) == 1 and costs.live_bytes_per_event == 200  # a shrinking heap learns nothing
    assert costs.plan(10, "eval", 1000) == 10


# ---------------------------------------------------------------- in-process windows
def test_a_window_past_the_cap_stops_mid_step_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="otelprof")
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_flops=False,
                            profile_max_events=2000)
    model = Tiny()
    otorch.instrument(model=model)
    _steps(model, 4, 10)
    answer = otorch.profile_window(4, 10_000)
    assert answer["max_events"] == 2000 and answer["steps_per_window"] is None  # nothing measured yet
    deadline = time.monotonic() + 90
    while len(list(read_recording(session.run_dir).ranks[0].profiles())) < 3 and time.monotonic() < deadline:
        _steps(model, 1, 400)  # over 10,000 events a step
        session.flush()
    found = _profiles(session, 3)
    truncated = dict(session.registry.counter(sc.PROFILE_TRUNCATED).values)
    kept = dict(session.registry.counter(sc.PROFILE_EVENTS).values)
    otelprof.shutdown()
    assert found[0]["start_step"] == 4 and found[0]["trigger"] == "api"
    assert [w["segment"] for w in found] == list(range(len(found)))  # the window goes on in segments
    for window in found:
        assert window["truncated"] == "events" and window["num_steps"] == 1  # stopped within its step
        events = window["events"]
        assert events["max"] == 2000 and 0 < events["kept"] <= 2000
        assert events["per_step"] >= events["kept"] + events["dropped"] > 0  # a step makes at least as many
        assert window["operators"]["operators"] <= events["kept"]
        assert window["operator_spans"] > 0  # under the step it stopped in, once that step ended
        _check_cost(window)
    for before, after in itertools.pairwise(found):
        assert after["start_step"] > before["start_step"]  # one segment at a time, never overlapping
    assert truncated[("events",)] == len(found)
    assert kept[("kept",)] == sum(w["events"]["kept"] for w in found)
    said = [r for r in caplog.records if "profiler events" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.INFO]  # said once, as bookkeeping: never a warning on stderr
    # the report: one window of len(found) segments, each stopped at the cap, in the windows table
    report = build_report(load(session.run_dir))
    [window] = report.framework.windows
    assert (window.start_step, window.last_step, window.num_steps) == (
        4, found[-1]["start_step"] + found[-1]["num_steps"] - 1, sum(w["num_steps"] for w in found))
    assert window.segments == len(found) and window.truncated == (("events", len(found)),)
    assert window.trigger == "api" and window.duration == pytest.approx(sum(w["d"] for w in found) / 1e9)
    page = render(report)
    table = page[page.index("<th>Segments</th>"):]
    assert (f"<td>{len(found)}</td><td>{len(found)} of {len(found)} at the event cap (OTELPROF_PROFILE_MAX_EVENTS)"
            "</td>") in table[:table.index("</table>")]


class WarmingUp(torch.nn.Module):
    """A model whose first call allocates a large buffer it keeps (lazy initialisation: the job's warm-up)."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.buffer is None:
            self.buffer = torch.ones(16 * 1024 * 1024)  # 64 MiB, every page touched
        return x.add(1.0)


def test_a_window_over_the_jobs_first_steps_is_not_stopped_by_their_warm_up_memory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # 64 MiB grown in the window's first step is 560,000 events at 120 B each, past the default cap of 100,000;
    # with no step measured before the window, that growth is the steps' own (the time estimate still bounds it)
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_flops=False)
    model = WarmingUp()
    otorch.instrument(model=model)
    learned = otorch_windows().costs.live_bytes_per_event
    otorch.profile_window(0, 2)
    _steps(model, 4, 3)
    [window] = _profiles(session, 1)
    otelprof.shutdown()
    assert model.buffer is not None
    assert "truncated" not in window and window["num_steps"] == 2 and window["events"]["dropped"] == 0
    assert window["events"]["heap_growth_bytes"] == 0  # nothing taken for events, nothing learned from it
    assert otorch_windows().costs.live_bytes_per_event == learned
    assert not any("profiler events" in r.getMessage() for r in caplog.records)


def test_a_window_of_steps_that_wait_is_not_cut_by_the_first_window_rate(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # three steps of 0.3 s waiting (I/O, a GPU) with a few operators: 0.9 s of wall clock is 180,000 events at the
    # first window's 200,000 a second, past the default cap; the busy time of the window's thread records events
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_flops=False)
    model = Tiny()
    otorch.instrument(model=model)
    otorch.profile_window(1, 3)
    x = torch.randn(4)
    for _ in range(6):
        with otelprof.step():
            model(x)
            time.sleep(0.3)
    [window] = _profiles(session, 1)
    otelprof.shutdown()
    assert "truncated" not in window and window["num_steps"] == 3 and window["events"]["dropped"] == 0
    assert 0 < window["events"]["kept"] < 100_000
    assert not any("profiler events" in r.getMessage() for r in caplog.records)


def test_the_heap_watch_counts_growth_only_against_a_measured_step() -> None:
    unknown, measured = window_bounds.HeapWatch(120.0, None), window_bounds.HeapWatch(120.0, 0)
    # 32 MiB of pages new to the process, each written (a tensor could reuse heap earlier tests freed, which is
    # resident already: the resident size would not grow)
    block = mmap.mmap(-1, 32 * 1024 * 1024)
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1
    assert unknown.events(force=True) >= 0 and measured.events(force=True) >= 0
    assert unknown.growth() == 0
    assert measured.growth() >= 16 * 1024 * 1024  # most of the block's pages are resident
    block.close()


def test_busy_time_is_cpu_time_allowing_for_a_busy_machine_never_past_the_wall_clock() -> None:
    assert window_bounds.busy_seconds(1.0, 0.1) == pytest.approx(0.1 / window_bounds.MIN_CPU_SHARE)  # mostly waited
    assert window_bounds.busy_seconds(1.0, 0.9) == 1.0  # ran throughout
    assert window_bounds.busy_seconds(1.0, 0.0) == 0.0  # slept: no events recorded


def otorch_windows() -> Any:
    from otelprof.integrations.torch_profiler import windows

    return windows


def test_the_watch_stops_a_window_past_its_cap_on_the_thread_that_started_it(tmp_path: Path) -> None:
    import threading

    from otelprof.integrations.torch_profiler import windows

    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_flops=False,
                            profile_max_events=2000)
    model = Tiny()
    otorch.instrument(model=model)
    otorch.profile_window(hot_next(), 10)
    x = torch.randn(4)
    calls = 0
    with otelprof.step():
        running = windows._running
        assert running is not None and torch.autograd.profiler._is_profiler_enabled
        helper = Tiny()  # not the instrumented model: its calls are module calls, no steps
        other = threading.Thread(target=lambda: [helper(x) for _ in range(3000)])  # on another thread
        other.start()
        other.join()
        assert windows._running is running  # not a checkpoint: the profiler is this thread's to stop
        assert torch.autograd.profiler._is_profiler_enabled
        while windows._running is running and calls < 100_000:
            model(x)  # a checkpoint of the window's own thread
            calls += 1
        assert windows._running is None and not torch.autograd.profiler._is_profiler_enabled  # stopped mid-step
    [window] = _profiles(session, 1)
    otelprof.shutdown()
    assert window["truncated"] == "events" and window["num_steps"] == 1 and window["segment"] == 0
    assert 0 < window["events"]["kept"] <= 2000


def hot_next() -> int:
    return hot.next_step_number()


def test_a_window_of_small_steps_is_whole_and_teaches_the_plan(tmp_path: Path) -> None:
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=0, profile_flops=False,
                            profile_max_events=20_000)
    model = Tiny()
    otorch.instrument(model=model)
    otorch.profile_window(2, 2)
    _steps(model, 8, 20)  # ~1,300 events a step: two steps fit (within the first window's 0.1 s at 200,000 a second)
    [window] = _profiles(session, 1)
    assert "truncated" not in window and window["num_steps"] == 2 and window["events"]["dropped"] == 0
    per_step = window["events"]["per_step"]
    assert per_step == pytest.approx(window["events"]["kept"] / 2)
    answer = otorch.profile_window(hot_next() + 1, 50)
    assert answer["steps_per_window"] == min(int(20_000 // per_step), 50)  # planned from what the first measured
    _steps(model, 60, 20)
    windows_seen = _profiles(session, 2)
    otelprof.shutdown()
    second = windows_seen[1]
    assert second["num_steps"] <= min(int(20_000 // per_step), 50) and second["events"]["kept"] <= 20_000
    _check_cost(second)
    first = build_report(load(session.run_dir)).framework.windows[0]
    assert (first.start_step, first.last_step, first.num_steps, first.segments, first.truncated) == (2, 3, 2, 1, ())


def test_an_expensive_window_stretches_the_interval_to_stay_within_the_budget(tmp_path: Path) -> None:
    every, budget = 0.1, 0.5
    session = otelprof.init(record_dir=str(tmp_path), system_metrics=False, profile_every=every, profile_warmup=0,
                            profile_warmup_steps=0, profile_budget=budget, profile_steps=2, profile_flops=False)
    model = Tiny()
    otorch.instrument(model=model)
    deadline = time.monotonic() + 90
    while profile_schedule.of(session).windows_run < 3 and time.monotonic() < deadline:
        _steps(model, 1, 150)  # ~10,000 events a step: a window costs tenths of a second, far past 5 % of 0.1 s
    found = _profiles(session, 3)
    schedule = profile_schedule.of(session)
    deadline = time.monotonic() + 10
    while schedule.windows_run < 3 or not session.registry.gauge(sc.PROFILE_INTERVAL).values:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    interval = session.registry.gauge(sc.PROFILE_INTERVAL).values[()]
    otelprof.shutdown()
    for window in found:
        _check_cost(window)
        assert window["trigger"] == "periodic"
    for before, after in itertools.pairwise(found):
        cost = before["overhead_s"]
        assert cost / budget > every  # the window was expensive: the interval had to stretch
        gap = (after["t"] - (before["t"] + before["d"])) / 1e9
        assert gap >= cost / budget  # cost / interval <= budget, from the recording's own times
    assert schedule.next_delay == pytest.approx(max(every, schedule._overhead / budget))
    assert interval == pytest.approx(schedule.next_delay)


# ---------------------------------------------------------------- a real process, a real capture request
JOB = """
import sys, threading, torch, otelprof
from otelprof.integrations import torch as ot

class Tiny(torch.nn.Module):
    def forward(self, x):
        for _ in range(4):
            x = x.add(1.0).mul(0.5)
        return x

otelprof.init(record_dir=sys.argv[1], system_metrics=False, profile_every=0, control_port=int(sys.argv[2]),
              profile_max_events=int(sys.argv[3]))
model = Tiny()
ot.instrument(model=model)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), done.set()), daemon=True).start()
print("ready", flush=True)
x = torch.randn(4)
while not done.is_set():
    with otelprof.step():
        y = x
        for _ in range(1000):
            y = model(y)
otelprof.shutdown()
print("done", flush=True)
"""


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


MAX_EVENTS = 20_000
RSS_BOUND = 256 << 20
"""Resident growth a capture may cause with MAX_EVENTS events a window: one window's results (about
2 kB an event once the profiler stopped, 40 MB) plus the profiler's one-time start-up and the allocator's slack,
measured at 140-150 MiB; the same loop without the cap grows by about 1.2 GiB a profiled step."""


def test_a_10000_step_capture_over_http_stays_bounded_in_memory(tmp_path: Path) -> None:
    port = free_port()
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, str(script), str(tmp_path / "rec"), str(port), str(MAX_EVENTS)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env)
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        time.sleep(1.0)  # a few steps without a window
        before = _rss_bytes(process.pid)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/capture", method="POST",
                                         data=json.dumps({"steps": 10_000}).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 202
            answer = json.load(response)
        assert answer["num_steps"] == 10_000 and answer["max_events"] == MAX_EVENTS
        peak = before
        run_dir = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            peak = max(peak, _rss_bytes(process.pid))
            runs = list((tmp_path / "rec").iterdir())
            run_dir = runs[0] if runs else None
            if run_dir is not None and (run_dir / "rank-0" / "profiles.jsonl").exists() and \
                    (run_dir / "rank-0" / "profiles.jsonl").read_text().count("\n") >= 4:
                break
            time.sleep(0.05)
        assert process.stdin is not None
        process.stdin.write("\n")
        process.stdin.flush()
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0 and out.endswith("done\n")
    assert peak - before <= RSS_BOUND, (before >> 20, peak >> 20)
    assert run_dir is not None
    found = list(read_recording(run_dir).ranks[0].profiles())
    assert len(found) >= 4
    assert [w["segment"] for w in found] == list(range(len(found)))
    first = found[0]["start_step"]
    for window in found:
        assert window["trigger"] == "capture" and window["truncated"] == "events"
        assert 0 < window["events"]["kept"] <= MAX_EVENTS and window["events"]["max"] == MAX_EVENTS
        assert window["num_steps"] == 1  # a step holds more events than a window may: a part of one step each
        assert first <= window["start_step"] < first + 10_000
        _check_cost(window)
    assert "Traceback" not in err
