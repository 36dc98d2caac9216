"""The training report's "Layers" row: the per-layer tensor checks' flags and the layers' gradient norms.

Reads the tensor metrics (``otelprof.tensor.*``, from the collections of ``OTELPROF_COLLECTIONS``): means per
saved step are window growths of the sums over the saves', exact whatever the scrape interval.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards import queries as pq
from otelprof.dashboards.model import Prom, Row
from otelprof.dashboards.panels import table, timeseries
from otelprof.mixin.promql import RANK

CHECK = sc.prometheus_label(sc.LABEL_CHECK)
TENSOR = sc.prometheus_label(sc.LABEL_TENSOR)
REDUCTION = sc.prometheus_label(sc.LABEL_REDUCTION)
TENSORS = frozenset({"tensors"})
FLAGS = frozenset({"tensor_flags"})
GRADIENTS = f'{TENSOR}=~"gradients/.*"'


def gradient_mean(qs: pq.Queries, reduction: str, window: str = pq.RANGE) -> str:
    """Per rank and gradient tensor: the mean of ``reduction`` per saved step over ``window``."""
    labels = f"{RANK}, {TENSOR}"
    summed = qs.proc.delta(sc.TENSOR_SUMMED, window, matchers=f'{GRADIENTS}, {REDUCTION}="{reduction}"')
    saves = qs.proc.delta(sc.TENSOR_SAVES, window, matchers=GRADIENTS)
    return f"sum by ({labels}) ({summed}) / sum by ({labels}) ({saves} > 0)"


def layers_row(qs: pq.Queries) -> Row:
    """The row, reading what ``qs``'s config selects."""
    flagged = f"sum by ({RANK}, {CHECK}, {TENSOR}) ({qs.proc.delta(sc.TENSOR_FLAGGED, pq.RANGE)}) > 0"
    return Row(1700, "Layers (tensor collections)", [
        table(ids.REPORT_LAYER_FLAGS, "Layers flagged", "Saved steps at which a per-layer check's condition held, "
              "per rank, check and tensor, over the dashboard's time range (the per-layer alerts fire on these "
              "counts; the same conditions as `otelprof check`). Needs OTELPROF_COLLECTIONS.",
              [("Flagged saved steps", Prom(flagged, needs=FLAGS), "short")],
              [(RANK, "Rank"), (CHECK, "Check"), (TENSOR, "Tensor")], sort_by="Flagged saved steps", w=12),
        table(ids.REPORT_LAYER_GRADIENTS, "Gradient norms per layer", "Per rank and layer, the mean L2 norm and "
              "mean absolute value of the gradient per saved step over the dashboard's time range (the "
              "vanishing-gradient check compares each layer's mean absolute value with the largest layer's). "
              "Needs the gradients collection.",
              [("L2 norm", Prom(gradient_mean(qs, "l2"), needs=TENSORS), "none"),
               ("Mean |g|", Prom(gradient_mean(qs, "abs_mean"), needs=TENSORS), "none")],
              [(RANK, "Rank"), (TENSOR, "Tensor")], sort_by="L2 norm", w=12),
        timeseries(ids.REPORT_LAYER_GRADIENT_NORMS, "Gradient norm per layer over time", "Mean L2 norm of each "
                   "layer's gradient per saved step over the last 10 minutes, per rank: a layer whose line sinks "
                   "decades below the others is vanishing, one that shoots up is exploding.",
                   [Prom(gradient_mean(qs, "l2", "10m"), "rank {{rank}} {{tensor}}", needs=TENSORS)], "none", w=24),
    ])
