"""Live and offline verdicts agree: the same scenarios go through promtool (as the series a training
process would expose, scraped every 5 s) and through otelprof.analysis.checks (as raw samples and
steps); the alerts firing at chosen times must be the same set."""

from __future__ import annotations

import dataclasses
import math
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import otelprof
from otelprof import semconv as sc
from otelprof.analysis import check_recording, checks
from otelprof.analysis.check_context import CheckContext
from otelprof.analysis.check_tables import RankData, Sample, StepRecord
from otelprof.analysis.histogram import bucket_quantile, cumulative_counts
from otelprof.mixin import MixinConfig, yamlout
from otelprof.mixin.alerts import alerts
from otelprof.mixin.config import with_overrides
from otelprof.mixin.generate import render_alerts, render_rules
from otelprof.mixin.promql import series_name
from otelprof.mixin.ruletests import group_eval_order
from otelprof.recording.reader import read_recording
from otelprof.shared.outliers import LossSpikes, StepJudge
from tests.servers import require_binary

SCRAPE = 5.0
END = 900.0
AT = (420.0, 720.0, 880.0)
CONFIG = MixinConfig()
CONFIG_PREFIX = "Otelprof"


# ------------------------------------------------------------------ scenarios

def _samples(cpu: Callable[[float], list[float]], gpus: Callable[[float], dict[str, tuple[float, float]]],
             iowait: Callable[[float], list[float]] | None = None,
             memory: Callable[[float], tuple[float, float, tuple[float, float | None]]] | None = None) -> list[Sample]:
    """Node samples every 0.5 s; ``memory(t)`` = (RSS, host used ratio, (container working set, limit))."""
    out = []
    t = 0.5
    while t <= END:
        rss, host, container = memory(t) if memory else (None, None, None)
        out.append(Sample(t, tuple(cpu(t)), tuple(iowait(t) if iowait else [0.0] * len(cpu(t))),
                          dict(gpus(t)), rss, host, container))  # type: ignore[arg-type]
        t += 0.5
    return out


def _steps(duration: Callable[[float], float], wait: Callable[[float], float] = lambda t: 0.0,
           collective: Callable[[float], float] = lambda t: 0.0, loss: Callable[[float, int], float] | None = None,
           start: float = 5.0, grad_norm: Callable[[float], float] | None = None) -> list[StepRecord]:
    """Steps back to back; outliers flagged, and their cost, as the recorder's judge finds them (its default
    settings)."""
    out, t, n = [], start, 0
    while t + duration(t) <= END:
        d = duration(t)
        out.append(StepRecord("train", t, t + d, wait(t), collective(t), loss(t, n) if loss else None,
                              grad_norm(t) if grad_norm else None))
        t += d
        n += 1
    judge = StepJudge(3.0, 20)
    costs = [judge.observe(s.end - s.start) for s in out]
    return [dataclasses.replace(s, outlier=c > 0, excess=c) for s, c in zip(out, costs)]


def cpu_bound() -> list[RankData]:
    def cpu(t: float) -> list[float]:
        return [0.97, 0.5, 0.4, 0.4] if t > 300 else [0.5, 0.4, 0.3, 0.3]

    def gpus(t: float) -> dict[str, tuple[float, float]]:
        return {"0": (0.05 if t > 300 else 0.9, 0.6)}

    return [RankData("cpubound", 0, "n1", 0.0, END, _samples(cpu, gpus), _steps(lambda t: 0.5))]


def input_bound_then_nan() -> list[RankData]:
    steps = _steps(lambda t: 0.1, wait=lambda t: 0.08 if t > 300 else 0.02,
                   loss=lambda t, n: math.nan if 600 < t < 610 else 2.0 / (1 + n / 100))
    return [RankData("loader", 0, "n1", 0.0, END, [], steps)]


def straggler_and_imbalance() -> list[RankData]:
    ranks = []
    for rank, (util, step) in enumerate([(0.9, 0.2), (0.9, 0.2), (0.5, 0.3)]):
        samples = _samples(lambda t: [0.3, 0.3], lambda t, u=util: {"0": (u, 0.8)})  # type: ignore[misc]
        ranks.append(RankData("ddp", rank, f"n{rank + 1}", 0.0, END, samples, _steps(lambda t, d=step: d)))
    return ranks


def straggler_pair() -> list[RankData]:
    """Two ranks, rank 1 30 % slower: against the pair's median (their mean) it scored 1.13 and hid."""
    return [RankData("pair", rank, f"n{rank + 1}", 0.0, END, [], _steps(lambda t, d=step: d))  # type: ignore[misc]
            for rank, step in enumerate((0.2, 0.26))]


def straggler_four() -> list[RankData]:
    """Four ranks, two of them 25 % slower than the median of their peers (not of the four: 1.11)."""
    return [RankData("four", rank, f"n{rank + 1}", 0.0, END, [], _steps(lambda t, d=step: d))  # type: ignore[misc]
            for rank, step in enumerate((0.2, 0.2, 0.25, 0.25))]


def memory() -> list[RankData]:
    """RSS leaks 2 MiB/s from 400 s; the container's working set climbs to 95 % of its 4 GiB limit from 600 s."""
    mib, gib = 2.0**20, 2.0**30

    def readings(t: float) -> tuple[float, float, tuple[float, float | None]]:
        rss = 400 * mib + max(t - 400, 0) * 2 * mib
        working_set = 3 * gib + min(max(t - 600, 0) / 200, 1) * 0.8 * gib
        return rss, 0.5, (working_set, 4 * gib)

    samples = _samples(lambda t: [0.3, 0.3], lambda t: {}, memory=readings)
    return [RankData("leaky", 0, "n1", 0.0, END, samples, _steps(lambda t: 0.5))]


def host_memory_without_limit() -> list[RankData]:
    """No container limit: the host's memory fills from 50 % to 97 % between 500 and 600 s."""
    def readings(t: float) -> tuple[float, float, tuple[float, float | None]]:
        return 512 * 2.0**20, 0.5 + min(max(t - 500, 0) / 100, 1) * 0.47, (3 * 2.0**30, None)

    samples = _samples(lambda t: [0.3, 0.3], lambda t: {}, memory=readings)
    return [RankData("host", 0, "n1", 0.0, END, samples, _steps(lambda t: 0.5))]


def loss_plateau_and_nan() -> list[RankData]:
    """The loss falls until 300 s, then stays at 1.0; NaN from 600 to 610 s (the held loss gauge looks flat
    then, but a NaN keeps the plateau check quiet while it is in the windows)."""
    def loss(t: float, n: int) -> float:
        return math.nan if 600 < t < 610 else 2.0 - min(t, 300) / 300

    return [RankData("plateau", 0, "n1", 0.0, END, [], _steps(lambda t: 0.5, loss=loss))]


def stalled_then_resumed() -> list[RankData]:
    """Steps stop from 300 to 700 s (the loss gauge holds still), then resume with the loss still falling."""
    steps = [s for s in _steps(lambda t: 0.5, loss=lambda t, n: 2.0 - t / 1000) if not 300 < s.end <= 700]
    return [RankData("stall", 0, "n1", 0.0, END, [], steps)]


def outliers() -> list[RankData]:
    """Steady 63.6 +- 1.9 ms steps with jitter spikes (+10-40 %) every 25 steps: 3-sigma "outliers" but not
    materially slower, so quiet; from 600 s every 20th step stalls (5 x, 17 % of the step time): a real outlier
    alert once the 10-minute window holds more than 5 % of cost."""
    import random

    rng = random.Random(11)
    count = [0]

    def duration(t: float) -> float:
        count[0] += 1
        d = rng.gauss(0.0636, 0.0019)
        if count[0] % 25 == 0:
            d *= rng.uniform(1.1, 1.4)
        if t > 600 and count[0] % 40 == 0:  # (two calls per step: every 20th step)
            d *= 5
        return d

    return [RankData("jittery", 0, "n1", 0.0, END, [], _steps(duration))]


def noisy_loss_with_a_spike() -> list[RankData]:
    """A loss falling with 18 % noise per batch (one batch every 0.5 s), 10 times higher for 5 steps at 600 s:
    a spike, and no plateau (the falling loss is measurably lower window after window, and the spike is left
    out of the means)."""
    import random

    rng = random.Random(5)

    def loss(t: float, n: int) -> float:
        value = (0.2 + 2.0 * math.exp(-t / 300)) * rng.uniform(0.82, 1.18)
        return value * 10 if 600 <= t < 602.5 else value

    return [RankData("spiky", 0, "n1", 0.0, END, [], _steps(lambda t: 0.5, loss=loss))]


@dataclass(frozen=True)
class Scenario:
    """One scenario: its ranks, what it must show on both sides (so that the comparison is never vacuous), what
    it must not show, and the config it is judged with."""

    ranks: Callable[[], list[RankData]]
    fires: frozenset[tuple[float, str]]
    """(evaluation time, alert) that must fire."""
    quiet: frozenset[tuple[float, str]] = frozenset()
    """(evaluation time, alert) that must not."""
    config: MixinConfig = CONFIG


def _at(*pairs: tuple[float, str]) -> frozenset[tuple[float, str]]:
    return frozenset((t, "Otelprof" + name) for t, name in pairs)


SHORT_LOSS = with_overrides(CONFIG, ["loss_window=60s", "loss_for=0s"])  # windows short enough for 900-s scenarios
SCENARIOS = {
    "noisy_loss_with_a_spike": Scenario(
        noisy_loss_with_a_spike, _at((720.0, "LossSpike"), (880.0, "LossSpike")),  # 10-min window
        _at((420.0, "LossSpike"), (420.0, "LossNotDecreasing"), (720.0, "LossNotDecreasing"),
            (880.0, "LossNotDecreasing")),
        with_overrides(CONFIG, ["loss_window=60s", "loss_for=30s"])),
    "cpu_bound": Scenario(cpu_bound, _at((720.0, "CPUBottleneck"), (880.0, "BatchSizeTooSmall"))),
    "input_bound_then_nan": Scenario(input_bound_then_nan, _at((720.0, "InputBound"), (720.0, "NonFiniteValues"))),
    "straggler_and_imbalance": Scenario(straggler_and_imbalance,
                                        _at((720.0, "RankStraggler"), (880.0, "GPULoadImbalance"))),
    "straggler_pair": Scenario(straggler_pair, _at((420.0, "RankStraggler"))),
    "straggler_four": Scenario(straggler_four, _at((420.0, "RankStraggler"))),
    "memory": Scenario(
        memory, _at((720.0, "HostMemoryIncrease"), (880.0, "HostMemoryNearLimit")),
        _at((420.0, "HostMemoryIncrease"), (720.0, "HostMemoryNearLimit")),
        with_overrides(CONFIG, ["patience=60s", "host_memory_increase_window=60s", "host_memory_increase_for=0s"])),
    "host_memory_without_limit": Scenario(
        host_memory_without_limit, _at((720.0, "HostMemoryNearLimit"), (880.0, "HostMemoryNearLimit")),
        _at((420.0, "HostMemoryNearLimit"))),
    "loss_plateau_and_nan": Scenario(
        loss_plateau_and_nan,
        _at((420.0, "LossNotDecreasing"), (880.0, "LossNotDecreasing"), (720.0, "NonFiniteValues")),
        _at((720.0, "LossNotDecreasing")), SHORT_LOSS),
    "stalled_then_resumed": Scenario(
        stalled_then_resumed, _at((420.0, "TrainingStalled")),
        _at((720.0, "LossNotDecreasing"), (720.0, "TrainingStalled"), (880.0, "LossNotDecreasing")),
        with_overrides(SHORT_LOSS, ["stalled_training_threshold=100s"])),
    "outliers": Scenario(outliers, _at((880.0, "StepOutliers")),
                         _at((420.0, "StepOutliers"), (720.0, "StepOutliers"))),  # stalls cost under 5 %
}


# ------------------------------------------------------------------ what the process would expose

@dataclass
class Series:
    values: dict[str, list[str]] = field(default_factory=dict)

    def put(self, key: str, index: int, value: float | None, length: int) -> None:
        row = self.values.setdefault(key, ["_"] * length)
        if value is not None:
            row[index] = repr(float(value))


def _labels(**labels: str) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def exposition(ranks: Sequence[RankData]) -> list[dict[str, str]]:
    """Input series: every catalog series the checks read, as scraped every SCRAPE seconds."""
    scrapes = [i * SCRAPE for i in range(int(END // SCRAPE) + 1)]
    out = Series()
    n = len(scrapes)
    for r in ranks:
        ident = {"job_name": r.job, "rank": str(r.rank), "local_rank": "0", "node": r.node, "job": "otelprof",
                 "instance": f"{r.node}:9464"}
        for i, t in enumerate(scrapes):
            out.put(series_name(sc.PROCESS_START_TIME) + _labels(**ident), i, r.process_start, n)
            seen = [s for s in r.samples if s.t <= t]
            if r.samples and seen:
                hits_cpu = sum(max(s.cpu) > CONFIG.cpu_threshold and min(u for u, _ in s.gpus.values())
                               < CONFIG.gpu_threshold for s in seen)
                hits_io = sum(max(s.iowait) > CONFIG.io_threshold and min(u for u, _ in s.gpus.values())
                              < CONFIG.gpu_threshold for s in seen)
                for spec, value in ((sc.SAMPLER_SAMPLES, len(seen)), (sc.SAMPLER_CPU_BOTTLENECK, hits_cpu),
                                    (sc.SAMPLER_IO_BOTTLENECK, hits_io)):
                    out.put(series_name(spec) + _labels(**ident), i, value, n)
                _histogram(out, sc.NODE_CPU_UTILIZATION, ident, [sum(s.cpu) / len(s.cpu) for s in seen], i, n)
                for gpu in seen[-1].gpus:
                    gl = {**ident, "gpu": gpu, "hw_id": f"GPU-{r.rank}-{gpu}"}
                    _histogram(out, sc.GPU_UTILIZATION_DISTRIBUTION, gl, [s.gpus[gpu][0] for s in seen], i, n)
                    _histogram(out, sc.GPU_MEMORY_UTILIZATION_DISTRIBUTION, gl, [s.gpus[gpu][1] for s in seen], i, n)
                    out.put(series_name(sc.GPU_UTILIZATION) + _labels(**gl), i, seen[-1].gpus[gpu][0], n)
            memory = [s for s in seen if s.rss is not None] if r.samples and seen else []
            if memory:
                last = memory[-1]
                out.put(series_name(sc.PROCESS_MEMORY_USAGE) + _labels(**ident), i, last.rss, n)
                out.put(series_name(sc.SYSTEM_MEMORY_UTILIZATION) + _labels(**ident), i, last.memory, n)
                if last.container is not None:
                    out.put(series_name(sc.CONTAINER_MEMORY_WORKING_SET) + _labels(**ident), i, last.container[0], n)
                    out.put(series_name(sc.CONTAINER_MEMORY_LIMIT) + _labels(**ident), i, last.container[1], n)
            done = [s for s in r.steps if s.end <= t]
            if not done:
                continue
            pl = {**ident, "phase": "train"}
            # the recorder creates the outlier counters with the first step
            out.put(series_name(sc.STEP_OUTLIERS) + _labels(**pl), i, sum(1 for s in done if s.outlier), n)
            out.put(series_name(sc.STEP_OUTLIER_EXCESS) + _labels(**pl), i, math.fsum(s.excess for s in done), n)
            out.put(series_name(sc.STEP_FIRST_TIMESTAMP) + _labels(**ident), i, r.steps[0].start, n)
            out.put(series_name(sc.STEPS) + _labels(**pl), i, len(done), n)
            out.put(series_name(sc.STEP_LAST_TIMESTAMP) + _labels(**pl), i, done[-1].end, n)
            out.put(series_name(sc.STEP_DURATION, "sum") + _labels(**pl), i, sum(s.end - s.start for s in done), n)
            out.put(series_name(sc.STEP_DURATION, "count") + _labels(**pl), i, len(done), n)
            if any(s.collective for s in r.steps):
                out.put(series_name(sc.COLLECTIVE_DURATION, "sum") + _labels(**pl), i,
                        sum(s.collective for s in done), n)
            waited = [min(s.wait / (s.end - s.start), 1.0) for s in done if s.wait > 0]
            if waited:
                out.put(series_name(sc.DATALOADER_WAIT_RATIO, "sum") + _labels(**pl), i, sum(waited), n)
                out.put(series_name(sc.DATALOADER_WAIT_RATIO, "count") + _labels(**pl), i, len(waited), n)
            nonfinite = sum(1 for s in done if s.loss is not None and not math.isfinite(s.loss))
            if nonfinite:
                out.put(series_name(sc.NONFINITE) + _labels(**pl, scalar="loss"), i, nonfinite, n)
            finite = [s.loss for s in done if s.loss is not None and math.isfinite(s.loss)]
            if finite:
                out.put(series_name(sc.LOSS) + _labels(**pl), i, finite[-1], n)
                spike = list(map(LossSpikes().observe, finite))  # spikes are counted, and left out of the sums
                kept = [v for v, s in zip(finite, spike) if not s]
                out.put(series_name(sc.LOSS_SUMMED) + _labels(**pl), i, math.fsum(kept), n)
                out.put(series_name(sc.LOSS_SQUARED) + _labels(**pl), i, math.fsum(v * v for v in kept), n)
                out.put(series_name(sc.LOSS_RECORDED) + _labels(**pl), i, len(kept), n)
                out.put(series_name(sc.LOSS_SPIKES) + _labels(**pl), i, sum(spike), n)
            norms = [s.grad_norm for s in done if s.grad_norm is not None and math.isfinite(s.grad_norm)]
            if norms:
                out.put(series_name(sc.GRAD_NORM_SUMMED) + _labels(**pl), i, math.fsum(norms), n)
                out.put(series_name(sc.GRAD_NORM_RECORDED) + _labels(**pl), i, len(norms), n)
    return [{"series": key, "values": " ".join(values)} for key, values in out.values.items()]


def _histogram(out: Series, spec: sc.MetricSpec, labels: dict[str, str], values: list[float], i: int,
               n: int) -> None:
    counts = cumulative_counts(values, spec.buckets)
    for bound, count in zip([*spec.buckets, math.inf], counts):
        le = "+Inf" if math.isinf(bound) else repr(float(bound))
        out.put(series_name(spec, "bucket") + _labels(**labels, le=le), i, count, n)
    out.put(series_name(spec, "sum") + _labels(**labels), i, sum(values), n)
    out.put(series_name(spec, "count") + _labels(**labels), i, len(values), n)


def _subject_labels(alert: str, subject: str, ranks: Sequence[RankData]) -> dict[str, str]:
    words = subject.split()
    if words[0] == "job":
        return {"alertname": alert, "job_name": words[1]}
    rank = next(r for r in ranks if r.rank == int(words[1]))
    labels = {"alertname": alert, "job_name": rank.job, "rank": words[1]}
    rest = words[2:]
    if rest[:1] == ["gpu"]:
        labels["gpu"] = rest[1]
    elif rest:
        labels["phase"] = rest[0]
        if len(rest) > 1:
            labels["scalar"] = rest[1]
    return labels


def _fmt(seconds: float) -> str:
    return f"{int(seconds)}s"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_promtool_and_offline_evaluator_agree(scenario: str, tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    case = SCENARIOS[scenario]
    ranks, config = case.ranks(), case.config
    offline = checks.firing_at(ranks, config, SCRAPE, AT)
    fired = {(t, name) for t, pairs in offline.items() for name, _ in pairs}
    assert case.fires <= fired, sorted(fired)
    assert not case.quiet & fired, sorted(fired)
    names = "|".join(CONFIG_PREFIX + short for short in checks.OFFLINE_CHECKS)
    query = ('count by (alertname, job_name, rank, gpu, phase, scalar) '
             f'(ALERTS{{alertstate="firing", alertname=~"{names}"}})')
    expr_tests = []
    for t in AT:
        samples = [{"labels": _labels(**_subject_labels(name, subject, ranks)), "value": 1}
                   for name, subject in sorted(offline[t])]
        expr_tests.append({"expr": query, "eval_time": _fmt(t), "exp_samples": samples})
    (tmp_path / "alerts.yaml").write_text(render_alerts(config))
    (tmp_path / "rules.yaml").write_text(render_rules(config))  # several alerts read recorded series
    document: dict[str, Any] = {
        "rule_files": ["alerts.yaml", "rules.yaml"], "evaluation_interval": _fmt(SCRAPE),
        "group_eval_order": group_eval_order(config),
        "tests": [{"name": scenario, "interval": _fmt(SCRAPE), "input_series": exposition(ranks),
                   "promql_expr_test": expr_tests}],
    }
    (tmp_path / "twin_test.yaml").write_text(yamlout.dump(document))
    result = subprocess.run([promtool, "test", "rules", "twin_test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"live and offline verdicts differ:\n{result.stdout[-8000:]}{result.stderr[-2000:]}"


def test_offline_checks_on_a_real_recording(tmp_path: Path) -> None:
    """A recorded run with a NaN loss and input-bound steps: the evaluator reads it through the reader."""
    import time

    otelprof.init(job_name="recorded", record_dir=str(tmp_path), system_metrics=False)
    for i in range(60):
        with otelprof.step():
            with otelprof.annotate(sc.REGION_DATALOADER):
                time.sleep(0.004)
            time.sleep(0.001)
            otelprof.record("loss", math.nan if i == 50 else 1.0)
    session = otelprof.get_session()
    assert session is not None and session.run_dir is not None
    run_dir = session.run_dir.parent
    otelprof.shutdown()
    results = {r.alert: r for r in checks.evaluate(read_recording(run_dir), CONFIG, interval=1.0)}
    nonfinite = results["OtelprofNonFiniteValues"]
    assert nonfinite.triggered and nonfinite.subjects == ("rank 0 train loss",) and nonfinite.value == 1
    assert nonfinite.original == "ExplodingTensor" and ("window", "10m") in nonfinite.parameters
    assert results["OtelprofInputBound"].firing_evaluations == 0  # for: 1m is longer than the run
    assert not results["OtelprofCPUBottleneck"].triggered and results["OtelprofCPUBottleneck"].datapoints == 0
    assert results["OtelprofNonFiniteValues"].datapoints == 60
    quick = MixinConfig(input_bound_for="0s")
    assert {r.alert: r for r in checks.evaluate(read_recording(run_dir), quick, 1.0)}["OtelprofInputBound"].triggered


def test_each_group_of_checks_builds_the_conditions_it_lists() -> None:
    """``checks.GROUPS`` is the one list of offline groups: each builds a condition for exactly the checks it
    names, in that order, each the twin of an alert; OFFLINE_CHECKS and the results keep that order."""
    ranks = straggler_and_imbalance()
    ctx = CheckContext(ranks, CONFIG)
    listed: list[str] = []
    for group in checks.GROUPS:
        assert list(group.conditions(ctx)) == list(group.checks)
        listed += group.checks
    assert tuple(listed) == checks.OFFLINE_CHECKS and len(set(listed)) == len(listed)
    assert [a.short for a in alerts(CONFIG) if a.short in listed] == listed  # each an alert's, in runbook order
    assert [r.alert for r in checks.evaluate_ranks(ranks, CONFIG, 5.0)] == [CONFIG_PREFIX + s for s in listed]


def test_bucket_quantile_matches_prometheus_cases() -> None:
    bounds = (0.05, 0.1, 0.5, 1.0)
    assert bucket_quantile(0.5, bounds, [0, 0, 10, 10, 10]) == pytest.approx(0.3)
    assert bucket_quantile(0.99, bounds, [0, 0, 0, 0, 10]) == 1.0  # rank in +Inf: second-highest bound
    assert bucket_quantile(0.5, bounds, [10, 10, 10, 10, 10]) == pytest.approx(0.025)
    assert math.isnan(bucket_quantile(0.5, bounds, [0, 0, 0, 0, 0]))


def test_outliers_by_cost_per_token_and_never_steps_otelprof_slowed(tmp_path: Path) -> None:
    """A real recorded run of variable-length batches (20 ms + 0.5 ms per token), every 30th batch a long
    document of 512 tokens (7 x the median step, no slower per token), every 40th step a 300-ms loader stall, and
    a real operator-profiling window whose steps and the two after it are 300 ms slower (as otelprof's profiler
    and FLOP count make them). Delays are large beside a loaded machine's scheduling jitter. The recorder counts
    the stalls, not the long documents nor the slowed steps; the offline twin finds exactly the same outliers and
    costs from the recording."""
    import random
    import time

    from otelprof.analysis.run import RunView
    from otelprof.analysis.steps import profiled_windows, step_analysis
    from otelprof.integrations import torch_profiler

    rng = random.Random(3)
    otelprof.init(job_name="outliers", record_dir=str(tmp_path), system_metrics=False, outlier_min_steps=20,
                  profile_every=0)  # no periodic windows: only the one armed here
    session = otelprof.get_session()
    assert session is not None and session.run_dir is not None
    window = (60, 3)
    torch_profiler.windows.arm(*window)
    stalls, long_documents, slowed = set(), set(), set(range(60, 60 + 3 + 2))
    for n in range(200):
        tokens = 512 if n % 30 == 29 else rng.randint(16, 64)
        extra = 0.0
        if n % 40 == 39 and tokens < 512:  # (a stall in a long document's step is no slower per token)
            stalls.add(n)
            extra = 0.3
        if n in slowed:
            extra = 0.3
        if tokens == 512:
            long_documents.add(n)
        with otelprof.step():
            time.sleep(0.02 + 0.0005 * tokens + extra)
            otelprof.record("tokens", tokens)
            otelprof.record("loss", 1.0)
    deadline = time.monotonic() + 60
    windows = session.registry.counter(sc.PROFILE_WINDOWS)
    while not windows.values and time.monotonic() < deadline:  # the window's summary is written
        time.sleep(0.1)
    session.recorder.drain()
    live_count = session.recorder.step_outliers.values[("train",)]
    live_cost = session.recorder.step_outlier_excess.values[("train",)]
    run_dir = session.run_dir.parent
    otelprof.shutdown()

    recording = read_recording(run_dir)
    rank = recording.ranks[0]
    assert profiled_windows(rank) == {"train": [window]}
    listed = set(step_analysis(RunView(recording)).rows[0].outlier_steps)  # the report's list of outlier steps
    assert {n for n in stalls if n >= 20} <= listed and not listed & slowed
    settings = check_recording.OutlierSettings.of(rank.manifest.get("config") or {}, CONFIG)
    costs = check_recording.outlier_costs(rank, settings)
    numbers = list(rank.step_columns.number)
    flagged = {numbers[i] for i, cost in enumerate(costs[0]) if cost > 0}
    assert {n for n in stalls if n >= 20} <= flagged  # every stall once 20 steps were seen
    assert not flagged & long_documents and not flagged & slowed
    assert len(flagged) == live_count and math.fsum(costs[0]) == pytest.approx(live_cost)
