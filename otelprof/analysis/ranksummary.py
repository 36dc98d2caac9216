"""Many ranks (or GPUs, or nodes) at once: the distribution of one figure over them and the worst and best few,
what the report shows instead of one row per rank once a job has more than :data:`THRESHOLD` of them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from otelprof.analysis.stats import quantile

THRESHOLD = 16
"""Up to this many ranks (GPUs, nodes) a section lists each; beyond, it shows their summary."""
TOP = 5
"""Ranks listed as the worst and as the best."""


@dataclass(frozen=True)
class Ranked:
    subject: str
    """``rank 7``, ``node-3 GPU 1``: whom the value belongs to."""
    value: float


@dataclass(frozen=True)
class RankSummary:
    """One figure over many subjects: its distribution and the worst and best :data:`TOP`."""

    figure: str
    """What the values are (``median step``), with ``group`` (a phase) when the section has several."""
    unit: str
    """``seconds``, ``ratio``, ``count``: how to format the values."""
    group: str
    count: int
    """Subjects with a value (NaN values are left out)."""
    min: float
    p5: float
    median: float
    p95: float
    max: float
    worst: tuple[Ranked, ...]
    """Highest first when ``higher_is_worse``, else lowest first."""
    best: tuple[Ranked, ...]
    """Best first."""
    folded: int
    """Subjects in neither list."""
    higher_is_worse: bool = True


def summarize(values: Iterable[tuple[str, float]], figure: str, unit: str, group: str = "",
              higher_is_worse: bool = True, top: int = TOP) -> RankSummary:
    """The summary of ``(subject, value)`` pairs; ties keep the order given (the lower rank first)."""
    kept = [(subject, v) for subject, v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    ordered = sorted(v for _, v in kept)
    by_worst = sorted(range(len(kept)), key=lambda i: -kept[i][1] if higher_is_worse else kept[i][1])
    n_worst = min(top, len(kept))
    n_best = min(top, len(kept) - n_worst)
    worst = tuple(Ranked(*kept[i]) for i in by_worst[:n_worst])
    by_best = sorted(range(len(kept)), key=lambda i: kept[i][1] if higher_is_worse else -kept[i][1])
    best = tuple(Ranked(*kept[i]) for i in by_best[:n_best])
    return RankSummary(figure, unit, group, len(kept), ordered[0] if ordered else math.nan, quantile(ordered, 0.05),
                       quantile(ordered, 0.5), quantile(ordered, 0.95), ordered[-1] if ordered else math.nan,
                       worst, best, len(kept) - n_worst - n_best, higher_is_worse)


def many(count: int) -> bool:
    """Whether ``count`` subjects are too many to list one by one."""
    return count > THRESHOLD
