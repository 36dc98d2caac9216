"""Each report section's numbers against values computed by hand for the fixture in test_report_fixtures."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from otelprof.analysis.report import Report, build_report, load, report_dict
from otelprof.analysis.stats import BoxPlot, Distribution, Histogram, quantile
from tests.test_report_fixtures import T0, small_run

approx = pytest.approx


@pytest.fixture
def report(tmp_path: Path) -> Report:
    return build_report(load(small_run(tmp_path)))


def test_quantile_is_linear_between_closest_ranks() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([0.1] * 19 + [1.0], 0.95) == approx(0.145)  # rank 18.05
    assert math.isnan(quantile([], 0.5))
    d = Distribution.of([1.0, 2.0, 3.0, math.nan])
    assert (d.count, d.mean, d.min, d.max) == (3, 2.0, 1.0, 3.0)
    assert d.std == approx(math.sqrt(2 / 3))
    box = BoxPlot.of([float(v) for v in range(11)] + [100.0])  # q1 2.75, q3 8.25, IQR 5.5 -> whisker 16.5
    assert (box.q1, box.median, box.q3) == (2.75, 5.5, 8.25)
    assert box.whisker_high == 16.5 and box.whisker_low == 0.0 and box.max == 100.0
    h = Histogram.of([0.0, 0.3, 0.5, 1.0], 50, 0.0, 1.0)
    assert h.counts[15] == 1 and h.counts[25] == 1 and h.counts[49] == 1 and h.total == 4


def test_job_summary(report: Report) -> None:
    s = report.summary
    assert (s.job, s.run_id, s.world_size, s.nodes) == ("fixture", "run-1", 1, ("n1",))
    assert s.start == approx(T0) and s.training_start == approx(T0 + 10)
    assert s.training_end == approx(T0 + 13.25) and s.end == approx(T0 + 18.25)
    assert s.duration == approx(18.25) and s.initialization == approx(10.0)
    assert s.training_duration == approx(3.25) and s.finalization == approx(5.0)
    assert s.initialization_share == approx(10 / 18.25)
    assert s.training_share == approx(3.25 / 18.25) and s.finalization_share == approx(5 / 18.25)
    assert s.steps_per_phase == (("eval", 5), ("train", 20))
    assert s.killed_ranks == () and s.skipped_lines == 0 and s.missing == ()


def test_system_usage(report: Report) -> None:
    u = report.system
    cpu = u.row("n1", "CPU")
    assert cpu is not None
    # node CPU per sample: 0.1, 0.2, ..., 1.0
    assert (cpu.max, cpu.p99, cpu.p95, cpu.p50, cpu.min, cpu.datapoints) == approx((1.0, 0.991, 0.955, 0.55, 0.1, 10))
    gpu = u.row("n1", "GPU")  # per-sample mean of 0.5 and (9 - i) / 10: 0.25 ... 0.7
    assert gpu is not None
    assert (gpu.max, gpu.p95, gpu.p50, gpu.min) == approx((0.7, 0.6775, 0.475, 0.25))
    mem = u.row("n1", "GPU memory")  # (0.5 + 0.25) / 2 in every sample
    assert mem is not None and (mem.max, mem.min) == approx((0.375, 0.375))
    iow = u.row("n1", "I/O wait")  # 0 except 0.6 / 4 in the last sample
    assert iow is not None and (iow.max, iow.p50, iow.min) == approx((0.15, 0.0, 0.0))
    host = u.row("n1", "CPU memory")
    assert host is not None and (host.max, host.p50, host.min) == approx((0.39, 0.345, 0.3))
    net = u.row("n1", "Network")  # (1000 + 1000) B per 0.5 s
    assert net is not None and (net.max, net.min, net.datapoints) == approx((4000.0, 4000.0, 9))
    [node] = u.nodes
    assert (node.node, node.samples, node.cores, node.gpus, node.interval) == ("n1", 10, 4, ("0", "1"), approx(0.5))
    assert node.core_mean == approx((0.55,) * 4)
    assert node.verdict == "cpu_bound"  # GPU p95 0.6775 < 0.7, CPU p95 0.955 > 0.7
    [pcpu, rss] = u.process_rows
    assert (pcpu.subject, pcpu.metric, pcpu.p50) == ("rank 0", "Process CPU", approx(0.25))
    assert (rss.max, rss.min) == (10000.0, 1000.0)


def test_framework_summary(report: Report) -> None:
    f = report.framework
    phases = {name: (t, share) for name, t, share in f.phases}
    assert phases["train"] == approx((2.9, 2.9 / 3.25))
    assert phases["eval"] == approx((0.25, 0.25 / 3.25))
    assert phases["between steps"] == approx((0.1, 0.1 / 3.25), abs=1e-5)
    assert f.forward == approx(20 * 0.03 + 5 * 0.02) and f.backward == approx(20 * 0.04)
    assert f.forward_share == approx(0.7 / 1.5)
    regions = {r.name: r for r in f.regions}
    loader = regions["dataloader"]
    assert (loader.count, loader.total, loader.max) == (25, approx(19 * 0.02 + 0.9 + 5 * 0.01), approx(0.9))
    assert loader.share == approx(1.33 / 3.15)
    assert [r.name for r in f.outside_steps] == ["initialization", "checkpoint"]
    assert [(o.name, o.calls, o.self_time) for o in f.cpu_operators] == [("aten::conv2d", 10, 0.06),
                                                                        ("aten::relu", 20, 0.02)]
    assert f.cpu_operators[0].share == approx(0.75) and f.cpu_operator_time == approx(0.08)
    assert f.gpu_operators[0].name == "sgemm_kernel"
    assert dict(f.gpu_activity) == {"kernel": 0.03, "memcpy": 0.01}
    [window] = f.windows
    assert (window.rank, window.start_step, window.num_steps, window.duration) == (0, 3, 2, approx(0.2))


def test_step_analysis(report: Report) -> None:
    train = report.steps.row(0, "train")
    assert train is not None
    d = train.durations
    assert (d.count, d.mean, d.min, d.p50, d.p95, d.p99, d.max) == approx((20, 0.145, 0.1, 0.1, 0.145, 0.829, 1.0))
    std = math.sqrt((19 * 0.045**2 + 0.855**2) / 20)
    assert d.std == approx(std)
    assert train.threshold == approx(0.145 + 3 * std)
    assert (train.outliers, train.outlier_steps) == (1, (19,))
    assert train.histogram.total == 19
    assert train.samples_per_step == 32.0
    assert train.samples_per_second == approx(640 / 2.9)
    assert dict(report.steps.throughput)["train"] == approx(640 / 2.9)
    evaluation = report.steps.row(0, "eval")
    assert evaluation is not None and evaluation.durations.count == 5 and evaluation.outliers == 0


def test_gpu_and_memory(report: Report) -> None:
    g0, g1 = report.gpus.gpus
    assert (g0.gpu, g0.utilization.median, g0.utilization.p95) == ("0", 0.5, 0.5)
    assert g0.underused and not g0.fluctuating  # p95 0.5 < 0.7: under-used, but steady
    # values 0.0 .. 0.9: q1 0.225, median 0.45, q3 0.675, p5 0.045, p95 0.855
    u = g1.utilization
    assert (u.min, u.p5, u.q1, u.median, u.q3, u.p95, u.max) == approx((0.0, 0.045, 0.225, 0.45, 0.675, 0.855, 0.9))
    assert g1.fluctuating and not g1.underused  # p5 0.045 < 0.1 and p95 0.855 > 0.7
    assert (g0.memory.median, g1.memory.median, g0.memory_total) == (0.5, 0.25, 8e9)
    assert (g0.power, g1.temperature) == (300.0, 50.0)


def test_bottlenecks(report: Report) -> None:
    [cpu] = report.cpu_bottleneck.nodes
    # low GPU (< 0.1): only sample 9 (GPU 1 at 0.0); busy core (> 0.9): only sample 9 (1.0)
    assert (cpu.datapoints, cpu.low_gpu, cpu.busy, cpu.coincidences) == (10, 1, 1, 1)
    assert cpu.fraction == approx(0.1)
    assert cpu.regions == (("dataloader", 1),)  # T0 + 12.5 is 0.6 s into the 1.0 s step's 0.9 s wait
    [io] = report.io_bottleneck.nodes
    assert (io.busy, io.coincidences) == (1, 1)  # CPU 0 at 0.6 iowait (> 0.5) in sample 9


def test_load_balance(report: Report) -> None:
    b = report.load
    assert [(g.gpu, g.mean) for g in b.gpus] == [("0", 0.5), ("1", approx(0.45))]
    assert b.spread == approx(0.05)
    [distance] = b.distances
    # GPU 0: all in the 0.50 bin; GPU 1: a tenth in each of ten bins, one of them the 0.50 bin
    m_shared, m_other = 0.55, 0.05
    js = (math.log(1 / m_shared) + 0.1 * math.log(0.1 / m_shared) + 0.9 * math.log(0.1 / m_other)) / 2
    assert distance.distance == approx(math.sqrt(js))
    [train, _] = sorted(b.ranks, key=lambda r: r.phase, reverse=True)
    assert train.mean_compute == approx((2.9 - (19 * 0.02 + 0.9)) / 20)
    assert not train.straggler  # a single rank


def test_dataloader(report: Report) -> None:
    d = report.dataloader
    train = next(x for x in d.phases if x.phase == "train")
    assert (train.steps, train.steps_waiting, train.input_bound_steps) == (20, 20, 1)
    assert train.wait.p50 == approx(0.02) and train.wait.max == approx(0.9)
    assert train.wait_p25 == approx(0.02)
    assert train.wait_share == approx(1.28 / 2.9)
    assert train.wait_ratio.p50 == approx(0.2)


def test_batch_size(report: Report) -> None:
    b = report.batch
    assert [(g.gpu, g.small) for g in b.gpus] == [("0", False), ("1", False)]  # CPU p95 0.955 is not small
    assert b.gpus[0].cpu_p95 == approx(0.955)
    assert b.samples_per_step == ((0, "train", 32.0), (0, "eval", 32.0))


def test_rules_summary_uses_the_offline_checks(report: Report) -> None:
    from otelprof.analysis import checks

    r = report.rules
    assert r.error is None and r.interval == 10.0
    assert {row.alert for row in r.rows} == {"Otelprof" + name for name in checks.OFFLINE_CHECKS}
    assert not r.fired
    outliers = next(row for row in r.rows if row.alert == "OtelprofStepOutliers")
    assert outliers.original == "StepOutlier" and outliers.description and outliers.recommendation
    assert outliers.evaluations == 3  # T0, T0 + 10, T0 + 18.25
    assert outliers.datapoints == 0 and outliers.status == "no data"  # never 100 steps in its window to judge
    stalled = next(row for row in r.rows if row.alert == "OtelprofTrainingStalled")
    assert stalled.datapoints == 25 and stalled.status == "ok"


def test_rules_summary_reports_a_fired_check(tmp_path: Path) -> None:
    from otelprof.mixin import MixinConfig

    report = build_report(load(small_run(tmp_path)), MixinConfig(max_initialization_time="5s"))
    fired = report.rules.fired
    assert [row.alert for row in fired] == ["OtelprofSlowInitialization"]
    assert fired[0].first_fired == approx(T0 + 10) and fired[0].firing_evaluations == 1
    assert report.rules.rows[0] == fired[0]  # most often fired first


def test_checks_in_a_forked_process_match_and_survive_its_death(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Long recordings evaluate the checks in a forked process: same result; if it dies, they run here."""
    import os

    from otelprof.analysis import rules
    from otelprof.mixin import MixinConfig

    recording = load(small_run(tmp_path))
    config = MixinConfig(max_initialization_time="5s")
    inline = rules.rules_summary(recording, 18.25, config)
    assert inline.fired  # something to compare
    real = rules.rules_summary
    pids = tmp_path / "pids"

    def tagged(*args: Any) -> rules.RulesSummary:  # which process evaluated which half: its pid in a file
        if len(args) > 4:
            with open(pids, "a") as out:
                out.write(f"{os.getpid()} {args[4]}\n")
        return dataclasses.replace(real(*args), skipped=str(os.getpid()))

    monkeypatch.setattr(rules, "rules_summary", tagged)
    forked = rules.rules_summary_later(recording, 18.25, config, background=True)()
    assert forked == inline  # both halves joined: the same verdicts in the same order
    halves = dict(line.split()[::-1] for line in pids.read_text().splitlines())
    assert set(halves) == {"0", "1"} and len({*halves.values(), str(os.getpid())}) == 3  # two other processes
    assert {r.alert for r in rules.rules_summary(recording, 18.25, config, None, 0).rows} & \
        {r.alert for r in rules.rules_summary(recording, 18.25, config, None, 1).rows} == set()

    def die(*args: object) -> None:
        os._exit(3)

    monkeypatch.setattr(rules, "_evaluate_into", die)
    fallback = rules.rules_summary_later(recording, 18.25, config, background=True)()
    assert dataclasses.replace(fallback, skipped=None) == inline and fallback.skipped == str(os.getpid())


def test_json_form_is_strict_and_complete(report: Report) -> None:
    import json

    data = report_dict(report)
    text = json.dumps(data, allow_nan=False)
    assert json.loads(text)["summary"]["duration"] == approx(18.25)
    assert set(data) >= {"summary", "system", "framework", "rules", "steps", "gpus", "batch", "cpu_bottleneck",
                         "io_bottleneck", "load", "dataloader"}


def test_run_without_gpus_or_profiles_says_what_is_missing(tmp_path: Path) -> None:
    report = build_report(load(small_run(tmp_path, gpus=False)))
    assert any("no GPU samples" in m for m in report.summary.missing)
    assert report.gpus.gpus == () and report.system.nodes[0].verdict == "no_gpu"
    assert report.cpu_bottleneck.nodes[0].coincidences == 0


def test_report_outliers_must_be_materially_slower_than_the_median() -> None:
    """Scheduler jitter on steady steps (63.6 ms ± 1.9 ms and, in 2 % of them, a 6 to 12 ms preemption, as on a
    busy 2-core machine) is above mean + 3 sigma now and then, but none of it is an outlier; 3x the median is."""
    import random
    import statistics

    from otelprof.analysis.steps import outlier_threshold

    rng = random.Random(7)
    steady = [0.0636 + rng.gauss(0.0, 0.0019) + (rng.uniform(0.006, 0.012) if rng.random() < 0.02 else 0.0)
              for _ in range(1500)]
    mean = sum(steady) / len(steady)
    std = math.sqrt(sum((d - mean) ** 2 for d in steady) / len(steady))
    assert sum(d > mean + 3 * std for d in steady) > 0  # what mean + 3 sigma alone would have flagged
    limit = outlier_threshold(steady, 3.0)
    assert limit >= 1.5 * statistics.median(steady) - 1e-12 and not [d for d in steady if d > limit]
    spiked = [*steady, 0.19]
    assert [d for d in spiked if d > outlier_threshold(spiked, 3.0)] == [0.19]
    assert outlier_threshold(steady, 3.0, (1.0, 0.0)) == pytest.approx(mean + 3 * std)  # floor off: the original
