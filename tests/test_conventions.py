"""Conventions the alerts and the catalog keep: a reason for every alert without `for`, in the runbook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otelprof import semconv as sc
from otelprof.mixin import custom_alerts
from otelprof.mixin.alerts import GROUPS, alert_groups, alerts, no_for
from otelprof.mixin.built_in_groups import BUILT_IN
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import render_runbook


def test_every_alert_without_for_says_why_one_evaluation_is_conclusive() -> None:
    config = MixinConfig()
    without = {a.short for a in alerts(config) if a.for_ in ("", "0s")}
    assert without, "some alerts are meant to fire on one evaluation"
    reasons = no_for()
    assert without <= set(reasons), sorted(without - set(reasons))
    runbook = render_runbook(config)
    for alert in alerts(config):
        section = runbook.split(f"## {alert.name}\n", 1)[1].split("\n## ", 1)[0]
        assert ("**Why no `for`.**" in section) == (alert.short in without), alert.name
    with_for = {a.short for a in alerts(config)} - without
    assert not with_for & set(reasons), "an alert with `for` keeps no stale reason"


def test_each_rule_group_builds_its_own_alerts_in_runbook_order() -> None:
    """``GROUPS`` is the one list of rule groups: each builds only alerts of its name, and alerts() and the rules
    file keep the groups' order."""
    config = MixinConfig()
    built = []
    for group in GROUPS:
        own = group.build(config)
        assert own or group is custom_alerts.GROUP, group.name  # the custom group: only the user's rules
        assert {a.group for a in own} <= {group.name}, group.name
        built += [a.short for a in own]
    assert len(built) == len(set(built))
    assert [a.short for a in alerts(config)] == built
    assert [g["name"] for g in alert_groups(config)] == [g.name for g in GROUPS if g.build(config)]


def test_the_custom_rules_refuse_the_name_of_every_alert_the_other_groups_build(tmp_path: Path) -> None:
    """The built-in groups are listed once: ``GROUPS`` is them and the custom group, and a custom rule may take
    the name of no alert of theirs (a new group added there is guarded without a second list)."""
    assert (*BUILT_IN, custom_alerts.GROUP) == GROUPS and custom_alerts.GROUP not in BUILT_IN
    shipped = [a.short for group in GROUPS if group is not custom_alerts.GROUP for a in group.build(MixinConfig())]
    assert len(shipped) > 20
    rule = {"expr": "otelprof_steps_total > 0", "severity": "info", "summary": "s", "meaning": "m", "todo": "t"}
    for short in shipped:
        path = tmp_path / "rules.json"
        path.write_text(json.dumps({"rules": [{"alert": short, **rule}]}), encoding="utf-8")
        with pytest.raises(ValueError, match=f"'{short}' is already defined"):
            custom_alerts.load(str(path))
    path.write_text(json.dumps({"rules": [{"alert": "NotShippedByOtelprof", **rule}]}), encoding="utf-8")
    assert [r["alert"] for r in custom_alerts.load(str(path))] == ["NotShippedByOtelprof"]


def test_container_memory_usage_is_an_up_down_counter() -> None:
    assert sc.CONTAINER_MEMORY_USAGE.instrument == "UpDownCounter"
