"""The step alerts' offline twins: stragglers, outlier steps, slow initialization, input-bound steps; judged
on the step records."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import partial

from otelprof.analysis.check_context import CheckContext, CheckGroup, Conditions, Firing, by_job
from otelprof.analysis.window_bounds import never_above
from otelprof.mixin.alert_model import OFFLINE_STEPS
from otelprof.mixin.config import seconds


def peers_median(values: Sequence[float], value: float) -> float | None:
    """The median of ``values`` other than ``value`` (one of them), as the RankStraggler rule computes it.

    With 2 or 3 values: the mean of the others. With 4 or more: the largest value not above the median of
    all, which is the median of the others for every value that can exceed it when the count is even, and
    the median of all (at most one value above the exact one) when it is odd. None when not positive."""
    typical = peers_typical(values)
    if typical is None:
        typical = (math.fsum(values) - value) / (len(values) - 1)
    return typical if typical > 0 else None


def peers_typical(values: Sequence[float]) -> float | None:
    """What :func:`peers_median` finds for every value of 4 or more (it does not depend on which): the largest
    value not above the median of all; None for fewer values (the mean of the others, one value's own)."""
    if len(values) < 4:
        return None
    middle = statistics.median(values)
    return max(v for v in values if v <= middle)


def straggler(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.straggler_window)
    ratio = ctx.c.straggler_ratio
    out: list[list[Firing]] = [[] for _ in times]
    for ranks in by_job(ctx.ranks).values():
        by_phase: dict[str, dict[int, dict[int, float]]] = {}  # phase -> time index -> rank -> mean compute time
        for r in ranks:
            alive = set(ctx.live(r, times))
            for phase, steps, windows in ctx.phase_windows(r, times, width):
                values = steps.compute.tolist()  # a list sums its floats without boxing them: the same sums
                at = by_phase.setdefault(phase, {})
                for k, i, j in windows:
                    if k in alive:
                        at.setdefault(k, {})[r.rank] = sum(values[i:j]) / (j - i)
        for phase in sorted(by_phase):  # per time: the phases in order, each phase's ranks in order
            for k, found in by_phase[phase].items():
                if len(found) < 2:
                    continue
                ctx.judged.add("RankStraggler")
                out[k].extend(Firing(f"rank {rank} {phase}", share) for rank, share in stragglers(found, ratio))
    return out


def stragglers(found: dict[int, float], ratio: float) -> list[tuple[int, float]]:
    """The ranks (in order) whose value over the median of their peers' exceeds ``ratio``, with that share. From 4
    values on, the peers' median is the same for every value that can exceed it: only values past it times the
    ratio (less a margin for its rounding) are divided by it."""
    values = list(found.values())
    typical = peers_typical(values)
    if typical is None:
        candidates = sorted(found.items())
    elif typical > 0:
        product = typical * ratio
        limit = product - abs(product) * 2.0 ** -30
        candidates = sorted((rank, value) for rank, value in found.items() if value > limit)
    else:
        return []
    out = []
    for rank, value in candidates:
        peers = peers_median(values, value) if typical is None else typical
        if peers is not None and value / peers > ratio:
            out.append((rank, value / peers))
    return out


def outliers(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.step_outlier_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        for phase, steps, windows in ctx.phase_windows(r, times, width):
            for k, i, j in windows:
                if j - i <= ctx.c.step_outlier_min_steps:
                    continue
                ctx.judged.add("StepOutliers")
                count = steps.outliers[j] - steps.outliers[i]
                busy = steps.busy[j] - steps.busy[i]
                cost = (steps.excess[j] - steps.excess[i]) / busy if busy > 0 else 0.0
                if count > ctx.c.step_outlier_n_outliers and cost > ctx.c.step_outlier_min_cost:
                    out[k].append(Firing(f"{r.subject} {phase}", cost))
    return out


def slow_initialization(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    limit = seconds(ctx.c.max_initialization_time)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        ends = ctx.steps[id(r)].ends
        first = ends[0] if ends else math.inf
        live = ctx.live(r, times)
        if live:
            ctx.judged.add("SlowInitialization")
        for k in live:
            t = times[k]
            if t - r.process_start > limit and first > t:
                out[k].append(Firing(r.subject, t - r.process_start))
    return out


def input_bound(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.input_bound_window)
    threshold = ctx.c.input_bound_threshold
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        for phase, steps, windows in ctx.phase_windows(r, times, width):
            inputs = steps.inputs
            if not len(inputs):
                continue
            # the steps that waited, of which the data-wait shares are: every step's window is theirs when all did
            lo, hi = ctx.spans(steps.ends if len(inputs) == len(steps.ends) else inputs.times, times, width)
            if never_above(ctx.extent(inputs), threshold):  # no window's mean can fire: none summed
                if "InputBound" not in ctx.judged and any(hi[k] > lo[k] for k, _, _ in windows):
                    ctx.judged.add("InputBound")
                continue
            values = inputs.values.tolist()  # a list sums its floats without boxing them: the same sums
            for k, _, _ in windows:
                i, j = lo[k], hi[k]
                if j > i:
                    ctx.judged.add("InputBound")
                    mean = sum(values[i:j]) / (j - i)
                    if mean > threshold:
                        out[k].append(Firing(f"{r.subject} {phase}", mean))
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


GROUP = CheckGroup(OFFLINE_STEPS, conditions)
"""The twins of the alerts declared with ``offline=OFFLINE_STEPS``, keyed by their short names in runbook order."""
