"""Conventions the alerts and the catalog keep: a reason for every alert without `for`, in the runbook."""

from __future__ import annotations

from otelprof import semconv as sc
from otelprof.mixin.alerts import NO_FOR, alerts
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import render_runbook


def test_every_alert_without_for_says_why_one_evaluation_is_conclusive() -> None:
    config = MixinConfig()
    without = {a.short for a in alerts(config) if a.for_ in ("", "0s")}
    assert without, "some alerts are meant to fire on one evaluation"
    assert without <= set(NO_FOR), sorted(without - set(NO_FOR))
    runbook = render_runbook(config)
    for alert in alerts(config):
        section = runbook.split(f"## {alert.name}\n", 1)[1].split("\n## ", 1)[0]
        assert ("**Why no `for`.**" in section) == (alert.short in without), alert.name
    with_for = {a.short for a in alerts(config)} - without
    assert not with_for & set(NO_FOR), "an alert with `for` keeps no stale reason"


def test_container_memory_usage_is_an_up_down_counter() -> None:
    assert sc.CONTAINER_MEMORY_USAGE.instrument == "UpDownCounter"
