"""Load balancing: do the job's GPUs work alike, and do its ranks take alike long per step?

* GPUs: a histogram of each GPU's utilization (2 % bins), the Jensen-Shannon distance between the
  histograms of each pair of GPUs (natural log, 0 .. 0.83; what the original LoadBalancing rule
  meant to compute), and the spread of mean utilization (what the alert judges).
* Ranks: per phase, each rank's median step time and mean compute time (step time minus data-loader
  wait and exposed communication, see :mod:`otelprof.shared.collectives`) against the median of its peers (the
  other ranks, as the alert compares them); a rank
  well above it is a straggler — the other ranks show its delay as exposed communication. Collective time
  is the union of a step's all-reduces (gradient buckets in flight at once count once).
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat

from otelprof import semconv as sc
from otelprof.analysis.ranksummary import RankSummary, many, summarize
from otelprof.analysis.run import RunView, per_rank
from otelprof.analysis.stats import Histogram, share, sorted_finite
from otelprof.analysis.step_checks import peers_median
from otelprof.analysis.system import gpu_order
from otelprof.mixin.config import MixinConfig
from otelprof.recording.columns import SampleColumns, StepColumns
from otelprof.shared import collectives

PAIRWISE_LIMIT = 16
"""Up to this many GPUs every pair is compared; beyond, each GPU against the mean of all."""
MAX_FARTHEST = 10
"""Pairs of GPUs listed as the farthest apart."""


@dataclass(frozen=True)
class GpuLoad:
    node: str
    gpu: str
    mean: float
    histogram: Histogram


@dataclass(frozen=True)
class GpuDistance:
    a: str
    """``node/gpu``; ``all`` for the mean of every GPU."""
    b: str
    distance: float


@dataclass(frozen=True)
class RankLoad:
    phase: str
    rank: int
    median_step: float
    mean_compute: float
    """Seconds per step outside data-loader wait and collectives."""
    mean_collective: float
    """Seconds per step with at least one all-reduce in flight."""
    ratio: float
    """mean_compute / the median of the other ranks' mean_compute (as RankStraggler judges it; NaN alone)."""
    straggler: bool
    mean_exposed: float = math.nan
    """Seconds per step of collective time the backward pass did not overlap: waiting for the other ranks."""


@dataclass(frozen=True)
class LoadBalance:
    threshold: float
    """Spread of mean utilization the alert judges."""
    spread: float | None
    distance_threshold: float
    gpus: tuple[GpuLoad, ...]
    distances: tuple[GpuDistance, ...]
    ranks: tuple[RankLoad, ...]
    straggler_ratio: float
    far_pairs: int = field(init=False)
    """Pairs of GPUs farther apart than ``distance_threshold``."""
    farthest: tuple[GpuDistance, ...] = field(init=False)
    """The MAX_FARTHEST pairs farthest apart, farthest first (pairs without a distance left out)."""
    uneven: bool = field(init=False)
    """Some pair is farther apart than ``distance_threshold``, or the spread (none: 0) is above ``threshold``."""
    summaries: tuple[RankSummary, ...] = field(init=False)
    """With more than ranksummary.THRESHOLD ranks, per phase: compute per step, compute / peers' median,
    exposed collective time (else empty)."""

    def __post_init__(self) -> None:
        out: list[RankSummary] = []
        if many(len({x.rank for x in self.ranks})):
            for phase in dict.fromkeys(x.phase for x in self.ranks):
                rows = [x for x in self.ranks if x.phase == phase]
                out += [summarize(((f"rank {x.rank}", x.mean_compute) for x in rows), "mean compute", "seconds", phase),
                        summarize(((f"rank {x.rank}", x.ratio) for x in rows), "compute / peers' median", "number",
                                  phase),
                        summarize(((f"rank {x.rank}", x.mean_exposed) for x in rows), "mean exposed collective",
                                  "seconds", phase)]
        object.__setattr__(self, "summaries", tuple(out))
        known = [d for d in self.distances if math.isfinite(d.distance)]
        far = sum(1 for d in known if d.distance > self.distance_threshold)
        object.__setattr__(self, "far_pairs", far)
        object.__setattr__(self, "farthest", tuple(sorted(known, key=lambda d: -d.distance)[:MAX_FARTHEST]))
        object.__setattr__(self, "uneven", bool(far) or (self.spread or 0.0) > self.threshold)


def js_distance(p: tuple[int, ...], q: tuple[int, ...]) -> float:
    """Jensen-Shannon distance (natural log) between two histograms of counts."""
    sp, sq = sum(p), sum(q)
    if not sp or not sq:
        return math.nan
    total = 0.0
    for a, b in zip(p, q):
        pa, qb = a / sp, b / sq
        m = (pa + qb) / 2
        if pa:
            total += pa * math.log(pa / m) / 2
        if qb:
            total += qb * math.log(qb / m) / 2
    return math.sqrt(max(total, 0.0))


def gpu_loads(c: SampleColumns, ordered: dict[str, list[float]] | None = None
              ) -> tuple[tuple[str, float, Histogram], ...]:
    """(GPU index, mean utilization, utilization histogram) of each GPU of a node's samples that has a value
    (kept with them: :func:`~otelprof.analysis.run.per_rank`; ``ordered``: :func:`ordered_utilization` when
    already known)."""
    def compute() -> tuple[tuple[str, float, Histogram], ...]:
        out = []
        for index, values in (ordered_utilization(c) if ordered is None else ordered).items():
            if values:  # in order: the mean is the same (fsum), the histogram bisected
                out.append((index, math.fsum(values) / len(values), Histogram.of_sorted(values, 50, 0.0, 1.0)))
        return tuple(out)

    return per_rank(c, "load gpus", compute)


def ordered_utilization(c: SampleColumns) -> dict[str, list[float]]:
    """Per GPU index of a node's samples, in :func:`~otelprof.analysis.system.gpu_order`: its utilization
    values in ascending order (NaN left out)."""
    return {index: sorted_finite(c.gpus[index].get("u", ())) for index in sorted(c.gpus, key=gpu_order)}


def rank_loads(columns: StepColumns) -> dict[str, tuple[float, float, float, float]]:
    """Per phase of one rank's steps: (median step, mean compute, mean collective, mean exposed collective), in
    seconds (kept with the step columns: :func:`~otelprof.analysis.run.per_rank`)."""
    def compute() -> dict[str, tuple[float, float, float, float]]:
        wait = columns.annotation_sums(sc.REGION_DATALOADER)
        collective, exposed = collectives.of_columns(columns)
        out = {}
        for phase, mask in columns.phase_steps().items():  # mask: the phase's steps
            durations = list(map(columns.duration_ns.__getitem__, mask))
            if durations:
                n = len(durations)
                compute = _compute(durations, map(wait.__getitem__, mask), map(exposed.__getitem__, mask))
                out[phase] = (statistics.median(durations) / 1e9, compute / n / 1e9,
                              sum(map(collective.__getitem__, mask)) / n / 1e9,
                              sum(map(exposed.__getitem__, mask)) / n / 1e9)
        return out

    return per_rank(columns, "load ranks", compute)


def load_balance(view: RunView, config: MixinConfig | None = None, distance_threshold: float = 0.5) -> LoadBalance:
    config = config or MixinConfig()
    gpus = [GpuLoad(node, index, mean, histogram) for node, (_, c) in view.nodes().items()
            for index, mean, histogram in gpu_loads(c)]
    distances = []
    if len(gpus) <= PAIRWISE_LIMIT:
        for i, a in enumerate(gpus):
            for b in gpus[i + 1:]:
                distances.append(GpuDistance(f"{a.node}/{a.gpu}", f"{b.node}/{b.gpu}",
                                             js_distance(a.histogram.counts, b.histogram.counts)))
    else:
        mean = tuple(sum(col) for col in zip(*(g.histogram.counts for g in gpus)))
        distances = [GpuDistance(f"{g.node}/{g.gpu}", "all", js_distance(g.histogram.counts, mean)) for g in gpus]
    means = [g.mean for g in gpus]
    ranks = []
    per_phase: dict[str, list[tuple[int, float, float, float, float]]] = {}
    shown = view.shown_phases()
    for position, info in enumerate(view.info):
        columns = view.ranks[position].step_columns
        if not len(columns):
            continue
        for phase, row in rank_loads(columns).items():
            if phase in shown:
                per_phase.setdefault(phase, []).append((info.rank, *row))
    for phase, rows in sorted(per_phase.items()):
        computes = [r[2] for r in rows]
        # from 4 ranks on, the peers' median is the same for each rank: worked out once
        common = peers_median(computes, computes[0]) if len(rows) >= 4 else None
        for rank, median_step, mean_compute, mean_collective, mean_exposed in rows:
            peers = common if len(rows) >= 4 else peers_median(computes, mean_compute) if len(rows) > 1 else None
            ratio = share(mean_compute, peers) if peers else math.nan
            ranks.append(RankLoad(phase, rank, median_step, mean_compute, mean_collective, ratio,
                                  len(rows) > 1 and ratio > config.straggler_ratio, mean_exposed))
    return LoadBalance(config.load_balancing_threshold, max(means) - min(means) if len(means) > 1 else None,
                       distance_threshold, tuple(gpus), tuple(distances), tuple(ranks), config.straggler_ratio)


def _compute(steps_ns: Iterable[int], waits_ns: Iterable[int], exposed_ns: Iterable[int]) -> int:
    """The steps' time outside data-loader wait and exposed communication (each step's never below 0)."""
    return sum(map(max, map(operator.sub, map(operator.sub, steps_ns, waits_ns), exposed_ns), repeat(0)))
