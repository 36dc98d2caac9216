"""The training alerts' offline twins: the loss not decreasing, loss spikes, non-finite values, vanishing
gradients, stalled training, overfitting; judged on the steps' losses and gradient norms."""

from __future__ import annotations

import bisect
import math
from functools import partial

from otelprof import thresholds
from otelprof.analysis.check_context import CheckContext, CheckGroup, Condition, Conditions, Firing
from otelprof.analysis.check_tables import EMPTY, PhaseSteps, RankData, Series
from otelprof.mixin.config import seconds


def _mean_se2(values: Series, i: int, j: int) -> tuple[float, float]:
    """Mean of the window's values and its squared standard error (sample variance / n), as the live rule
    computes them from the running sum, sum of squares and count (at least two values)."""
    n, total, squares = values.moments(i, j)
    variance = max((squares - total * total / n) / (n - 1), 0.0)
    return total / n, variance / n


def _losses(ctx: CheckContext, r: RankData, phase: str) -> Series:
    """A phase's finite losses without spikes, as the live rules' sums hold them."""
    steps = ctx.steps[id(r)].phases.get(phase)
    return steps.trend if steps is not None else EMPTY


def loss_not_decreasing(ctx: CheckContext, t: float) -> list[Firing]:
    lw = seconds(ctx.c.loss_window)
    out = []
    for r in ctx.ranks:
        first = ctx.first_steps[id(r)]
        if first is None or t - first <= 2 * lw or not ctx.alive(r, t):
            continue  # both windows inside training, as the live rule asks (time since the first step)
        losses = _losses(ctx, r, ctx.c.train_phase)
        (i, j), (k, m) = losses.span(t - lw, t), losses.span(t - 2 * lw, t - lw)
        steps = ctx.steps[id(r)].phases.get(ctx.c.train_phase)
        if steps is not None and any(bisect.bisect_right(bad, t) > bisect.bisect_right(bad, t - 2 * lw)
                                     for bad in (steps.bad_losses, steps.bad_norms)):
            continue  # a NaN in the windows: NonFiniteValues speaks, the held loss would look flat
        if j - i > 1 and m - k > 1:
            ctx.judged.add("LossNotDecreasing")
            (mean_now, se2_now), (mean_before, se2_before) = _mean_se2(losses, i, j), _mean_se2(losses, k, m)
            margin = ctx.c.loss_diff_percent / 100 * abs(mean_before) - \
                ctx.c.loss_noise_sigmas * math.sqrt(se2_now + se2_before)
            if mean_now > mean_before - margin:
                out.append(Firing(f"{r.subject} {ctx.c.train_phase}", mean_now))  # the live alert's labels
    return out


def loss_spike(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.loss_spike_window)
    out = []
    for r in ctx.ranks:
        steps = ctx.steps[id(r)].phases.get(ctx.c.train_phase)
        if steps is None or len(steps.losses) <= thresholds.LOSS_SPIKE_MIN_STEPS:
            continue
        i, j = steps.losses.span(t - width, t)
        if j > thresholds.LOSS_SPIKE_MIN_STEPS and ctx.alive(r, t):
            ctx.judged.add("LossSpike")  # losses past the warm-up of the spike test in the window
        count = steps.spikes[j] - steps.spikes[i]
        if count > 0:
            out.append(Firing(f"{r.subject} {ctx.c.train_phase}", count))
    return out


def nonfinite(ctx: CheckContext) -> Condition:
    width = seconds(ctx.c.nonfinite_window)
    flagged: dict[int, list[tuple[str, PhaseSteps]]] = {}
    """Per rank, the phases with a non-finite value at all (few; looking at every phase each time is T x P)."""

    def condition(t: float) -> list[Firing]:
        out: list[Firing] = []
        ctx.judged.add("NonFiniteValues")  # every recorded loss and gradient norm is judged (its datapoints)
        for r in ctx.ranks:
            counts: dict[str, int] = {}
            if id(r) not in flagged:
                flagged[id(r)] = [(phase, steps) for phase, steps in ctx.steps[id(r)].phases.items()
                                  if len(steps.bad_losses) or len(steps.bad_norms)]
            for phase, steps in flagged[id(r)]:
                for name, ends in (("loss", steps.bad_losses), ("grad_norm", steps.bad_norms)):
                    count = bisect.bisect_right(ends, t) - bisect.bisect_right(ends, t - width)
                    if count:
                        counts[f"{r.subject} {phase} {name}"] = count
            out.extend(Firing(k, v) for k, v in sorted(counts.items()))
        return out
    return condition


def vanishing(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.vanishing_gradient_window)
    out = []
    for r in ctx.ranks:
        steps = ctx.steps[id(r)].phases.get(ctx.c.train_phase)
        if steps is None:
            continue
        i, j = steps.norms.span(t - width, t)
        if j > i:
            ctx.judged.add("VanishingGradients")
            mean = steps.norms.mean(i, j)
            if mean < ctx.c.vanishing_gradient_threshold:
                out.append(Firing(f"{r.subject} {ctx.c.train_phase}", mean))
    return out


def stalled(ctx: CheckContext, t: float) -> list[Firing]:
    limit = seconds(ctx.c.stalled_training_threshold)
    out = []
    for r in ctx.ranks:
        ends = ctx.steps[id(r)].ends
        i = bisect.bisect_right(ends, t)
        if i and ctx.alive(r, t):
            ctx.judged.add("TrainingStalled")
        if i and ctx.alive(r, t) and t - ends[i - 1] > limit:
            out.append(Firing(r.subject, t - ends[i - 1]))
    return out


def _window_mean(ctx: CheckContext, r: RankData, t: float, width: float, phase: str) -> float | None:
    """Per-step mean of a phase's losses over the window (None: no loss in it), as the live rule's sums."""
    losses = _losses(ctx, r, phase)
    i, j = losses.span(t - width, t)
    if j > i:
        n, total, _ = losses.moments(i, j)
        return total / n
    return None


def overfit(ctx: CheckContext, t: float) -> list[Firing]:
    width = seconds(ctx.c.overfit_window)
    out = []
    for r in ctx.ranks:
        if not ctx.alive(r, t):
            continue
        train = _window_mean(ctx, r, t, width, ctx.c.train_phase)
        evaluation = _window_mean(ctx, r, t, width, ctx.c.eval_phase)
        if train and evaluation is not None and train > 0:
            ctx.judged.add("Overfitting")
            ratio = (evaluation - train) / train
            if ratio > ctx.c.overfit_ratio_threshold:
                out.append(Firing(r.subject, ratio))
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
        "NonFiniteValues": (nonfinite(ctx), scalars),
        "VanishingGradients": (partial(vanishing, ctx), ctx.phase_count(train, lambda p: p.norms)),
        "TrainingStalled": (partial(stalled, ctx), ctx.step_count()),
        "Overfitting": (partial(overfit, ctx), ctx.phase_count(evaluation, lambda p: p.losses) if train_losses else 0),
    }


GROUP = CheckGroup(("LossNotDecreasing", "LossSpike", "NonFiniteValues", "VanishingGradients", "TrainingStalled",
                    "Overfitting"), conditions)
