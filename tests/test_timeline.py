"""otelprof timeline: valid trace-event JSON (phases, required fields, monotonic time per track,
properly nested slices), the tracks it promises, outliers marked, windows that keep files small."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from otelprof.recording.reader import read_recording
from otelprof.report.timeline import build_timeline
from tests.test_report_fixtures import T0, manifest, ns, small_run, step_line, write_rank

PHASES = {"B", "E", "X", "I", "i", "C", "b", "n", "e", "s", "t", "f", "M", "P", "N", "O", "D"}


def validate(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert the Chrome trace-event format rules otelprof relies on; returns the non-metadata events."""
    assert set(trace) >= {"traceEvents", "displayTimeUnit"}
    json.dumps(trace, allow_nan=False)  # strict JSON: no NaN or infinities
    events = trace["traceEvents"]
    last: dict[tuple[int, int], float] = {}
    open_slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    body = []
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            assert "args" in e
            continue
        body.append(e)
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        track = (e["pid"], e.get("tid", 0))
        assert e["ts"] >= last.get(track, 0.0), f"time goes back on track {track}: {e}"
        last[track] = e["ts"]
        if e["ph"] == "X":
            assert e["dur"] >= 0
            stack = open_slices.setdefault(track, [])
            while stack and stack[-1][1] <= e["ts"] + 1e-3:
                stack.pop()
            if stack:  # a slice on the same track must nest inside the open one
                assert e["ts"] + e["dur"] <= stack[-1][1] + 1e-3, (e, stack[-1])
            stack.append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
        elif e["ph"] in ("i", "I"):
            assert e.get("s", "t") in ("g", "p", "t")
    metadata_names = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "process_name"}
    assert {e["pid"] for e in body} <= {pid for pid, _ in metadata_names}
    return body


def test_tracks_outliers_and_counters(tmp_path: Path) -> None:
    trace = build_timeline(read_recording(small_run(tmp_path), samples=True))
    events = validate(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] in ("process_name", "thread_name")}
    assert {"rank 0 (n1)", "node n1", "steps", "regions", "outside steps", "operator profiling"} <= names
    steps = [e for e in events if e["cat"] in ("step", "outlier step")]
    assert len(steps) == 25
    first = steps[0]
    assert first["name"] == "train step 0" and first["ts"] == pytest.approx(10e6) and first["dur"] == pytest.approx(1e5)
    assert first["args"]["loss"] == 2.0 and first["args"]["samples"] == 32.0
    [outlier] = [e for e in steps if e["args"].get("outlier")]
    assert outlier["name"] == "train step 19" and outlier["cat"] == "outlier step"
    assert [e["name"] for e in events if e["cat"] == "outlier"] == ["outlier: train step 19"]
    regions = [e for e in events if e["cat"] == "region"]
    assert len(regions) == 20 * 3 + 5 * 2 + 2  # in steps + initialization and checkpoint
    lifecycle = {e["name"] for e in events if e["cat"] == "lifecycle"}
    assert lifecycle == {"process start", "init", "first step start", "last step end", "shutdown"}
    [profile] = [e for e in events if e["cat"] == "profile"]
    assert profile["args"]["self time ms"]["cpu aten::conv2d"] == 60.0
    gpu = [e for e in events if e["name"] == "GPU utilization %"]
    assert len(gpu) == 10 and gpu[-1]["args"] == {"gpu0": 50.0, "gpu1": 0.0}
    cpu = [e for e in events if e["name"] == "CPU %"]
    assert cpu[0]["args"] == {"mean": 10.0, "busiest core": 10.0} and cpu[0]["ts"] == pytest.approx(8e6)
    assert len([e for e in events if e["name"] == "process RSS MiB"]) == 10
    assert trace["otherData"]["origin_unix_ns"] == int(T0 * 1e9)


def test_window_by_step_numbers_and_max_steps(tmp_path: Path) -> None:
    recording = read_recording(small_run(tmp_path), samples=True)
    trace = build_timeline(recording, from_step=6, to_step=8)
    events = validate(trace)
    steps = [e for e in events if e["cat"] in ("step", "outlier step")]
    assert [e["args"]["number"] for e in steps] == [6, 7, 8]
    assert not [e for e in events if e["name"] == "CPU %"]  # samples at 10.5 s and 11 s; the window 10.6-10.9 s
    assert trace["otherData"]["steps_in_window"] == 3 and trace["otherData"]["steps_in_run"] == 25
    wider = validate(build_timeline(recording, from_step=1, to_step=13))  # 10.1 s .. 11.4 s
    assert [e["args"]["mean"] for e in wider if e["name"] == "CPU %"] == [60.0, 70.0]
    capped = build_timeline(recording, max_steps=3)
    steps = [e for e in validate(capped) if e["cat"] in ("step", "outlier step")]
    assert [e["args"]["number"] for e in steps] == [0, 1, 2]
    assert "cut after 3 steps" in capped["otherData"]["window"]
    none = build_timeline(recording, from_step=100)
    assert not [e for e in validate(none) if e["cat"] == "step"]


def _uneven_ranks(root: Path) -> Path:
    """Two ranks of one node whose steps run at different times: rank 0's train steps take 0.1 s every 0.2 s
    (an eval step between train steps 4 and 5, another after 7; a checkpoint after step 9), rank 1's take
    0.3 s back to back, so its steps 3..5 start when rank 0 is at step 4 and end after rank 0's step 9."""
    run = root / "uneven"
    fast = [step_line("train", n, T0 + 0.2 * n, 0.1, [("forward", 0.0, 0.04, 0)]) for n in range(12)]
    fast += [step_line("eval", 0, T0 + 0.2 * 4 + 0.12, 0.05), step_line("eval", 1, T0 + 0.2 * 7 + 0.12, 0.05)]
    fast.sort(key=lambda r: r["t"])
    checkpoint = {"k": "a", "name": "checkpoint", "ph": "train", "t": ns(T0 + 1.92), "d": ns(0.05)}
    slow = [step_line("train", n, T0 + 0.3 * n, 0.3, [("forward", 0.0, 0.1, 0), ("backward", 0.1, 0.15, 0)])
            for n in range(8)]
    samples = [{"t": ns(T0 + 0.25 * i), "pid": 100, "pcpu": 0.5, "rss": 1000, "cpu": [0.5], "iow": [0.0],
                "mem": 0.3, "disk": [0, 0], "net": [0, 0], "thr": 0} for i in range(12)]
    write_rank(run, 0, manifest(0, world=2), fast, samples, [checkpoint])
    write_rank(run, 1, manifest(1, world=2), slow)
    return run


def test_a_step_range_selects_exactly_those_steps_of_each_rank(tmp_path: Path) -> None:
    recording = read_recording(_uneven_ranks(tmp_path), samples=True)
    trace = build_timeline(recording, from_step=3, to_step=5)
    events = validate(trace)
    steps = {(e["pid"] - 1, e["args"]["phase"], e["args"]["number"]) for e in events if e["cat"] == "step"}
    # each rank's own steps 3..5 (rank 1's span, 0.9-1.8 s, holds rank 0's steps 5..8: none of them shown), and
    # the eval step inside rank 0's span (0.6-1.1 s); not the one after step 7, nor rank 0's checkpoint at 1.92 s
    assert steps == {(0, "train", 3), (0, "train", 4), (0, "train", 5), (0, "eval", 0),
                     (1, "train", 3), (1, "train", 4), (1, "train", 5)}
    assert trace["otherData"]["steps_in_window"] == 7 and trace["otherData"]["steps_in_run"] == 22
    assert "of each rank" in trace["otherData"]["window"]
    regions = sorted((e["pid"] - 1, e["args"].get("step"), e["name"]) for e in events if e["cat"] == "region")
    assert regions == sorted([(0, n, "forward") for n in (3, 4, 5)]
                             + [(1, n, name) for n in (3, 4, 5) for name in ("forward", "backward")])
    # the node's counters over the span of the steps shown on it: 0.6 s (rank 0's step 3) to 1.8 s (rank 1's 5)
    cpu = [e["ts"] for e in events if e["name"] == "CPU %"]
    assert cpu == pytest.approx([0.75e6, 1.0e6, 1.25e6, 1.5e6, 1.75e6])
    capped = build_timeline(recording, from_step=3, to_step=5, max_steps=2)
    steps = {(e["pid"] - 1, e["args"]["number"]) for e in validate(capped)
             if e["cat"] == "step" and e["args"]["phase"] == "train"}
    assert steps == {(0, 3), (0, 4), (1, 3), (1, 4)}  # the first 2 of each rank's
    assert "cut after 2 steps per rank" in capped["otherData"]["window"]
    out = tmp_path / "trace.json"
    result = subprocess.run([sys.executable, "-m", "otelprof", "timeline", str(tmp_path / "uneven"), "--steps", "6-",
                             "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    shown = {(e["pid"] - 1, e["args"]["phase"], e["args"]["number"]) for e in validate(json.loads(out.read_text()))
             if e["cat"] == "step"}
    assert shown == {(0, "train", n) for n in range(6, 12)} | {(0, "eval", 1), (1, "train", 6), (1, "train", 7)}


def test_overlapping_regions_go_to_separate_lanes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # two collectives in flight at once (depth 1), one outlasting the backward region it started in
    write_rank(run, 0, manifest(), [step_line("train", 0, T0, 1.0, [
        ("backward", 0.1, 0.5, 0), ("collective", 0.2, 0.6, 1), ("collective", 0.3, 0.2, 1),
        ("collective", 0.4, 0.5, 1)])])
    trace = build_timeline(read_recording(run))
    events = validate(trace)
    lanes = {e["tid"] for e in events if e["name"] == "collective"}
    assert len(lanes) == 2  # the second nests in the first; the third overlaps both without nesting


def test_cli_writes_a_trace(tmp_path: Path) -> None:
    run = small_run(tmp_path)
    out = tmp_path / "trace.json"
    result = subprocess.run([sys.executable, "-m", "otelprof", "timeline", str(run), "-o", str(out),
                             "--max-steps", "10"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout and "10 of 25 steps" in result.stdout
    validate(json.loads(out.read_text()))
    bad = subprocess.run([sys.executable, "-m", "otelprof", "timeline", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


# ---------------------------------------------------------------- operator, kernel and device-time tracks
def _tracks(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}


def _on(events: list[dict[str, Any]], tracks: dict[tuple[int, int], str], label: str) -> list[dict[str, Any]]:
    return [e for e in events if e["ph"] == "X" and tracks.get((e["pid"], e.get("tid", 0))) == label]


def _encloses(outer: dict[str, Any], inner: dict[str, Any]) -> bool:
    return outer["ts"] - 1e-3 <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def _profiled_run(tmp_path: Path, steps: int, sleep_s: float = 0.0) -> Path:
    import time

    import torch

    import otelprof
    from otelprof.integrations import torch as otorch
    from tests.test_operators import Block, _finish

    session = otelprof.init(record_dir=str(tmp_path / "rec"), system_metrics=False, profile_every=0,
                            span_first_steps=0, span_budget=0.0)
    otorch.profile_window(1, 2)
    model, x = Block(), torch.randn(8, 32)
    for _ in range(steps):
        with otelprof.step():
            model(x).sum()
            time.sleep(sleep_s)
    run_dir = session.run_dir
    _finish(session)
    return Path(run_dir).parent


def test_a_cpu_window_shows_operator_tracks_nested_under_its_steps(tmp_path: Path) -> None:
    trace = build_timeline(read_recording(_profiled_run(tmp_path, 4)))
    events = validate(trace)
    tracks = _tracks(trace)
    steps = {e["args"]["number"]: e for e in events if e["cat"] == "step"}
    blocks = [e for e in _on(events, tracks, "operators") if e["name"] == "block"]
    assert sorted(b["args"]["step"] for b in blocks) == [1, 2]  # one forward per profiled step, none elsewhere
    ops = _on(events, tracks, "operators")
    for block in blocks:
        assert _encloses(steps[block["args"]["step"]], block)
        inner = [e["name"] for e in ops if e is not block and _encloses(block, e)]
        assert inner[:1] == ["aten::mm"] and "aten::relu" in inner and "aten::clamp_min" in inner
        relu = next(e for e in ops if e["name"] == "aten::relu" and _encloses(block, e))
        assert [e["name"] for e in ops if e is not relu and _encloses(relu, e)] == ["aten::clamp_min"]
    assert not [e for e in events if e["cat"] == "gpu" or e["ph"] in ("s", "f")]  # a CPU run has no kernels


def test_gpu_window_kernels_go_to_stream_tracks_with_launch_flows(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from otelprof.integrations import torch_profiler

    fixture = json.loads((Path(__file__).parent / "fixtures" / "kineto_gpu_trace.json").read_text())

    def gpu_trace(window: Any, keep: str | None) -> dict[str, Any]:  # both fixture steps 1-2 ms into the window
        return {**fixture, "baseTimeNanoseconds": window.started_ns}

    monkeypatch.setattr(torch_profiler, "_kineto_trace", gpu_trace)
    trace = build_timeline(read_recording(_profiled_run(tmp_path, 4, sleep_s=0.005)))
    events = validate(trace)
    tracks = _tracks(trace)
    assert {"operators", "GPU 0 stream 7", "GPU 0 stream 13"} <= set(tracks.values())
    kernels = _on(events, tracks, "GPU 0 stream 7")
    copies = _on(events, tracks, "GPU 0 stream 13")
    assert [k["name"][:12] for k in kernels] == ["ampere_sgemm", "void at::nat"] * 2
    assert [k["dur"] for k in kernels] == pytest.approx([90, 12, 90, 12])
    assert [c["args"]["bytes"] for c in copies] == [262144, 262144] and copies[0]["args"]["kind"] == "memcpy"
    assert kernels[0]["args"]["grid"] == [16, 4, 1]
    step = next(e for e in events if e["cat"] == "step" and e["args"]["number"] == 1)
    ops = _on(events, tracks, "operators")
    assert len(ops) == 10 and all(_encloses(step, op) for op in ops)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == 6 and set(starts) == set(ends)
    launchers = {"ampere_sgemm": "aten::addmm", "void at::nat": "aten::relu", "Memcpy DtoH ": "aten::copy_"}
    for flow, end in ends.items():
        assert end["bp"] == "e"
        [device] = [k for k in kernels + copies if k["tid"] == end["tid"] and k["ts"] == end["ts"]]
        start = starts[flow]
        assert len([o for o in ops if o["tid"] == start["tid"] and o["name"] == launchers[device["name"][:12]]
                    and o["ts"] <= start["ts"] <= o["ts"] + o["dur"]]) == 1  # the arrow leaves its launcher
        assert start["ts"] <= end["ts"]  # the launch comes before the kernel


def test_device_times_of_every_step_on_their_own_track(tmp_path: Path) -> None:
    run = tmp_path / "run"
    regions = [("forward", 0.01, 0.02, 0), ("backward", 0.03, 0.04, 0), ("optimizer", 0.07, 0.01, 0)]
    steps = [step_line("train", n, T0 + 0.1 * n, 0.1, regions) for n in range(3)]
    device = [{"k": "d", "ph": "train", "n": n, "a": [["forward", 30_000_000], ["backward", 20_000_000],
                                                      ["optimizer", 5_000_000]]} for n in range(3)]
    write_rank(run, 0, manifest(), steps + device)
    trace = build_timeline(read_recording(run))
    events = validate(trace)
    device_track = _on(events, _tracks(trace), "device time (CUDA events)")
    assert len(device_track) == 9
    first = device_track[:3]
    assert [e["name"] for e in first] == ["forward (device)", "backward (device)", "optimizer (device)"]
    assert [e["args"]["device_ms"] for e in first] == [30.0, 20.0, 5.0]
    assert [e["args"]["host_ms"] for e in first] == [20.0, 40.0, 10.0]
    # forward's device work (30 ms) outlasts its host region: backward's starts where forward's ends
    assert first[0]["ts"] == pytest.approx(1e4) and first[1]["ts"] == pytest.approx(4e4)
    assert first[2]["ts"] == pytest.approx(7e4)  # the optimizer's host start is later than backward's device end
