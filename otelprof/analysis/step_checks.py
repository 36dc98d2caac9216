"""The step alerts' offline twins: stragglers, outlier steps, slow initialization, input-bound steps; judged
on the step records."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import partial

from otelprof.analysis.check_context import CheckContext, CheckGroup, Conditions, Firing, by_job
from otelprof.mixin.config import seconds


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


def straggler(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.straggler_window)
    out = []
    for ranks in by_job(ctx.ranks).values():
        compute: dict[tuple[str, int], float] = {}
        for r in ranks:
            if not ctx.alive(r, t):
                continue
            for phase, steps, i, j in ctx.phase_windows(r, t - width, t):
                compute[(phase, r.rank)] = sum(steps.compute[i:j]) / (j - i)
        by_phase: dict[str, dict[int, float]] = {}
        for (p, rank), v in compute.items():
            by_phase.setdefault(p, {})[rank] = v
        for phase in sorted(by_phase):
            values = by_phase[phase]
            if len(values) > 1:
                ctx.judged.add("RankStraggler")
                for rank, value in sorted(values.items()):
                    peers = peers_median(list(values.values()), value)
                    if peers is not None and value / peers > ctx.c.straggler_ratio:
                        out.append(Firing(f"rank {rank} {phase}", value / peers))
    return out


def outliers(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.step_outlier_window)
    out = []
    for r in ctx.ranks:
        for phase, steps, i, j in ctx.phase_windows(r, t - width, t):
            if j - i <= ctx.c.step_outlier_min_steps:
                continue
            ctx.judged.add("StepOutliers")
            count = steps.outliers[j] - steps.outliers[i]
            busy = steps.busy[j] - steps.busy[i]
            cost = (steps.excess[j] - steps.excess[i]) / busy if busy > 0 else 0.0
            if count > ctx.c.step_outlier_n_outliers and cost > ctx.c.step_outlier_min_cost:
                out.append(Firing(f"{r.subject} {phase}", cost))
    return out


def slow_initialization(ctx: CheckContext, t: float) -> list[Firing]:
    limit = seconds(ctx.c.max_initialization_time)
    out = []
    for r in ctx.ranks:
        ends = ctx.steps[id(r)].ends
        first = ends[0] if ends else math.inf
        if ctx.alive(r, t):
            ctx.judged.add("SlowInitialization")
        if ctx.alive(r, t) and t - r.process_start > limit and first > t:
            out.append(Firing(r.subject, t - r.process_start))
    return out


def input_bound(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.input_bound_window)
    out = []
    for r in ctx.ranks:
        for phase, steps, _, _ in ctx.phase_windows(r, t - width, t):
            i, j = steps.inputs.span(t - width, t)
            if j > i:
                ctx.judged.add("InputBound")
            if j > i and steps.inputs.mean(i, j) > ctx.c.input_bound_threshold:
                out.append(Firing(f"{r.subject} {phase}", steps.inputs.mean(i, j)))
    return out


def conditions(ctx: CheckContext) -> Conditions:
    """The group's conditions and datapoints: the steps they read (those compared across ranks for a straggler)."""
    steps = ctx.step_count()
    ranks_per_phase: dict[tuple[str, str], int] = {}
    for r in ctx.ranks:
        for phase in ctx.steps[id(r)].phases:
            ranks_per_phase[(r.job, phase)] = ranks_per_phase.get((r.job, phase), 0) + 1
    compared = sum(len(steps_.ends) for r in ctx.ranks for phase, steps_ in ctx.steps[id(r)].phases.items()
                   if ranks_per_phase[(r.job, phase)] > 1)
    return {
        "RankStraggler": (partial(straggler, ctx), compared),
        "StepOutliers": (partial(outliers, ctx), steps),
        "SlowInitialization": (partial(slow_initialization, ctx), steps),
        "InputBound": (partial(input_bound, ctx), ctx.phase_count(None, lambda p: p.inputs)),
    }


GROUP = CheckGroup(("RankStraggler", "StepOutliers", "SlowInitialization", "InputBound"), conditions)
