"""CPU and I/O bottlenecks: samples in which some logical CPU was busy (or waiting on I/O) above its
threshold while some GPU was below the GPU threshold — the per-sample coincidence of the original
CPUBottleneck / IOBottleneck rules, counted over the whole run — and what the training loop was
doing at those moments (the region each rank on the node was in)."""

from __future__ import annotations

import bisect
import operator
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat

from otelprof.analysis.ranksummary import RankSummary, many, summarize
from otelprof.analysis.run import RunView, gpu_min, per_rank
from otelprof.analysis.stats import share
from otelprof.mixin.config import MixinConfig
from otelprof.recording.columns import SampleColumns

BETWEEN_STEPS = "between steps"
OUTSIDE_LOOP = "outside the training loop"
IN_STEP = "in a step, outside any region"


@dataclass(frozen=True)
class NodeBottleneck:
    node: str
    datapoints: int
    low_gpu: int
    """Samples with a GPU below the GPU threshold."""
    busy: int
    """Samples with a CPU above the CPU (or iowait) threshold."""
    coincidences: int
    fraction: float
    regions: tuple[tuple[str, int], ...]
    """What the node's ranks were doing in the coincident samples: (region, rank-samples)."""


@dataclass(frozen=True)
class Bottleneck:
    kind: str
    """``cpu`` or ``io``."""
    busy_threshold: float
    gpu_threshold: float
    threshold: float
    """Share of samples above which the check calls it a bottleneck."""
    nodes: tuple[NodeBottleneck, ...]
    summary: RankSummary | None = field(init=False)
    """With more than ranksummary.THRESHOLD nodes: the share of coincident samples over them (else None)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", summarize(((n.node, n.fraction) for n in self.nodes),
                                                      "samples with a GPU waiting", "ratio")
                           if many(len(self.nodes)) else None)


def bottleneck(view: RunView, kind: str, config: MixinConfig | None = None) -> Bottleneck:
    config = config or MixinConfig()
    io = kind == "io"
    high = config.io_threshold if io else config.cpu_threshold
    rows = []
    for node, (_, c) in view.nodes().items():
        datapoints, low_gpu, busy, hits = coincidences(c, io, high, config.gpu_threshold)
        regions = _regions(view, node, hits)
        rows.append(NodeBottleneck(node, datapoints, low_gpu, busy, len(hits), share(len(hits), datapoints),
                                   tuple(regions.most_common())))
    threshold = config.io_bottleneck_threshold if io else config.cpu_bottleneck_threshold
    return Bottleneck(kind, high, config.gpu_threshold, threshold, tuple(rows))


def coincidences(c: SampleColumns, io: bool, high: float, gpu_threshold: float, lowest: list[float] | None = None
                  ) -> tuple[int, int, int, array[int]]:
    """One node's samples: (node samples, with a GPU below ``gpu_threshold``, with a CPU (``io``: I/O wait) above
    ``high``, times of the samples with both), kept with them (:func:`~otelprof.analysis.run.per_rank`;
    ``lowest``: :func:`~otelprof.analysis.run.gpu_min` when already known)."""
    def compute() -> tuple[int, int, int, array[int]]:
        busy_col = c.iow_max if io else c.cpu_max
        least = gpu_min(c) if lowest is None else lowest
        known = list(map(operator.eq, busy_col, busy_col))  # a node value (not NaN)
        low = list(map(operator.lt, least, repeat(gpu_threshold))) if least else [False] * len(busy_col)
        busy = list(map(operator.gt, busy_col, repeat(high)))  # NaN: False
        hits = array("q", compress(c.t_ns, map(operator.and_, low, busy)))
        return sum(known), sum(compress(low, known)), sum(busy), hits

    return per_rank(c, ("coincidences", io, high, gpu_threshold), compute)


def region_at(view: RunView, index: int, t_ns: int) -> str:
    """The depth-0 region rank ``index`` was in at ``t_ns`` (or where it was relative to its steps)."""
    c = view.ranks[index].step_columns
    if not len(c):
        return OUTSIDE_LOOP
    i = bisect.bisect_right(c.start_ns, t_ns) - 1
    if i < 0:
        return OUTSIDE_LOOP
    start = c.start_ns[i]
    if t_ns >= start + c.duration_ns[i]:
        return BETWEEN_STEPS if i + 1 < len(c) else OUTSIDE_LOOP
    for j in range(c.ann_index[i], c.ann_index[i + 1]):
        if c.ann_depth[j] == 0 and start + c.ann_offset[j] <= t_ns < start + c.ann_offset[j] + c.ann_duration[j]:
            return c.ann_names[c.ann_name[j]]
    return IN_STEP


def _regions(view: RunView, node: str, times: Sequence[int]) -> Counter[str]:
    counts: Counter[str] = Counter()
    members = [i for i, info in enumerate(view.info) if info.node == node]
    for index in members:
        for t in times:
            counts[region_at(view, index, t)] += 1
    return counts
