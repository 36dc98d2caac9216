"""The report's per-rank figures: computed in the parsing processes (rank_figures.prepare_figures), kept with each
rank's columns, and the report built from them equal to the report that computes them itself; the shortcuts of
the figures' loops (no NaN, no reset, every value in range) equal to the plain loops written here."""

from __future__ import annotations

import math
import random
from array import array
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otelprof import semconv as sc
from otelprof.analysis import bottlenecks, dataloader, framework, gpu, loadbalance, progress, steps, system
from otelprof.analysis.check_recording import prepare_sections
from otelprof.analysis.rank_figures import prepare_figures
from otelprof.analysis.report import build_report, report_dict
from otelprof.analysis.run import across, mean_and_min, outlier_settings, per_rank
from otelprof.analysis.stats import Chunks, Histogram, Series, finite, sorted_finite
from otelprof.mixin.config import MixinConfig
from otelprof.recording.columns import SampleColumns, StepColumns
from otelprof.recording.reader import read_recording
from otelprof.shared import nesting
from tests.test_report_fixtures import T0, manifest, ns, step_line, write_rank

RANKS = 20
PER_NODE = 4
GPUS = 4
STEPS = 60


def _fleet(root: Path) -> Path:
    """RANKS ranks on nodes of PER_NODE: train steps with an eval pass, slow steps, a region nested in forward,
    all-reduces at depth 1; node samples from each node's local rank 0 with a GPU missing now and then, a
    network counter that resets and process-only samples in between."""
    rng = random.Random(7)
    run = root / "fleet"
    for rank in range(RANKS):
        node, local = divmod(rank, PER_NODE)
        t = T0 + 5
        records = []
        for n in range(STEPS):
            phase = "eval" if n % 20 >= 17 else "train"
            d = 0.1 + rng.random() * 0.02 + (0.5 if n in (23, 41) else 0.0)
            regions = [("dataloader", 0.0, 0.01 + rng.random() * 0.01, 0), ("forward", 0.02, d / 3, 0),
                       ("collective", 0.03, 0.01, 1), ("backward", 0.02 + d / 3, d / 3, 0)]
            if n % 7 == 0:
                regions.append(("attention", 0.025, d / 6, 1))
            records.append(step_line(phase, n, t, d, regions, {"loss": 2.0 - n / 100, "samples": 16.0,
                                                                "tokens": 2048.0 + n}))
            t += d + 0.005
        samples: list[dict[str, Any]] = []
        for i in range(120):
            sample: dict[str, Any] = {"t": ns(T0 + 5 + 0.05 * i), "pid": 100 + rank, "pcpu": rng.random(),
                                      "rss": 1000 + 10 * i}
            if local == 0 and i % 9 != 4:
                sample.update({"cpu": [rng.random() for _ in range(4)], "iow": [rng.random() / 5 for _ in range(4)],
                               "mem": 0.3 + rng.random() / 10, "disk": [100 * i, 50 * i],
                               "net": [1000 * (i % 50), 10 * i], "thr": 0,
                               "gpu": {str(g): {"u": rng.random(), "mu": 1e9 * (1 + g + i / 100), "mt": 8e9,
                                                "p": 300.0 + rng.random(), "t": 60.0 + g}
                                       for g in range(GPUS) if not (g == 1 and i % 13 == 0)}})
            samples.append(sample)
        man = manifest(rank, node=f"node-{node}", world=RANKS, lifecycle={
            "process_start": T0, "first_step_start": T0 + 5, "last_step_end": t, "shutdown": t + 1})
        man["local_rank"] = local
        write_rank(run, rank, man, records, samples)
    return run


def _report(run: Path, prepare: Any, config: MixinConfig | None = None) -> dict[str, Any]:
    recording = read_recording(run, samples=True, regions=True, workers=2, prepare=prepare)
    data = report_dict(build_report(recording, config, checks=False))
    data.pop("generated")
    return data


def test_figures_from_the_parsing_processes_make_the_same_report(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    run = _fleet(tmp_path)
    plain = _report(run, None)
    recording = read_recording(run, samples=True, regions=True, workers=2, prepare=prepare_sections)
    assert all("_figures" in r.step_columns.__dict__ for r in recording.ranks)  # came back from the workers
    # the report computes none of them again: each would fail here, in the main process
    for module, name in ((system, "_node_figures"), (gpu, "_gpu_figures"), (framework, "_rank_breakdown"),
                         (framework, "_covered"), (steps, "_by_phase"), (dataloader, "wait_histogram"),
                         (loadbalance, "_compute"), (bottlenecks, "gpu_min"), (system, "_usage")):
        monkeypatch.setattr(module, name, _fails)
    data = report_dict(build_report(recording, checks=False))
    data.pop("generated")
    monkeypatch.undo()
    assert data == plain
    assert len(data["steps"]["rows"]) == RANKS * 2 and data["steps"]["summaries"]  # both phases, summarised
    assert any(r["self_time"] < r["total"] for r in data["framework"]["regions"])  # forward holds attention


def _fails(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("computed again in the report")


def test_other_settings_are_computed_afresh(tmp_path: Path) -> None:
    """A config given to the report (thresholds the figures depend on) is not answered from the figures the
    parsing processes computed with the defaults."""
    run = _fleet(tmp_path)
    config = MixinConfig(input_bound_threshold=0.05, cpu_threshold=0.5, io_threshold=0.1, gpu_threshold=0.6)
    prepared = _report(run, prepare_sections, config)
    assert prepared == _report(run, None, config)
    assert prepared != _report(run, prepare_sections)


def test_figures_follow_their_columns() -> None:
    """Kept per key and recomputed when the columns grew (a recording read again as it is written)."""
    columns = StepColumns()
    columns.append("train", 0, 0, 10)
    calls: list[int] = []

    def count() -> int:
        calls.append(len(columns))
        return len(columns)

    assert per_rank(columns, "k", count) == 1 and per_rank(columns, "k", count) == 1
    columns.append("train", 1, 20, 10)
    assert per_rank(columns, "k", count) == 2 and per_rank(columns, "other", count) == 2
    assert calls == [1, 2, 2]


def test_prepared_figures_are_those_the_sections_ask_for(tmp_path: Path) -> None:
    """prepare_figures fills the cache under the keys the sections look up with the default config."""
    run = _fleet(tmp_path)
    recording = read_recording(run, samples=True, regions=True)
    rank = recording.ranks[0]
    prepare_figures(rank)
    kept = set(rank.step_columns.__dict__["_figures"]) | set(rank.sample_columns().__dict__["_figures"])
    config = MixinConfig()
    assert {"phase totals", "regions", "breakdown", "load ranks", "system process", "system node", "gpu",
            "load gpus", ("loader", sc.REGION_DATALOADER, config.input_bound_threshold),
            ("coincidences", False, config.cpu_threshold, config.gpu_threshold),
            ("coincidences", True, config.io_threshold, config.gpu_threshold),
            ("throughput", progress.MAIN_PHASE, sc.SCALAR_SAMPLES),
            ("steps", "train", *outlier_settings(rank.manifest["config"]), 50)} <= kept


# ---------------------------------------------------------------- the loops' shortcuts against plain loops
values = st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0])),
                  max_size=60)


@settings(max_examples=200, deadline=None)
@given(values)
def test_finite_equals_a_filter(data: list[float]) -> None:
    expected = [v for v in data if math.isfinite(v)]
    assert finite(data) == expected and finite(iter(data)) == expected and finite(tuple(data)) == expected
    assert _same(sorted_finite(array("d", data)), sorted(expected))
    assert finite(data) is not data


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5).flatmap(lambda k: st.lists(st.lists(
    st.one_of(st.floats(0, 1), st.just(math.nan)), min_size=k, max_size=k), max_size=30)), st.booleans())
def test_across_equals_a_loop_over_the_samples(rows: list[list[float]], complete: bool) -> None:
    if complete:
        rows = [[0.5 if v != v else v for v in row] for row in rows]
    columns = [array("d", column) for column in zip(*rows)] if rows else []
    for how, pick in (("mean", None), ("min", min), ("max", max)):
        expected = []
        for row in rows:
            present = [v for v in row if v == v]
            if not present:
                expected.append(math.nan)
            elif pick is None:
                expected.append(sum(row) / len(row) if len(present) == len(row) else sum(present) / len(present))
            else:
                expected.append(pick(present))
        assert _same(across(columns, how), expected)
    if columns:
        mean, least = mean_and_min(columns)  # both in one pass where no column lacks a sample
        assert _same(mean, across(columns, "mean")) and _same(least, across(columns, "min"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.one_of(st.floats(0, 1e6), st.just(math.nan))), max_size=40))
def test_rates_equal_a_loop_over_the_samples(steps_and_counts: list[tuple[int, float]]) -> None:
    times, t = [], 10**18
    for step, _ in steps_and_counts:
        t += step * 500_000_000  # a step of 0: two samples at one time
        times.append(t)
    a = array("d", [c for _, c in steps_and_counts])
    b = array("d", [c / 2 for _, c in steps_and_counts])
    out_t, out_v = [], []
    previous: tuple[int, float] | None = None
    for i, now in enumerate(times):  # the loop the rates were computed with
        total = sum(c[i] for c in (a, b))
        if total != total:
            continue
        if previous is not None and now > previous[0] and total >= previous[1]:
            out_t.append(now / 1e9)
            out_v.append((total - previous[1]) / ((now - previous[0]) / 1e9))
        previous = (now, total)
    found = system._rates(array("q", times), a, b)
    assert _same(found[0], out_t) and _same(found[1], out_v)
    assert _same(system._rate_values(array("q", times), system._intervals(array("q", times)), a, b), out_v)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1e6), st.floats(0, 1e6)), min_size=1, max_size=40),
       st.booleans())
def test_node_rates_at_once_equal_the_loop(rows: list[tuple[int, float, float]], forward: bool) -> None:
    """Counters that never fall, time that always runs forward (the usual node): the rates at once."""
    times = list(accumulate((step + forward for step, _, _ in rows), initial=10**18))[1:]
    a = array("d", accumulate(x for _, x, _ in rows))
    b = array("d", accumulate(y for _, _, y in rows))
    seconds = system._intervals(array("q", times))
    assert (seconds is None) == (len(times) < 2 or min(b - a for a, b in pairwise(times)) <= 0)
    assert _same(system._rate_values(array("q", times), seconds, a, b), system._rates(array("q", times), a, b)[1])
    assert _same(system._rate_values(array("q", times), seconds, a), system._rates(array("q", times), a)[1])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3).flatmap(lambda k: st.lists(st.tuples(
    st.one_of(st.floats(0, 1), st.just(math.nan)), st.lists(st.one_of(st.floats(0, 1), st.just(math.nan)),
                                                            min_size=k, max_size=k)), max_size=30)),
       st.sampled_from([0.1, 0.5]), st.booleans())
def test_coincidences_equal_a_loop_over_the_samples(rows: list[tuple[float, list[float]]], gpu_threshold: float,
                                                    io: bool) -> None:
    c = SampleColumns()
    c.t_ns = array("q", range(10**18, 10**18 + len(rows)))
    busy = array("d", [b for b, _ in rows])
    c.cpu_max, c.iow_max = (array("d"), busy) if io else (busy, array("d"))
    k = len(rows[0][1]) if rows else 0
    c.gpus = {str(g): {"u": array("d", [u[g] for _, u in rows])} for g in range(k)}
    least = [min((v for v in u if v == v), default=math.nan) for _, u in rows] if k else []
    datapoints = low_gpu = busy_count = 0
    hits = []
    for i, (value, _) in enumerate(rows):  # the loop the counts were computed with
        if value != value:
            continue
        datapoints += 1
        low = bool(least) and least[i] < gpu_threshold
        low_gpu += low
        busy_count += value > 0.8
        if low and value > 0.8:
            hits.append(c.t_ns[i])
    found = bottlenecks.coincidences(c, io, 0.8, gpu_threshold)
    assert found[:3] == (datapoints, low_gpu, busy_count) and list(found[3]) == hits


@settings(max_examples=200, deadline=None)
@given(values, st.integers(1, 12))
def test_chunks_make_the_series_of_a_loop(data: list[float], buckets: int) -> None:
    times = [T0 + 0.5 * i for i in range(len(data))]
    times_ns = [ns(t) for t in times]
    n = len(data)
    at, mean_out, max_out = [], [], []
    if n:
        size = max(1, -(-n // buckets))
        for i in range(0, n, size):
            chunk = [v for v in data[i:i + size] if math.isfinite(v)]
            if chunk:
                at.append(min(i + size // 2, n - 1))
                mean_out.append(sum(chunk) / len(chunk))
                max_out.append(max(chunk))
    series = Series.of(times, data, T0, buckets)
    assert _same(series.t, [times[i] - T0 for i in at]) and _same(series.mean, mean_out)
    assert _same(series.max, max_out)
    assert Chunks.of(data, buckets).series_ns(times_ns, T0) == Series(
        tuple(times_ns[i] / 1e9 - T0 for i in at), series.mean, series.max)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-0.5, 1.5), min_size=1, max_size=60), st.booleans(), st.sampled_from([0.0, -0.0, -0.25]))
def test_histogram_counts_equal_a_loop(data: list[float], in_range: bool, low: float) -> None:
    if in_range:
        data = [min(max(v, low), 1.0) for v in data]
    counts = [0] * 10
    width = (1.0 - low) / 10
    for v in data:
        if low <= v <= 1.0:
            counts[min(max(int((v - low) * ((1 + 1e-12) / width)), 0), 9)] += 1
    assert Histogram.of(data, 10, low, 1.0).counts == tuple(counts)


@settings(max_examples=300, deadline=None)
@given(values, st.integers(1, 12), st.sampled_from([None, 0.0, -0.0, -0.25, 3.0]),
       st.sampled_from([None, 1.0, 0.0, 1e5]))
def test_histogram_of_sorted_values_equals_the_counted_one(data: list[float], bins: int, low: float | None,
                                                           high: float | None) -> None:
    """Bisected bins (values in order) against the bins counted value by value (subnormal ranges included)."""
    expected = Histogram.of(data, bins, low, high)
    assert Histogram.of_sorted(sorted_finite(data), bins, low, high) == expected


@pytest.mark.parametrize("data", [[2.2250738585e-313], [0.0, 5e-324], [1e-310, 2e-310, 3e-310]])
@pytest.mark.parametrize("low", [None, 0.0])
def test_histogram_of_a_subnormal_range(data: list[float], low: float | None) -> None:
    """Values a few subnormal steps apart (a hostile or degenerate recording) are counted, not an error."""
    for histogram in (Histogram.of(data, 10, low), Histogram.of_sorted(sorted(data), 10, low)):
        assert sum(histogram.counts) == len(data) and len(histogram.edges) == 11


def test_covered_time_equals_a_scan_of_every_step() -> None:
    """Only the steps with a nested region are looked at: the same totals as scanning each step."""
    rng = random.Random(3)
    columns = StepColumns()
    for n in range(200):
        annotations = [("forward", 0, 100, 0), ("collective", 10, 20, 1), ("backward", 100, 100, 0)]
        if n % 11 == 0:
            annotations.append(("attention", 20, 30 + rng.randrange(40), 1))
        if n % 17 == 0:
            annotations.append(("bucket", 110, 10, 1))
        if n % 5 == 0:
            annotations = []  # a step without regions
        columns.append("train", n, n * 1000, 300, annotations)
    names, codes, offsets, durations, depths, index = (columns.ann_names, columns.ann_name, columns.ann_offset,
                                                       columns.ann_duration, columns.ann_depth, columns.ann_index)
    apart = names.index(sc.REGION_COLLECTIVE)
    expected: dict[str, float] = {}
    for i in range(len(columns)):  # every step, as the covered time was first computed
        lo, hi = index[i], index[i + 1]
        if not any(depths[j] and codes[j] != apart for j in range(lo, hi)):
            continue
        counts, self_ns = nesting.step_regions(codes[lo:hi], offsets[lo:hi], durations[lo:hi], depths[lo:hi], apart)
        for j, (counted, own) in enumerate(zip(counts, self_ns)):
            if counted and own != durations[lo + j]:
                name = names[codes[lo + j]]
                expected[name] = expected.get(name, 0.0) + (durations[lo + j] - own) / 1e9
    assert framework._covered(columns) == expected and set(expected) == {"forward", "backward"}


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN equal to NaN, and 0.0 told from -0.0."""
    a, b = list(a), list(b)
    return len(a) == len(b) and all((x != x and y != y) or (x == y and math.copysign(1, x) == math.copysign(1, y))
                                    for x, y in zip(a, b))


def test_same_tells_zeros_apart() -> None:
    assert _same([0.0, math.nan], [0.0, math.nan]) and not _same([0.0], [-0.0]) and not _same([1.0], [1.0, 2.0])


def test_process_rows_from_samples_without_node_values() -> None:
    columns = SampleColumns(t_ns=array("q", [1, 2, 3]), pcpu=array("d", [0.5, math.nan, 0.25]),
                            rss=array("d", [3.0, 2.0, 1.0]))
    cpu, rss = system.process_figures(columns)
    assert cpu == (0.5, 0.4975, 0.4875, 0.375, 0.25, 2) and rss == (3.0, 2.98, 2.9, 2.0, 1.0, 3)
