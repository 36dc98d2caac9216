from __future__ import annotations

import statistics

import pytest

from otelprof.shared.sampling import OutlierDetector, SpanSelector, flag_outliers


def test_outlier_threshold_is_mean_plus_sigma_population_stddev() -> None:
    detector = OutlierDetector(sigma=3.0, min_steps=5, min_ratio=1.0, min_excess=0.0)
    durations = [0.10, 0.11, 0.09, 0.10, 0.12, 0.08]
    for d in durations:
        assert detector.observe(d) is False
    expected = statistics.fmean(durations) + 3 * statistics.pstdev(durations)
    assert detector.threshold() == pytest.approx(expected)
    assert detector.observe(expected * 0.99) is False
    assert detector.observe(1.0) is True


def test_an_outlier_is_also_materially_slower_than_the_median() -> None:
    """Steady 63.6 +- 1.9 ms steps: mean + 3 sigma is about 70 ms, but a 70-90 ms step is jitter, not an outlier;
    with the default floor (1.5 x the median) only a step above 95.4 ms is."""
    import random

    rng = random.Random(3)
    steady = [rng.gauss(0.0636, 0.0019) for _ in range(1500)]
    jitter = [d + (rng.uniform(0.007, 0.025) if i % 50 == 49 else 0.0) for i, d in enumerate(steady)]
    sigma_only = flag_outliers(jitter, 3.0, 20, min_ratio=1.0, min_excess=0.0)
    assert sum(sigma_only) >= 25  # what the 3-sigma rule alone flagged: every jittered step
    assert sum(flag_outliers(jitter, 3.0, 20)) == 0
    detector = OutlierDetector(sigma=3.0, min_steps=20)
    for d in jitter[:300]:
        detector.observe(d)
    median = statistics.median(list(detector.window))
    assert detector.threshold() == pytest.approx(1.5 * median)
    assert detector.observe(1.5 * median * 0.99) is False
    assert detector.observe(1.5 * median * 1.01) is True
    slow = [d * (3.0 if i % 40 == 39 else 1.0) for i, d in enumerate(steady)]  # a real stall every 40 steps
    assert sum(flag_outliers(slow, 3.0, 20)) == sum(1 for i in range(20, 1500) if i % 40 == 39)


def test_outlier_floor_settings_come_from_the_config() -> None:
    from otelprof.config import Config

    detector = OutlierDetector.from_config(Config(outlier_sigma=2.0, outlier_min_steps=5, outlier_min_ratio=2.0,
                                                  outlier_min_excess=0.5))
    assert (detector.sigma, detector.min_steps, detector.min_ratio, detector.min_excess) == (2.0, 5, 2.0, 0.5)
    for _ in range(10):
        detector.observe(1.0)
    assert detector.threshold() == pytest.approx(2.0)  # max(2 x median, median + 0.5 s)
    assert OutlierDetector.from_config(Config()).min_ratio == 1.5


def test_outliers_need_min_steps_and_sigma_zero_disables() -> None:
    detector = OutlierDetector(sigma=3.0, min_steps=20)
    assert not any(detector.observe(d) for d in [0.1] * 19 + [5.0])
    off = OutlierDetector(sigma=0.0, min_steps=2)
    assert not any(off.observe(d) for d in [0.1] * 50 + [5.0])


def test_running_sums_stay_exact_over_a_long_window() -> None:
    detector = OutlierDetector(sigma=3.0, min_steps=5, window=16, min_ratio=1.0, min_excess=0.0)
    for i in range(10_000):
        detector.observe(0.1 + (i % 7) * 1e-3)
    window = list(detector.window)
    expected = statistics.fmean(window) + 3 * statistics.pstdev(window)
    assert detector.threshold() == pytest.approx(expected, rel=1e-9)


def test_flagging_a_whole_series_gives_the_detectors_verdicts() -> None:
    """The offline checks flag a recording's steps in one loop; the live recorder observes one by one."""
    import random

    rng = random.Random(7)
    durations = [0.05 + rng.random() * 0.002 + (0.5 if rng.random() < 0.01 else 0.0) for _ in range(10_000)]
    for sigma, min_steps, ratio, excess in ((3.0, 20, 1.5, 0.001), (1.0, 5, 1.0, 0.0), (0.0, 20, 1.5, 0.001),
                                            (2.0, 10, 1.02, 0.0005)):
        detector = OutlierDetector(sigma, min_steps, min_ratio=ratio, min_excess=excess)
        expected = [detector.observe(d) for d in durations]
        assert list(map(bool, flag_outliers(durations, sigma, min_steps, min_ratio=ratio, min_excess=excess))) \
            == expected
        assert sigma == 0 or sum(expected) > 0
    assert sum(flag_outliers(durations, 3.0, 20)) > 50  # the injected slow steps


def test_budget_spends_at_most_its_share_of_step_time() -> None:
    selector = SpanSelector(budget=0.01, first_steps=0, every=0, windows=())
    step, cost_per_span, spans = 0.010, 50e-6, 5
    traced = 0
    for number in range(10_000):
        if selector.select(number, number, step, outlier=False, spans=spans) is not None:
            traced += 1
            selector.settle(cost_per_span * spans, spans)
    spent = traced * cost_per_span * spans
    assert spent <= 0.01 * 10_000 * step * 1.05
    assert spent >= 0.01 * 10_000 * step * 0.5  # and it does use the budget


def test_forced_reasons_win_over_budget() -> None:
    selector = SpanSelector(budget=0.0, first_steps=2, every=5, windows=((7, 2),))
    reasons = [selector.select(n, n, 0.1, outlier=(n == 11), spans=1) for n in range(13)]
    assert reasons == ["first", "first", None, None, None, "every", None, "window", "window", None,
                       "every", "outlier", None]


def test_sub_millisecond_jitter_is_not_an_outlier() -> None:
    detector = OutlierDetector(sigma=3.0, min_steps=5)
    for i in range(50):
        detector.observe(100e-6 + (i % 2) * 1e-6)  # 100 us steps, a microsecond of jitter
    assert detector.observe(400e-6) is False  # far above mean + 3 sigma, but only 0.3 ms above the mean
    assert detector.observe(15e-3) is False  # 150 times the median, but within a loaded scheduler's delay
    assert detector.observe(30e-3) is True
