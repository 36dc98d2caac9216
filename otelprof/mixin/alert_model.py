"""What an alert is: :class:`Alert`, one declaration of everything about it (its Prometheus rule and annotations,
its :class:`Runbook` entry, the dashboard panel it links to, the report section and the kind of finding it
backs, the settings it reads, its offline twin and its promtool cases), and :class:`AlertGroup`, one rule group's
alerts as :mod:`otelprof.mixin.alerts` assembles them.

The rules, the runbook, the alerts table of ``docs/alerts.md``, the dashboard links, the diagnosis's map of report
sections and the offline checks' lists are all read from the declarations (:mod:`otelprof.mixin.declared`)."""

from __future__ import annotations

from collections.abc import Callable
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


CAUSE = "cause"
SYMPTOM = "symptom"
RISK = "risk"
KINDS = (CAUSE, SYMPTOM, RISK)
"""What a firing alert is in the report's diagnosis: a cause of lost time, a symptom of one (both taken up by
the diagnosis's own findings, which weigh what they cost), or a risk that costs no time yet (a finding of its
own)."""

OFFLINE_SYSTEM = "system_checks"
OFFLINE_STEPS = "step_checks"
OFFLINE_TRAINING = "training_checks"
OFFLINE_TENSORS = "tensors"
OFFLINE = (OFFLINE_SYSTEM, OFFLINE_STEPS, OFFLINE_TRAINING, OFFLINE_TENSORS)
"""Where ``otelprof check`` judges an alert's condition on a recording: the module of :mod:`otelprof.analysis`
that holds its offline twin (keyed by the alert's short name)."""

SHARED_KNOBS = ("selector", "target_labels")
"""Settings any alert reads where its series carry them (matchers, the scrape target's labels): not repeated in
each alert's ``knobs``."""


@dataclass(frozen=True, kw_only=True)
class Alert:
    """One alert as data, declared once with named fields: its expression, ``for``, severity, texts, dashboard
    panel, runbook entry, and what the report, the offline checks and the tests need to know about it."""

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
    panel: int | None
    """Id of the panel of ``dashboard`` that shows what it judged (:mod:`otelprof.dashboards.ids`); the
    ``dashboard_url`` opens it."""
    section: str
    """Anchor of the report section with its details (``rules``: the checks' table)."""
    kind: str
    """:data:`CAUSE`, :data:`SYMPTOM` or :data:`RISK`."""
    knobs: tuple[str, ...]
    """The :class:`MixinConfig` fields it reads besides :data:`SHARED_KNOBS` (a test finds them by changing
    each field alone)."""
    offline: str | None
    """Where ``otelprof check`` judges it (one of :data:`OFFLINE`), None when nothing does."""
    cases: tuple[str, ...]
    """The promtool test files (``tests/rules/``) that hold its firing and quiet cases."""
    no_for: str = ""
    """Why it needs no ``for`` (one evaluation is conclusive), for an alert declared without one; the runbook
    states it."""
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
        return dashboard_ids.dashboard_url(config.grafana_url, self.dashboard, variables, self.panel)

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
    """One Prometheus rule group: its name and the alerts it builds from a config (in runbook order)."""

    name: str
    build: Callable[[MixinConfig], list[Alert]]
