"""The per-layer tensor checks' thresholds and conditions, shared by the training process and the offline twin.

The offline rules (:mod:`otelprof.analysis.tensors`) judge a recording's saved steps with these conditions; the
training process judges each saved step as it is read back with the same conditions (:class:`StreamJudge`) and
counts, per rule and tensor, the saved steps at which a condition had held for :data:`HOLD` consecutive saved
steps (``otelprof.tensor.flagged``). A live alert on that counter and the offline check therefore reach the same
verdict on the same run. No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

HOLD = 2
"""Consecutive saved steps a layer's condition must hold to fire."""

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

SATURATING_MODULES = ("Sigmoid", "Tanh")
RELU_MODULES = ("ReLU", "ReLU6")
EXPLODING_KINDS = ("weights", "biases", "gradients", "outputs", "optimizer")
UNCHANGED_KEYS = ("mean", "std", "min", "max", "l2")

# Short names (the alert's name without its prefix; the ``rule`` label of otelprof.tensor.flagged).
VANISHING = "LayerVanishingGradient"
EXPLODING = "LayerExplodingTensor"
POOR_INIT = "PoorWeightInitialization"
SATURATED = "SaturatedActivation"
DEAD_RELU = "DeadRelu"
UPDATE_RATIO = "WeightUpdateRatio"
ALL_ZERO = "AllZeroTensor"
UNCHANGED = "TensorUnchanged"
CLASS_IMBALANCE = "ClassImbalance"
OVERTRAINING = "Overtraining"
LAYER_RULES = (VANISHING, EXPLODING, POOR_INIT, SATURATED, DEAD_RELU, UPDATE_RATIO, ALL_ZERO, UNCHANGED,
               CLASS_IMBALANCE)
"""The rules the training process judges (overtraining reads the recorded losses instead)."""


def vanishing(r: Mapping[str, float], largest: float) -> float | None:
    """A gradient's mean absolute value when it is below the floor and ``VANISHING_RATIO`` x ``largest``."""
    v = r.get("abs_mean", math.nan)
    return v if v < VANISHING_ABS_MEAN and v <= VANISHING_RATIO * largest else None


def exploding(r: Mapping[str, float]) -> float | None:
    biggest = r.get("abs_max", 0.0)
    if r.get("nonfinite", 0.0) > 0 or not math.isfinite(biggest):
        return math.inf
    return biggest if biggest > EXPLODING_ABS_MAX else None


def poor_init(r: Mapping[str, float], shape: Sequence[int]) -> float | None:
    """A weight of two or more dimensions whose elements are (nearly) all equal: its std."""
    if len(shape) < 2:
        return None
    std = r.get("std", math.nan)
    return std if std <= POOR_INIT_STD else None


def saturated(r: Mapping[str, float]) -> float | None:
    v = r.get("saturated", math.nan)
    return v if v > SATURATED_FRACTION else None


def dead_relu(r: Mapping[str, float]) -> float | None:
    v = r.get("zeros", math.nan)
    return v if v > DEAD_RELU_FRACTION else None


def update_ratio(r: Mapping[str, float]) -> float | None:
    v = r.get("ratio", math.nan)
    return v if v > UPDATE_RATIO_LARGE or 0 < v < UPDATE_RATIO_SMALL else None


def all_zero(r: Mapping[str, float]) -> bool:
    return r.get("zeros", 0.0) >= 1.0


def imbalance(counts: Sequence[int]) -> tuple[float, int] | None:
    """(most/least frequent class ratio, least frequent class) when the labels are imbalanced."""
    total = sum(counts)
    if total < IMBALANCE_MIN_LABELS or len(counts) < 2:
        return None
    least = min(counts)
    ratio = max(counts) / least if least else math.inf
    return (ratio, counts.index(least)) if ratio > IMBALANCE_RATIO else None


def class_subject(index: int) -> str:
    """How a finding names a class (the ``tensor`` label of a class-imbalance flag)."""
    return f"class {index}"


@dataclass(frozen=True)
class Saved:
    """One tensor of a saved step, as the judge sees it."""

    name: str
    kind: str
    module: str | None
    shape: tuple[int, ...]
    reductions: Mapping[str, float]


class StreamJudge:
    """Judges saved steps one after another (in the training process); keeps a few values per tensor."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, str], int] = {}
        self._saves: dict[str, int] = {}
        self._zero: dict[str, bool] = {}
        self._first: dict[str, tuple[float | None, ...]] = {}
        self._same: dict[str, bool] = {}
        self._gradients: set[str] = set()
        self._labels: list[int] = []

    def _run(self, rule: str, name: str, held: bool) -> bool:
        key = (rule, name)
        run = self._runs.get(key, 0) + 1 if held else 0
        if run:
            self._runs[key] = run
        else:
            self._runs.pop(key, None)
        return run >= HOLD

    def step(self, saved: Iterable[Saved], labels: Sequence[int] = ()) -> list[tuple[str, str]]:
        """(rule, tensor) pairs whose condition holds at this saved step as the offline check counts it."""
        records = list(saved)
        flagged: list[tuple[str, str]] = []
        largest = max((s.reductions.get("abs_mean", 0.0) for s in records if s.kind == "gradients"
                       and math.isfinite(s.reductions.get("abs_mean", math.nan))), default=0.0)
        self._gradients.update(s.name.removeprefix("gradients/") for s in records if s.kind == "gradients")
        for s in records:
            r = s.reductions
            first = s.name not in self._saves
            saves = self._saves[s.name] = self._saves.get(s.name, 0) + 1
            checks: list[tuple[str, bool]] = []
            if s.kind == "gradients":
                checks.append((VANISHING, vanishing(r, largest) is not None))
            if s.kind in EXPLODING_KINDS:
                checks.append((EXPLODING, exploding(r) is not None))
            if s.kind == "outputs" and s.module in SATURATING_MODULES:
                checks.append((SATURATED, saturated(r) is not None))
            if s.kind == "outputs" and s.module in RELU_MODULES:
                checks.append((DEAD_RELU, dead_relu(r) is not None))
            if s.kind == "optimizer":
                checks.append((UPDATE_RATIO, update_ratio(r) is not None))
            flagged.extend((rule, s.name) for rule, held in checks if self._run(rule, s.name, held))
            if first and s.kind == "weights" and poor_init(r, s.shape) is not None:
                flagged.append((POOR_INIT, s.name))
            if s.kind != "inputs":
                zero = self._zero[s.name] = self._zero.get(s.name, True) and all_zero(r)
                if zero and saves >= HOLD:
                    flagged.append((ALL_ZERO, s.name))
            if s.kind in ("weights", "biases"):
                values = tuple(r.get(k) for k in UNCHANGED_KEYS)
                same = self._same[s.name] = self._same.get(s.name, True) and self._first.setdefault(
                    s.name, values) == values
                if same and saves >= HOLD + 1 and s.name in self._gradients:
                    flagged.append((UNCHANGED, s.name))
        if labels:
            if len(labels) > len(self._labels):
                self._labels.extend([0] * (len(labels) - len(self._labels)))
            for i, count in enumerate(labels):
                self._labels[i] += count
            found = imbalance(self._labels)
            if found is not None:
                flagged.append((CLASS_IMBALANCE, class_subject(found[1])))
        return flagged
