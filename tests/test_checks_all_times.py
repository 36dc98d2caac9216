"""The offline checks judge every evaluation time at once (windows that slide, counts kept from one time to the
next, a batch replay of the recorder's outlier judge): each mechanism gives what the plain one gives, value for
value, on sequences written here (random and adversarial)."""

from __future__ import annotations

import json
import math
import random
from itertools import accumulate
from pathlib import Path

import pytest

from otelprof.analysis import checks
from otelprof.analysis.check_context import CheckContext
from otelprof.analysis.check_recording import _build_sample_table
from otelprof.analysis.check_tables import RankData, Sample, Series, StepRecord
from otelprof.analysis.histogram import bucket_quantile, monotonic_quantile
from otelprof.analysis.step_checks import peers_median, peers_typical
from otelprof.mixin.config import MixinConfig
from otelprof.recording.samples import parse_samples
from otelprof.shared.outliers import LossSpikes, StepJudge
from otelprof.shared.sampling import RESUM_STEPS


def _durations(rnd: random.Random, n: int) -> list[float]:
    """Steady steps with jitter, bursts of slow ones, runs of identical ones, zeros and a regime change."""
    out = []
    for k in range(n):
        kind = rnd.random()
        if kind < 0.03:
            out.append(rnd.uniform(1.0, 5.0))  # a slow step
        elif kind < 0.05:
            out.append(0.0)
        elif k % 500 < 40:
            out.append(0.25)  # identical steps: zero variance
        else:
            out.append(rnd.gauss(0.2 if k < n // 2 else 0.6, 0.01))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_step_judge_replay_equals_the_live_judge_step_by_step(seed: int) -> None:
    """observe_all gives each step the cost observe gives it, with units present, absent, zero, negative or
    infinite, across the detectors' periodic exact resum; and leaves both judges in the same state."""
    rnd = random.Random(seed)
    n = 2 * RESUM_STEPS + 300
    durations = _durations(rnd, n)
    units: list[float | None] = [rnd.choice([None, 0.0, -1.0, math.inf, 128.0, 512.0, rnd.uniform(1, 1000)])
                                 for _ in range(n)]
    live, replay = StepJudge(3.0, 20), StepJudge(3.0, 20)
    expected = [live.observe(d, u) for d, u in zip(durations, units)]
    found = replay.observe_all(durations, units)
    assert found == expected
    assert sum(c > 0 for c in expected) > 10  # the sequence has outliers to find
    more = _durations(rnd, 300)
    assert [replay.observe(d) for d in more] == [live.observe(d) for d in more]  # the same state after
    for detector in ("time", "per_unit"):
        a, b = getattr(live, detector), getattr(replay, detector)
        assert (list(a.window), a._sum, a._sumsq, a._since_resum) == (list(b.window), b._sum, b._sumsq,
                                                                        b._since_resum)


def test_step_judge_replay_of_no_steps_and_of_few() -> None:
    assert StepJudge(3.0, 20).observe_all([], []) == []
    few = [0.1, 0.1, 5.0]
    assert StepJudge(3.0, 20).observe_all(few, [None] * 3) == [0.0, 0.0, 0.0]  # before min_steps: no verdict
    judge, live = StepJudge(0.0, 20), StepJudge(0.0, 20)  # sigma 0: never an outlier
    steps = [0.1] * 30 + [9.0]
    assert judge.observe_all(steps, [None] * 31) == [live.observe(d) for d in steps] == [0.0] * 31


@pytest.mark.parametrize("seed", range(3))
def test_loss_spike_replay_equals_the_live_judge(seed: int) -> None:
    rnd = random.Random(seed)
    losses = [max(2.0 - k / 3000, 0.1) + rnd.gauss(0, 0.02) + (rnd.choice([5.0, 50.0]) if rnd.random() < 0.01
              else 0.0) for k in range(RESUM_STEPS + 500)]
    losses[100:140] = [-1.0] * 40  # a non-positive median: no spike, whatever the jump
    live = LossSpikes()
    expected = [live.observe(x) for x in losses]
    assert LossSpikes().observe_all(losses) == expected
    assert any(expected)


def _series(rnd: random.Random, n: int) -> Series:
    times = sorted(rnd.uniform(0, 1000) for _ in range(n))
    values = [rnd.choice([0.0, 0.05, 0.1, 1.0, 1.5, -0.2]) if rnd.random() < 0.2 else rnd.random()
              for _ in range(n)]
    values[n // 3: n // 3 + 200] = [0.0] * 200  # an idle stretch: windows of only zeros
    return Series(times, values)


def _times(rnd: random.Random) -> list[float]:
    """Sorted evaluation times, with gaps wider than a window (the counts start afresh), and then a few going
    back (a caller may ask for any times)."""
    times, t = [], -50.0
    while t < 1100:
        times.append(t)
        t += rnd.choice([3.0, 10.0, 10.0, 400.0])
    return [*times, 500.0, 20.0, 980.0]


def test_monotonic_quantile_is_bucket_quantile_on_monotonic_counts() -> None:
    rnd = random.Random(7)
    bounds = (0.0, 0.05, 0.1, 0.5, 1.0)
    for _ in range(2000):
        counts = list(accumulate(rnd.choice([0, 0, 1, 3, 10]) for _ in range(len(bounds) + 1)))
        for q in (0.0, 0.01, 0.05, 0.5, 0.95, 1.0):
            assert repr(monotonic_quantile(q, bounds, counts)) == repr(bucket_quantile(q, bounds, counts))


@pytest.mark.parametrize("seed", range(3))
def test_window_means_equal_the_plain_ones(seed: int) -> None:
    """The window means (list sums; running totals for whole numbers, exact below 2**53) equal Series.mean window
    by window."""
    rnd = random.Random(seed)
    series = _series(rnd, 3000)
    whole = Series(series.times, [float(rnd.randrange(2**40)) for _ in range(3000)])  # bytes: running totals
    huge = Series(series.times, [2.0**52 + rnd.randrange(4) for _ in range(3000)])  # too large for them
    assert whole.exact_sums() is not None and huge.exact_sums() is None and series.exact_sums() is None
    times = sorted(_times(rnd))
    ctx = CheckContext([], MixinConfig())
    for values in (series, whole, huge):
        for back, until in ((60.0, 0.0), (120.0, 60.0)):
            means = ctx.means(values, times, back, until)
            for k, t in enumerate(times):
                i, j = values.span(t - back, t - until)
                assert means[k] == (values.mean(i, j) if j > i else None)


def test_peers_typical_is_every_values_peers_median() -> None:
    rnd = random.Random(3)
    for n in range(2, 40):
        values = [rnd.choice([0.0, 1.0, rnd.random()]) for _ in range(n)]
        typical = peers_typical(values)
        for v in values:
            expected = peers_median(values, v)
            if n >= 4:
                assert expected == (typical if typical is not None and typical > 0 else None)
            else:
                assert typical is None


def _ranks(seed: int) -> list[RankData]:
    """Five ranks of two jobs (rank numbers repeat across them): rank 0 fluctuates and stalls with vanishing
    gradients, rank 1 is a slow, underused small-batch rank with a loss spike, rank 2 leaks host memory and names
    a phase per step, rank 3 is CPU- and I/O-bound beside idle GPUs with a flat loss, rank 4 initializes slowly
    in a container near its limit and overfits; GPU memory grows, some losses are NaN."""
    rnd = random.Random(seed)
    ranks = []
    for k in range(5):
        start, end = rnd.choice([0.0, 40.0]), 900.0
        util = {0: (0.5, 0.4), 1: (0.3, 0.02), 2: (0.8, 0.05), 3: (0.0, 0.0), 4: (0.9, 0.05)}[k]
        cpu = 0.95 if k == 3 else 0.2 if k == 1 else 0.5
        samples, t = [], start + 1.0
        while t <= end:
            gpus = {str(g): (min(1.0, max(0.0, rnd.gauss(*util))), min(1.0, 0.5 + t / 1000 * k / 4)) for g in range(2)}
            samples.append(Sample(t, (cpu + rnd.uniform(-0.05, 0.05), 0.1), (0.6 if k == 3 else 0.01,), gpus,
                                  float(int(1e8 + t * 2e6 * (k == 2))), rnd.random(),
                                  (float(int(9.5e8 + t)), 1e9) if k == 4 else None))
            t += 1.0
        steps, t, n = [], start + (400.0 if k == 4 else 5.0), 0
        while t < end - 5:
            d = (0.5 if k != 1 else 0.7) * (4.0 if rnd.random() < 0.04 else 1.0)
            phase = f"p{n}" if k == 2 and n % 2 else ("eval" if n % 10 == 9 else "train")
            loss = 2.0 + rnd.gauss(0, 0.01) if k == 3 else 2.0 - t / 2000 + rnd.gauss(0, 0.01) * (k + 1)
            loss = math.nan if k != 3 and rnd.random() < 0.01 else 20.0 if k == 1 and n == 500 else \
                loss * 1.5 if k == 4 and phase == "eval" else loss
            steps.append(StepRecord(phase, t, t + d, wait=d * rnd.choice([0.1, 0.8]), collective=0.05 * d,
                                    loss=loss, grad_norm=abs(rnd.gauss(0, 1e-7)) if k == 0 else 1.0,
                                    outlier=d > 1.0, excess=d / 2 if d > 1.0 else 0.0))
            t += d + (300.0 if k == 0 and n == 300 else 0.0)  # a stall
            n += 1
        ranks.append(RankData("ab"[k % 2], k // 2, f"n{k}", start, end, samples, steps))
    return ranks


@pytest.mark.parametrize("seed", range(2))
def test_every_check_over_all_times_equals_each_time_judged_alone(seed: int) -> None:
    """Each condition judges all evaluation times at once; judged one time at a time (every window counted
    afresh, no running state carried from one time to the next) it finds the same subjects with the same values,
    in the same order, and marks the same checks as judged."""
    ranks = _ranks(seed)
    config = MixinConfig(patience="100s", loss_window="2m", max_initialization_time="5m",
                         stalled_training_threshold="2m")
    times = [float(t) for t in range(0, 950, 10)]
    together, alone = CheckContext(ranks, config), CheckContext(ranks, config)
    fired = set()
    for (short, (condition, _)), (_, (single, _)) in zip(checks.conditions(together).items(),
                                                         checks.conditions(alone).items()):
        found = condition(times)
        assert len(found) == len(times)
        assert repr(found) == repr([single([t])[0] for t in times]), short
        if any(found):
            fired.add(short)
    assert together.judged == alone.judged
    assert fired == set(checks.OFFLINE_CHECKS)  # every check has something to find in these ranks



def _sample_lines(rnd: random.Random, shape: str) -> str:
    """A rank's sample lines: every one a node sample ("node"), none ("process"), or node samples then process
    ones, some without a resident size or a GPU reading ("mixed")."""
    lines = []
    for k in range(400):
        line: dict[str, object] = {"t": 1_750_000_000_000_000_000 + k * 500_000_000, "pid": 7, "pcpu": 1.0}
        if not (shape == "mixed" and k % 7 == 3):
            line["rss"] = 8_000_000_000 + k * 1024
        if shape == "node" or (shape == "mixed" and k < 250):
            line.update(cpu=[rnd.random(), rnd.choice([0.99, 0.1])], iow=[rnd.random() * 0.5], mem=rnd.random(),
                        cws=9e8 + k, cml=1e9)
            gpus = {"0": {"u": rnd.choice([0.0, 0.05, 0.5, 0.95]), "mu": 6e10, "mt": 8e10}}
            if k % 5:
                gpus["1"] = {"u": rnd.random(), "mu": 1e10 + k, "mt": 8e10}
            line["gpu"] = gpus
        lines.append(json.dumps(line))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("shape", ["node", "process", "mixed"])
def test_sample_table_holds_each_series_known_values(shape: str, tmp_path: Path) -> None:
    """The checks' sample table from the reader's columns (a node rank's copied whole, others through their
    node-sample mask) holds, per series, the (time, value) of each sample that has the value, and the running
    count of bottleneck coincidences, as read value by value here."""
    path = tmp_path / "samples.jsonl"
    path.write_text(_sample_lines(random.Random(5), shape))
    columns = parse_samples(path)
    config = MixinConfig()
    table = _build_sample_table(columns, config)
    seconds = [t / 1e9 for t in columns.t_ns]
    node = [k for k, v in enumerate(columns.cpu_max) if v == v] if len(columns.cpu_max) else []

    def pairs(series: Series) -> list[tuple[float, float]]:
        return list(zip(series.times, series.values))

    def known(values: object, at: list[int]) -> list[tuple[float, float]]:
        return [(seconds[k], v) for k in at if (v := values[k]) == v]  # type: ignore[index]

    assert list(table.times) == [seconds[k] for k in node]
    assert pairs(table.rss) == known(columns.rss, list(range(len(columns))))
    assert pairs(table.cpu_mean) == known(columns.cpu_mean, node)
    assert pairs(table.host_memory) == known(columns.mem, node)
    assert pairs(table.container_memory) == known(columns.container_memory, node)
    gpus = {str(g): c for g, c in columns.gpus.items()}
    assert sorted(table.util) == sorted(table.memory) == (sorted(gpus) if node else [])
    for g, c in gpus.items():
        assert pairs(table.util[g]) == known(c["u"], node)
        assert pairs(table.memory[g]) == [(seconds[k], c["mu"][k] / c["mt"][k]) for k in node
                                         if c["mu"][k] == c["mu"][k]]
    hits, count = [0], 0
    for k in node:
        count += columns.cpu_max[k] > config.cpu_threshold and any(
            c["u"][k] < config.gpu_threshold for c in gpus.values())
        hits.append(count)
    assert list(table.cpu_hits) == hits
    assert (shape == "process") == (not node) and (shape != "node" or len(node) == len(columns))
