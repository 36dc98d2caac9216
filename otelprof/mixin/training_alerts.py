"""The training alerts (group ``otelprof-training``): the loss not decreasing, loss spikes, non-finite values,
vanishing gradients, stalled training, overfitting."""

from __future__ import annotations

from dataclasses import dataclass

from otelprof import semconv as sc
from otelprof import thresholds
from otelprof.dashboards import ids
from otelprof.mixin import config as mc
from otelprof.mixin.alert_model import OFFLINE_TRAINING, RISK, Alert, AlertGroup, Runbook
from otelprof.mixin.alert_text import AT_RANK, DUR, L_PHASE, NUM, PCT, VAL, human, params, pct
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.promql import IDENTITY, JOB, PHASE, RANK, Q, by, number

NAME = "otelprof-training"


@dataclass(frozen=True)
class _WindowStats:
    """PromQL for the per-step mean of a value over a window and the squared standard error of that mean, from
    its running sum, sum of squares and count."""

    count: str
    mean: str
    se2: str


def window_stats(q: Q, summed: sc.MetricSpec, squared: sc.MetricSpec, recorded: sc.MetricSpec, window: str,
                  matchers: str, offset: str = "") -> _WindowStats:
    total = q.delta(summed, window, matchers=matchers, offset=offset)
    squares = q.delta(squared, window, matchers=matchers, offset=offset)
    count = q.delta(recorded, window, matchers=matchers, offset=offset)
    variance = f"clamp_min(({squares} - {total} ^ 2 / {count}) / ({count} - 1), 0)"  # sample variance
    return _WindowStats(count, f"({total} / {count})", f"{variance} / {count}")



def alerts(c: MixinConfig) -> list[Alert]:
    """The training alerts in runbook order."""
    q = Q(c.selector)
    train = f'{PHASE}="{c.train_phase}"'
    evl = f'{PHASE}="{c.eval_phase}"'
    lw = c.loss_window
    lws = seconds(lw)
    diff = number(c.loss_diff_percent / 100)
    now, before = window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, lw, train), \
        window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, lw, train, offset=lw)
    noise = f"{number(c.loss_noise_sigmas)} * sqrt({now.se2} + {before.se2})"
    # Losses in both windows (2 or more: a noise), and no loss was NaN in them (NonFiniteValues speaks then).
    steps_moving = (f"and on ({JOB}, {RANK}, {PHASE}) {now.count} > 1\n"
                    f"and on ({JOB}, {RANK}, {PHASE}) {before.count} > 1\n"
                    f"unless on ({JOB}, {RANK}, {PHASE}) "
                    f"{q.delta(sc.NONFINITE, f'{2 * int(lws)}s', matchers=train)} > 0")
    not_decreasing = Alert(
        short="LossNotDecreasing", group=NAME,
        expr=f"{now.mean}\n> {before.mean}\n  - {diff} * abs({before.mean})\n  + {noise}\n{steps_moving}\n"
             # both windows inside training (from the first step on), so the earlier mean is not one early loss
             f"and on ({JOB}, {RANK}) (time() - {q.sel(sc.STEP_FIRST_TIMESTAMP)}) > {2 * int(lws)}",
        for_=c.loss_for, severity="warning",
        summary="The training loss stopped decreasing.",
        description=f"{AT_RANK}: mean training loss per step over the last {lw} is {VAL}, clearly not "
                    f"{c.loss_diff_percent:g} % lower than over the {lw} before (beyond the noise of both means). "
                    "Training has converged or stalled.",
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=(*IDENTITY, PHASE, *c.target_labels),
        runbook=Runbook(
            meaning=f"The mean of the training losses recorded in the steps of the last {lw} is higher than their "
                    f"mean over the {lw} before less {c.loss_diff_percent:g} % of it, by more than "
                    f"{c.loss_noise_sigmas:g} standard errors of the difference (the noise of the two means, from "
                    "the steps' sums of squares): the loss surely did not fall by that much. It holds for "
                    f"{c.loss_for}, while losses were recorded in both windows and every loss was finite; judged "
                    "once training has run for two windows. The means are per step (from otelprof_loss_summed, "
                    "_squared_total and _recorded_total), so a checkpoint or an evaluation pass (no training "
                    "steps) weighs no loss more than another, and loss spikes (OtelprofLossSpike) are left out.",
            thresholds=params(("window", lw), ("diff_percent", f"{c.loss_diff_percent:g} %"),
                               ("noise_sigmas", f"{c.loss_noise_sigmas:g}"), ("for", c.loss_for)),
            limit=f"A loss whose {lw} mean falls by less than {c.loss_diff_percent:g} % less "
                  f"{c.loss_noise_sigmas:g} standard errors per {lw}, or rises. With per-step noise s (relative "
                  f"standard deviation) and n steps per window the standard error of the difference is s x "
                  f"sqrt(2 / n): a flat loss fires when {c.loss_noise_sigmas:g} s sqrt(2 / n) < "
                  f"{c.loss_diff_percent:g} %, e.g. s = 1 % with n = 1000 "
                  f"({c.loss_noise_sigmas * (2 / 1000) ** 0.5:.2g} %); a noisier loss only once it rises by "
                  f"more than its noise (s = 10 %, n = 1000: "
                  f"{c.loss_noise_sigmas * 10 * (2 / 1000) ** 0.5 - c.loss_diff_percent:.2g} %); raise "
                  "diff_percent (or the window) to catch flat noisy losses. A loss that stops falling fires at the "
                  f"latest {human(2 * lws + seconds(c.loss_for))} after it flattens (both windows flat, then `for` "
                  f"{c.loss_for}), and never before training (the first step) has run {human(2 * lws)}.",
            todo="Expected near convergence: then stop or lower the learning rate. Early in training it "
                 "points at a learning rate that is too high or too low, a data pipeline that repeats the "
                 "same batches, or frozen parameters. Check OtelprofVanishingGradients and the learning-rate "
                 "panel.",
            deviations="The original compared the loss at step s with the loss at step s - num_steps (10), one "
                       f"value each. This compares the per-step means of the last {lw} and the {lw} before, and "
                       "fires only when the shortfall is beyond the noise of those means: a healthy loss that falls "
                       "more slowly than its noise can show stays quiet (scraped values of a last-loss gauge "
                       "weighed one batch per scrape, and the same batch 10-15 times through an evaluation pass or "
                       "a checkpoint, and fired on 38-40 of 40 scrape phasings of a healthy run).",
            original="LossNotDecreasing"),
        panel=ids.REPORT_LOSS, section="training", kind=RISK,
        knobs=("train_phase", "loss_window", "loss_diff_percent", "loss_noise_sigmas", "loss_for"),
        offline=OFFLINE_TRAINING, cases=("training_test.yaml",))

    sw = c.loss_spike_window
    spike = Alert(
        short="LossSpike", group=NAME,
        expr=f"{q.delta(sc.LOSS_SPIKES, sw, matchers=train)} > 0",
        for_="0s", severity="warning",
        summary="The training loss jumped.",
        description=f"{AT_RANK}: {NUM} training steps of the last {sw} had a loss of more than "
                    f"{c.loss_spike_ratio:g} times the recent median.",
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=(*IDENTITY, PHASE, *c.target_labels),
        runbook=Runbook(
            meaning=f"In the last {sw}, a training step recorded a finite loss above {c.loss_spike_ratio:g} times "
                    f"the median and above the mean + {c.loss_spike_sigma:g} standard deviations of the phase's "
                    f"last {thresholds.OUTLIER_WINDOW} losses (judged in the training process after "
                    f"{thresholds.LOSS_SPIKE_MIN_STEPS} losses, while the median is positive). Severity warning, "
                    "not info: a jump of that size is a large, wrong update (a bad batch, a learning rate too high "
                    "for the current curvature, an fp16 overflow just short of inf) that the optimizer's state "
                    "keeps; repeated spikes are how training starts to diverge, and a run that recovers has still "
                    "lost progress. Not critical: training often recovers by itself.",
            thresholds=params(("window", sw), ("ratio (in process)", f"{c.loss_spike_ratio:g}"),
                               ("stddev (in process)", f"{c.loss_spike_sigma:g}")),
            limit=f"A single step whose loss is {c.loss_spike_ratio:g} times the recent median (and beyond "
                  f"{c.loss_spike_sigma:g} sigma of the recent losses); fires at the first scrape and rule "
                  f"evaluation after it (no `for`) and stays firing for {sw}. Jumps below {c.loss_spike_ratio:g} "
                  "times the median (noise, a harder batch) never fire; nor do the first "
                  f"{thresholds.LOSS_SPIKE_MIN_STEPS} losses of a process.",
            todo="Look at the spiking steps' inputs (log the batch ids of steps whose loss jumped) and the "
                 "gradient norm around them (record('grad_norm', ...)). Common fixes: gradient clipping, a lower "
                 "peak learning rate or a longer warm-up, skipping or cleaning bad samples, bf16 instead of "
                 "fp16, a larger Adam epsilon. If spikes repeat and the loss does not come back, restart from "
                 "the checkpoint before the first spike.",
            deviations="No original: SageMaker Debugger watched for NaN/inf (ExplodingTensor) and a flat loss, "
                       "not a transient jump. The spike test runs in the training process on every step's loss "
                       "(otelprof_loss_spikes_total), so a spike between two scrapes is never missed."),
        no_for="each counted spike was already judged in the training process against the recent losses (ratio to "
               "the median and sigma): one is the fault, and a `for` would let a transient jump expire unseen.",
        panel=ids.REPORT_LOSS, section="training", kind=RISK,
        knobs=("train_phase", "loss_spike_ratio", "loss_spike_sigma", "loss_spike_window"),
        offline=OFFLINE_TRAINING, cases=("training_test.yaml",))

    nonfinite = Alert(
        short="NonFiniteValues", group=NAME,
        expr=f"{q.delta(sc.NONFINITE, c.nonfinite_window)} > 0",
        for_="0s", severity="critical",
        summary="The loss or the gradient norm became NaN or infinite.",
        description=f"{AT_RANK}: {NUM} non-finite {{{{ $labels.scalar }}}} values recorded in {L_PHASE} steps over the "
                    f"last {c.nonfinite_window}.",
        dashboard=mc.DASHBOARD_TRAINING_REPORT,
        labels=(*IDENTITY, PHASE, sc.prometheus_label(sc.LABEL_SCALAR), *c.target_labels),
        runbook=Runbook(
            meaning=f"record('loss', ...) or record('grad_norm', ...) received NaN or an infinity in the last "
                    f"{c.nonfinite_window}. Training rarely recovers: every further step wastes compute.",
            thresholds=params(("window", c.nonfinite_window)),
            limit=f"A single NaN or infinite loss or gradient norm; fires at the first scrape and rule evaluation "
                  f"after it (no `for`) and stays firing for {c.nonfinite_window}.",
            todo="With the default action `stop` the job ends at the next step boundary after your on_stop "
                 "callbacks. Resume from the last good checkpoint with a lower learning rate, gradient "
                 "clipping, loss scaling for fp16 (or bf16), and check the inputs of the failing steps for "
                 "NaNs or extreme values.",
            deviations="The original (ExplodingTensor) inspected saved tensors; otelprof checks the recorded "
                       "loss and gradient norm of every step, counted in the process (so a NaN between "
                       "scrapes is never missed).",
            original="ExplodingTensor"),
        no_for="one NaN or infinite loss or gradient norm is conclusive: the run's weights are likely already "
               "corrupted.",
        panel=ids.REPORT_NONFINITE, section="training", kind=RISK,
        knobs=("nonfinite_window",),
        offline=OFFLINE_TRAINING, cases=("training_test.yaml",))

    vw = c.vanishing_gradient_window
    norm_mean = (f"{q.delta(sc.GRAD_NORM_SUMMED, vw, matchers=train)}\n  / "
                 f"{q.delta(sc.GRAD_NORM_RECORDED, vw, matchers=train)}")
    vanishing = Alert(
        short="VanishingGradients", group=NAME,
        expr=f"(\n  {norm_mean}\n) < {number(c.vanishing_gradient_threshold)}",
        for_="0s", severity="warning",
        summary="Gradients vanished.",
        description=f"{AT_RANK}: the mean gradient norm of the training steps of the last {vw} is {VAL}, below "
                    f"{c.vanishing_gradient_threshold:g}.",
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=(*IDENTITY, PHASE, *c.target_labels),
        runbook=Runbook(
            meaning=f"The mean of the global gradient norms recorded in the training steps of the last {vw} was "
                    f"below {c.vanishing_gradient_threshold:g}: the parameters barely change.",
            thresholds=params(("window", vw), ("threshold", f"{c.vanishing_gradient_threshold:g}")),
            limit=f"A mean gradient norm below {c.vanishing_gradient_threshold:g} over {vw} of training steps; "
                  f"norms that collapse at once fire within {vw} (no `for`).",
            todo="Check for saturated activations, a loss that is detached from the parameters, parameters "
                 "accidentally frozen, or a learning-rate schedule that has decayed to zero; use normalization "
                 "layers, residual connections or a different initialization.",
            deviations="The original compared the mean absolute value of each gradient tensor with 1e-7; "
                       "otelprof sees the global gradient norm (record('grad_norm', ...)), which is larger "
                       "than any mean absolute value, so with the same threshold it fires later. The mean over "
                       "every step of the window comes from per-step sums and counts "
                       "(otelprof_grad_norm_summed_total, _recorded_total), not from scraped last values.",
            original="VanishingGradient"),
        no_for="one evaluation takes the largest gradient norm of the whole window while steps run: the window is "
               "the `for`.",
        panel=ids.REPORT_GRAD_NORM, section="training", kind=RISK,
        knobs=("train_phase", "vanishing_gradient_threshold", "vanishing_gradient_window"),
        offline=OFFLINE_TRAINING, cases=("training_test.yaml",))

    stalled_limit = int(seconds(c.stalled_training_threshold))
    stalled = Alert(
        short="TrainingStalled", group=NAME,
        expr=f"time() - max by ({by(*IDENTITY)}) ({q.sel(sc.STEP_LAST_TIMESTAMP)}) > {stalled_limit}",
        for_="0s", severity="critical",
        summary="No training step finished for a long time.",
        description=f"{AT_RANK}: the last step ended {DUR} ago.",
        dashboard=mc.DASHBOARD_RANKS, labels=IDENTITY,
        runbook=Runbook(
            meaning=f"The process is alive (its metrics are scraped) but no step of any phase has finished for "
                    f"more than {c.stalled_training_threshold}.",
            thresholds=params(("threshold", c.stalled_training_threshold)),
            limit=f"No step of any phase ending for {c.stalled_training_threshold}; fires "
                  f"{c.stalled_training_threshold} after the last step ended (no `for`).",
            todo="A hung collective is the usual cause in distributed jobs: check whether another rank died "
                 "(OtelprofTelemetryAbsent) and run py-spy dump on the process. Otherwise look for a dead "
                 "data-loader worker, a full disk during checkpointing, or a very long evaluation outside "
                 "steps (raise the threshold if that is expected). A stop request cannot reach a loop that "
                 "is stuck inside a step: restart the job from its last checkpoint.",
            deviations="The original watched for new tensors being saved (default 1800 s); this watches the "
                       "end time of the last step of any phase.",
            original="StalledTrainingRule"),
        no_for="the condition is itself a duration (no step ended for that long); a `for` would only add to it.",
        panel=ids.RANKS_LAST_STEP, section="steps", kind=RISK,
        knobs=("stalled_training_threshold",),
        offline=OFFLINE_TRAINING, cases=("training_test.yaml",))

    ow = c.overfit_window
    eval_mean = window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, ow, evl).mean
    train_mean = window_stats(q, sc.LOSS_SUMMED, sc.LOSS_SQUARED, sc.LOSS_RECORDED, ow, train).mean
    overfit = Alert(
        short="Overfitting", group=NAME,
        expr=f"(\n  {eval_mean}\n  - ignoring ({PHASE})\n  {train_mean}\n)\n/ ignoring ({PHASE})\n"
             f"{train_mean} > {number(c.overfit_ratio_threshold)}\n"
             f"and ignoring ({PHASE}) {train_mean} > 0",
        for_=c.overfit_for, severity="warning",
        summary="The evaluation loss pulls away from the training loss.",
        description=f"{AT_RANK}: mean evaluation loss over the last {ow} is {PCT} above the mean training loss.",
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=(*IDENTITY, *c.target_labels),
        runbook=Runbook(
            meaning=f"(mean eval loss - mean train loss) / mean train loss over the steps of the last {ow} exceeds "
                    f"{c.overfit_ratio_threshold:g}. Only jobs that record a loss in an `{c.eval_phase}` phase "
                    f"are checked, at times when both phases ran steps within {ow} (evaluate at least that often, "
                    "or widen the window).",
            thresholds=params(("window", ow), ("ratio_threshold", c.overfit_ratio_threshold),
                               ("for", c.overfit_for)),
            limit=f"A mean eval loss more than {pct(c.overfit_ratio_threshold)} above the mean training loss over "
                  f"{ow}, with an evaluation pass in the window. A gap of g that opens at once fires once the "
                  f"window's evaluation steps are mostly past it, then `for` {c.overfit_for}: at the latest "
                  f"{human(seconds(ow) + seconds(c.overfit_for))} with an evaluation pass every {ow}.",
            todo="Stop at the best checkpoint (early stopping), add regularization (weight decay, dropout, "
                 "augmentation) or more data. A gap that is there from the start usually means the two "
                 "losses are computed differently (e.g. dropout, label smoothing or a different reduction).",
            deviations="The original compared the means of saved train and eval losses per step; this "
                       f"compares the per-step means of the two phases' losses over {ow} (from per-step sums and "
                       f"counts, never scraped last values) and waits {c.overfit_for} instead of a step-count "
                       "patience.",
            original="Overfit"),
        panel=ids.REPORT_LOSS, section="training", kind=RISK,
        knobs=("train_phase", "eval_phase", "overfit_ratio_threshold", "overfit_window", "overfit_for"),
        offline=OFFLINE_TRAINING, cases=("training_test.yaml",))
    return [not_decreasing, spike, nonfinite, vanishing, stalled, overfit]


GROUP = AlertGroup(NAME, alerts)
