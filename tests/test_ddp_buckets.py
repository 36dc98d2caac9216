"""The distributed view with several gradient buckets in flight at once: collective time is the union of a
step's all-reduces, exposed communication what of it the backward pass did not overlap, compute never
negative, and a +6 ms/step straggler is found — on a real 3-rank gloo DDP job (torchrun, CPU) whose model
has six buckets, checked against what the training loop measured itself; the interval arithmetic on
hand-made steps."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof import semconv as sc
from otelprof.analysis.check_recording import rank_data
from otelprof.analysis.checks import evaluate_ranks
from otelprof.analysis.loadbalance import load_balance
from otelprof.analysis.run import RunView
from otelprof.mixin.config import MixinConfig
from otelprof.recording.ranks import Recording
from otelprof.recording.reader import read_recording
from otelprof.report.timeline import ARG_COLLECTIVE, ARG_EXPOSED, build_timeline
from otelprof.shared import collectives

RANKS = 3
STRAGGLER = 1
DELAY = 0.006
"""Seconds the straggler rank sleeps per step, between its forward and backward passes."""
LAYERS = 6
Job = tuple[Recording, dict[int, dict[str, Any]]]

SCRIPT = """
import json, os, sys, time, torch, torch.distributed as dist
import otelprof
from otelprof.integrations import torch as otorch

straggler, delay, layers, out_dir = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
otelprof.init(job_name="buckets", system_metrics=False, metric_export_interval=1.0, profile_every=0)
torch.manual_seed(0)
width = 128
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]),
    bucket_cap_mb=width * (width + 1) * 4 / 2**20)  # one layer's weight and bias per bucket
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
otorch.instrument(model=model, optimizer=optimizer)
x, y = torch.randn(64, width), torch.randn(64, width)
walls, backwards, delays = [], [], []
for i in range(100):
    t0 = time.perf_counter_ns()
    out = model(x)
    if rank == straggler:
        d0 = time.perf_counter_ns()
        time.sleep(delay)
        delays.append(time.perf_counter_ns() - d0)
    loss = ((out - y) ** 2).mean()
    optimizer.zero_grad()
    b0 = time.perf_counter_ns()
    loss.backward()
    backwards.append(time.perf_counter_ns() - b0)
    optimizer.step()
    walls.append(time.perf_counter_ns() - t0)
buckets = len(model.reducer._get_zeros_like_grad_buckets())
otelprof.shutdown()
with open(os.path.join(out_dir, f"loop-{rank}.json"), "w") as f:
    json.dump({"walls": walls, "backwards": backwards, "delays": delays, "buckets": buckets}, f)
dist.destroy_process_group()
"""


# ---------------------------------------------------------------------- the interval arithmetic

def test_concurrent_buckets_count_once() -> None:
    """Three all-reduces in flight at once inside a backward pass that launched the last at 40: their union
    (10..90) once; exposed only after the last launch (40..90)."""
    union, exposed = collectives.communication(0, 100, [(10, 60), (20, 70), (40, 90)], [(5, 95)])
    assert (union, exposed) == (80, 50)


def test_collectives_are_clipped_to_the_step_and_without_a_backward_region_all_exposed() -> None:
    union, exposed = collectives.communication(100, 200, [(90, 150), (140, 260)], [])
    assert (union, exposed) == (100, 100)


def test_a_step_without_collectives_has_no_communication() -> None:
    assert collectives.communication(0, 100, [], [(0, 50)]) == (0, 0)


def test_exposed_time_is_what_no_backward_pass_computed() -> None:
    """A gap between two buckets after the last launch is not communication at all; a bucket that outlives
    its step's backward pass is exposed up to the step's end."""
    union, exposed = collectives.communication(0, 100, [(10, 30), (50, 60), (55, 120)], [(0, 80)])
    assert union == 20 + (100 - 50)
    assert exposed == 100 - 55  # from the last launch (55) on: its own flight and the earlier bucket's tail


def test_columns_and_step_records_agree() -> None:
    """The recorder's per-record function and the analyses' per-column one give the same numbers."""
    record = [(sc.REGION_FORWARD, 1000, 1010, 0, None), (sc.REGION_BACKWARD, 1010, 1090, 0, None),
              (sc.REGION_COLLECTIVE, 1020, 1070, 1, None), (sc.REGION_COLLECTIVE, 1030, 1088, 1, None)]
    live = collectives.step_communication(1000, 1100, record)
    names = [sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_COLLECTIVE]
    codes = [names.index(a[0]) for a in record]
    union, exposed = collectives.columns_communication(names, [0, len(record)], codes, [a[1] - 1000 for a in record],
                                                       [a[2] - a[1] for a in record], [100])
    assert live == (union[0], exposed[0]) == (68, 58)


region = st.tuples(st.sampled_from([sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_COLLECTIVE]),
                   st.integers(-30, 130), st.integers(0, 80))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(steps=st.lists(st.tuples(st.integers(1, 120), st.lists(region, max_size=4)), min_size=1, max_size=6))
def test_the_columns_one_bucket_shortcut_equals_the_intervals(steps: list[tuple[int, list[Any]]]) -> None:
    """One collective (and at most one backward) per step takes a shortcut: the same numbers as the intervals'
    union and cover, for regions clipped by the step, empty, outside it, launched inside or outside backward."""
    names = [sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_COLLECTIVE]
    index, codes, offsets, durations = [0], [], [], []
    for _, regions in steps:
        for name, offset, duration in regions:
            codes.append(names.index(name))
            offsets.append(offset)
            durations.append(duration)
        index.append(len(codes))
    union, exposed = collectives.columns_communication(names, index, codes, offsets, durations,
                                                       [d for d, _ in steps])
    for i, (duration, regions) in enumerate(steps):
        record = [(name, offset, offset + length, 0, None) for name, offset, length in regions]
        assert (union[i], exposed[i]) == collectives.step_communication(0, duration, record), (duration, regions)


# ---------------------------------------------------------------------- a real multi-bucket DDP job

@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Recording, dict[int, dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("buckets")
    script = tmp / "train_buckets.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OTELPROF_RECORD_DIR": str(tmp / "runs"), "OTELPROF_RUN_ID": "buckets",
           "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}
    torchrun = Path(sys.executable).parent / "torchrun"
    result = subprocess.run([str(torchrun), "--standalone", f"--nproc_per_node={RANKS}", str(script),
                             str(STRAGGLER), str(DELAY), str(LAYERS), str(tmp)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    loops = {rank: json.loads((tmp / f"loop-{rank}.json").read_text()) for rank in range(RANKS)}
    return read_recording(tmp / "runs" / "buckets"), loops


def test_every_step_holds_its_buckets_and_they_overlap(job: Job) -> None:
    recording, loops = job
    ranks = recording.ranks
    assert [r.rank for r in ranks] == list(range(RANKS))
    for rank in ranks:
        buckets = loops[rank.rank]["buckets"]
        assert buckets >= 4
        steps = rank.steps
        assert len(steps) == len(loops[rank.rank]["walls"]) == 100
        counts = [sum(a.name == sc.REGION_COLLECTIVE for a in s.annotations) for s in steps[1:]]
        assert counts == [buckets] * len(counts)  # one collective region per bucket (after DDP's first rebuild)
        union, _ = collectives.of_columns(rank.step_columns)
        summed = rank.step_columns.annotation_sums(sc.REGION_COLLECTIVE)
        overlapping = sum(s > u for s, u in zip(summed[1:], union[1:]))
        assert overlapping > len(counts) / 2  # buckets in flight at once: what summing counted twice


def test_collective_union_within_the_step_exposed_within_it_compute_not_negative(
        job: Job) -> None:
    recording, loops = job
    ranks = recording.ranks
    for rank in ranks:
        c = rank.step_columns
        union, exposed = collectives.of_columns(c)
        walls, backwards = loops[rank.rank]["walls"], loops[rank.rank]["backwards"]
        for i, step in enumerate(rank.steps):
            assert step.duration_ns <= walls[i]  # the automatic step lies inside the loop's iteration
            assert 0 < union[i] <= step.duration_ns
            assert 0 <= exposed[i] <= union[i]
            assert step.duration_ns - exposed[i] >= 0
            backward = next(a for a in step.annotations if a.name == sc.REGION_BACKWARD)
            assert backward.duration_ns <= backwards[i]
            # DDP's backward() returns once every bucket is reduced: the collectives end inside it
            assert max(a.start_ns + a.duration_ns for a in step.annotations if a.name == sc.REGION_COLLECTIVE) \
                <= backward.start_ns + backward.duration_ns


def test_the_straggler_is_found_in_training(job: Job) -> None:
    recording, loops = job
    view = RunView(recording)
    balance = load_balance(view)
    rows = {x.rank: x for x in balance.ranks if x.phase == "train"}
    assert [r for r, x in sorted(rows.items()) if x.straggler] == [STRAGGLER], rows
    for x in rows.values():
        assert x.mean_compute >= 0 and x.mean_exposed <= x.mean_collective
    # the straggler's extra compute is the delay its loop measured (less what its waiting peers still compute)
    peers = statistics.median(x.mean_compute for r, x in rows.items() if r != STRAGGLER)
    measured = statistics.fmean(loops[STRAGGLER]["delays"]) / 1e9
    assert rows[STRAGGLER].mean_compute - peers > measured / 2, rows
    # ... and it waits least: the others wait for it
    assert rows[STRAGGLER].mean_exposed < min(x.mean_exposed for r, x in rows.items() if r != STRAGGLER), rows

    # the offline twin of the alert, judged once at the run's end over a window holding every step
    config = MixinConfig(straggler_window="1h", straggler_for="0s")
    data = [rank_data(r, config) for r in recording.ranks]
    end = min(d.end for d in data)  # every rank still up: its shutdown came after every last step
    results = {r.alert: r for r in evaluate_ranks(data, config, start=end, end=end)}
    straggler = results["OtelprofRankStraggler"]
    assert straggler.triggered and straggler.subjects == (f"rank {STRAGGLER} train",), (straggler, rows)


def test_live_metrics_hold_the_same_union_and_exposed_time(job: Job) -> None:
    """The recorder's histograms (what the rules and the ranks dashboard read) sum the same per-step values
    the analyses compute from the recording."""
    for rank in job[0].ranks:
        last = list(rank.metric_snapshots())[-1]
        metrics = {m.name: m for sm in last.resource_metrics[0].scope_metrics for m in sm.metrics}
        union, exposed = collectives.of_columns(rank.step_columns)
        for spec, values in ((sc.COLLECTIVE_DURATION, union), (sc.COLLECTIVE_EXPOSED, exposed)):
            point = metrics[spec.name].histogram.data_points[0]
            assert point.count == len(rank.steps)
            assert point.sum == pytest.approx(sum(values) / 1e9, rel=1e-9)


def test_the_timeline_gives_each_step_its_collective_and_exposed_time(job: Job) -> None:
    recording, _ = job
    trace = build_timeline(recording, counters=False)
    steps = [e for e in trace["traceEvents"] if e.get("cat") in ("step", "outlier step")]
    assert len(steps) == RANKS * 100
    for rank in recording.ranks:
        union, exposed = collectives.of_columns(rank.step_columns)
        mine = [e["args"] for e in steps if e["pid"] == rank.rank + 1]
        assert [a[ARG_COLLECTIVE] for a in mine] == [u / 1e6 for u in union]
        assert [a[ARG_EXPOSED] for a in mine] == [x / 1e6 for x in exposed]
        assert all(a[ARG_EXPOSED] <= a[ARG_COLLECTIVE] for a in mine)
