"""deploy/ validated offline: kustomize builds, Kubernetes schemas, prometheus-operator CRD schemas,
promtool on the rules inside the PrometheusRule and the plain-Prometheus config, amtool on the
Alertmanager configs, the Collector config's pipelines, and the generated copies are current."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from otelprof.mixin import deploy
from tests.servers import require_binary

ROOT = Path(__file__).resolve().parent.parent
OVERLAYS = ["base", "overlays/kube-prometheus-stack", "overlays/kube-prometheus-stack/alertmanager",
            "overlays/plain-prometheus", "overlays/object-storage"]
CRD_DIR = ROOT.parent / "shared" / "schemas" / "prometheus-operator-v0.93.0"
CRD_FILES = {"AlertmanagerConfig": "monitoring.coreos.com_alertmanagerconfigs.yaml",
             "PodMonitor": "monitoring.coreos.com_podmonitors.yaml",
             "PrometheusRule": "monitoring.coreos.com_prometheusrules.yaml",
             "ServiceMonitor": "monitoring.coreos.com_servicemonitors.yaml"}


def _kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("kubectl is not installed (kubectl kustomize builds the overlays)")
        pytest.skip("kubectl not installed")
    return path


class _Loader(yaml.SafeLoader):
    """PyYAML reads a plain ``=`` (kustomize writes AlertmanagerConfig's ``matchType: =`` unquoted) as YAML 1.1's
    value tag; Kubernetes' YAML reader takes it as the string it is."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def build(overlay: str) -> list[dict[str, Any]]:
    result = subprocess.run([_kubectl(), "kustomize", str(ROOT / "deploy/kubernetes" / overlay)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.load_all(result.stdout, Loader=_Loader) if doc]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds_and_every_object_validates(overlay: str) -> None:
    import kubernetes_validate

    docs = build(overlay)
    assert docs
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRDs: validated against the operator's schemas below
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def _crd_schema(kind: str) -> dict[str, Any]:
    if not CRD_DIR.is_dir():
        pytest.skip(f"{CRD_DIR} is absent (the prometheus-operator CRD schemas sit beside the repository in CI)")
    path = CRD_DIR / CRD_FILES[kind]
    if not path.is_file():
        pytest.skip(f"{path.name} is absent from {CRD_DIR}")
    crd = yaml.load(path.read_text(), Loader=_Loader)  # its matchType enum holds a plain =
    [version] = [v for v in crd["spec"]["versions"] if v["name"] in ("v1", "v1alpha1")]
    return dict(version["schema"]["openAPIV3Schema"])


def test_custom_resources_validate_against_the_operator_crds() -> None:
    import jsonschema

    docs = build("overlays/kube-prometheus-stack")
    kinds = {doc["kind"] for doc in docs if doc["apiVersion"].startswith("monitoring.coreos.com/")}
    assert kinds == {"PodMonitor", "PrometheusRule", "ServiceMonitor"}  # the ServiceMonitor: the webhook's /metrics
    for doc in docs:
        if doc["kind"] in CRD_FILES:
            schema = _crd_schema(doc["kind"])
            # No meta-schema check: the CRDs' Go regexes (e.g. "^(?i)...") are not Python regexes.
            jsonschema.validators.validator_for(schema)(schema).validate(doc)
            assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack", doc["kind"]


def test_rules_inside_the_prometheusrule_pass_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    [rule] = [doc for doc in build("overlays/kube-prometheus-stack") if doc["kind"] == "PrometheusRule"]
    path = tmp_path / "groups.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(rule["spec"]["groups"]) >= 2


def test_plain_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    promtool = require_binary("promtool")
    [config_map] = [d for d in build("overlays/plain-prometheus") if d["metadata"]["name"] == "otelprof-prometheus"]
    rules_dir = tmp_path / "etc/prometheus/otelprof"
    rules_dir.mkdir(parents=True)
    for name, text in config_map["data"].items():
        (rules_dir / name).write_text(text)
    config = yaml.safe_load(config_map["data"]["prometheus.yml"])
    config["rule_files"] = [str(tmp_path / f.lstrip("/")) for f in config["rule_files"]]
    for scrape in config["scrape_configs"]:
        # Debian's Prometheus is built without Kubernetes discovery; the relabelling is still checked.
        assert scrape.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        scrape["static_configs"] = [{"targets": ["127.0.0.1:9464"]}]
    (rules_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run([promtool, "check", "config", str(rules_dir / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("overlay", "secret", "key"), [
    ("overlays/plain-prometheus", "otelprof-alertmanager", "alertmanager.yml"),
])
def test_alertmanager_secrets_pass_amtool(overlay: str, secret: str, key: str, tmp_path: Path) -> None:
    amtool = require_binary("amtool")
    [doc] = [d for d in build(overlay) if d["kind"] == "Secret" and d["metadata"]["name"] == secret]
    path = tmp_path / "alertmanager.yml"
    path.write_text(doc["stringData"][key])
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_kube_prometheus_stack_gets_an_alertmanagerconfig_not_a_whole_config() -> None:
    """The stack overlay never replaces the cluster's Alertmanager config: no config Secret, one AlertmanagerConfig
    in Alertmanager's namespace, with the webhook token Secret it reads beside it."""
    stack = build("overlays/kube-prometheus-stack")
    assert not [d for d in stack if d["kind"] == "Secret" and d["metadata"]["name"].startswith("alertmanager-")]
    docs = build("overlays/kube-prometheus-stack/alertmanager")
    [config] = [d for d in docs if d["kind"] == "AlertmanagerConfig"]
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert config["metadata"]["namespace"] == secret["metadata"]["namespace"] == "monitoring"
    [webhook] = [r for r in config["spec"]["receivers"] if "webhookConfigs" in r]
    assert webhook["webhookConfigs"][0]["httpConfig"]["authorization"]["credentials"]["name"] == \
        secret["metadata"]["name"]


def test_grafana_configmaps_carry_the_sidecar_labels() -> None:
    docs = build("overlays/kube-prometheus-stack")
    dashboards = [d for d in docs if d["metadata"]["name"].startswith("grafana-dashboard-")]
    assert dashboards and all(d["metadata"]["labels"]["grafana_dashboard"] == "1" for d in dashboards)
    assert {next(iter(d["data"])) for d in dashboards} == {p.name for p in (ROOT / "dashboards").glob("*.json")}
    [datasources] = [d for d in docs if d["metadata"]["name"] == "grafana-datasources-otelprof"]
    assert datasources["metadata"]["labels"]["grafana_datasource"] == "1"


def test_training_job_is_wired_for_otelprof() -> None:
    docs = build("base")
    [job] = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]
    assert pod["metadata"]["labels"]["otelprof.io/scrape"] == "true"
    [container] = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    for name in ("OTELPROF_JOB_NAME", "OTELPROF_RUN_ID", "OTELPROF_POD_NAME", "OTELPROF_POD_NAMESPACE",
                 "OTELPROF_NODE_NAME", "OTELPROF_CONTAINER_NAME", "OTEL_METRICS_EXPORTER",
                 "OTEL_EXPORTER_OTLP_ENDPOINT", "OTELPROF_CONTROL_PORT", "OTELPROF_CONTROL_TOKEN"):
        assert name in env, name
    assert env["OTELPROF_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["OTELPROF_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # one metrics-N and one control-N port per local rank: N = 0 .. --nproc_per_node - 1
    [nproc] = [int(a.split("=")[1]) for a in container["command"] if a.startswith("--nproc_per_node=")]
    assert nproc == 8
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {**{f"metrics-{i}": 9464 + i for i in range(nproc)},
                     **{f"control-{i}": 9565 + i for i in range(nproc)}}
    assert container["resources"]["limits"]["cpu"]
    from otelprof import environment_variables as ev

    known = {v.name for v in ev.ENV_VARS}
    assert set(env) <= known | {"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL"}


def test_webhook_has_least_privilege() -> None:
    docs = build("base")
    [role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "otelprof-webhook"]
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "patch"]}]
    assert not [d for d in docs if d["kind"] == "ClusterRoleBinding" and "webhook" in d["metadata"]["name"]]
    [deployment] = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "otelprof-webhook"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--suspend-jobs" in args and any(a.startswith("--token-file=") for a in args)
    from otelprof.cli import build_parser

    parsed = build_parser().parse_args(args[1:])  # the Deployment's command line is valid for our CLI
    assert parsed.control_port_base == 9565


def test_collector_config_pipelines_are_consistent() -> None:
    config = yaml.safe_load((ROOT / deploy.COLLECTOR_CONFIG).read_text())
    for pipeline in config["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline[kind]:
                assert name in config[kind], f"{name} is used but not defined"
        assert pipeline["processors"][0] == "memory_limiter" and pipeline["processors"][-1] == "batch"
    assert {"grpc", "http"} <= set(config["receivers"]["otlp"]["protocols"])
    assert set(config["service"]["pipelines"]) == {"traces", "metrics"}


def test_generated_copies_are_current() -> None:
    for relative, text in deploy.files(ROOT).items():
        assert (ROOT / relative).read_text(encoding="utf-8") == text, f"{relative} is stale: run otelprof generate"
