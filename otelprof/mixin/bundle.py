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
    kubernetes/alertmanagerconfig.yaml          otelprof's routes as an AlertmanagerConfig (adds, replaces nothing)
    kubernetes/kube-prometheus-stack-values.yaml  the chart values that select and link all of it
    kubernetes/podmonitor.yaml                  scrapes every local rank's /metrics port of labelled pods
    kubernetes/servicemonitor.yaml              scrapes the webhook's own /metrics through its Service
    kubernetes/training-job.yaml                a training Job wired for otelprof (the pod template to copy)
    otel-collector/config.yaml                  the OpenTelemetry Collector config (spans to Tempo)
    prometheus/prometheus.yml                   plain Prometheus: pod discovery of the ranks and the webhook, the rules
    prometheus/alertmanager.yml                 plain Prometheus: a whole Alertmanager config of its own
    tests/otelprof-rules-test.yaml              promtool unit tests of these rules (``promtool test rules``)
    scale/mimir-otelprof.yaml                   the same rules as a Grafana Mimir / Cortex ruler namespace
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from otelprof.mixin import routing, rulers, ruletests, yamlout
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import ALERTS_FILE, RULES_FILE
from otelprof.mixin.generate import render_all as render_rules

DASHBOARDS = Path("dashboards")
KUBERNETES = Path("kubernetes")
PROMETHEUS = Path("prometheus")
TESTS = Path("tests")
SCALE = Path("scale")
SOURCE = "`otelprof mixin`"


def packaged(name: str) -> str:
    """A copy of a deploy/ source shipped in the package (``otelprof/mixin/files``)."""
    return (resources.files("otelprof.mixin") / "files" / name).read_text(encoding="utf-8")


def _monitor(config: MixinConfig, file: str, name: str) -> str:
    """A packaged PodMonitor / ServiceMonitor with the ``release`` label kube-prometheus-stack selects monitors by."""
    text = packaged(file)
    head = f"metadata:\n  name: {name}\n"
    if head not in text:
        raise ValueError(f"the packaged {file} has no {name} metadata")
    labels = f"  labels:\n    release: {yamlout.dump(config.prometheus_rule_release).strip()}\n"
    return text.replace(head, head + labels, 1)


def render(config: MixinConfig) -> dict[Path, str]:
    """Path relative to the output directory -> content."""
    from otelprof.dashboards import generate as dashboards
    from otelprof.mixin import deploy

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
    stack_doc = routing.alertmanager_config(config)
    out[KUBERNETES / "alertmanagerconfig.yaml"] = deploy.documents([stack_doc], SOURCE)
    out[KUBERNETES / "kube-prometheus-stack-values.yaml"] = (deploy.HEADER.format(source=SOURCE)
                                                             + yamlout.dump(routing.stack_values(config)))
    out[KUBERNETES / "podmonitor.yaml"] = _monitor(config, "podmonitor.yaml", "otelprof-training")
    out[KUBERNETES / "servicemonitor.yaml"] = _monitor(config, "servicemonitor.yaml", deploy.WEBHOOK_NAME)
    out[KUBERNETES / "training-job.yaml"] = packaged("training-job.yaml")
    out[Path("otel-collector") / "config.yaml"] = packaged("otel-collector-config.yaml")
    scrape = deploy.prometheus_config()
    scrape["rule_files"] = [f"../{ALERTS_FILE}", f"../{RULES_FILE}"]
    out[PROMETHEUS / "prometheus.yml"] = deploy.HEADER.format(source=SOURCE) + yamlout.dump(scrape)
    out[PROMETHEUS / "alertmanager.yml"] = packaged("alertmanager.yml")
    tests = ruletests.render_tests(config, [f"../{ALERTS_FILE}", f"../{RULES_FILE}"])
    out[TESTS / ruletests.TEST_FILE] = deploy.HEADER.format(source=SOURCE) + yamlout.dump(tests)
    out[SCALE / rulers.MIMIR_FILE] = rulers.render_all(config)[rulers.MIMIR_FILE]
    return out


def write(directory: Path, config: MixinConfig, force: bool = False) -> list[Path]:
    """Write the bundle into ``directory``; return the files that changed. Refuses (``RefusedWrite``, nothing
    written) links inside ``directory``, anything but regular files, and files otelprof did not write unless
    ``force`` (:mod:`otelprof.mixin.bundle_files`)."""
    from otelprof.mixin.bundle_files import write_bundle

    check(config)
    return write_bundle(directory, render(config), force=force)


def check(config: MixinConfig) -> None:
    """Raise ValueError where a rule the bundle would hold is not PromQL Prometheus accepts (one typo in a custom
    rule or a setting would make Prometheus refuse the whole file)."""
    from otelprof.mixin.alerts import alert_groups
    from otelprof.mixin.promql_check import check_groups
    from otelprof.mixin.rule_groups import rule_groups

    check_groups(alert_groups(config), ALERTS_FILE)
    check_groups(rule_groups(config), RULES_FILE)
