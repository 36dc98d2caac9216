"""What an alert is: :class:`Alert` (its Prometheus rule and annotations), its :class:`Runbook` entry, and
:class:`AlertGroup`, one rule group's alerts as :mod:`otelprof.mixin.alerts` assembles them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otelprof.mixin import config as mc
from otelprof.mixin.alert_text import L_GPU, L_JOB, L_NODE, L_RANK
from otelprof.mixin.config import MixinConfig, seconds
from otelprof.mixin.promql import GPU, NODE, RANK


@dataclass(frozen=True)
class Runbook:
    """An alert's runbook entry: what it means, its thresholds and detection limit, what to do, how it differs
    from the original."""

    meaning: str
    thresholds: tuple[tuple[str, str], ...]
    todo: str
    deviations: str
    limit: str
    """Detection limit: the smallest fault the alert catches and how long it takes, computed from the config."""
    original: str = ""
    """SageMaker Debugger rule it stands for ("" when otelprof adds it)."""


@dataclass(frozen=True)
class Alert:
    """One alert as data: its expression, ``for``, severity, texts, dashboard and runbook entry."""

    short: str
    """Name without the prefix; the config's ``actions`` and ``disabled_alerts`` use it."""
    group: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    dashboard: str
    labels: tuple[str, ...]
    """Labels the alert carries (from its expression), besides alertname/severity/action."""
    runbook: Runbook
    action: str | None = None

    @property
    def name(self) -> str:
        return mc.ALERT_PREFIX + self.short

    @property
    def anchor(self) -> str:
        return self.name.lower()

    def runbook_url(self, config: MixinConfig) -> str:
        return f"{config.runbook_url}#{self.anchor}"

    def dashboard_url(self, config: MixinConfig) -> str:
        """The dashboard (and its panel for this alert) with the alert's job/rank/node/GPU selected."""
        from otelprof.dashboards import ids as dashboard_ids

        variables = {dashboard_ids.VAR_JOB: L_JOB}
        for label, var, template in ((RANK, dashboard_ids.VAR_RANK, L_RANK), (NODE, dashboard_ids.VAR_NODE, L_NODE),
                                     (GPU, dashboard_ids.VAR_GPU, L_GPU)):
            if label in self.labels:
                variables[var] = template
        panel = dashboard_ids.alert_panel(self.short)
        return dashboard_ids.dashboard_url(config.grafana_url, self.dashboard, variables, panel[1] if panel else None)

    def rule(self, config: MixinConfig) -> dict[str, Any]:
        """The Prometheus alerting rule."""
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr}
        if seconds(self.for_) > 0:
            rule["for"] = self.for_
        labels = {"severity": self.severity}
        if self.action:
            labels["action"] = self.action
        rule["labels"] = labels
        rule["annotations"] = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": self.runbook_url(config),
            "dashboard_url": self.dashboard_url(config),
        }
        return rule


@dataclass(frozen=True)
class AlertGroup:
    """One Prometheus rule group: its name, the alerts it builds from a config (in runbook order), and why
    those without ``for`` need none."""

    name: str
    build: Callable[[MixinConfig], list[Alert]]
    no_for: Mapping[str, str]
