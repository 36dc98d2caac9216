"""The training alerts' offline twins: the loss not decreasing, loss spikes, non-finite values, vanishing
gradients, stalled training, overfitting; judged on the steps' losses and gradient norms."""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Sequence
from functools import partial
from itertools import accumulate

from otelprof import thresholds
from otelprof.analysis.check_context import CheckContext, CheckGroup, Conditions, Firing
from otelprof.analysis.check_tables import EMPTY, RankData, Series
from otelprof.mixin.alert_model import OFFLINE_TRAINING
from otelprof.mixin.config import seconds


def _mean_se2(values: Series, i: int, j: int) -> tuple[float, float]:
    """Mean of the window's values and its squared standard error (sample variance / n), as the live rule
    computes them from the running sum, sum of squares and count (at least two values)."""
    n, total, squares = values.moments(i, j)
    variance = max((squares - total * total / n) / (n - 1), 0.0)
    return total / n, variance / n


def _running_moments(values: Series) -> tuple[Sequence[float], list[float]]:
    """The running totals of the values and of their squares that :meth:`Series.moments` differences."""
    listed = values.values.tolist()
    return values.running_sums(), list(accumulate(map(operator.mul, listed, listed), initial=0.0))


def _losses(ctx: CheckContext, r: RankData, phase: str) -> Series:
    """A phase's finite losses without spikes, as the live rules' sums hold them."""
    steps = ctx.steps[id(r)].phases.get(phase)
    return steps.trend if steps is not None else EMPTY


def loss_not_decreasing(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    lw = seconds(ctx.c.loss_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        first = ctx.first_steps[id(r)]
        if first is None:
            continue
        live = [k for k in ctx.live(r, times) if times[k] - first > 2 * lw]  # both windows inside training, as
        if not live:  # the live rule asks (time since the first step)
            continue
        losses = _losses(ctx, r, ctx.c.train_phase)
        (now_lo, now_hi), (before_lo, before_hi) = ctx.spans(losses.times, times, lw), \
            ctx.spans(losses.times, times, 2 * lw, lw)
        steps = ctx.steps[id(r)].phases.get(ctx.c.train_phase)
        bad = {k for ends in ((steps.bad_losses, steps.bad_norms) if steps else ()) if ends
               for k, (lo, hi) in enumerate(zip(*ctx.spans(ends, times, 2 * lw))) if hi > lo}
        sums, squares = _running_moments(losses)
        share, sigmas = ctx.c.loss_diff_percent / 100, ctx.c.loss_noise_sigmas
        subject = f"{r.subject} {ctx.c.train_phase}"  # the live alert's labels
        for k in live:
            if k in bad:
                continue  # a NaN in the windows: NonFiniteValues speaks, the held loss would look flat
            i, j, k0, m = now_lo[k], now_hi[k], before_lo[k], before_hi[k]
            if j - i > 1 and m - k0 > 1:
                ctx.judged.add("LossNotDecreasing")
                # _mean_se2 of both windows, inline (the same arithmetic in the same order)
                n, total = j - i, sums[j] - sums[i]
                se2_now = max((squares[j] - squares[i] - total * total / n) / (n - 1), 0.0) / n
                mean_now = total / n
                n, total = m - k0, sums[m] - sums[k0]
                se2_before = max((squares[m] - squares[k0] - total * total / n) / (n - 1), 0.0) / n
                mean_before = total / n
                margin = share * abs(mean_before) - sigmas * math.sqrt(se2_now + se2_before)
                if mean_now > mean_before - margin:
                    out[k].append(Firing(subject, mean_now))
    return out


def loss_spike(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.loss_spike_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        steps = ctx.steps[id(r)].phases.get(ctx.c.train_phase)
        if steps is None or len(steps.losses) <= thresholds.LOSS_SPIKE_MIN_STEPS:
            continue
        alive = set(ctx.live(r, times))
        for k, (i, j) in enumerate(zip(*ctx.spans(steps.losses.times, times, width))):
            if j > thresholds.LOSS_SPIKE_MIN_STEPS and k in alive:
                ctx.judged.add("LossSpike")  # losses past the warm-up of the spike test in the window
            count = steps.spikes[j] - steps.spikes[i]
            if count > 0:
                out[k].append(Firing(f"{r.subject} {ctx.c.train_phase}", count))
    return out


def nonfinite(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.nonfinite_window)
    out: list[list[Firing]] = [[] for _ in times]
    if times:
        ctx.judged.add("NonFiniteValues")  # every recorded loss and gradient norm is judged (its datapoints)
    for r in ctx.ranks:
        flagged = [(phase, steps) for phase, steps in ctx.steps[id(r)].phases.items()
                   if len(steps.bad_losses) or len(steps.bad_norms)]  # few phases; looking at every one is T x P
        if not flagged:
            continue
        counts: list[dict[str, int]] = [{} for _ in times]
        for phase, steps in flagged:
            for name, ends in (("loss", steps.bad_losses), ("grad_norm", steps.bad_norms)):
                for k, (i, j) in enumerate(zip(*ctx.spans(ends, times, width))):
                    if j > i:
                        counts[k][f"{r.subject} {phase} {name}"] = j - i
        for k, found in enumerate(counts):
            out[k].extend(Firing(key, v) for key, v in sorted(found.items()))
    return out


def vanishing(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.vanishing_gradient_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        steps = ctx.steps[id(r)].phases.get(ctx.c.train_phase)
        if steps is None or not len(steps.norms):
            continue
        for k, mean in enumerate(ctx.means(steps.norms, times, width)):
            if mean is not None:
                ctx.judged.add("VanishingGradients")
                if mean < ctx.c.vanishing_gradient_threshold:
                    out[k].append(Firing(f"{r.subject} {ctx.c.train_phase}", mean))
    return out


def stalled(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    limit = seconds(ctx.c.stalled_training_threshold)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        ends = ctx.steps[id(r)].ends
        if not ends:
            continue
        for k in ctx.live(r, times):
            t = times[k]
            i = bisect.bisect_right(ends, t)
            if i:
                ctx.judged.add("TrainingStalled")
                if t - ends[i - 1] > limit:
                    out[k].append(Firing(r.subject, t - ends[i - 1]))
    return out


def _window_means(ctx: CheckContext, r: RankData, times: Sequence[float], width: float,
                  phase: str) -> list[float | None]:
    """Per time, the per-step mean of a phase's losses over the window (None: no loss in it), as the live rule's
    sums (running totals: :meth:`Series.moments`' count and sum)."""
    losses = _losses(ctx, r, phase)
    lo, hi = ctx.spans(losses.times, times, width)
    if not len(losses):
        return [None] * len(lo)
    sums = losses.running_sums()
    return [(sums[j] - sums[i]) / (j - i) if j > i else None for i, j in zip(lo, hi)]


def overfit(ctx: CheckContext, times: Sequence[float]) -> list[list[Firing]]:
    width = seconds(ctx.c.overfit_window)
    out: list[list[Firing]] = [[] for _ in times]
    for r in ctx.ranks:
        live = ctx.live(r, times)
        if not live:
            continue
        trains = _window_means(ctx, r, times, width, ctx.c.train_phase)
        evaluations = _window_means(ctx, r, times, width, ctx.c.eval_phase)
        for k in live:
            train, evaluation = trains[k], evaluations[k]
            if train and evaluation is not None and train > 0:
                ctx.judged.add("Overfitting")
                ratio = (evaluation - train) / train
                if ratio > ctx.c.overfit_ratio_threshold:
                    out[k].append(Firing(r.subject, ratio))
    return out


def conditions(ctx: CheckContext) -> Conditions:
    """The group's conditions and datapoints: the losses and gradient norms they read."""
    train, evaluation = ctx.c.train_phase, ctx.c.eval_phase
    scalars = (ctx.phase_count(None, lambda p: p.losses) + ctx.phase_count(None, lambda p: p.bad_losses)
               + ctx.phase_count(None, lambda p: p.norms) + ctx.phase_count(None, lambda p: p.bad_norms))
    train_losses = ctx.phase_count(train, lambda p: p.losses)
    return {
        "LossNotDecreasing": (partial(loss_not_decreasing, ctx), train_losses),
        "LossSpike": (partial(loss_spike, ctx), train_losses),
        "NonFiniteValues": (partial(nonfinite, ctx), scalars),
        "VanishingGradients": (partial(vanishing, ctx), ctx.phase_count(train, lambda p: p.norms)),
        "TrainingStalled": (partial(stalled, ctx), ctx.step_count()),
        "Overfitting": (partial(overfit, ctx), ctx.phase_count(evaluation, lambda p: p.losses) if train_losses else 0),
    }


GROUP = CheckGroup(OFFLINE_TRAINING, conditions)
"""The twins of the alerts declared with ``offline=OFFLINE_TRAINING``, keyed by their short names in runbook order."""
