"""The built-in alerts as declared: what the report, the offline checks, the docs and the tests read from them.

Each alert is one :class:`~otelprof.mixin.alert_model.Alert` declaration in its group's module (``*_alerts``).
Its config-independent fields (panel, report section, kind, offline twin, promtool cases, knobs) are the same
whatever the config (a test changes every setting alone to prove it), so they are read here from the default
config's alerts, once.
"""

from __future__ import annotations

from functools import cache

from otelprof.mixin.alert_model import Alert
from otelprof.mixin.built_in_groups import BUILT_IN
from otelprof.mixin.config import MixinConfig

__all__ = ["by_short", "declared", "offline_twins", "section_checks"]


@cache
def declared() -> tuple[Alert, ...]:
    """Every built-in alert with the default config, in runbook order (none disabled)."""
    config = MixinConfig()
    return tuple(alert for group in BUILT_IN for alert in group.build(config))


def by_short() -> dict[str, Alert]:
    return {alert.short: alert for alert in declared()}


def offline_twins(where: str) -> tuple[str, ...]:
    """The alerts (short names, runbook order) whose offline twin lives in ``where`` (one of ``OFFLINE``)."""
    return tuple(alert.short for alert in declared() if alert.offline == where)


def section_checks(sections: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Each report section of ``sections`` and the alerts that point at it (runbook order)."""
    return {anchor: tuple(alert.short for alert in declared() if alert.section == anchor) for anchor in sections}
