"""The per-layer tensor checks as alerts: the live twins of :mod:`otelprof.analysis.tensors`.

The training process judges every saved step of the tensor collections with the offline rules' own conditions
and thresholds (:mod:`otelprof.tensor_checks`) and counts, per check and tensor, the saved steps at which a
layer's condition held as the offline check counts it (``otelprof.tensor.flagged``). Each alert fires while such
a count grew within ``tensor_window`` and names the tensor in its labels: the same verdict as ``otelprof check``
on the same run, whatever the scrape interval. Overtraining reads the per-step loss sums of the eval and train
phases instead. Meaning, what to do and detection limits come from the offline rules' table (one text).
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof import tensor_checks as tc
from otelprof.dashboards import ids
from otelprof.mixin import config as mc
from otelprof.mixin.alert_model import OFFLINE_TENSORS, RISK, Alert, AlertGroup, Runbook
from otelprof.mixin.alert_text import AT_RANK, NUM, PCT, human, params
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.promql import IDENTITY, JOB, PHASE, RANK, Q, number
from otelprof.mixin.rules import recording_names
from otelprof.mixin.tensor_rules import BY_NAME

NAME = "otelprof-tensors"

CHECK = sc.prometheus_label(sc.LABEL_CHECK)
COLLECTION = sc.prometheus_label(sc.LABEL_COLLECTION)
TENSOR = sc.prometheus_label(sc.LABEL_TENSOR)
L_TENSOR = "{{ $labels.tensor }}"

SUMMARIES = {
    tc.VANISHING: "A layer's gradients vanished.",
    tc.EXPLODING: "A layer's tensors exploded (NaN, Inf or huge values).",
    tc.POOR_INIT: "A layer's weights were initialized constant.",
    tc.SATURATED: "A sigmoid/tanh layer is saturated.",
    tc.DEAD_RELU: "A ReLU layer is dead.",
    tc.UPDATE_RATIO: "A layer's weight updates are too large or too small.",
    tc.ALL_ZERO: "A tensor is all zeros.",
    tc.UNCHANGED: "A trained weight never changes.",
    tc.CLASS_IMBALANCE: "The training labels are imbalanced.",
}
"""Each per-layer check's alert summary (the checks are :data:`otelprof.tensor_checks.LAYER_RULES`)."""

CONDITIONS = {
    tc.VANISHING: f"mean absolute gradient below {tc.VANISHING_ABS_MEAN:g} and below {tc.VANISHING_RATIO:g} x the "
                  "largest layer's",
    tc.EXPLODING: f"a NaN/Inf element or an absolute value above {tc.EXPLODING_ABS_MAX:g}",
    tc.POOR_INIT: f"weight std at most {tc.POOR_INIT_STD:g} at its first saved step",
    tc.SATURATED: f"more than {tc.SATURATED_FRACTION:.0%} of its outputs within 0.01 of the bounds",
    tc.DEAD_RELU: f"more than {tc.DEAD_RELU_FRACTION:.0%} of its outputs zero",
    tc.UPDATE_RATIO: f"update/weight L2 ratio above {tc.UPDATE_RATIO_LARGE:g} or below {tc.UPDATE_RATIO_SMALL:g}",
    tc.ALL_ZERO: "every element zero at every saved step",
    tc.UNCHANGED: "the same mean, std, min, max and L2 norm at every saved step",
    tc.CLASS_IMBALANCE: f"most/least frequent class above {tc.IMBALANCE_RATIO:g} over at least "
                        f"{tc.IMBALANCE_MIN_LABELS} labels",
}

def _layer(c: MixinConfig, check: str) -> Alert:
    q = Q(c.selector)
    rule = BY_NAME[mc.ALERT_PREFIX + check]
    w = c.tensor_window
    subject = "class" if check == tc.CLASS_IMBALANCE else "tensor"
    return Alert(
        short=check, group=NAME,
        expr=f'{q.delta(sc.TENSOR_FLAGGED, w, matchers=f"{CHECK}={chr(34)}{check}{chr(34)}")} > 0',
        for_="0s", severity=rule.severity,
        summary=SUMMARIES[check],
        description=f"{AT_RANK}: {subject} {L_TENSOR} met the condition ({CONDITIONS[check]}) at {NUM} saved steps of "
                    f"the last {w}. {rule.todo}",
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=(*IDENTITY, CHECK, COLLECTION, TENSOR, *c.target_labels),
        runbook=Runbook(
            meaning=f"{rule.meaning} Judged in the training process at each saved step of the tensor collections "
                    "(OTELPROF_COLLECTIONS, every OTELPROF_SAVE_INTERVAL optimizer steps) with the offline check's "
                    f"condition and thresholds ({CONDITIONS[check]}); the alert fires while a saved step was "
                    f"flagged within {w} and names the {subject} (label `tensor`).",
            thresholds=(*rule.parameters, ("window", w)),
            limit=f"{rule.limit} Live: at the first scrape and rule evaluation after the flagged saved step is read "
                  f"back (one optimizer step after it), then for {w}; a fault confined to the steps between two "
                  "saves is never seen. A collection's tensors flagged after the first OTELPROF_TENSOR_SERIES_MAX "
                  "(64) are named `other`.",
            todo=rule.todo,
            deviations="The original judged saved tensors in a separate rule container. otelprof reduces each "
                       "tensor on its device at saved steps and judges the reductions in the process, with the "
                       "same condition as `otelprof check`; the flag counts (otelprof.tensor.flagged) make the "
                       "live and offline verdicts agree whatever the scrape interval.",
            original=rule.original),
        no_for="each flag was counted at a saved step whose condition had already held for 2 consecutive saved steps "
               "in the training process (the offline check's own count): one flag is the finding, the 2 saved steps "
               "are its `for`.",
        panel=ids.REPORT_LAYER_FLAGS, section="rules", kind=RISK, knobs=("tensor_window",), offline=OFFLINE_TENSORS,
        cases=("tensors_test.yaml",))


def _overtraining(c: MixinConfig) -> Alert:
    ow, lb = c.overtraining_window, c.overtraining_lookback
    mean = recording_names(c)["loss_mean"]  # a recorded series: min/max over the lookback without a subquery

    def phase(name: str) -> str:
        return f"{mean}{{{', '.join(m for m in (c.selector, f'{PHASE}={chr(34)}{name}{chr(34)}') if m)}}}"

    evaluated, trained = phase(c.eval_phase), phase(c.train_phase)
    rule = BY_NAME[mc.ALERT_PREFIX + tc.OVERTRAINING]
    by_process = f"{', '.join(IDENTITY)}"
    return Alert(
        short=tc.OVERTRAINING, group=NAME,
        expr=f"min by ({by_process}) ({evaluated})\n"
             f"/ min by ({by_process}) (min_over_time({evaluated}[{lb}])) - 1\n"
             f"> {number(c.overtraining_delta)}\n"
             f"and on ({JOB}, {RANK}) min by ({by_process}) ({trained})\n"
             f"  < max by ({by_process}) (max_over_time({trained}[{lb}]))",
        for_=c.overtraining_for, severity=rule.severity,
        summary="The evaluation loss keeps rising while the training loss falls.",
        description=f"{AT_RANK}: the mean evaluation loss over the last {ow} is {PCT} above its best over the last "
                    f"{lb}, while the training loss still falls. {rule.todo}",
        dashboard=mc.DASHBOARD_TRAINING_REPORT, labels=IDENTITY,
        runbook=Runbook(
            meaning=f"{rule.meaning} The per-step mean of the evaluation losses of the last {ow} (from "
                    f"otelprof_loss_summed and _recorded_total, recorded as {mean}) is more than "
                    f"{c.overtraining_delta:.0%} above the lowest such mean within {lb}, while the training "
                    f"loss's {ow} mean is below its highest within {lb}, for {c.overtraining_for}.",
            thresholds=params(("delta", f"{c.overtraining_delta:g}"), ("window", ow), ("lookback", lb),
                               ("for", c.overtraining_for)),
            limit=f"An evaluation loss {c.overtraining_delta:.0%} above its best; fires "
                  f"{human(seconds(c.overtraining_for))} after every {ow} window holding an evaluation pass "
                  f"shows it (evaluate at least every {ow}). Offline: {rule.limit}",
            todo=rule.todo,
            deviations="The original counted evaluation steps without a new best (patience); this compares "
                       f"windowed per-step means and waits `for` {c.overtraining_for} instead of "
                       f"{tc.OVERTRAINING_PATIENCE} evaluation passes.",
            original=rule.original),
        panel=ids.REPORT_LOSS, section="rules", kind=RISK,
        knobs=("train_phase", "eval_phase", "overtraining_delta", "overtraining_window", "overtraining_lookback",
               "overtraining_for"),
        offline=OFFLINE_TENSORS, cases=("tensors_test.yaml",))


def tensor_alerts(config: MixinConfig) -> list[Alert]:
    """The per-layer checks' alerts and overtraining, in runbook order."""
    return [*(_layer(config, check) for check in tc.LAYER_RULES), _overtraining(config)]


GROUP = AlertGroup(NAME, tensor_alerts)
