"""Everything ``otelprof mixin -o DIR`` writes: the whole mixin from the installed package, no checkout.

Layout of ``DIR`` (one config applied to all of it)::

    otelprof-alerts.yaml, otelprof-rules.yaml   Prometheus rule files
    otelprof-prometheusrule.yaml                the same rules as a PrometheusRule (prometheus-operator)
    runbook.md                                  the runbook the alerts' runbook_url points at
    dashboards/*.json                           the Grafana dashboards
    dashboards/provisioning/*.yaml              Grafana provisioning: dashboard provider, data sources
    kubernetes/grafana-dashboards.yaml          dashboards as ConfigMaps for kube-prometheus-stack's sidecar
    kubernetes/grafana-datasources.yaml         the Tempo data source for the sidecar
    kubernetes/grafana-provisioning.yaml        provisioning + dashboards as ConfigMaps for a Grafana you run
"""

from __future__ import annotations

from pathlib import Path

from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import render_all as render_rules

DASHBOARDS = Path("dashboards")
KUBERNETES = Path("kubernetes")
SOURCE = "`otelprof mixin`"


def render(config: MixinConfig) -> dict[Path, str]:
    """Path relative to the output directory -> content."""
    from otelprof import deploy
    from otelprof.dashboards import generate as dashboards

    out = {Path(name): text for name, text in render_rules(config).items()}
    boards = dashboards.render_all(config)
    out.update({DASHBOARDS / name: text for name, text in boards.items()})
    board_json = {name: text for name, text in boards.items() if name.endswith(".json")}
    out[KUBERNETES / "grafana-dashboards.yaml"] = deploy.documents(deploy.grafana_sidecar_documents(board_json),
                                                                   SOURCE)
    out[KUBERNETES / "grafana-datasources.yaml"] = deploy.documents(
        deploy.grafana_sidecar_datasources(boards[dashboards.TEMPO_DATASOURCE_FILE]), SOURCE)
    provider_files = {Path(name).name: boards[name] for name in (dashboards.DATASOURCES_FILE, dashboards.PROVIDER_FILE)}
    out[KUBERNETES / "grafana-provisioning.yaml"] = deploy.documents(
        deploy.grafana_provisioning_documents(provider_files, board_json), SOURCE)
    return out


def write(directory: Path, config: MixinConfig) -> list[Path]:
    """Write the bundle into ``directory``; return the files that changed."""
    from otelprof.deploy import write_changed

    return write_changed(directory, render(config))
