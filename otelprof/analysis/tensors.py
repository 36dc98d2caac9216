"""Built-in per-layer rules over saved tensor statistics (``tensors.jsonl``) and the recorded losses.

Each rule judges every saved step of the tensors it needs and names the layers (tensors) it fires on;
a layer fires when its condition holds at :data:`HOLD` consecutive saved steps (fewer when fewer were
saved). A rule whose tensors were never saved says "no data". Results are rows of the checks' table
(:class:`otelprof.analysis.rules.RuleRow`): ``evaluations`` are saved steps, ``firing_evaluations`` those
at which some layer was firing, ``datapoints`` the (tensor, step) values judged, ``value`` the worst
value, ``subjects`` ``"rank R <tensor>"``. Thresholds and runbook text: :data:`RULES` (docs/tensors.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from otelprof.recording.ranks import RankRecording, Recording
from otelprof.recording.tensors import TENSORS, Trial, read_trial

if TYPE_CHECKING:
    from otelprof.analysis.rule_row import RuleRow

HOLD = 2
"""Consecutive saved steps a layer's condition must hold to fire."""


@dataclass(frozen=True)
class TensorRule:
    name: str
    original: str
    """SageMaker Debugger rule it stands for."""
    severity: str
    meaning: str
    todo: str
    limit: str
    parameters: tuple[tuple[str, str], ...]


VANISHING_ABS_MEAN = 1e-7
VANISHING_RATIO = 1e-3
EXPLODING_ABS_MAX = 1e6
POOR_INIT_STD = 1e-8
SATURATED_FRACTION = 0.5
DEAD_RELU_FRACTION = 0.95
UPDATE_RATIO_SMALL = 1e-8
UPDATE_RATIO_LARGE = 1.0
OVERTRAINING_PATIENCE = 3
OVERTRAINING_DELTA = 0.1
IMBALANCE_RATIO = 10.0
IMBALANCE_MIN_LABELS = 100

RULES: tuple[TensorRule, ...] = (
    TensorRule("OtelprofLayerVanishingGradient", "VanishingGradient", "warning",
               "A layer's gradients are so small that its weights barely learn (deep sigmoid/tanh stacks, "
               "poor initialization).",
               "Use ReLU-family activations, residual connections or normalization layers; initialize with "
               "He/Xavier; check the named layers first (the closest to the input).",
               f"Fires when a layer's mean absolute gradient is below {VANISHING_ABS_MEAN:g} and below "
               f"{VANISHING_RATIO:g} times the largest layer's at {HOLD} consecutive saved steps of the gradients "
               "collection (a model whose loss reached ~0 has small gradients everywhere: not vanishing).",
               (("abs_mean below", f"{VANISHING_ABS_MEAN:g}"), ("of the largest layer's", f"{VANISHING_RATIO:g}"))),
    TensorRule("OtelprofLayerExplodingTensor", "ExplodingTensor", "critical",
               "A weight, gradient or activation holds NaN/Inf or has grown beyond any healthy magnitude: the "
               "model is diverging.",
               "Lower the learning rate, clip gradients (clip_grad_norm_), add warm-up; check the named layer.",
               f"Fires when a weight, gradient, output or update has a non-finite element or an absolute value above "
               f"{EXPLODING_ABS_MAX:g} at {HOLD} consecutive saved steps (one saved step if only one).",
               (("abs_max above", f"{EXPLODING_ABS_MAX:g}"), ("nonfinite above", "0"))),
    TensorRule("OtelprofPoorWeightInitialization", "PoorWeightInitialization", "warning",
               "A layer's weight matrix starts with every element equal (zeros or a constant): its units stay "
               "identical and learn the same thing.",
               "Initialize weights randomly (torch.nn.init.kaiming_uniform_/xavier_uniform_); zero init is only "
               "for biases.",
               f"Judges the first saved step of the weights collection: a weight of two or more dimensions with a "
               f"standard deviation at most {POOR_INIT_STD:g}.",
               (("std at most", f"{POOR_INIT_STD:g}"),)),
    TensorRule("OtelprofSaturatedActivation", "SaturatedActivation", "warning",
               "Most outputs of a sigmoid/tanh layer sit within 0.01 of its bounds, where its gradient is ~0.",
               "Scale the layer's input down (smaller init, normalization before it) or use a non-saturating "
               "activation.",
               f"Fires when more than {SATURATED_FRACTION:.0%} of a Sigmoid/Tanh module's outputs are saturated at "
               f"{HOLD} consecutive saved steps of the outputs collection.",
               (("saturated fraction above", f"{SATURATED_FRACTION:g}"),)),
    TensorRule("OtelprofDeadRelu", "DeadRelu", "warning",
               "Almost every output of a ReLU layer is zero: its units are dead and pass no gradient.",
               "Check the preceding layer's bias and initialization, lower the learning rate, or use LeakyReLU.",
               f"Fires when more than {DEAD_RELU_FRACTION:.0%} of a ReLU module's outputs are zero at {HOLD} "
               "consecutive saved steps of the outputs collection.",
               (("zero fraction above", f"{DEAD_RELU_FRACTION:g}"),)),
    TensorRule("OtelprofWeightUpdateRatio", "WeightUpdateRatio", "warning",
               "An optimizer step changes a weight by too large (divergence) or too small (no learning) a share "
               "of its norm.",
               "Too large: lower the learning rate; too small: raise it, or check that the layer is meant to "
               "train.",
               f"Fires when the L2 norm of a step's update over the weight's is above {UPDATE_RATIO_LARGE:g} or below "
               f"{UPDATE_RATIO_SMALL:g} (non-zero weight) at {HOLD} consecutive saved steps of the optimizer "
               "collection.",
               (("ratio above", f"{UPDATE_RATIO_LARGE:g}"), ("ratio below", f"{UPDATE_RATIO_SMALL:g}"))),
    TensorRule("OtelprofAllZeroTensor", "AllZero", "warning",
               "A weight, gradient or activation is entirely zero at every saved step: that part of the model "
               "does nothing.",
               "Check the named tensor's initialization and whether it is connected to the loss.",
               f"Fires when every element is zero at every saved step (at least {HOLD}).",
               (("zero fraction", "1"),)),
    TensorRule("OtelprofTensorUnchanged", "TensorVariance", "warning",
               "A weight that has gradients never changes between saved steps: it is not being trained.",
               "Check that the optimizer holds the parameter, that its learning rate is not 0, and that its "
               "gradient is not zero.",
               f"Fires when a weight with saved gradients has the same mean, std, min, max and L2 norm at every saved "
               f"step (at least {HOLD + 1}).",
               (("saved steps at least", f"{HOLD + 1}"),)),
    TensorRule("OtelprofOvertraining", "Overtraining", "warning",
               "The evaluation loss has stopped improving and keeps rising while the training loss still falls: "
               "the model memorizes the training set.",
               "Stop at the best evaluation (early stopping), add regularization or data augmentation.",
               f"Fires when the last {OVERTRAINING_PATIENCE} evaluation passes' mean losses are all more than "
               f"{OVERTRAINING_DELTA:.0%} above the best one while the training loss fell since it.",
               (("patience (eval passes)", str(OVERTRAINING_PATIENCE)), ("delta", f"{OVERTRAINING_DELTA:g}"))),
    TensorRule("OtelprofClassImbalance", "ClassImbalance", "warning",
               "The labels seen in training are dominated by some classes: the model learns to predict them.",
               "Resample (WeightedRandomSampler) or weight the loss per class.",
               f"Fires when the most frequent class has more than {IMBALANCE_RATIO:g} times the labels of the least "
               f"frequent one, over at least {IMBALANCE_MIN_LABELS} labels counted with record_labels().",
               (("ratio above", f"{IMBALANCE_RATIO:g}"), ("labels at least", str(IMBALANCE_MIN_LABELS)))),
)
BY_NAME = {r.name: r for r in RULES}


@dataclass
class Verdict:
    """What one rule found on one rank."""

    evaluations: int = 0
    datapoints: int = 0
    firing_steps: set[int] = field(default_factory=set)
    subjects: set[str] = field(default_factory=set)
    value: float | None = None

    def worse(self, value: float, high: bool) -> None:
        if self.value is None or (value > self.value if high else value < self.value):
            self.value = value


def _per_layer(trial: Trial, names: Iterable[str], condition: Any, verdict: Verdict, rank: int, high: bool,
               per_step: bool = False) -> None:
    """Judge each step of each tensor: ``condition`` gives the offending value or None (or NaN: no judgement)."""
    steps = trial.steps()
    verdict.evaluations = max(verdict.evaluations, len(steps))
    for name in names:
        saved = trial.steps(name)
        hold = min(HOLD, len(saved))
        run: list[int] = []
        for n in saved:
            verdict.datapoints += 1
            value = (condition(n) if per_step else condition)(trial.record(name, n).reductions)
            if value is None:
                run = []
                continue
            run.append(n)
            if len(run) >= hold:
                verdict.firing_steps.update(run)
                verdict.subjects.add(f"rank {rank} {name}")
                verdict.worse(value, high)


def _vanishing(trial: Trial, verdict: Verdict, rank: int) -> None:
    names = trial.tensor_names(kind="gradients")
    largest: dict[int, float] = {}  # per step, the largest layer's mean absolute gradient
    for name in names:
        for n in trial.steps(name):
            v = trial.reduction(name, n, "abs_mean")
            if math.isfinite(v):
                largest[n] = max(largest.get(n, 0.0), v)

    def judged(n: int) -> Callable[[dict[str, float]], float | None]:
        def condition(r: dict[str, float]) -> float | None:
            v = r.get("abs_mean", math.nan)
            return v if v < VANISHING_ABS_MEAN and v <= VANISHING_RATIO * largest.get(n, 0.0) else None
        return condition
    _per_layer(trial, names, judged, verdict, rank, high=False, per_step=True)


def _exploding(trial: Trial, verdict: Verdict, rank: int) -> None:
    def condition(r: dict[str, float]) -> float | None:
        biggest = r.get("abs_max", 0.0)
        if r.get("nonfinite", 0.0) > 0 or not math.isfinite(biggest):
            return math.inf
        return biggest if biggest > EXPLODING_ABS_MAX else None
    names = [n for n in trial.tensor_names() if trial.kind(n) in ("weights", "biases", "gradients", "outputs",
                                                                     "optimizer")]
    _per_layer(trial, names, condition, verdict, rank, high=True)


def _poor_init(trial: Trial, verdict: Verdict, rank: int) -> None:
    for name in trial.tensor_names(kind="weights"):
        first = trial.steps(name)[0]
        record = trial.record(name, first)
        verdict.evaluations = 1
        if len(record.shape) < 2:
            continue
        verdict.datapoints += 1
        std = record.reductions.get("std", math.nan)
        if std <= POOR_INIT_STD:
            verdict.firing_steps.add(first)
            verdict.subjects.add(f"rank {rank} {name}")
            verdict.worse(std, high=False)


def _saturated(trial: Trial, verdict: Verdict, rank: int) -> None:
    def condition(r: dict[str, float]) -> float | None:
        v = r.get("saturated", math.nan)
        return v if v > SATURATED_FRACTION else None
    names = [n for n in trial.tensor_names(kind="outputs") if trial.module(n) in ("Sigmoid", "Tanh")]
    _per_layer(trial, names, condition, verdict, rank, high=True)


def _dead_relu(trial: Trial, verdict: Verdict, rank: int) -> None:
    def condition(r: dict[str, float]) -> float | None:
        v = r.get("zeros", math.nan)
        return v if v > DEAD_RELU_FRACTION else None
    names = [n for n in trial.tensor_names(kind="outputs") if trial.module(n) in ("ReLU", "ReLU6")]
    _per_layer(trial, names, condition, verdict, rank, high=True)


def _update_ratio(trial: Trial, verdict: Verdict, rank: int) -> None:
    def condition(r: dict[str, float]) -> float | None:
        v = r.get("ratio", math.nan)
        if v > UPDATE_RATIO_LARGE or 0 < v < UPDATE_RATIO_SMALL:
            return v
        return None
    _per_layer(trial, trial.tensor_names(kind="optimizer"), condition, verdict, rank, high=True)


def _all_zero(trial: Trial, verdict: Verdict, rank: int) -> None:
    verdict.evaluations = max(verdict.evaluations, len(trial.steps()))
    for name in trial.tensor_names():
        if trial.kind(name) == "inputs":
            continue
        saved = trial.steps(name)
        verdict.datapoints += len(saved)
        if len(saved) >= HOLD and all(trial.reduction(name, n, "zeros") >= 1.0 for n in saved):
            verdict.firing_steps.update(saved)
            verdict.subjects.add(f"rank {rank} {name}")
            verdict.worse(1.0, high=True)


def _unchanged(trial: Trial, verdict: Verdict, rank: int) -> None:
    keys = ("mean", "std", "min", "max", "l2")
    verdict.evaluations = max(verdict.evaluations, len(trial.steps()))
    for name in trial.tensor_names(kind="weights") + trial.tensor_names(kind="biases"):
        if f"gradients/{name}" not in trial.records:
            continue
        saved = trial.steps(name)
        if len(saved) < HOLD + 1:
            continue
        verdict.datapoints += len(saved)
        first = trial.record(name, saved[0]).reductions
        if all(all(trial.record(name, n).reductions.get(k) == first.get(k) for k in keys) for n in saved[1:]):
            verdict.firing_steps.update(saved)
            verdict.subjects.add(f"rank {rank} {name}")
            verdict.worse(float(len(saved)), high=True)


def _class_imbalance(trial: Trial, verdict: Verdict, rank: int) -> None:
    counts = trial.label_counts()
    total = sum(counts)
    verdict.evaluations = len(trial.labels)
    if total < IMBALANCE_MIN_LABELS or len(counts) < 2:
        return
    verdict.datapoints = total
    least = min(counts)
    ratio = max(counts) / least if least else math.inf
    if ratio > IMBALANCE_RATIO:
        verdict.firing_steps.update(trial.labels)
        verdict.subjects.add(f"rank {rank} class {counts.index(least)} ({least} of {total} labels)")
        verdict.worse(ratio, high=True)


def eval_passes(rank: RankRecording) -> tuple[list[float], list[float]]:
    """(mean eval loss of each evaluation pass, mean train loss of the train steps before it)."""
    columns = rank.step_columns
    at, values = columns.scalar("loss")
    loss = dict(zip(at, values))
    evals: list[float] = []
    trains: list[float] = []
    current: list[float] = []
    train: list[float] = []
    for index, code in enumerate(columns.phase):
        phase = columns.phase_names[code]
        value = loss.get(index)
        if phase == "eval":
            if value is not None and math.isfinite(value):
                current.append(value)
            continue
        if current:
            evals.append(sum(current) / len(current))
            trains.append(sum(train) / len(train) if train else math.nan)
            current, train = [], []
        if phase == "train" and value is not None and math.isfinite(value):
            train.append(value)
    if current:
        evals.append(sum(current) / len(current))
        trains.append(sum(train) / len(train) if train else math.nan)
    return evals, trains


def _overtraining(rank: RankRecording, verdict: Verdict) -> None:
    evals, trains = eval_passes(rank)
    verdict.evaluations = len(evals)
    verdict.datapoints = len(evals)
    if len(evals) < OVERTRAINING_PATIENCE + 1:
        return
    best = min(range(len(evals)), key=evals.__getitem__)
    last = evals[-OVERTRAINING_PATIENCE:]
    if len(evals) - best <= OVERTRAINING_PATIENCE or not all(e > evals[best] * (1 + OVERTRAINING_DELTA) for e in last):
        return
    if not trains[-1] < trains[best]:
        return
    verdict.firing_steps.update(range(len(evals) - OVERTRAINING_PATIENCE, len(evals)))
    verdict.subjects.add(f"rank {rank.rank} eval loss {evals[best]:.4g} -> {evals[-1]:.4g} (pass {best + 1} best "
                         f"of {len(evals)})")
    verdict.worse(evals[-1] / evals[best] if evals[best] else math.inf, high=True)


_JUDGES: dict[str, Callable[[Trial, Verdict, int], None]] = {
    "OtelprofLayerVanishingGradient": _vanishing,
    "OtelprofLayerExplodingTensor": _exploding,
    "OtelprofPoorWeightInitialization": _poor_init,
    "OtelprofSaturatedActivation": _saturated,
    "OtelprofDeadRelu": _dead_relu,
    "OtelprofWeightUpdateRatio": _update_ratio,
    "OtelprofAllZeroTensor": _all_zero,
    "OtelprofTensorUnchanged": _unchanged,
    "OtelprofClassImbalance": _class_imbalance,
}


def judge(recording: Recording) -> dict[str, Verdict]:
    """Every built-in tensor rule over every rank, merged per rule."""
    out = {r.name: Verdict() for r in RULES}
    for rank in recording.ranks:
        trial = read_trial(rank.path)
        for name, rule in _JUDGES.items():
            found = Verdict()
            rule(trial, found, rank.rank)
            _merge(out[name], found)
        found = Verdict()
        _overtraining(rank, found)
        _merge(out["OtelprofOvertraining"], found)
    return out


def _merge(into: Verdict, found: Verdict) -> None:
    into.evaluations = max(into.evaluations, found.evaluations)
    into.datapoints += found.datapoints
    into.firing_steps |= found.firing_steps
    into.subjects |= found.subjects
    if into.value is None:
        into.value = found.value


def has_tensors(recording: Recording) -> bool:
    """Whether some rank saved tensor collections (a ``tensors.jsonl``)."""
    return any((rank.path / TENSORS).is_file() for rank in recording.ranks)


def rule_rows(recording: Recording) -> list[RuleRow]:
    """The rules as rows of the checks' table; none for a recording made without collections (whose
    checks table stays as it was)."""
    from otelprof.analysis.rule_row import RuleRow

    rows: list[RuleRow] = []
    if not has_tensors(recording):
        return rows
    for name, verdict in judge(recording).items():
        rule = BY_NAME[name]
        fired = bool(verdict.subjects)
        rows.append(RuleRow(rule.name, rule.original, rule.severity, rule.meaning, rule.todo, fired,
                            len(verdict.firing_steps), verdict.evaluations, verdict.datapoints, None,
                            verdict.value if verdict.value is None or math.isfinite(verdict.value) else None,
                            tuple(sorted(verdict.subjects)), rule.parameters))
    return rows
