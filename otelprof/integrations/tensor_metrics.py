"""The saved tensor statistics as metrics: per tensor, bounded, with the per-layer checks judged in the process.

At each saved step read back (:mod:`otelprof.integrations.tensors`), for every saved tensor:

* ``otelprof.tensor.saves`` counts the saved step;
* ``otelprof.tensor.summed`` adds the finite values of the reductions the checks and dashboards read (``l2`` of
  every tensor; ``abs_mean`` of gradients; ``zeros`` of ReLU outputs; ``saturated`` of Sigmoid/Tanh outputs;
  ``ratio`` of optimizer updates): a window's growth over the saves' is the mean per saved step;
* ``otelprof.tensor.flagged`` counts the saved steps at which a per-layer check's condition held as the offline
  check counts it (:class:`otelprof.tensor_checks.StreamJudge`, the offline rules' conditions and thresholds).

Series are kept for ``OTELPROF_TENSOR_SERIES_MAX`` tensors per collection and metric (the first seen); the
others are summed under ``tensor="other"`` and each such observation is counted in ``otelprof.series.folded``.
No torch import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from otelprof import semconv as sc
from otelprof._log import warn_once
from otelprof.runtime.metrics import MetricRegistry
from otelprof.tensor_checks import RELU_MODULES, SATURATING_MODULES, Saved, StreamJudge

OTHER = sc.OTHER_LABEL_VALUE
LABELS_COLLECTION = "labels"
"""The ``collection`` label of class-imbalance flags (labels counted with ``record_labels``)."""


def exported_reductions(saved: Saved) -> tuple[str, ...]:
    """The reductions of ``saved`` summed in ``otelprof.tensor.summed``."""
    if saved.kind == "gradients":
        return ("l2", "abs_mean")
    if saved.kind == "outputs" and saved.module in RELU_MODULES:
        return ("l2", "zeros")
    if saved.kind == "outputs" and saved.module in SATURATING_MODULES:
        return ("l2", "saturated")
    if saved.kind == "optimizer":
        return ("l2", "ratio")
    return ("l2",)


class TensorMetrics:
    """Adds each saved step's statistics to ``registry`` (from the thread that reads them back)."""

    def __init__(self, registry: MetricRegistry, series_max: int) -> None:
        self.registry = registry
        self.series_max = series_max
        self.judge = StreamJudge()
        self._admitted: dict[tuple[str, str], set[str]] = {}

    def _tensor(self, spec: sc.MetricSpec, collection: str, name: str) -> str:
        """``name``, or ``other`` once ``collection`` has ``series_max`` tensors in ``spec`` (counted)."""
        admitted = self._admitted.setdefault((spec.name, collection), set())
        if name in admitted:
            return name
        if len(admitted) < self.series_max:
            admitted.add(name)
            return name
        warn_once(f"tensors:fold:{spec.name}", "otelprof: %s has %d tensors of a collection; further ones are "
                  "summed as %r (OTELPROF_TENSOR_SERIES_MAX)", spec.name, self.series_max, OTHER)
        self.registry.counter(sc.SERIES_FOLDED).add(1, (spec.name,))
        return OTHER

    def observe(self, saved: Sequence[tuple[Saved, str]], labels: Sequence[int] = ()) -> None:
        """One saved step: each tensor with its (first) collection; ``labels``: the step's label counts."""
        collection_of = {s.name: collection for s, collection in saved}
        flagged = self.judge.step([s for s, _ in saved], labels)
        with self.registry.lock:
            saves = self.registry.counter(sc.TENSOR_SAVES)
            summed = self.registry.gauge(sc.TENSOR_SUMMED)
            flags = self.registry.counter(sc.TENSOR_FLAGGED)
            for s, collection in saved:
                saves.add(1, (collection, self._tensor(sc.TENSOR_SAVES, collection, s.name)))
                tensor = self._tensor(sc.TENSOR_SUMMED, collection, s.name)
                for reduction in exported_reductions(s):
                    value = s.reductions.get(reduction, math.nan)
                    if math.isfinite(value):
                        key = (collection, tensor, reduction)
                        summed.set(summed.values.get(key, 0.0) + value, key)
            for check, name in flagged:
                collection = collection_of.get(name, LABELS_COLLECTION)
                flags.add(1, (check, collection, self._tensor(sc.TENSOR_FLAGGED, collection, name)))
