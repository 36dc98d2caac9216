"""The alert rules as Python data, assembled: every group's alerts in runbook order, and the rule groups.

:func:`alerts` builds them from a :class:`MixinConfig`; :func:`alert_groups` turns them
into Prometheus rule groups. Every alert carries ``severity``, an ``action`` label when the
config gives it one, and ``summary`` / ``description`` / ``runbook_url`` / ``dashboard_url``.
What an alert is lives in :mod:`otelprof.mixin.alert_model`; each group's alerts in a module
of their own (``*_alerts``), listed once in :data:`~otelprof.mixin.built_in_groups.BUILT_IN`; :data:`GROUPS`
adds the custom rules' group after them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from otelprof.mixin import custom_alerts
from otelprof.mixin.alert_model import Alert, AlertGroup
from otelprof.mixin.built_in_groups import BUILT_IN
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.declared import declared

__all__ = ["GROUPS", "alert_groups", "alerts", "no_for"]

GROUPS: tuple[AlertGroup, ...] = (*BUILT_IN, custom_alerts.GROUP)
"""The rule groups in runbook order: the built-in ones (a new group is one line there), then the custom rules."""

def no_for() -> dict[str, str]:
    """Why an alert without ``for`` needs none: one evaluation is conclusive (its declaration's ``no_for``, stated
    in its runbook entry). A function, not a constant: nothing builds the alerts while the modules load."""
    return {alert.short: alert.no_for for alert in declared() if alert.no_for}


def alerts(config: MixinConfig) -> list[Alert]:
    """Every alert of the mixin, in runbook order (disabled ones left out)."""
    built = [alert for group in GROUPS for alert in group.build(config)]
    result = []
    for alert in built:
        if alert.short in config.disabled_alerts:
            continue
        action = config.action_for(alert.short)
        result.append(dataclasses.replace(alert, action=action))
    return result


def alert_groups(config: MixinConfig) -> list[dict[str, Any]]:
    """Rule groups for the alerts file (one group per topic)."""
    groups = []
    all_alerts = alerts(config)
    for group in GROUPS:
        rules = [a.rule(config) for a in all_alerts if a.group == group.name]
        if rules:
            groups.append({"name": group.name, "rules": rules})
    return groups
