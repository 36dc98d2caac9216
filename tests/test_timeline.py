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
from otelprof.timeline import build_timeline
from tests.test_report_fixtures import T0, manifest, small_run, step_line, write_rank

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
