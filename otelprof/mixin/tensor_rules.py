"""The per-layer tensor rules' text: what each means, what to do, when it fires and the rule it stands for.

One text for both twins: the offline checks (:mod:`otelprof.analysis.tensors`) and the live alerts
(:mod:`otelprof.mixin.tensor_alerts`) read it; the conditions and thresholds are :mod:`otelprof.tensor_checks`.
"""

from __future__ import annotations

from dataclasses import dataclass

from otelprof.tensor_checks import (
    DEAD_RELU_FRACTION,
    EXPLODING_ABS_MAX,
    HOLD,
    IMBALANCE_MIN_LABELS,
    IMBALANCE_RATIO,
    OVERTRAINING_DELTA,
    OVERTRAINING_PATIENCE,
    POOR_INIT_STD,
    SATURATED_FRACTION,
    UPDATE_RATIO_LARGE,
    UPDATE_RATIO_SMALL,
    VANISHING_ABS_MEAN,
    VANISHING_RATIO,
)


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
