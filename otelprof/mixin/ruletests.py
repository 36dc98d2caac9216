"""promtool unit tests written with the bundle (``otelprof mixin -o DIR``), for the rules of the same config.

``promtool test rules tests/otelprof-rules-test.yaml`` in the bundle proves, with your windows and selector,
that the rules load together, that a recording rule the dashboards read computes the exact mean of a window,
and that an alert stays quiet on a healthy run and fires on the fault it names (a non-finite loss). The
repository's own, much larger suite (firing and non-firing cases of every alert at its thresholds) runs
against the default config.
"""

from __future__ import annotations

from typing import Any

from otelprof import semconv as sc
from otelprof.mixin.config import ALERT_PREFIX, MixinConfig, seconds
from otelprof.mixin.promql import series_name
from otelprof.mixin.rules import recording_names

INTERVAL = 15
"""Seconds between the test's samples (a typical scrape interval)."""
TEST_FILE = "otelprof-rules-test.yaml"


def group_eval_order(config: MixinConfig) -> list[str]:
    """Every rule group of ``config``'s files, the recording groups first (promtool's ``group_eval_order``): at each
    evaluation time promtool then evaluates the alerts on what the recording rules just computed; left to itself
    its order among groups is arbitrary, so an alert reading a recorded series would lag one evaluation in some
    runs and not in others. (A live Prometheus evaluates each group on its own schedule: there an alert reads the
    recorded series as of the recording group's last evaluation, at most one interval older.)"""
    from otelprof.mixin.alerts import alert_groups
    from otelprof.mixin.rule_groups import rule_groups

    return [group["name"] for group in (*rule_groups(config), *alert_groups(config))]


def _selector_labels(selector: str) -> dict[str, str]:
    """Equality matchers of the mixin's ``selector`` (``namespace="ml"``) as labels the test series carry."""
    labels = {}
    for part in selector.split(","):
        name, sep, value = part.partition("=")
        if sep and not name.endswith(("!", "~")) and not value.startswith("~"):
            labels[name.strip()] = value.strip().strip('"')
    return labels


def _series(name: str, labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def render_tests(config: MixinConfig, rule_files: list[str]) -> dict[str, Any]:
    """The promtool test file (as data) for ``config``'s rules, which ``rule_files`` name relative to it."""
    labels = {**_selector_labels(config.selector), "job": "otelprof", "instance": "10.0.0.1:9464",
              sc.prometheus_label(sc.LABEL_JOB): "resnet", sc.prometheus_label(sc.LABEL_RANK): "0",
              sc.prometheus_label(sc.LABEL_LOCAL_RANK): "0", sc.prometheus_label(sc.LABEL_NODE): "n1"}
    train = {**labels, sc.prometheus_label(sc.LABEL_PHASE): config.train_phase}
    window = int(seconds(config.straggler_window))
    steps = (window // INTERVAL) * 4 + 8
    # 10 steps per sample, 0.25 s each: the exact mean over any window is 0.25 s
    step_time = sc.STEP_DURATION
    mean_at = f"{INTERVAL * steps}s"
    mean = recording_names(config)["step_mean"]
    tests: list[dict[str, Any]] = [{
        "name": f"recording rule: exact mean step time over {config.straggler_window}",
        "interval": f"{INTERVAL}s",
        "input_series": [
            {"series": _series(series_name(step_time, "sum"), train), "values": f"0+2.5x{steps}"},
            {"series": _series(series_name(step_time, "count"), train), "values": f"0+10x{steps}"},
        ],
        "promql_expr_test": [{"expr": mean, "eval_time": mean_at,
                              "exp_samples": [{"labels": _series(mean, train), "value": 0.25}]}],
    }]
    nonfinite_window = int(seconds(config.nonfinite_window))
    fault = (nonfinite_window // INTERVAL) + 4  # the NaN comes after a whole healthy window
    total = fault + 4
    scalar = {**train, sc.prometheus_label(sc.LABEL_SCALAR): "loss"}
    alert = f"{ALERT_PREFIX}NonFiniteValues"
    tests.append({
        "name": "a healthy run stays quiet; a NaN loss fires NonFiniteValues",
        "interval": f"{INTERVAL}s",
        "input_series": [
            {"series": _series(series_name(sc.PROCESS_START_TIME), labels), "values": f"0+0x{total}"},
            {"series": _series(series_name(sc.STEPS), train), "values": f"0+10x{total}"},
            {"series": _series(series_name(sc.NONFINITE), scalar), "values": f"0+0x{fault} 1+0x4"},
        ],
        "alert_rule_test": [{"eval_time": f"{INTERVAL * (fault - 1)}s", "alertname": alert, "exp_alerts": []}],
        "promql_expr_test": [{
            "expr": f'count(ALERTS{{alertname="{alert}", alertstate="firing"}})',
            "eval_time": f"{INTERVAL * (fault + 1)}s",
            "exp_samples": [{"labels": "{}", "value": 1}],
        }],
    })
    return {"rule_files": rule_files, "evaluation_interval": f"{INTERVAL}s",
            "group_eval_order": group_eval_order(config), "tests": tests}
