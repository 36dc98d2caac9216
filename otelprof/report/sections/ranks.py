"""Many ranks, GPUs or nodes drawn as their summary (:class:`~otelprof.analysis.ranksummary.RankSummary`): one
row per figure with its distribution, the worst and the best few, and how many are folded."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from otelprof.analysis.ranksummary import TOP, RankSummary
from otelprof.report.blocks import p, table
from otelprof.report.formatting import num, pct, rate, secs, size

FORMATS: dict[str, Callable[[float | None], str]] = {"seconds": secs, "ratio": pct, "bytes": size, "bytes/s": rate,
                                                     "count": lambda v: num(v, 9), "number": lambda v: num(v, 3)}


def summaries(items: Sequence[RankSummary], noun: str = "ranks") -> str:
    """The summaries as one table, with a line saying what it is instead of."""
    if not items:
        return ""
    groups = any(s.group for s in items)
    rows = []
    for s in items:
        fmt = FORMATS.get(s.unit, num)
        listed = ", ".join(f"{x.subject} ({fmt(x.value)})" for x in s.worst)
        best = ", ".join(f"{x.subject} ({fmt(x.value)})" for x in s.best)
        rows.append((s.figure, *((s.group,) if groups else ()), f"{s.count:,}",
                     *(fmt(v) for v in (s.min, s.p5, s.median, s.p95, s.max)), listed, best, f"{s.folded:,}"))
    headers = ("Figure", *(("Phase",) if groups else ()), noun.capitalize(), "min", "p5", "median", "p95", "max",
               f"Worst {TOP}", f"Best {TOP}", "Folded")
    return (p(f"{items[0].count:,} {noun}: the distribution of each figure over them and the worst and best {TOP}, "
              f"instead of one row each (the JSON output lists every one).")
            + table(headers, rows, 2 if groups else 1))
