"""The alerts table of ``docs/alerts.md``, generated from the alerts' declarations (``otelprof generate``).

One row per built-in alert in runbook order: what it says, the settings it reads with their defaults, its
severity and default action, the dashboard panel its link opens, the report section and kind of finding it backs,
and where ``otelprof check`` judges it.
"""

from __future__ import annotations

from otelprof.mixin.alert_model import Alert
from otelprof.mixin.config import MixinConfig

RUNBOOK = "../deploy/prometheus/runbook.md"
"""The runbook, relative to ``docs/``."""


def _default(config: MixinConfig, knob: str) -> str:
    value = getattr(config, knob)
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(none)"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value) or "(empty)"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(alert: Alert, config: MixinConfig, panels: dict[tuple[str, int], str]) -> str:
    settings = ", ".join(f"`{knob}` {_default(config, knob)}" for knob in alert.knobs) or "-"
    action = config.action_for(alert.short)
    severity = f"{alert.severity} / **{action}**" if action else alert.severity
    panel = panels.get((alert.dashboard, alert.panel), "-") if alert.panel is not None else "-"
    offline = f"`{alert.offline}`" if alert.offline else "live only"
    return (f"| [`{alert.short}`]({RUNBOOK}#{alert.anchor}) | {_cell(alert.summary)} | {settings} | {severity} | "
            f"{_cell(panel)} | `{alert.section}` ({alert.kind}) | {offline} |")


def alerts_markdown() -> str:
    """The table, for the default config."""
    from otelprof.dashboards.generate import dashboards
    from otelprof.mixin.declared import declared

    config = MixinConfig()
    panels = {(board.uid, panel["id"]): f"{board.title.removeprefix('otelprof / ')}: {panel['title']}"
              for board in dashboards(config) for panel in board.to_json()["panels"]}
    rows = ["| Alert (`Otelprof…`) | Says | Settings (defaults) | Severity / action | Dashboard panel "
            "| Report section (kind) | `otelprof check` |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    rows += [_row(alert, config, panels) for alert in declared()]
    return "\n".join(rows)
