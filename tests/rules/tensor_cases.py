"""promtool cases of the per-layer tensor alerts (otelprof/mixin/tensor_alerts.py) and overtraining.

Each per-layer check fires on the flags the training process counted for one tensor, names that tensor, stays
firing for ``tensor_window`` after the last flag and is silent on a run whose saved steps flag nothing, or flag
another check. Overtraining fires when the evaluation loss's window mean rises 10 % above its best while the
training loss falls, and stays quiet when both fall or both rise.
"""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof import tensor_checks as tc
from otelprof.mixin.config import seconds
from tests.rules.cases import CONFIG, ID, IDN, TRAIN, Group, const, seq

CHECK = sc.prometheus_label(sc.LABEL_CHECK)
COLLECTION = sc.prometheus_label(sc.LABEL_COLLECTION)
TENSOR = sc.prometheus_label(sc.LABEL_TENSOR)
SUBJECT = {tc.VANISHING: ("gradients", "gradients/0.weight"), tc.EXPLODING: ("weights", "2.weight"),
           tc.POOR_INIT: ("weights", "2.weight"), tc.SATURATED: ("outputs", "1/output"),
           tc.DEAD_RELU: ("outputs", "3/output"), tc.UPDATE_RATIO: ("optimizer", "update/0.weight"),
           tc.ALL_ZERO: ("gradients", "gradients/2.weight"), tc.UNCHANGED: ("weights", "4.weight"),
           tc.CLASS_IMBALANCE: ("labels", "class 1")}
N = 30
"""5-minute intervals: 150 minutes."""
WINDOW_MIN = int(seconds(CONFIG.tensor_window) // 60)


def _flags(g: Group, check: str, values: str, tensor: str | None = None) -> dict[str, str]:
    collection, name = SUBJECT[check]
    labels = {**ID, CHECK: check, COLLECTION: collection, TENSOR: tensor or name}
    g.counter(sc.TENSOR_FLAGGED, labels, values)
    return labels


def _saves(g: Group) -> Group:
    """A healthy run's tensor metrics: one saved step every 5 minutes, norms that flag nothing."""
    labels = {**ID, COLLECTION: "gradients", TENSOR: "gradients/0.weight"}
    g.counter(sc.TENSOR_SAVES, labels, seq([(N, 1)]))
    return g.gauge(sc.TENSOR_SUMMED, {**labels, sc.prometheus_label(sc.LABEL_REDUCTION): "l2"}, seq([(N, 0.5)]))


def layer_groups() -> list[Group]:
    groups = []
    for check in tc.LAYER_RULES:
        # flagged at the saved steps of 20, 25 and 30 min (the condition held from the save at 15 min on), then
        # the layer recovers: it fires from the first flag, says how many saved steps were flagged in the window,
        # and resolves one window after the last flag.
        g = Group(f"{check}: a layer flagged at three saved steps", interval="5m")
        labels = _flags(g, check, f"{const(0, 3)} 1 2 {const(3, N - 6)}")
        g.silent(check, "15m").fires(check, "20m", (labels, 1)).fires(check, "40m", (labels, 3))
        g.fires(check, f"{30 + WINDOW_MIN - 5}m", (labels, 1)).silent(check, f"{30 + WINDOW_MIN}m")
        groups.append(g)

        g = Group(f"{check}: healthy saved steps flag nothing; another check's flags are not this one's",
                  interval="5m")
        other = tc.EXPLODING if check != tc.EXPLODING else tc.DEAD_RELU
        _flags(_saves(g), other, seq([(N, 1)]))
        g.silent(check, "30m").silent(check, "2h")
        groups.append(g)
    return groups


def overtraining_groups() -> list[Group]:
    groups = []
    train_id, eval_id = {**ID, **TRAIN}, {**ID, "phase": "eval"}

    def run(name: str, eval_means: tuple[float, float], train_means: tuple[float, float]) -> Group:
        """2 hours at 1-minute intervals, 10 eval and 10 train losses a minute; means change at 60 min."""
        g = Group(name, interval="1m")
        for labels, (before, after) in ((eval_id, eval_means), (train_id, train_means)):
            g.gauge(sc.LOSS_SUMMED, labels, seq([(60, 10 * before), (60, 10 * after)]))
            g.counter(sc.LOSS_RECORDED, labels, seq([(120, 10)]))
        return g

    g = run("eval loss 50 % above its best while the training loss falls", (1.0, 1.5), (1.0, 0.5))
    # the 15-min eval mean passes 1.1 near 63 min (a fifth of the window at 1.5), then `for` 15m
    g.silent("Overtraining", "60m").silent("Overtraining", "75m").fires("Overtraining", "100m", (IDN, 0.5))
    groups.append(g)
    groups.append(run("healthy: both losses fall", (1.0, 0.8), (1.0, 0.5)).silent("Overtraining", "100m"))
    groups.append(run("diverging: both losses rise (not overtraining)", (1.0, 1.5), (1.0, 1.5))
                  .silent("Overtraining", "100m"))
    g = Group("no evaluation losses: nothing to judge", interval="1m")
    g.gauge(sc.LOSS_SUMMED, train_id, seq([(60, 10), (60, 5)])).counter(sc.LOSS_RECORDED, train_id, seq([(120, 10)]))
    groups.append(g.silent("Overtraining", "100m"))
    return groups


def tensor_groups() -> list[Group]:
    return [*layer_groups(), *overtraining_groups()]
