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
import dataclasses
import math
import operator
import statistics
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, compress, repeat

from otelprof import collectives, thresholds
from otelprof import semconv as sc
from otelprof.analysis.histogram import bucket_quantile
from otelprof.analysis.steps import profiled_windows
from otelprof.mixin.alerts import Alert, alerts
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.outliers import LossSpikes, StepJudge, in_windows
from otelprof.recording.columns import group_indexes
from otelprof.recording.ranks import RankRecording, Recording

BUCKETS = sc.RATIO_BUCKETS


@dataclass(frozen=True)
class Sample:
    """One node sample: busy and iowait ratio per CPU, (utilization, memory ratio) per GPU."""

    t: float
    cpu: tuple[float, ...]
    iowait: tuple[float, ...] = ()
    gpus: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    rss: float | None = None
    """The process's resident memory (bytes)."""
    memory: float | None = None
    """The host's used memory ratio."""
    container: tuple[float, float | None] | None = None
    """The container's working set and memory limit (None: no limit), bytes."""

    def busy_max(self, io: bool) -> float | None:
        values = self.iowait if io else self.cpu
        return max(values) if values else None

    def busy_mean(self) -> float | None:
        return sum(self.cpu) / len(self.cpu) if self.cpu else None


@dataclass(frozen=True)
class StepRecord:
    phase: str
    start: float
    end: float
    wait: float = 0.0
    """Seconds in data-loader regions."""
    collective: float = 0.0
    """Seconds of exposed communication (collective time the backward pass did not overlap)."""
    loss: float | None = None
    grad_norm: float | None = None
    outlier: bool = False
    excess: float = 0.0
    """Seconds an outlier step took beyond the median of its phase's recent steps (what it cost)."""


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
    sample_table: SampleTable | None = None
    """The samples as columns (made from ``samples`` when not given)."""
    step_table: StepTable | None = None
    """The steps as columns (made from ``steps`` when not given)."""
    first_step: float | None = None
    """When the first step began (Unix seconds; from ``steps`` when not given)."""

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


class _Series:
    """Values at sorted times; a window is the index range of ``start < t <= end`` (the rules' windows).

    For quantiles each value's ratio-bucket index is computed once (on first use), so a window's
    ``histogram_quantile`` counts bytes instead of re-bucketing every value."""

    __slots__ = ("times", "values", "_buckets", "_positive", "_sums", "_squares")

    def __init__(self, times: Iterable[float], values: Iterable[float]) -> None:
        self.times = array("d", times)
        self.values = array("d", values)
        self._buckets: bytes | None = None
        self._positive: array[int] | None = None
        self._sums: array[float] | None = None
        self._squares: array[float] | None = None

    def __len__(self) -> int:
        return len(self.times)

    def span(self, start: float, end: float) -> tuple[int, int]:
        return bisect.bisect_right(self.times, start), bisect.bisect_right(self.times, end)

    def mean(self, i: int, j: int) -> float:
        return sum(self.values[i:j]) / (j - i)

    def moments(self, i: int, j: int) -> tuple[int, float, float]:
        """Count, sum and sum of squares of the window's values (running totals, as the live series are)."""
        if self._sums is None or self._squares is None:
            self._sums = array("d", accumulate(self.values, initial=0.0))
            self._squares = array("d", accumulate(map(operator.mul, self.values, self.values), initial=0.0))
        return j - i, self._sums[j] - self._sums[i], self._squares[j] - self._squares[i]

    def any_positive(self, i: int, j: int) -> bool:
        if self._positive is None:
            self._positive = array("q", accumulate(map((0.0).__lt__, self.values), initial=0))
        return self._positive[j] > self._positive[i]

    def quantile(self, q: float, i: int, j: int) -> float:
        if self._buckets is None:
            self._buckets = bytes(map(partial(bisect.bisect_left, BUCKETS), self.values))
        window = self._buckets[i:j]
        return bucket_quantile(q, BUCKETS, list(accumulate(map(window.count, range(len(BUCKETS) + 1)))))


_EMPTY = _Series((), ())


@dataclass(frozen=True)
class SampleTable:
    """One rank's node samples as the checks read them: per-sample hits, per-GPU series."""

    times: array[float]
    cpu_hits: array[int]
    """Running count of samples that were CPU-bottleneck coincidences (``cpu_hits[i]`` = before sample i)."""
    io_hits: array[int]
    cpu_mean: _Series
    """Mean busy share over the node's CPUs, where known."""
    util: dict[str, _Series]
    memory: dict[str, _Series]
    """GPU memory used / total."""
    rss: _Series = _EMPTY
    """The process's resident memory, from every sample of the rank (node samples or not)."""
    host_memory: _Series = _EMPTY
    """The host's used memory ratio."""
    container_memory: _Series = _EMPTY
    """The container's working set (bytes)."""
    container_limit: _Series = _EMPTY
    """The container's memory limit (bytes), where it has one."""

    @staticmethod
    def build(times: Sequence[float], busy_max: Sequence[float], busy_mean: Sequence[float],
              iowait_max: Sequence[float], util: dict[str, Sequence[float]], memory: dict[str, Sequence[float]],
              config: MixinConfig, rss: tuple[Sequence[float], Sequence[float]] = ((), ()),
              host_memory: Sequence[float] = (), container_memory: Sequence[float] = (),
              container_limit: Sequence[float] = ()) -> SampleTable:
        """From per-sample columns, NaN where a sample lacks a value; ``rss`` as (times, values) of every sample."""
        lowest = _LowestGPU(list(util.values()))

        def hits(peaks: Sequence[float], high: float) -> array[int]:
            hit = map(lowest.below, map(high.__lt__, peaks), range(len(peaks)), repeat(config.gpu_threshold))
            return array("q", accumulate(hit, initial=0))

        def series(values: Sequence[float]) -> _Series:
            known = list(map(operator.eq, values, values))  # not NaN
            return _Series(compress(times, known), compress(values, known))

        def known(t: Sequence[float], values: Sequence[float]) -> _Series:
            keep = list(map(operator.eq, values, values))
            return _Series(compress(t, keep), compress(values, keep)) if any(keep) else _EMPTY

        return SampleTable(array("d", times), hits(busy_max, config.cpu_threshold),
                           hits(iowait_max, config.io_threshold), series(busy_mean),
                           {g: series(v) for g, v in util.items()}, {g: series(v) for g, v in memory.items()},
                           known(*rss), known(times, host_memory), known(times, container_memory),
                           known(times, container_limit))

    @staticmethod
    def from_samples(samples: Sequence[Sample], config: MixinConfig) -> SampleTable:
        gpus = sorted({g for s in samples for g in s.gpus})

        def column(values: Iterable[float | None]) -> list[float]:
            return [math.nan if v is None else float(v) for v in values]

        util = {g: column(s.gpus[g][0] if g in s.gpus else None for s in samples) for g in gpus}
        memory = {g: column(s.gpus[g][1] if g in s.gpus else None for s in samples) for g in gpus}
        return SampleTable.build([s.t for s in samples], column(s.busy_max(False) for s in samples),
                                 column(s.busy_mean() for s in samples), column(s.busy_max(True) for s in samples),
                                 {g: v for g, v in util.items() if any(map(operator.eq, v, v))},
                                 {g: v for g, v in memory.items() if any(map(operator.eq, v, v))}, config,
                                 ([s.t for s in samples], column(s.rss for s in samples)),
                                 column(s.memory for s in samples),
                                 column(s.container[0] if s.container else None for s in samples),
                                 column(s.container[1] if s.container else None for s in samples))

    def span(self, start: float, end: float) -> tuple[int, int]:
        return bisect.bisect_right(self.times, start), bisect.bisect_right(self.times, end)


class _LowestGPU:
    """The least busy GPU of a sample, computed only for samples that need it (a CPU above threshold)."""

    def __init__(self, util: list[Sequence[float]]) -> None:
        self.util = util

    def below(self, busy: bool, index: int, low: float) -> bool:
        """One bottleneck coincidence: ``busy`` (a CPU or iowait above its threshold) while a GPU is below ``low``."""
        return busy and any(u[index] < low for u in self.util)  # NaN compares False


@dataclass(frozen=True)
class PhaseSteps:
    """One phase's steps of one rank, by end time."""

    ends: array[float]
    compute: array[float]
    """Step time minus the time gradient all-reduces were in flight."""
    outliers: array[int]
    """Running count of the steps the recorder's outlier judge flagged (``outliers[i]`` = before step i)."""
    excess: array[float]
    """Running total of what those steps cost: seconds beyond the median step."""
    busy: array[float]
    """Running total of the step durations."""
    spikes: array[int]
    """Running count of loss spikes, by the index of the phase's finite losses (``losses``)."""
    trend: _Series
    """The finite losses without the spikes: what the loss means judge (as the live sums hold them)."""
    inputs: _Series
    """Share of the step spent waiting for data, for steps that waited."""
    losses: _Series
    """Finite losses."""
    norms: _Series
    """Finite gradient norms."""
    bad_losses: array[float]
    """End times of steps with a non-finite loss."""
    bad_norms: array[float]

    def span(self, start: float, end: float) -> tuple[int, int]:
        return bisect.bisect_right(self.ends, start), bisect.bisect_right(self.ends, end)


@dataclass(frozen=True)
class StepTable:
    """One rank's steps as the checks read them: every end time, and per phase columns."""

    ends: array[float]
    phases: dict[str, PhaseSteps]

    def __len__(self) -> int:
        return len(self.ends)

    @staticmethod
    def build(phase_names: Sequence[str], phase: Sequence[int], start: Sequence[float], end: Sequence[float],
              wait: Sequence[float], collective: Sequence[float], outliers: Mapping[int, Sequence[float]],
              losses: tuple[Sequence[int], Sequence[float]], norms: tuple[Sequence[int], Sequence[float]]) -> StepTable:
        """From per-step columns (``phase`` codes into ``phase_names``), per-phase outlier costs in step order
        (seconds beyond the median step, 0 for a step that is no outlier), and the sparse (step index, value)
        pairs of losses and gradient norms."""
        phases = {}
        by_phase = group_indexes(phase)  # one pass for every phase: a phase per step costs no more
        loss_by_phase, norm_by_phase = _by_phase(phase, losses[0]), _by_phase(phase, norms[0])
        for code, name in enumerate(phase_names):
            mask = by_phase.get(code)  # the phase's steps
            if not mask:
                continue
            starts, ends = list(map(start.__getitem__, mask)), list(map(end.__getitem__, mask))
            waits = list(map(wait.__getitem__, mask))
            waited = [w > 0 and e > s for s, e, w in zip(starts, ends, waits)]
            ratios = [min(w / (e - s), 1.0) for s, e, w in zip(compress(starts, waited), compress(ends, waited),
                                                                   compress(waits, waited))]
            loss_values, bad_losses = _scalar_series(loss_by_phase.get(code, ()), end, *losses)
            norm_values, bad_norms = _scalar_series(norm_by_phase.get(code, ()), end, *norms)
            durations = list(map(operator.sub, ends, starts))
            compute = map(operator.sub, durations, map(collective.__getitem__, mask))
            excess = outliers.get(code) or [0.0] * len(ends)
            spike = list(map(LossSpikes().observe, loss_values.values))
            kept = list(map(operator.not_, spike))
            phases[name] = PhaseSteps(
                array("d", ends), array("d", compute),
                array("q", accumulate(map((0.0).__lt__, excess), initial=0)),
                array("d", accumulate(excess, initial=0.0)), array("d", accumulate(durations, initial=0.0)),
                array("q", accumulate(spike, initial=0)),
                _Series(compress(loss_values.times, kept), compress(loss_values.values, kept)),
                _Series(compress(ends, waited), ratios), loss_values, norm_values, bad_losses, bad_norms)
        return StepTable(array("d", end), phases)

    @staticmethod
    def from_records(steps: Sequence[StepRecord]) -> StepTable:
        names = list(dict.fromkeys(s.phase for s in steps))
        codes = [names.index(s.phase) for s in steps]
        outliers: dict[int, list[float]] = {}
        for code, s in zip(codes, steps):
            outliers.setdefault(code, []).append(s.excess if s.outlier else 0.0)
        losses = [(i, s.loss) for i, s in enumerate(steps) if s.loss is not None]
        norms = [(i, s.grad_norm) for i, s in enumerate(steps) if s.grad_norm is not None]
        return StepTable.build(names, codes, [s.start for s in steps], [s.end for s in steps], [s.wait for s in steps],
                               [s.collective for s in steps], outliers,
                               ([i for i, _ in losses], [v for _, v in losses]),
                               ([i for i, _ in norms], [v for _, v in norms]))


def _by_phase(phase: Sequence[int], index: Sequence[int]) -> dict[int, list[int]]:
    """Per phase code: the positions in ``index`` (a scalar's step indexes) of its steps."""
    return group_indexes(map(phase.__getitem__, index))


def _scalar_series(mine: Sequence[int], end: Sequence[float], index: Sequence[int],
                   values: Sequence[float]) -> tuple[_Series, array[float]]:
    """A scalar's finite values of one phase (``mine``: their positions in ``index``) by step end time, and the
    end times of its non-finite values."""
    ends = [end[index[k]] for k in mine]
    mine_values = list(map(values.__getitem__, mine))
    finite = list(map(math.isfinite, mine_values))
    return (_Series(compress(ends, finite), compress(mine_values, finite)),
            array("d", compress(ends, map(operator.not_, finite))))


FEW_PHASES = 16
"""Up to this many phases per rank, the step checks look at each phase's steps in every window."""


class _Checks:
    def __init__(self, ranks: list[RankData], config: MixinConfig) -> None:
        self.ranks = ranks
        self.c = config
        self.w = seconds(config.window)
        self.patience = seconds(config.patience)
        self.samples = {id(r): r.sample_table or SampleTable.from_samples(r.samples, config) for r in ranks}
        self.steps = {id(r): r.step_table or StepTable.from_records(r.steps) for r in ranks}
        self.first_steps = {id(r): r.first_step if r.first_step is not None else
                            min((s.start for s in r.steps), default=None) for r in ranks}
        self.judged: set[str] = set()
        """Checks that compared something with their threshold at least once (past warm-up, with data)."""
        self._phase_indexes: dict[int, tuple[list[float], list[int], list[tuple[str, PhaseSteps]]]] = {}
        self._nonfinite: dict[int, list[tuple[str, PhaseSteps]]] = {}

    def warm(self, rank: RankData, t: float) -> bool:
        return t - rank.process_start > self.patience

    def alive(self, rank: RankData, t: float) -> bool:
        return rank.process_start <= t <= rank.end

    def gpu_windows(self, series: dict[str, _Series], start: float, end: float) -> dict[str, tuple[_Series, int, int]]:
        """Per GPU with values in the window: its series and the window's index range."""
        out = {}
        for gpu, values in series.items():
            i, j = values.span(start, end)
            if j > i:
                out[gpu] = (values, i, j)
        return out

    # ---------------------------------------------------------------- system
    def bottleneck(self, io: bool) -> Condition:
        threshold = self.c.io_bottleneck_threshold if io else self.c.cpu_bottleneck_threshold
        name = "IOBottleneck" if io else "CPUBottleneck"

        def condition(t: float) -> list[Firing]:
            out = []
            for r in self.ranks:
                table = self.samples[id(r)]
                i, j = table.span(t - self.w, t)
                if j > i and self.warm(r, t) and self.alive(r, t):
                    self.judged.add(name)
                    hits = table.io_hits if io else table.cpu_hits
                    fraction = (hits[j] - hits[i]) / (j - i)
                    if fraction > threshold:
                        out.append(Firing(r.subject, fraction))
            return out
        return condition

    def gpu_quantiles(self, kind: str) -> Condition:
        c = self.c
        name = {"under": "GPUUnderutilized", "fluctuating": "GPUUtilizationFluctuating",
                "batch": "BatchSizeTooSmall"}[kind]

        def condition(t: float) -> list[Firing]:
            out = []
            for r in self.ranks:
                if not (self.warm(r, t) and self.alive(r, t)):
                    continue
                table = self.samples[id(r)]
                util = self.gpu_windows(table.util, t - self.w, t)
                mem = self.gpu_windows(table.memory, t - self.w, t)
                cpu_i, cpu_j = table.cpu_mean.span(t - self.w, t)
                for gpu, (values, i, j) in sorted(util.items()):
                    if not values.any_positive(i, j):
                        continue  # never busy: an unused device
                    self.judged.add(name)
                    p95, p5 = values.quantile(0.95, i, j), values.quantile(0.05, i, j)
                    subject = f"{r.subject} gpu {gpu}"
                    if kind == "under" and p95 < c.low_gpu_threshold_p95:
                        out.append(Firing(subject, p95))
                    elif kind == "fluctuating" and p5 < c.low_gpu_threshold_p5 and p95 > c.low_gpu_threshold_p95:
                        out.append(Firing(subject, p5))
                    elif (kind == "batch" and p95 < c.batch_size_gpu_threshold_p95 and gpu in mem
                          and mem[gpu][0].quantile(0.95, *mem[gpu][1:]) < c.batch_size_gpu_memory_threshold_p95
                          and cpu_j > cpu_i
                          and table.cpu_mean.quantile(0.95, cpu_i, cpu_j) < c.batch_size_cpu_threshold_p95):
                        out.append(Firing(subject, p95))
            return out
        return condition

    def memory_increase(self, t: float) -> list[Firing]:
        m = seconds(self.c.gpu_memory_increase_window)
        out = []
        for r in self.ranks:
            if not (self.warm(r, t) and self.alive(r, t)):
                continue
            memory = self.samples[id(r)].memory
            now, before = self.gpu_windows(memory, t - m, t), self.gpu_windows(memory, t - 2 * m, t - m)
            for gpu in sorted(now):
                if gpu in before:
                    self.judged.add("GPUMemoryIncrease")
                    increase = now[gpu][0].mean(*now[gpu][1:]) - before[gpu][0].mean(*before[gpu][1:])
                    if increase > self.c.gpu_memory_increase:
                        out.append(Firing(f"{r.subject} gpu {gpu}", increase))
        return out

    def memory_capacity(self, t: float) -> list[Firing]:
        width = seconds(self.c.gpu_memory_capacity_window)
        out = []
        for r in self.ranks:
            if self.alive(r, t):
                for gpu, (values, i, j) in sorted(self.gpu_windows(self.samples[id(r)].memory, t - width, t).items()):
                    mean = values.mean(i, j)
                    self.judged.add("GPUMemoryNearCapacity")
                    if mean > self.c.gpu_memory_capacity_threshold:
                        out.append(Firing(f"{r.subject} gpu {gpu}", mean))
        return out

    def host_memory_increase(self, t: float) -> list[Firing]:
        c = self.c
        width = seconds(c.host_memory_increase_window)
        out = []
        for r in self.ranks:
            first = self.first_steps[id(r)]
            if not self.alive(r, t) or first is None or t - first <= self.patience + 2 * width:
                continue
            rss = self.samples[id(r)].rss
            (i, j), (k, m) = rss.span(t - width, t), rss.span(t - 2 * width, t - width)
            if j > i and m > k:
                self.judged.add("HostMemoryIncrease")
                now, before = rss.mean(i, j), rss.mean(k, m)
                growth = now - before
                if growth > c.host_memory_increase * before and growth > c.host_memory_increase_min_bytes:
                    out.append(Firing(r.subject, growth))
        return out

    def host_memory_near_limit(self, t: float) -> list[Firing]:
        width = seconds(self.c.host_memory_limit_window)
        out = []
        for r in self.ranks:
            if not self.alive(r, t):
                continue
            table = self.samples[id(r)]
            (i, j), (k, m) = table.container_memory.span(t - width, t), table.container_limit.span(t - width, t)
            if m > k:  # a memory limit: the container's working set against it
                if j <= i:
                    continue
                used = table.container_memory.mean(i, j) / max(table.container_limit.values[k:m])
            else:  # no limit: the host's memory
                i, j = table.host_memory.span(t - width, t)
                if j <= i:
                    continue
                used = table.host_memory.mean(i, j)
            self.judged.add("HostMemoryNearLimit")
            if used > self.c.host_memory_limit_threshold:
                out.append(Firing(r.subject, used))
        return out

    def load_imbalance(self, t: float) -> list[Firing]:
        out = []
        for job, ranks in _by_job(self.ranks).items():
            live = [r for r in ranks if self.alive(r, t)]
            if not live or not all(self.warm(r, t) for r in live):
                continue
            means = [values.mean(i, j) for r in live
                     for values, i, j in self.gpu_windows(self.samples[id(r)].util, t - self.w, t).values()]
            if len(means) > 1:
                self.judged.add("GPULoadImbalance")
            if len(means) > 1 and max(means) - min(means) > self.c.load_balancing_threshold:
                out.append(Firing(f"job {job}", max(means) - min(means)))
        return out

    # ---------------------------------------------------------------- steps
    def phase_windows(self, rank: RankData, start: float, end: float) -> Iterable[tuple[str, PhaseSteps, int, int]]:
        """Per phase with steps ending in the window: its columns and the window's index range. With many phases
        (a run that names one per step) only those with a step in the window are looked at: the evaluations cost
        the steps in their windows, not every phase each time."""
        phases = self.steps[id(rank)].phases
        if len(phases) <= FEW_PHASES:
            candidates: Iterable[tuple[str, PhaseSteps]] = phases.items()
        else:
            ends, order, items = self._phase_index(rank)
            found = order[bisect.bisect_right(ends, start):bisect.bisect_right(ends, end)]
            candidates = map(items.__getitem__, sorted(set(found)))  # in the phases' order, as above
        for phase, steps in candidates:
            i, j = steps.span(start, end)
            if j > i:
                yield phase, steps, i, j

    def _phase_index(self, rank: RankData) -> tuple[list[float], list[int], list[tuple[str, PhaseSteps]]]:
        """Every step end of the rank in time order, the position of its phase, and the phases (built once)."""
        found = self._phase_indexes.get(id(rank))
        if found is None:
            items = list(self.steps[id(rank)].phases.items())
            pairs = sorted((e, k) for k, (_, steps) in enumerate(items) for e in steps.ends)
            found = self._phase_indexes[id(rank)] = ([e for e, _ in pairs], [k for _, k in pairs], items)
        return found

    def straggler(self, t: float) -> list[Firing]:
        width = seconds(self.c.straggler_window)
        out = []
        for ranks in _by_job(self.ranks).values():
            compute: dict[tuple[str, int], float] = {}
            for r in ranks:
                if not self.alive(r, t):
                    continue
                for phase, steps, i, j in self.phase_windows(r, t - width, t):
                    compute[(phase, r.rank)] = sum(steps.compute[i:j]) / (j - i)
            by_phase: dict[str, dict[int, float]] = {}
            for (p, rank), v in compute.items():
                by_phase.setdefault(p, {})[rank] = v
            for phase in sorted(by_phase):
                values = by_phase[phase]
                if len(values) > 1:
                    self.judged.add("RankStraggler")
                    for rank, value in sorted(values.items()):
                        peers = peers_median(list(values.values()), value)
                        if peers is not None and value / peers > self.c.straggler_ratio:
                            out.append(Firing(f"rank {rank} {phase}", value / peers))
        return out

    def outliers(self, t: float) -> list[Firing]:
        width = seconds(self.c.step_outlier_window)
        out = []
        for r in self.ranks:
            for phase, steps, i, j in self.phase_windows(r, t - width, t):
                if j - i <= self.c.step_outlier_min_steps:
                    continue
                self.judged.add("StepOutliers")
                count = steps.outliers[j] - steps.outliers[i]
                busy = steps.busy[j] - steps.busy[i]
                cost = (steps.excess[j] - steps.excess[i]) / busy if busy > 0 else 0.0
                if count > self.c.step_outlier_n_outliers and cost > self.c.step_outlier_min_cost:
                    out.append(Firing(f"{r.subject} {phase}", cost))
        return out

    def slow_initialization(self, t: float) -> list[Firing]:
        limit = seconds(self.c.max_initialization_time)
        out = []
        for r in self.ranks:
            ends = self.steps[id(r)].ends
            first = ends[0] if ends else math.inf
            if self.alive(r, t):
                self.judged.add("SlowInitialization")
            if self.alive(r, t) and t - r.process_start > limit and first > t:
                out.append(Firing(r.subject, t - r.process_start))
        return out

    def input_bound(self, t: float) -> list[Firing]:
        width = seconds(self.c.input_bound_window)
        out = []
        for r in self.ranks:
            for phase, steps, _, _ in self.phase_windows(r, t - width, t):
                i, j = steps.inputs.span(t - width, t)
                if j > i:
                    self.judged.add("InputBound")
                if j > i and steps.inputs.mean(i, j) > self.c.input_bound_threshold:
                    out.append(Firing(f"{r.subject} {phase}", steps.inputs.mean(i, j)))
        return out

    # ---------------------------------------------------------------- training
    def _losses(self, r: RankData, phase: str) -> _Series:
        """A phase's finite losses without spikes, as the live rules' sums hold them."""
        steps = self.steps[id(r)].phases.get(phase)
        return steps.trend if steps is not None else _EMPTY

    def loss_not_decreasing(self, t: float) -> list[Firing]:
        lw = seconds(self.c.loss_window)
        out = []
        for r in self.ranks:
            first = self.first_steps[id(r)]
            if first is None or t - first <= 2 * lw or not self.alive(r, t):
                continue  # both windows inside training, as the live rule asks (time since the first step)
            losses = self._losses(r, self.c.train_phase)
            (i, j), (k, m) = losses.span(t - lw, t), losses.span(t - 2 * lw, t - lw)
            steps = self.steps[id(r)].phases.get(self.c.train_phase)
            if steps is not None and any(bisect.bisect_right(bad, t) > bisect.bisect_right(bad, t - 2 * lw)
                                         for bad in (steps.bad_losses, steps.bad_norms)):
                continue  # a NaN in the windows: NonFiniteValues speaks, the held loss would look flat
            if j - i > 1 and m - k > 1:
                self.judged.add("LossNotDecreasing")
                (mean_now, se2_now), (mean_before, se2_before) = _mean_se2(losses, i, j), _mean_se2(losses, k, m)
                margin = self.c.loss_diff_percent / 100 * abs(mean_before) - \
                    self.c.loss_noise_sigmas * math.sqrt(se2_now + se2_before)
                if mean_now > mean_before - margin:
                    out.append(Firing(f"{r.subject} {self.c.train_phase}", mean_now))  # the live alert's labels
        return out

    def loss_spike(self, t: float) -> list[Firing]:
        width = seconds(self.c.loss_spike_window)
        out = []
        for r in self.ranks:
            steps = self.steps[id(r)].phases.get(self.c.train_phase)
            if steps is None or len(steps.losses) <= thresholds.LOSS_SPIKE_MIN_STEPS:
                continue
            i, j = steps.losses.span(t - width, t)
            if j > thresholds.LOSS_SPIKE_MIN_STEPS and self.alive(r, t):
                self.judged.add("LossSpike")  # losses past the warm-up of the spike test in the window
            count = steps.spikes[j] - steps.spikes[i]
            if count > 0:
                out.append(Firing(f"{r.subject} {self.c.train_phase}", count))
        return out

    def nonfinite(self, t: float) -> list[Firing]:
        width = seconds(self.c.nonfinite_window)
        out: list[Firing] = []
        self.judged.add("NonFiniteValues")  # every recorded loss and gradient norm is judged (its datapoints)
        for r in self.ranks:
            counts: dict[str, int] = {}
            if id(r) not in self._nonfinite:  # the phases with a non-finite value at all (few; every time is T x P)
                self._nonfinite[id(r)] = [(phase, steps) for phase, steps in self.steps[id(r)].phases.items()
                                          if len(steps.bad_losses) or len(steps.bad_norms)]
            for phase, steps in self._nonfinite[id(r)]:
                for name, ends in (("loss", steps.bad_losses), ("grad_norm", steps.bad_norms)):
                    count = bisect.bisect_right(ends, t) - bisect.bisect_right(ends, t - width)
                    if count:
                        counts[f"{r.subject} {phase} {name}"] = count
            out.extend(Firing(k, v) for k, v in sorted(counts.items()))
        return out

    def vanishing(self, t: float) -> list[Firing]:
        width = seconds(self.c.vanishing_gradient_window)
        out = []
        for r in self.ranks:
            steps = self.steps[id(r)].phases.get(self.c.train_phase)
            if steps is None:
                continue
            i, j = steps.norms.span(t - width, t)
            if j > i:
                self.judged.add("VanishingGradients")
                mean = steps.norms.mean(i, j)
                if mean < self.c.vanishing_gradient_threshold:
                    out.append(Firing(f"{r.subject} {self.c.train_phase}", mean))
        return out

    def stalled(self, t: float) -> list[Firing]:
        limit = seconds(self.c.stalled_training_threshold)
        out = []
        for r in self.ranks:
            ends = self.steps[id(r)].ends
            i = bisect.bisect_right(ends, t)
            if i and self.alive(r, t):
                self.judged.add("TrainingStalled")
            if i and self.alive(r, t) and t - ends[i - 1] > limit:
                out.append(Firing(r.subject, t - ends[i - 1]))
        return out

    def _window_mean(self, r: RankData, t: float, width: float, phase: str) -> float | None:
        """Per-step mean of a phase's losses over the window (None: no loss in it), as the live rule's sums."""
        losses = self._losses(r, phase)
        i, j = losses.span(t - width, t)
        if j > i:
            n, total, _ = losses.moments(i, j)
            return total / n
        return None

    def overfit(self, t: float) -> list[Firing]:
        width = seconds(self.c.overfit_window)
        out = []
        for r in self.ranks:
            if not self.alive(r, t):
                continue
            train = self._window_mean(r, t, width, self.c.train_phase)
            evaluation = self._window_mean(r, t, width, self.c.eval_phase)
            if train and evaluation is not None and train > 0:
                self.judged.add("Overfitting")
                ratio = (evaluation - train) / train
                if ratio > self.c.overfit_ratio_threshold:
                    out.append(Firing(r.subject, ratio))
        return out

    def conditions(self) -> dict[str, tuple[Condition, int]]:
        """Condition and datapoint count per alert short name. Datapoints are what the check reads (GPU samples,
        losses, ...); a check that never judged them (no data, or never past its warm-up) gets 0 in
        :func:`evaluate_ranks`, reported as "no data", never "ok"."""
        tables = list(self.samples.values())
        step_tables = list(self.steps.values())

        def union(series: Iterable[_Series]) -> int:
            """Samples with a reading of some GPU (a node's GPUs are read in the same samples)."""
            return max(map(len, series), default=0)

        gpu_samples = sum(union(t.util.values()) for t in tables)
        gpu_memory = sum(union(t.memory.values()) for t in tables)
        gpus_per_job: dict[str, int] = {}
        for r in self.ranks:
            gpus_per_job[r.job] = gpus_per_job.get(r.job, 0) + len(self.samples[id(r)].util)
        balanced = sum(union(self.samples[id(r)].util.values()) for r in self.ranks if gpus_per_job[r.job] > 1)
        steps = sum(len(t) for t in step_tables)
        ranks_per_phase: dict[tuple[str, str], int] = {}
        for r in self.ranks:
            for phase in self.steps[id(r)].phases:
                ranks_per_phase[(r.job, phase)] = ranks_per_phase.get((r.job, phase), 0) + 1
        compared = sum(len(steps_.ends) for r in self.ranks for phase, steps_ in self.steps[id(r)].phases.items()
                       if ranks_per_phase[(r.job, phase)] > 1)

        def phase_count(phase: str | None, column: Callable[[PhaseSteps], Sized]) -> int:
            return sum(len(column(p)) for t in step_tables for name, p in t.phases.items()
                       if phase is None or name == phase)

        train, evaluation = self.c.train_phase, self.c.eval_phase
        scalars = (phase_count(None, lambda p: p.losses) + phase_count(None, lambda p: p.bad_losses)
                   + phase_count(None, lambda p: p.norms) + phase_count(None, lambda p: p.bad_norms))
        train_losses = phase_count(train, lambda p: p.losses)
        limits = sum(len(t.container_memory) if len(t.container_limit) else len(t.host_memory) for t in tables)
        return {
            "CPUBottleneck": (self.bottleneck(io=False), gpu_samples),
            "IOBottleneck": (self.bottleneck(io=True), gpu_samples),
            "GPUUnderutilized": (self.gpu_quantiles("under"), gpu_samples),
            "GPUUtilizationFluctuating": (self.gpu_quantiles("fluctuating"), gpu_samples),
            "BatchSizeTooSmall": (self.gpu_quantiles("batch"), gpu_samples),
            "GPUMemoryIncrease": (self.memory_increase, gpu_memory),
            "GPUMemoryNearCapacity": (self.memory_capacity, gpu_memory),
            "HostMemoryIncrease": (self.host_memory_increase, sum(len(t.rss) for t in tables)),
            "HostMemoryNearLimit": (self.host_memory_near_limit, limits),
            "GPULoadImbalance": (self.load_imbalance, balanced),
            "RankStraggler": (self.straggler, compared),
            "StepOutliers": (self.outliers, steps),
            "SlowInitialization": (self.slow_initialization, steps),
            "InputBound": (self.input_bound, phase_count(None, lambda p: p.inputs)),
            "LossNotDecreasing": (self.loss_not_decreasing, train_losses),
            "LossSpike": (self.loss_spike, train_losses),
            "NonFiniteValues": (self.nonfinite, scalars),
            "VanishingGradients": (self.vanishing, phase_count(train, lambda p: p.norms)),
            "TrainingStalled": (self.stalled, steps),
            "Overfitting": (self.overfit, phase_count(evaluation, lambda p: p.losses) if train_losses else 0),
        }


OFFLINE_CHECKS = ("CPUBottleneck", "IOBottleneck", "GPUUnderutilized", "GPUUtilizationFluctuating", "BatchSizeTooSmall",
                  "GPUMemoryIncrease", "GPUMemoryNearCapacity", "HostMemoryIncrease", "HostMemoryNearLimit",
                  "GPULoadImbalance", "RankStraggler", "StepOutliers", "SlowInitialization", "InputBound",
                  "LossNotDecreasing", "LossSpike", "NonFiniteValues", "VanishingGradients", "TrainingStalled",
                  "Overfitting")
"""Alerts (names without the prefix) that have an offline twin."""


def _mean_se2(values: _Series, i: int, j: int) -> tuple[float, float]:
    """Mean of the window's values and its squared standard error (sample variance / n), as the live rule
    computes them from the running sum, sum of squares and count (at least two values)."""
    n, total, squares = values.moments(i, j)
    variance = max((squares - total * total / n) / (n - 1), 0.0)
    return total / n, variance / n


def peers_median(values: Sequence[float], value: float) -> float | None:
    """The median of ``values`` other than ``value`` (one of them), as the RankStraggler rule computes it.

    With 2 or 3 values: the mean of the others. With 4 or more: the largest value not above the median of
    all, which is the median of the others for every value that can exceed it when the count is even, and
    the median of all (at most one value above the exact one) when it is odd. None when not positive."""
    n = len(values)
    if n < 4:
        typical = (math.fsum(values) - value) / (n - 1)
    else:
        middle = statistics.median(values)
        typical = max(v for v in values if v <= middle)
    return typical if typical > 0 else None


def _by_job(ranks: Iterable[RankData]) -> dict[str, list[RankData]]:
    out: dict[str, list[RankData]] = {}
    for r in ranks:
        out.setdefault(r.job, []).append(r)
    return out


def evaluate_ranks(ranks: list[RankData], config: MixinConfig | None = None, interval: float = 10.0,
                   start: float | None = None, end: float | None = None) -> list[CheckResult]:
    """Evaluate every offline-capable check every ``interval`` seconds from ``start`` to ``end``."""
    config = config or MixinConfig()
    if not ranks:
        return []
    start = min(r.process_start for r in ranks) if start is None else start
    end = max(max(r.end for r in ranks) if end is None else end, start)
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
        result = _run(alert, condition, datapoints, times)
        if short not in checks.judged:  # never past its warm-up, or never with data in its windows
            result = dataclasses.replace(result, datapoints=0)
        results.append(result)
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

def _sample_table(rank: RankRecording, config: MixinConfig) -> SampleTable:
    """Node samples from the reader's columns: per-CPU maxima and means, not 64-value tuples."""
    columns = rank.sample_columns()
    node = list(map(operator.eq, columns.cpu_max, columns.cpu_max))  # NaN: a process-only sample
    nan = array("d", [math.nan]) * len(columns)

    def kept(values: Sequence[float] | None) -> list[float]:
        return list(compress(nan if values is None else values, node))

    def ratio(used: list[float], total: list[float]) -> list[float]:
        if 0.0 in total:
            return [u / t if t else math.nan for u, t in zip(used, total)]
        return list(map(operator.truediv, used, total))  # NaN propagates

    util = {str(index): kept(g.get("u")) for index, g in columns.gpus.items()}
    memory = {str(index): ratio(kept(g.get("mu")), kept(g.get("mt"))) for index, g in columns.gpus.items()}
    return SampleTable.build([t / 1e9 for t in compress(columns.t_ns, node)], kept(columns.cpu_max),
                             kept(columns.cpu_mean), kept(columns.iow_max),
                             {g: v for g, v in util.items() if any(map(operator.eq, v, v))},
                             {g: v for g, v in memory.items() if any(map(operator.eq, v, v))}, config,
                             ([t / 1e9 for t in columns.t_ns], columns.rss), kept(columns.mem),
                             kept(columns.container_memory), kept(columns.container_limit))


@dataclass(frozen=True)
class OutlierSettings:
    """How the recorder flagged outlier steps (``OTELPROF_OUTLIER_*``)."""

    sigma: float
    min_steps: int
    min_ratio: float
    min_excess: float

    @staticmethod
    def of(recorded: Mapping[str, object], config: MixinConfig) -> OutlierSettings:
        """The settings a recording carries in its manifest, else the mixin config's (older recordings)."""
        def get(key: str, default: float) -> float:
            value = recorded.get(key)
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default

        return OutlierSettings(get("outlier_sigma", config.step_outlier_sigma), int(get("outlier_min_steps", 20)),
                               get("outlier_min_ratio", config.step_outlier_min_ratio),
                               get("outlier_min_excess", config.step_outlier_min_excess))


def _step_table(rank: RankRecording, outlier: OutlierSettings) -> StepTable:
    """Steps from the reader's columns: a million Step objects with their annotations would cost ~25 s here."""
    columns = rank.step_columns
    start = [t / 1e9 for t in columns.start_ns]
    end = [(t + d) / 1e9 for t, d in zip(columns.start_ns, columns.duration_ns)]
    return StepTable.build(columns.phase_names, columns.phase, start, end,
                           [w / 1e9 for w in columns.annotation_sums(sc.REGION_DATALOADER)],
                           [c / 1e9 for c in collectives.of_columns(columns)[1]],  # exposed communication
                           outlier_costs(rank, outlier), columns.scalar("loss"), columns.scalar("grad_norm"))


def outlier_costs(rank: RankRecording, outlier: OutlierSettings) -> dict[int, list[float]]:
    """Per phase code, each step's cost as the recorder's outlier judge finds it (:class:`StepJudge`, fed the
    same steps in the same order, per token or sample where recorded; 0.0: no outlier). Steps of a profiling
    window and the few after it are not judged, as in the recorder."""
    columns = rank.step_columns
    units: dict[int, float] = {}
    for name in (sc.SCALAR_SAMPLES, sc.SCALAR_TOKENS):  # tokens win over samples (written last)
        at, values = columns.scalar(name)
        units.update((i, v) for i, v in zip(at, values) if v > 0 and math.isfinite(v))
    slowed = profiled_windows(rank)
    judges: dict[int, StepJudge] = {}
    costs: dict[int, list[float]] = {}
    for index, (code, number, duration) in enumerate(zip(columns.phase, columns.number, columns.duration_ns)):
        windows = slowed.get(columns.phase_names[code])
        if windows and in_windows(number, windows):
            costs.setdefault(code, []).append(0.0)
            continue
        judge = judges.get(code)
        if judge is None:
            judge = judges[code] = StepJudge(outlier.sigma, outlier.min_steps, outlier.min_ratio, outlier.min_excess)
        costs.setdefault(code, []).append(judge.observe(duration / 1e9, units.get(index)))
    return costs


def rank_data(rank: RankRecording, config: MixinConfig | None = None) -> RankData:
    """The checks' view of one rank's recording."""
    manifest = rank.manifest
    resource = manifest.get("resource") or {}
    recorded = manifest.get("config") or {}
    life = rank.lifecycle
    config = config or MixinConfig()
    steps = _step_table(rank, OutlierSettings.of(recorded, config))
    samples = _sample_table(rank, config)
    first_start = rank.step_columns.start_ns[0] / 1e9 if len(steps) else None
    last_sample = samples.times[-1] if samples.times else None
    times = [x for x in (life.get("shutdown"), life.get("last_step_end"), last_sample) if x is not None]
    start = float(life.get("process_start") or (first_start if first_start is not None else last_sample or 0.0))
    first_sample = samples.times[0] if samples.times else None
    # A clock stepped back between the process start and its data: the run starts at its first data.
    start = min(x for x in (start, first_start, first_sample) if x is not None)
    return RankData(str(resource.get(sc.SERVICE_NAME, "")), rank.rank,
                    str(resource.get(sc.K8S_NODE_NAME) or resource.get(sc.HOST_NAME, "")), start,
                    max(times) if times else start, sample_table=samples, step_table=steps,
                    first_step=float(began) if isinstance(began := life.get("first_step_start"), int | float)
                    else first_start)


def evaluate(recording: Recording, config: MixinConfig | None = None, interval: float = 10.0) -> list[CheckResult]:
    """Every offline-capable alert check on a recording (all ranks)."""
    return evaluate_ranks([rank_data(r, config) for r in recording.ranks], config, interval)
