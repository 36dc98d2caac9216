"""The offline checks' input: one rank's node samples and steps, as records (:class:`Sample`,
:class:`StepRecord`, :class:`RankData`) and as the sorted columns the checks read (:class:`SampleTable`,
:class:`StepTable`), where a window is an index range and its counts and sums are differences of running
totals, as in the live series."""

from __future__ import annotations

import bisect
import math
import operator
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, compress

from otelprof import semconv as sc
from otelprof.analysis.histogram import bucket_quantile
from otelprof.mixin.config import MixinConfig
from otelprof.recording.columns import group_indexes
from otelprof.shared.outliers import LossSpikes

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


class Series:
    """Values at sorted times; a window is the index range of ``start < t <= end`` (the rules' windows).

    For quantiles each value's ratio-bucket index is computed once (on first use), so a window's
    ``histogram_quantile`` counts bytes instead of re-bucketing every value."""

    __slots__ = ("times", "values", "_buckets", "_positive", "_sums", "_squares", "_exact")

    def __init__(self, times: Iterable[float], values: Iterable[float]) -> None:
        self.times = times if type(times) is array and times.typecode == "d" else array("d", times)  # kept, not copied
        self.values = array("d", values)
        self._buckets: bytes | None = None
        self._positive: array[int] | None = None
        self._sums: array[float] | None = None
        self._squares: array[float] | None = None
        self._exact: bool | None = None

    def __len__(self) -> int:
        return len(self.times)

    def span(self, start: float, end: float) -> tuple[int, int]:
        return bisect.bisect_right(self.times, start), bisect.bisect_right(self.times, end)

    def mean(self, i: int, j: int) -> float:
        return sum(self.values[i:j]) / (j - i)

    def moments(self, i: int, j: int) -> tuple[int, float, float]:
        """Count, sum and sum of squares of the window's values (running totals, as the live series are)."""
        sums = self.running_sums()
        if self._squares is None:
            self._squares = array("d", accumulate(map(operator.mul, self.values, self.values), initial=0.0))
        return j - i, sums[j] - sums[i], self._squares[j] - self._squares[i]

    def running_sums(self) -> array[float]:
        """Running total of the values (``[i]``: of the values before i)."""
        if self._sums is None:
            self._sums = array("d", accumulate(self.values, initial=0.0))
        return self._sums

    def positive(self) -> array[int]:
        """Running count of the positive values (``positive()[i]``: before value i)."""
        if self._positive is None:
            self._positive = array("q", accumulate(map((0.0).__lt__, self.values), initial=0))
        return self._positive

    def exact_sums(self) -> array[float] | None:
        """The running totals (``[i]``: of the values before i) when every window's sum of the values in order is
        their difference, exactly: whole numbers whose absolute sum is below 2**53, so that every partial sum
        either way is a whole number a double holds. None otherwise (sum a window's values instead)."""
        if self._exact is None:
            self._exact = all(map(float.is_integer, self.values)) and sum(map(abs, self.values)) < 2.0 ** 52
        return self.running_sums() if self._exact else None

    def any_positive(self, i: int, j: int) -> bool:
        positive = self.positive()
        return positive[j] > positive[i]

    def buckets(self) -> bytes:
        """Each value's ratio-bucket index (``le`` semantics; the last, ``len(BUCKETS)``, is +Inf's)."""
        if self._buckets is None:
            self._buckets = bytes(map(partial(bisect.bisect_left, BUCKETS), self.values))
        return self._buckets

    def quantile(self, q: float, i: int, j: int) -> float:
        window = self.buckets()[i:j]
        return bucket_quantile(q, BUCKETS, list(accumulate(map(window.count, range(len(BUCKETS) + 1)))))


EMPTY = Series((), ())


@dataclass(frozen=True)
class SampleTable:
    """One rank's node samples as the checks read them: per-sample hits, per-GPU series."""

    times: array[float]
    cpu_hits: array[int]
    """Running count of samples that were CPU-bottleneck coincidences (``cpu_hits[i]`` = before sample i)."""
    io_hits: array[int]
    cpu_mean: Series
    """Mean busy share over the node's CPUs, where known."""
    util: dict[str, Series]
    memory: dict[str, Series]
    """GPU memory used / total."""
    rss: Series = EMPTY
    """The process's resident memory, from every sample of the rank (node samples or not)."""
    host_memory: Series = EMPTY
    """The host's used memory ratio."""
    container_memory: Series = EMPTY
    """The container's working set (bytes)."""
    container_limit: Series = EMPTY
    """The container's memory limit (bytes), where it has one."""

    @staticmethod
    def build(times: Sequence[float], busy_max: Sequence[float], busy_mean: Sequence[float],
              iowait_max: Sequence[float], util: dict[str, Sequence[float]], memory: dict[str, Sequence[float]],
              config: MixinConfig, rss: tuple[Sequence[float], Sequence[float]] = ((), ()),
              host_memory: Sequence[float] = (), container_memory: Sequence[float] = (),
              container_limit: Sequence[float] = (), lowest: Sequence[float] | None = None) -> SampleTable:
        """From per-sample columns, NaN where a sample lacks a value; ``rss`` as (times, values) of every sample;
        ``lowest``: per sample, the least utilization over the GPUs that have one (NaN: none), when known."""
        if lowest is not None:  # some GPU below the threshold: the least one is (NaN compares False)
            low_gpu = list(map(partial(operator.gt, config.gpu_threshold), lowest))
        else:
            low_gpu = [False] * len(times)  # per sample: some GPU below the threshold (NaN compares False)
            for values in util.values():
                low_gpu = list(map(operator.or_, low_gpu, map(partial(operator.gt, config.gpu_threshold), values)))

        def hits(peaks: Sequence[float], high: float) -> array[int]:
            """Running count of bottleneck coincidences: a CPU (or iowait) above ``high`` while a GPU is low."""
            return array("q", accumulate(map(operator.and_, map(high.__lt__, peaks), low_gpu), initial=0))

        every_time = array("d", times)
        kept_times: dict[bytes, array[float]] = {b"": every_time}

        def series(values: Sequence[float]) -> Series:
            if len(values) == len(times) and math.isfinite(sum(values)):  # every value known (most columns)
                return Series(every_time, values)
            known = list(map(operator.eq, values, values))  # not NaN
            every = False not in known
            key = b"" if every else bytes(known)  # the GPUs of a node read in the same samples share their times
            at = kept_times.get(key)
            if at is None:
                at = kept_times[key] = array("d", times if every else compress(times, known))
            return Series(at, values if every else compress(values, known))  # a list converts faster

        def known(t: Sequence[float], values: Sequence[float]) -> Series:
            if values and len(values) == len(t) and math.isfinite(sum(values)):  # every value known (no NaN)
                return Series(every_time if t is times else t, values)
            keep = list(map(operator.eq, values, values))
            if False not in keep:
                return Series(t, values) if keep else EMPTY
            return Series(compress(t, keep), compress(values, keep)) if any(keep) else EMPTY

        return SampleTable(every_time, hits(busy_max, config.cpu_threshold),
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
    trend: Series
    """The finite losses without the spikes: what the loss means judge (as the live sums hold them)."""
    inputs: Series
    """Share of the step spent waiting for data, for steps that waited."""
    losses: Series
    """Finite losses."""
    norms: Series
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
            spike = LossSpikes().observe_all(loss_values.values)
            kept = list(map(operator.not_, spike))
            phases[name] = PhaseSteps(
                array("d", ends), array("d", compute),
                array("q", accumulate(map((0.0).__lt__, excess), initial=0)),
                array("d", accumulate(excess, initial=0.0)), array("d", accumulate(durations, initial=0.0)),
                array("q", accumulate(spike, initial=0)),
                Series(compress(loss_values.times, kept), compress(loss_values.values, kept)),
                Series(compress(ends, waited), ratios), loss_values, norm_values, bad_losses, bad_norms)
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
                   values: Sequence[float]) -> tuple[Series, array[float]]:
    """A scalar's finite values of one phase (``mine``: their positions in ``index``) by step end time, and the
    end times of its non-finite values."""
    ends = [end[index[k]] for k in mine]
    mine_values = list(map(values.__getitem__, mine))
    finite = list(map(math.isfinite, mine_values))
    return (Series(compress(ends, finite), compress(mine_values, finite)),
            array("d", compress(ends, map(operator.not_, finite))))
