"""The alert rules' offline twin: the same checks, names and thresholds, evaluated on a recording.

The mixin's alerts (:mod:`otelprof.mixin.alerts`) run in Prometheus on counters and histograms
that the training process keeps per sample and per step; here the same conditions run on the
raw samples (``samples.jsonl``) and step records (``steps.jsonl``) of a recording, at a fixed
evaluation interval, with the same windows, warm-up and ``for`` durations. Quantiles use
Prometheus's ``histogram_quantile`` on the same 5 % buckets, so both sides agree.

The result speaks the report's vocabulary: whether a check triggered, how many evaluations
fired (SageMaker's "RuleTriggered"), how many datapoints it judged, and its parameters.
Telemetry-absence alerts have no offline meaning (the recording is the telemetry) and the
data-loader worker checks need framework gauges, so those are not evaluated here.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from otelprof import semconv as sc
from otelprof.analysis.histogram import bucket_quantile, cumulative_counts
from otelprof.mixin.alerts import Alert, alerts
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.recording.reader import RankRecording, Recording
from otelprof.sampling import OutlierDetector

BUCKETS = sc.RATIO_BUCKETS


@dataclass(frozen=True)
class Sample:
    """One node sample: busy and iowait ratio per CPU, (utilization, memory ratio) per GPU."""

    t: float
    cpu: tuple[float, ...]
    iowait: tuple[float, ...] = ()
    gpus: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    summary: tuple[float, float, float | None] | None = None
    """(max busy, mean busy, max iowait) when the per-CPU values were not kept (long recordings)."""

    def busy_max(self, io: bool) -> float | None:
        if self.summary is not None:
            return self.summary[2] if io else self.summary[0]
        values = self.iowait if io else self.cpu
        return max(values) if values else None

    def busy_mean(self) -> float | None:
        if self.summary is not None:
            return self.summary[1]
        return sum(self.cpu) / len(self.cpu) if self.cpu else None


@dataclass(frozen=True)
class StepRecord:
    phase: str
    start: float
    end: float
    wait: float = 0.0
    """Seconds in data-loader regions."""
    collective: float = 0.0
    loss: float | None = None
    grad_norm: float | None = None
    outlier: bool = False


@dataclass
class RankData:
    """What the checks need from one training process."""

    job: str
    rank: int
    node: str
    process_start: float
    end: float
    samples: list[Sample] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def subject(self) -> str:
        return f"rank {self.rank}"


@dataclass(frozen=True)
class Firing:
    subject: str
    value: float


@dataclass(frozen=True)
class CheckResult:
    alert: str
    original: str
    severity: str
    triggered: bool
    evaluations: int
    firing_evaluations: int
    """Evaluations at which the alert was firing (the report's "triggered N times")."""
    datapoints: int
    first_fired: float | None
    value: float | None
    """The alert's value when it first fired."""
    subjects: tuple[str, ...]
    parameters: tuple[tuple[str, str], ...]


Condition = Callable[[float], list[Firing]]


class _Window:
    """Items sorted by time; ``between(a, b)`` = those with a < t <= b (the rules' windows)."""

    def __init__(self, items: Sequence[object], times: Sequence[float]) -> None:
        self.items = items
        self.times = list(times)

    def between(self, start: float, end: float) -> Sequence[object]:
        return self.items[bisect.bisect_right(self.times, start):bisect.bisect_right(self.times, end)]


def _quantile(q: float, values: Iterable[float]) -> float:
    return bucket_quantile(q, BUCKETS, cumulative_counts(values, BUCKETS))


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


class _Checks:
    def __init__(self, ranks: list[RankData], config: MixinConfig) -> None:
        self.ranks = ranks
        self.c = config
        self.w = seconds(config.window)
        self.patience = seconds(config.patience)
        self.samples = {id(r): _Window(r.samples, [s.t for s in r.samples]) for r in ranks}
        self.steps = {id(r): _Window(r.steps, [s.end for s in r.steps]) for r in ranks}

    def warm(self, rank: RankData, t: float) -> bool:
        return t - rank.process_start > self.patience

    def alive(self, rank: RankData, t: float) -> bool:
        return rank.process_start <= t <= rank.end

    def window(self, rank: RankData, t: float, width: float, offset: float = 0.0) -> list[Sample]:
        return list(self.samples[id(rank)].between(t - offset - width, t - offset))  # type: ignore[arg-type]

    def step_window(self, rank: RankData, t: float, width: float, offset: float = 0.0) -> list[StepRecord]:
        return list(self.steps[id(rank)].between(t - offset - width, t - offset))  # type: ignore[arg-type]

    def gpu_values(self, samples: Sequence[Sample], index: int) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for s in samples:
            for gpu, pair in s.gpus.items():
                if pair[index] is not None:
                    out.setdefault(gpu, []).append(float(pair[index]))  # type: ignore[arg-type]
        return out

    # ---------------------------------------------------------------- system
    def bottleneck(self, io: bool) -> Condition:
        threshold = self.c.io_bottleneck_threshold if io else self.c.cpu_bottleneck_threshold
        high = self.c.io_threshold if io else self.c.cpu_threshold

        def hit(s: Sample) -> bool:
            peak = s.busy_max(io)
            low = [u for u, _ in s.gpus.values() if u is not None]
            return peak is not None and peak > high and bool(low) and min(low) < self.c.gpu_threshold

        def condition(t: float) -> list[Firing]:
            out = []
            for r in self.ranks:
                window = self.window(r, t, self.w)
                if window and self.warm(r, t) and self.alive(r, t):
                    fraction = sum(hit(s) for s in window) / len(window)
                    if fraction > threshold:
                        out.append(Firing(r.subject, fraction))
            return out
        return condition

    def gpu_quantiles(self, kind: str) -> Condition:
        c = self.c

        def condition(t: float) -> list[Firing]:
            out = []
            for r in self.ranks:
                if not (self.warm(r, t) and self.alive(r, t)):
                    continue
                window = self.window(r, t, self.w)
                util, mem = self.gpu_values(window, 0), self.gpu_values(window, 1)
                node_cpu = [m for m in map(Sample.busy_mean, window) if m is not None]
                for gpu, values in sorted(util.items()):
                    if max(values) <= 0:
                        continue  # never busy: an unused device
                    p95, p5 = _quantile(0.95, values), _quantile(0.05, values)
                    subject = f"{r.subject} gpu {gpu}"
                    if kind == "under" and p95 < c.low_gpu_threshold_p95:
                        out.append(Firing(subject, p95))
                    elif kind == "fluctuating" and p5 < c.low_gpu_threshold_p5 and p95 > c.low_gpu_threshold_p95:
                        out.append(Firing(subject, p5))
                    elif (kind == "batch" and p95 < c.batch_size_gpu_threshold_p95 and mem.get(gpu)
                          and _quantile(0.95, mem[gpu]) < c.batch_size_gpu_memory_threshold_p95
                          and node_cpu and _quantile(0.95, node_cpu) < c.batch_size_cpu_threshold_p95):
                        out.append(Firing(subject, p95))
            return out
        return condition

    def memory_increase(self, t: float) -> list[Firing]:
        m = seconds(self.c.gpu_memory_increase_window)
        out = []
        for r in self.ranks:
            if not (self.warm(r, t) and self.alive(r, t)):
                continue
            now = self.gpu_values(self.window(r, t, m), 1)
            before = self.gpu_values(self.window(r, t, m, offset=m), 1)
            for gpu in sorted(now):
                if before.get(gpu):
                    increase = _mean(now[gpu]) - _mean(before[gpu])
                    if increase > self.c.gpu_memory_increase:
                        out.append(Firing(f"{r.subject} gpu {gpu}", increase))
        return out

    def memory_capacity(self, t: float) -> list[Firing]:
        width = seconds(self.c.gpu_memory_capacity_window)
        out = []
        for r in self.ranks:
            if self.alive(r, t):
                for gpu, values in sorted(self.gpu_values(self.window(r, t, width), 1).items()):
                    if _mean(values) > self.c.gpu_memory_capacity_threshold:
                        out.append(Firing(f"{r.subject} gpu {gpu}", _mean(values)))
        return out

    def load_imbalance(self, t: float) -> list[Firing]:
        out = []
        for job, ranks in _by_job(self.ranks).items():
            live = [r for r in ranks if self.alive(r, t)]
            if not live or not all(self.warm(r, t) for r in live):
                continue
            means = [_mean(v) for r in live for v in self.gpu_values(self.window(r, t, self.w), 0).values()]
            if len(means) > 1 and max(means) - min(means) > self.c.load_balancing_threshold:
                out.append(Firing(f"job {job}", max(means) - min(means)))
        return out

    # ---------------------------------------------------------------- steps
    def straggler(self, t: float) -> list[Firing]:
        width = seconds(self.c.straggler_window)
        out = []
        for ranks in _by_job(self.ranks).values():
            compute: dict[tuple[str, int], float] = {}
            for r in ranks:
                if not self.alive(r, t):
                    continue
                for phase, steps in _by_phase(self.step_window(r, t, width)).items():
                    compute[(phase, r.rank)] = sum(s.end - s.start - s.collective for s in steps) / len(steps)
            for phase in sorted({p for p, _ in compute}):
                values = {rank: v for (p, rank), v in compute.items() if p == phase}
                if len(values) > 1:
                    median = statistics.median(values.values())
                    for rank, value in sorted(values.items()):
                        if median > 0 and value / median > self.c.straggler_ratio:
                            out.append(Firing(f"rank {rank} {phase}", value / median))
        return out

    def outliers(self, t: float) -> list[Firing]:
        width = seconds(self.c.step_outlier_window)
        out = []
        for r in self.ranks:
            for phase, steps in _by_phase(self.step_window(r, t, width)).items():
                count = sum(s.outlier for s in steps)
                if (count > self.c.step_outlier_n_outliers and len(steps) > self.c.step_outlier_min_steps
                        and count > self.c.step_outlier_min_share * len(steps)):
                    out.append(Firing(f"{r.subject} {phase}", count))
        return out

    def slow_initialization(self, t: float) -> list[Firing]:
        limit = seconds(self.c.max_initialization_time)
        out = []
        for r in self.ranks:
            first = r.steps[0].end if r.steps else math.inf
            if self.alive(r, t) and t - r.process_start > limit and first > t:
                out.append(Firing(r.subject, t - r.process_start))
        return out

    def input_bound(self, t: float) -> list[Firing]:
        width = seconds(self.c.input_bound_window)
        out = []
        for r in self.ranks:
            for phase, steps in _by_phase(self.step_window(r, t, width)).items():
                ratios = [min(s.wait / (s.end - s.start), 1.0) for s in steps if s.wait > 0 and s.end > s.start]
                if ratios and _mean(ratios) > self.c.input_bound_threshold:
                    out.append(Firing(f"{r.subject} {phase}", _mean(ratios)))
        return out

    # ---------------------------------------------------------------- training
    def _losses(self, steps: Iterable[StepRecord], phase: str) -> list[float]:
        return [s.loss for s in steps if s.phase == phase and s.loss is not None and math.isfinite(s.loss)]

    def loss_not_decreasing(self, t: float) -> list[Firing]:
        lw = seconds(self.c.loss_window)
        out = []
        for r in self.ranks:
            if t - r.process_start <= 2 * lw or not self.alive(r, t):
                continue
            now = self._losses(self.step_window(r, t, lw), self.c.train_phase)
            before = self._losses(self.step_window(r, t, lw, offset=lw), self.c.train_phase)
            if now and before:
                mean_now, mean_before = _mean(now), _mean(before)
                if mean_now > mean_before - self.c.loss_diff_percent / 100 * abs(mean_before):
                    out.append(Firing(r.subject, mean_now))
        return out

    def nonfinite(self, t: float) -> list[Firing]:
        width = seconds(self.c.nonfinite_window)
        out: list[Firing] = []
        for r in self.ranks:
            counts: dict[str, int] = {}
            for s in self.step_window(r, t, width):
                for name, value in (("loss", s.loss), ("grad_norm", s.grad_norm)):
                    if value is not None and not math.isfinite(value):
                        key = f"{r.subject} {s.phase} {name}"
                        counts[key] = counts.get(key, 0) + 1
            out.extend(Firing(k, v) for k, v in sorted(counts.items()))
        return out

    def vanishing(self, t: float) -> list[Firing]:
        width = seconds(self.c.vanishing_gradient_window)
        out = []
        for r in self.ranks:
            steps = [s for s in self.step_window(r, t, width) if s.phase == self.c.train_phase]
            norms = [s.grad_norm for s in steps if s.grad_norm is not None and math.isfinite(s.grad_norm)]
            if steps and norms and max(norms) < self.c.vanishing_gradient_threshold:
                out.append(Firing(r.subject, max(norms)))
        return out

    def stalled(self, t: float) -> list[Firing]:
        limit = seconds(self.c.stalled_training_threshold)
        out = []
        for r in self.ranks:
            ends = self.steps[id(r)].times
            i = bisect.bisect_right(ends, t)
            if i and self.alive(r, t) and t - ends[i - 1] > limit:
                out.append(Firing(r.subject, t - ends[i - 1]))
        return out

    def _held_mean(self, r: RankData, t: float, width: float, phase: str) -> float | None:
        """Mean of a loss gauge over the window: the window's values, else the last one before (held)."""
        window = self._losses(self.step_window(r, t, width), phase)
        if window:
            return _mean(window)
        index = bisect.bisect_right(self.steps[id(r)].times, t - width)
        for i in range(index - 1, -1, -1):
            step = r.steps[i]
            if step.phase == phase and step.loss is not None and math.isfinite(step.loss):
                return step.loss
        return None

    def overfit(self, t: float) -> list[Firing]:
        width = seconds(self.c.overfit_window)
        out = []
        for r in self.ranks:
            if not self.alive(r, t):
                continue
            train = self._held_mean(r, t, width, self.c.train_phase)
            evaluation = self._held_mean(r, t, width, self.c.eval_phase)
            if train and evaluation is not None and train > 0:
                ratio = (evaluation - train) / train
                if ratio > self.c.overfit_ratio_threshold:
                    out.append(Firing(r.subject, ratio))
        return out

    def conditions(self) -> dict[str, tuple[Condition, int]]:
        """Condition and datapoint count per alert short name."""
        samples = sum(len(r.samples) for r in self.ranks)
        steps = sum(len(r.steps) for r in self.ranks)
        return {
            "CPUBottleneck": (self.bottleneck(io=False), samples),
            "IOBottleneck": (self.bottleneck(io=True), samples),
            "GPUUnderutilized": (self.gpu_quantiles("under"), samples),
            "GPUUtilizationFluctuating": (self.gpu_quantiles("fluctuating"), samples),
            "BatchSizeTooSmall": (self.gpu_quantiles("batch"), samples),
            "GPUMemoryIncrease": (self.memory_increase, samples),
            "GPUMemoryNearCapacity": (self.memory_capacity, samples),
            "GPULoadImbalance": (self.load_imbalance, samples),
            "RankStraggler": (self.straggler, steps),
            "StepOutliers": (self.outliers, steps),
            "SlowInitialization": (self.slow_initialization, steps),
            "InputBound": (self.input_bound, steps),
            "LossNotDecreasing": (self.loss_not_decreasing, steps),
            "NonFiniteValues": (self.nonfinite, steps),
            "VanishingGradients": (self.vanishing, steps),
            "TrainingStalled": (self.stalled, steps),
            "Overfitting": (self.overfit, steps),
        }


OFFLINE_CHECKS = ("CPUBottleneck", "IOBottleneck", "GPUUnderutilized", "GPUUtilizationFluctuating",
                  "BatchSizeTooSmall", "GPUMemoryIncrease", "GPUMemoryNearCapacity", "GPULoadImbalance",
                  "RankStraggler", "StepOutliers", "SlowInitialization", "InputBound", "LossNotDecreasing",
                  "NonFiniteValues", "VanishingGradients", "TrainingStalled", "Overfitting")
"""Alerts (names without the prefix) that have an offline twin."""


def _by_job(ranks: Iterable[RankData]) -> dict[str, list[RankData]]:
    out: dict[str, list[RankData]] = {}
    for r in ranks:
        out.setdefault(r.job, []).append(r)
    return out


def _by_phase(steps: Iterable[StepRecord]) -> dict[str, list[StepRecord]]:
    out: dict[str, list[StepRecord]] = {}
    for s in steps:
        out.setdefault(s.phase, []).append(s)
    return out


def evaluate_ranks(ranks: list[RankData], config: MixinConfig | None = None, interval: float = 10.0,
                   start: float | None = None, end: float | None = None) -> list[CheckResult]:
    """Evaluate every offline-capable check every ``interval`` seconds from ``start`` to ``end``."""
    config = config or MixinConfig()
    if not ranks:
        return []
    start = min(r.process_start for r in ranks) if start is None else start
    end = max(r.end for r in ranks) if end is None else end
    times = [start + i * interval for i in range(int((end - start) // interval) + 1)]
    if times[-1] < end:
        times.append(end)  # judge the recording's last data too
    checks = _Checks(ranks, config)
    by_short = {a.short: a for a in alerts(config)}
    results = []
    for short, (condition, datapoints) in checks.conditions().items():
        alert = by_short.get(short)
        if alert is None:  # disabled in the config
            continue
        results.append(_run(alert, condition, datapoints, times))
    return results


def firing_at(ranks: list[RankData], config: MixinConfig, interval: float, at: Sequence[float],
              start: float = 0.0) -> dict[float, set[tuple[str, str]]]:
    """(alert name, subject) pairs firing at each time of ``at`` (evaluating every ``interval`` from ``start``)."""
    checks = _Checks(ranks, config)
    by_short = {a.short: a for a in alerts(config)}
    last = max(at)
    times = [start + i * interval for i in range(int((last - start) // interval) + 1)]
    out: dict[float, set[tuple[str, str]]] = {t: set() for t in at}
    for short, (condition, _) in checks.conditions().items():
        alert = by_short.get(short)
        if alert is None:
            continue
        for t, firing in _states(alert, condition, times):
            if t in out:
                out[t] |= {(alert.name, f.subject) for f in firing}
    return out


def _states(alert: Alert, condition: Condition, times: Sequence[float]) -> Iterable[tuple[float, list[Firing]]]:
    """Prometheus's pending -> firing logic: a subject fires once its condition held for ``for``."""
    hold = seconds(alert.for_)
    active: dict[str, float] = {}
    for t in times:
        current = {f.subject: f for f in condition(t)}
        active = {s: active.get(s, t) for s in current}
        yield t, [current[s] for s in sorted(current) if t - active[s] >= hold]


def _run(alert: Alert, condition: Condition, datapoints: int, times: Sequence[float]) -> CheckResult:
    firing_evaluations = 0
    first: float | None = None
    value: float | None = None
    subjects: set[str] = set()
    for t, firing in _states(alert, condition, times):
        if firing:
            firing_evaluations += 1
            subjects |= {f.subject for f in firing}
            if first is None:
                first, value = t, firing[0].value
    return CheckResult(alert.name, alert.runbook.original, alert.severity, first is not None, len(times),
                       firing_evaluations, datapoints, first, value, tuple(sorted(subjects)),
                       alert.runbook.thresholds)


# -------------------------------------------------------------------- from a recording

def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _samples(rank: RankRecording) -> list[Sample]:
    """Node samples from the reader's columns: per-CPU maxima and means, not 64-value tuples."""
    columns = rank.sample_columns()
    gpu_columns = [(str(index), g.get("u"), g.get("mu"), g.get("mt")) for index, g in columns.gpus.items()]
    samples = []
    for i, (t_ns, cpu_max) in enumerate(zip(columns.t_ns, columns.cpu_max)):
        if math.isnan(cpu_max):
            continue  # a process-only sample: this rank does not sample the node
        gpus: dict[str, tuple[float | None, float | None]] = {}
        for index, util, used, total in gpu_columns:
            u = _number(util[i]) if util is not None else None
            mu = _number(used[i]) if used is not None else None
            mt = _number(total[i]) if total is not None else None
            if u is None and mu is None:
                continue  # the GPU was not in this sample
            gpus[index] = (u, mu / mt if mu is not None and mt else None)
        samples.append(Sample(t_ns / 1e9, (), (), gpus,
                              (cpu_max, columns.cpu_mean[i], _number(columns.iow_max[i]))))
    return samples


def rank_data(rank: RankRecording) -> RankData:
    """The checks' view of one rank's recording."""
    manifest = rank.manifest
    resource = manifest.get("resource") or {}
    config = manifest.get("config") or {}
    life = rank.lifecycle
    detectors: dict[str, OutlierDetector] = {}
    # From the reader's columns: a million Step objects with their annotations would cost ~25 s here.
    columns = rank.step_columns
    waits = columns.annotation_sums(sc.REGION_DATALOADER)
    collectives = columns.annotation_sums(sc.REGION_COLLECTIVE)
    losses = dict(zip(*columns.scalar("loss")))
    norms = dict(zip(*columns.scalar("grad_norm")))
    steps = []
    for i, (code, start_ns, duration_ns) in enumerate(zip(columns.phase, columns.start_ns, columns.duration_ns)):
        phase = columns.phase_names[code]
        detector = detectors.get(phase)
        if detector is None:
            detector = detectors[phase] = OutlierDetector(float(config.get("outlier_sigma", 3)),
                                                          int(config.get("outlier_min_steps", 20)))
        steps.append(StepRecord(phase, start_ns / 1e9, (start_ns + duration_ns) / 1e9, waits[i] / 1e9,
                                collectives[i] / 1e9, losses.get(i), norms.get(i),
                                detector.observe(duration_ns / 1e9)))
    samples = _samples(rank)
    times = [x for x in (life.get("shutdown"), life.get("last_step_end"),
                         samples[-1].t if samples else None) if x is not None]
    start = float(life.get("process_start") or (steps[0].start if steps else samples[0].t if samples else 0.0))
    return RankData(str(resource.get(sc.SERVICE_NAME, "")), rank.rank,
                    str(resource.get(sc.K8S_NODE_NAME) or resource.get(sc.HOST_NAME, "")), start,
                    max(times) if times else start, samples, steps)


def evaluate(recording: Recording, config: MixinConfig | None = None, interval: float = 10.0) -> list[CheckResult]:
    """Every offline-capable alert check on a recording (all ranks)."""
    return evaluate_ranks([rank_data(r) for r in recording.ranks], config, interval)
