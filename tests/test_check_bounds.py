"""The offline checks' early answers (:mod:`otelprof.analysis.window_bounds`) give what the windows' own sums and
counts give: each bound holds on series written here (random, adversarial, with NaN and infinities), and every
check finds the same subjects with the same values, and marks the same checks judged, with the early answers as
with none (every window summed and counted in full)."""

from __future__ import annotations

import bisect
import math
import random
from array import array
from collections.abc import Iterator

import pytest

from otelprof.analysis import check_context, checks, system_checks, window_bounds
from otelprof.analysis.check_context import CheckContext
from otelprof.analysis.check_tables import BUCKETS, RankData, Sample, Series, StepRecord
from otelprof.analysis.histogram import cumulative_counts
from otelprof.analysis.step_checks import peers_median, peers_typical, stragglers
from otelprof.mixin.config import MixinConfig
from tests.test_checks_all_times import _ranks


def _values(rnd: random.Random, n: int, kind: str) -> list[float]:
    """Ratios of a busy GPU with dips (``busy``), any ratios with values on the bucket bounds (``ratio``), large
    numbers of both signs that cancel (``cancel``), or ratios with a NaN or an infinity somewhere (``hostile``)."""
    if kind == "busy":
        out = [rnd.uniform(0.75, 1.0) for _ in range(n)]
        for start in rnd.sample(range(n - 30), 3):
            out[start:start + rnd.randrange(1, 30)] = [rnd.choice([0.0, 0.05, 0.1, 0.65, 0.7, 0.3])] * 30
        return out[:n]
    if kind == "ratio":
        return [rnd.choice(BUCKETS) if rnd.random() < 0.3 else rnd.random() for _ in range(n)]
    if kind == "cancel":
        return [rnd.choice([1e16, -1e16, 3.0, 1e-3, -7.5e15]) + rnd.random() for _ in range(n)]
    out = [rnd.random() for _ in range(n)]
    out[rnd.randrange(n)] = rnd.choice([math.nan, math.inf, -math.inf])
    if rnd.random() < 0.5:
        out[0] = math.nan
    return out


def _windows(rnd: random.Random, n: int) -> tuple[list[int], list[int]]:
    lo = sorted(rnd.randrange(n + 1) for _ in range(200))
    hi = [min(n, i + rnd.choice([0, 1, 2, 40, 300, n])) for i in lo]
    return lo, hi


def _plain_mean(series: Series, i: int, j: int) -> float:
    sums = series.exact_sums()
    return (sums[j] - sums[i]) / (j - i) if sums is not None else sum(series.values.tolist()[i:j]) / (j - i)


KINDS = ["busy", "ratio", "cancel", "hostile"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_cut_counts_and_quantile_ranges_hold_each_window(kind: str, seed: int) -> None:
    """The counts at the cuts are the window's own (counted afresh, NaN in the first bucket), and its
    ``histogram_quantile`` at each q lies in the range they give."""
    rnd = random.Random(seed)
    series = Series(range(2000), _values(rnd, 2000, kind))
    cuts = window_bounds.threshold_cuts(below=(0.7, 0.1, rnd.choice([0.33, 0.0, 2.0])), above=(0.7, 0.05))
    lo, hi = _windows(rnd, len(series))
    found = window_bounds.cut_counts(series, cuts, lo, hi)
    every = series.buckets()
    for k, (i, j) in enumerate(zip(lo, hi)):
        expected = tuple(sum(b <= c for b in every[i:j]) for c in cuts)
        assert (found[k] if found is not None else (0,) * len(cuts)) == expected
        assert expected == tuple(int(cumulative_counts(series.values[i:j], BUCKETS)[c]) for c in cuts)
        if j > i:
            for q in (0.05, 0.5, 0.95, 1.0):
                lower, upper = window_bounds.quantile_range(q, j - i, expected, cuts)
                assert lower <= series.quantile(q, i, j) <= upper
    assert (found is None) == (min(every) > cuts[-1])


def test_cut_counts_of_a_series_with_no_low_value_is_none() -> None:
    series = Series(range(500), [0.9, 0.99, 1.0, 1.5] * 125)
    assert window_bounds.cut_counts(series, (0, 1, 13), [0, 10], [100, 500]) is None
    nan_late = Series(range(500), [0.9] * 499 + [math.nan])  # NaN is in the first bucket: it counts
    assert window_bounds.cut_counts(nan_late, (0, 13), [0, 400], [100, 500]) == [(0, 0), (1, 1)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_extent_holds_every_window_mean_and_approximate_means_their_error(kind: str, seed: int) -> None:
    rnd = random.Random(seed)
    values = _values(rnd, 3000, kind)
    for series in (Series(range(3000), values), Series(range(3000), [float(int(v * 1e6)) if math.isfinite(v) else v
                                                                    for v in values])):
        low, high = window_bounds.extent(series)
        lo, hi = _windows(rnd, len(series))
        approximate = window_bounds.approximate_means(series, lo, hi)
        assert (approximate is None) == (not all(map(math.isfinite, series.values)))
        for k, (i, j) in enumerate(zip(lo, hi)):
            if j <= i:
                assert approximate is None or math.isnan(approximate[0][k])
                continue
            mean = _plain_mean(series, i, j)
            assert math.isnan(mean) or math.isnan(low) or low <= mean <= high  # a NaN mean fires nothing
            if approximate is not None:
                assert abs(approximate[0][k] - mean) <= approximate[1][k]


def test_stragglers_equal_each_rank_judged_against_its_peers() -> None:
    """Only ranks past the peer median times the ratio are divided: the same ranks and shares as dividing each,
    including values exactly at the ratio, a peer median of 0 and fewer than 4 ranks."""
    rnd = random.Random(11)
    for _ in range(3000):
        n = rnd.choice([2, 3, 4, 5, 8, 33])
        base = rnd.choice([1.0, 0.1, 0.0, 3.7])
        found = {rank: rnd.choice([base, base * 1.2, base * 1.2000000000000002, base * 1.19999999, rnd.random(),
                                   math.inf, -1.0]) for rank in rnd.sample(range(100), n)}
        ratio = rnd.choice([1.2, 0.5, -0.5])
        values = list(found.values())
        typical = peers_typical(values)
        expected = []
        for rank, value in sorted(found.items()):
            peers = peers_median(values, value) if typical is None else typical if typical > 0 else None
            if peers is not None and value / peers > ratio:
                expected.append((rank, value / peers))
        assert stragglers(found, ratio) == expected


def _healthy_ranks(seed: int) -> list[RankData]:
    """Ranks of one job whose checks decide early: busy GPUs (with an idle one, a brief dip and one used at about
    60 %), flat GPU and host memory, steps that wait little; and one rank whose GPU memory creeps up and whose GPU
    idles for a while."""
    rnd = random.Random(seed)
    ranks = []
    for k in range(4):
        samples, t = [], 1.0
        while t <= 900.0:
            util = 0.0 if k == 3 and 300 < t < 500 else 0.2 if k == 1 and 600 < t < 610 else rnd.uniform(0.8, 1.0)
            memory = 0.5 + (t / 2000 if k == 3 else 0.0)
            other = 0.0 if k == 2 else rnd.uniform(0.5, 0.66) if k == 1 else rnd.uniform(0.8, 1.0)
            gpus = {"0": (util, memory), "1": (other, 0.6)}
            samples.append(Sample(t, (0.5, 0.4), (0.01,), gpus, 1e9 + (t * 1e6 if k == 3 else 0.0), 0.4))
            t += 1.0
        steps, t = [], 5.0
        while t < 895.0:
            d = 0.5 * (1.3 if k == 1 and rnd.random() < 0.5 else 1.0)
            steps.append(StepRecord("train", t, t + d, wait=0.02 * d, collective=0.01, loss=2.0 - t / 1000,
                                    grad_norm=1.0))
            t += d
        ranks.append(RankData("job", k, f"n{k}", 0.0, 900.0, samples, steps))
    return ranks


def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early answer: no extent decides, every window's counts are counted afresh and no quantile range decides,
    no running-total mean bounds the spread."""
    def counts(series: Series, cuts: tuple[int, ...], lo: list[int], hi: list[int],
               least: float | None = None) -> list[tuple[int, ...]]:
        every = series.buckets()
        return [tuple(sum(b <= c for b in every[i:j]) for c in cuts) for i, j in zip(lo, hi)]

    monkeypatch.setattr(window_bounds, "extent", lambda series: (-math.inf, math.inf))
    monkeypatch.setattr(window_bounds, "cut_counts", counts)
    monkeypatch.setattr(system_checks, "quantile_range", lambda *args: (-math.inf, math.inf))
    monkeypatch.setattr(system_checks, "approximate_means", lambda *args: None)


def _found(ranks: list[RankData], config: MixinConfig, times: list[float]) -> Iterator[tuple[str, str, set[str]]]:
    ctx = CheckContext(ranks, config)
    for short, (condition, _) in checks.conditions(ctx).items():
        yield short, repr(condition(times)), set(ctx.judged)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("which", ["faults", "healthy"])
def test_every_check_with_early_answers_equals_it_without(which: str, seed: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = _ranks(seed) if which == "faults" else _healthy_ranks(seed)
    config = MixinConfig(patience="100s", loss_window="2m", max_initialization_time="5m",
                         stalled_training_threshold="2m", host_memory_increase_min_bytes=1e8)
    times = [float(t) for t in range(0, 950, 10)]
    decided = []
    extent = window_bounds.extent
    monkeypatch.setattr(window_bounds, "extent", lambda s: decided.append(extent(s)) or extent(s))
    early = list(_found(ranks, config, times))
    monkeypatch.undo()
    _plain(monkeypatch)
    plain = list(_found(ranks, config, times))
    assert early == plain
    assert decided and check_context.window_bounds is window_bounds
    if which == "healthy":  # the early answers were taken: memory checks judged, nothing fired on them
        fired = {short for short, found, _ in early if found != repr([[] for _ in times])}
        assert {"GPUMemoryNearCapacity", "HostMemoryIncrease"} <= set(early[-1][2])
        assert "GPUMemoryNearCapacity" not in fired and {"GPUUtilizationFluctuating", "GPUUnderutilized"} <= fired


def test_window_ends_of_arrays_of_the_same_times_are_bisected_once() -> None:
    """Arrays holding the same times share their windows' index ranges; one differing by an ulp, or a list, gets
    its own; every range is the bisection's."""
    rnd = random.Random(2)
    a = array("d", sorted(rnd.uniform(0, 100) for _ in range(300)))
    same, other, listed = array("d", a), array("d", a), a.tolist()
    other[150] = math.nextafter(other[150], math.inf)
    times = [float(t) for t in range(-5, 110, 3)]
    ctx = CheckContext([], MixinConfig())
    found = {name: ctx.spans(at, times, 10.0, 2.5) for name, at in
             (("a", a), ("same", same), ("other", other), ("list", listed))}
    for name, at in (("a", a), ("same", same), ("other", other), ("list", listed)):
        assert found[name] == ([bisect.bisect_right(at, t - 10.0) for t in times],
                               [bisect.bisect_right(at, t - 2.5) for t in times])
    assert found["same"][0] is found["a"][0] and found["same"][1] is found["a"][1]
    assert found["other"][0] is not found["a"][0] and found["list"][0] is not found["a"][0]
