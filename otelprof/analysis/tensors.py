"""Built-in per-layer rules over saved tensor statistics (``tensors.jsonl``) and the recorded losses.

Each rule judges every saved step of the tensors it needs and names the layers (tensors) it fires on;
a layer fires when its condition holds at :data:`HOLD` consecutive saved steps (fewer when fewer were
saved). A rule whose tensors were never saved says "no data". Results are rows of the checks' table
(:class:`otelprof.analysis.rule_row.RuleRow`): ``evaluations`` are saved steps, ``firing_evaluations`` those
at which some layer was firing, ``datapoints`` the (tensor, step) values judged, ``value`` the worst
value, ``subjects`` ``"rank R <tensor>"``. Thresholds and runbook text: :data:`RULES` (docs/tensors.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from otelprof.mixin.tensor_rules import BY_NAME, RULES
from otelprof.recording.ranks import RankRecording, Recording
from otelprof.recording.tensors import TENSORS, Trial, read_trial
from otelprof.tensor_checks import (
    EXPLODING_KINDS,
    HOLD,
    IMBALANCE_MIN_LABELS,
    OVERTRAINING_DELTA,
    OVERTRAINING_PATIENCE,
    RELU_MODULES,
    SATURATING_MODULES,
    UNCHANGED_KEYS,
    all_zero,
    class_subject,
    dead_relu,
    exploding,
    imbalance,
    poor_init,
    saturated,
    update_ratio,
    vanishing,
)

if TYPE_CHECKING:
    from otelprof.analysis.rule_row import RuleRow




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
        return lambda r: vanishing(r, largest.get(n, 0.0))
    _per_layer(trial, names, judged, verdict, rank, high=False, per_step=True)


def _exploding(trial: Trial, verdict: Verdict, rank: int) -> None:
    names = [n for n in trial.tensor_names() if trial.kind(n) in EXPLODING_KINDS]
    _per_layer(trial, names, exploding, verdict, rank, high=True)


def _poor_init(trial: Trial, verdict: Verdict, rank: int) -> None:
    for name in trial.tensor_names(kind="weights"):
        first = trial.steps(name)[0]
        record = trial.record(name, first)
        verdict.evaluations = 1
        if len(record.shape) < 2:
            continue
        verdict.datapoints += 1
        std = poor_init(record.reductions, record.shape)
        if std is not None:
            verdict.firing_steps.add(first)
            verdict.subjects.add(f"rank {rank} {name}")
            verdict.worse(std, high=False)


def _saturated(trial: Trial, verdict: Verdict, rank: int) -> None:
    names = [n for n in trial.tensor_names(kind="outputs") if trial.module(n) in SATURATING_MODULES]
    _per_layer(trial, names, saturated, verdict, rank, high=True)


def _dead_relu(trial: Trial, verdict: Verdict, rank: int) -> None:
    names = [n for n in trial.tensor_names(kind="outputs") if trial.module(n) in RELU_MODULES]
    _per_layer(trial, names, dead_relu, verdict, rank, high=True)


def _update_ratio(trial: Trial, verdict: Verdict, rank: int) -> None:
    _per_layer(trial, trial.tensor_names(kind="optimizer"), update_ratio, verdict, rank, high=True)


def _all_zero(trial: Trial, verdict: Verdict, rank: int) -> None:
    verdict.evaluations = max(verdict.evaluations, len(trial.steps()))
    for name in trial.tensor_names():
        if trial.kind(name) == "inputs":
            continue
        saved = trial.steps(name)
        verdict.datapoints += len(saved)
        if len(saved) >= HOLD and all(all_zero(trial.record(name, n).reductions) for n in saved):
            verdict.firing_steps.update(saved)
            verdict.subjects.add(f"rank {rank} {name}")
            verdict.worse(1.0, high=True)


def _unchanged(trial: Trial, verdict: Verdict, rank: int) -> None:
    keys = UNCHANGED_KEYS
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
    found = imbalance(counts)
    if found is not None:
        ratio, least = found
        verdict.firing_steps.update(trial.labels)
        verdict.subjects.add(f"rank {rank} {class_subject(least)} ({counts[least]} of {total} labels)")
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
