"""The rule groups otelprof ships, in runbook order, listed once.

:mod:`otelprof.mixin.alerts` adds the custom group after them and :mod:`otelprof.mixin.custom_alerts` refuses a
custom rule that takes one of their names; both read this list, neither imports the other.
"""

from __future__ import annotations

from otelprof.mixin import step_alerts, system_alerts, telemetry_alerts, tensor_alerts, training_alerts
from otelprof.mixin.alert_model import AlertGroup

__all__ = ["BUILT_IN"]

BUILT_IN: tuple[AlertGroup, ...] = (
    system_alerts.GROUP,
    step_alerts.GROUP,
    training_alerts.GROUP,
    tensor_alerts.GROUP,
    telemetry_alerts.GROUP,
)
"""A new group of alerts is one line here."""
