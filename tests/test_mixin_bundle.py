"""`otelprof mixin -o DIR` gives a pip user the whole mixin, no repository checkout: rules that pass
promtool, a PrometheusRule the operator's CRD accepts, the runbook the alerts link to, dashboards
that match Grafana's schema with the selector and data-source settings applied, provisioning, and
ConfigMaps Kubernetes accepts. Run from a directory outside the repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from otelprof.mixin.bundle import render
from otelprof.mixin.bundle_files import MANIFEST
from otelprof.mixin.config import MixinConfig
from tests.servers import require_binary
from tests.test_deploy import _crd_schema

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tests" / "fixtures" / "grafana-dashboard.schema.json").read_text(encoding="utf-8"))
SELECTOR = 'namespace="ml"'


def _mixin(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the package, as installed; the cwd holds nothing of the repo
    return subprocess.run([sys.executable, "-m", "otelprof", "mixin", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("pip-user")
    (cwd / "mixin.yaml").write_text(f"selector: '{SELECTOR}'\nprometheus_url: http://prometheus-operated:9090\n"
                                    "disabled_alerts: [Overfitting]\n")
    result = _mixin(cwd, "-o", "monitoring", "--config", "mixin.yaml", "--set", "prometheus_rule_release=prom")
    assert result.returncode == 0, result.stderr
    assert not result.stderr
    return cwd / "monitoring"


def test_everything_is_written(bundle: Path) -> None:
    written = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*") if p.is_file())
    assert written == sorted([str(p) for p in render(MixinConfig())] + [MANIFEST])  # + what otelprof wrote
    assert {"otelprof-alerts.yaml", "otelprof-rules.yaml", "otelprof-prometheusrule.yaml", "runbook.md",
            "dashboards/provisioning/datasources.yaml", "kubernetes/grafana-dashboards.yaml"} <= set(written)
    assert len([w for w in written if w.startswith("dashboards/") and w.endswith(".json")]) == 4


def test_rules_pass_promtool(bundle: Path) -> None:
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "check", "rules", str(bundle / "otelprof-alerts.yaml"),
                             str(bundle / "otelprof-rules.yaml")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = yaml.safe_load((bundle / "otelprof-alerts.yaml").read_text())
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    assert "OtelprofOverfitting" not in names and len(names) > 10  # the config file reached the rules
    assert all(SELECTOR in r["expr"] for g in alerts["groups"] for r in g["rules"] if "otelprof_" in r["expr"])


def test_prometheusrule_validates_against_the_crd(bundle: Path) -> None:
    rule = yaml.safe_load((bundle / "otelprof-prometheusrule.yaml").read_text())
    assert rule["metadata"]["labels"]["release"] == "prom"
    schema = _crd_schema("PrometheusRule")
    jsonschema.validators.validator_for(schema)(schema).validate(rule)


def _anchors(markdown: str) -> set[str]:
    return {re.sub(r"[^a-z0-9 _-]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", markdown, re.MULTILINE)}


def test_runbook_links_point_at_the_runbooks_sections(bundle: Path) -> None:
    """Absolute by default (the project's runbook: links work from Alertmanager, Slack and Grafana), with one
    anchor per alert that the written runbook has; ``runbook_url`` points them at your copy instead."""
    anchors = _anchors((bundle / "runbook.md").read_text())
    for name in ("otelprof-alerts.yaml", "otelprof-prometheusrule.yaml"):
        doc = yaml.safe_load((bundle / name).read_text())
        rules = [r for g in (doc.get("spec") or doc)["groups"] for r in g["rules"] if "alert" in r]
        assert rules
        for rule in rules:
            url = urlsplit(rule["annotations"]["runbook_url"])
            assert url.scheme == "https" and url.netloc and url.path.endswith("/runbook.md"), url
            assert url.fragment == rule["alert"].lower() and url.fragment in anchors, url


def test_runbook_url_can_point_at_your_copy(tmp_path: Path) -> None:
    result = _mixin(tmp_path, "-o", "out", "--set", "runbook_url=https://wiki.example.com/ml/runbook")
    assert result.returncode == 0, result.stderr
    alerts = yaml.safe_load((tmp_path / "out/otelprof-alerts.yaml").read_text())
    urls = {r["annotations"]["runbook_url"].split("#")[0] for g in alerts["groups"] for r in g["rules"]}
    assert urls == {"https://wiki.example.com/ml/runbook"}


def _boards(bundle: Path) -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted((bundle / "dashboards").glob("*.json"))}


def _exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [v for k, v in node.items() if k in ("expr", "query") and isinstance(v, str)]
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_dashboards_match_grafanas_schema_with_the_selector_applied(bundle: Path) -> None:
    boards = _boards(bundle)
    uids = {board["uid"] for board in boards.values()}
    for board in boards.values():
        jsonschema.Draft7Validator(SCHEMA).validate(board)
        # every raw otelprof series (not recording rules, not ALERTS) carries the selector
        raw = r"(?<![\w:])((?:otelprof|hw|system|process)_\w+)\{([^}]*)"
        series = [m for e in _exprs(board) for m in re.findall(raw, e)]
        assert series and all(inner.startswith(SELECTOR) for _, inner in series), board["uid"]
        # links between dashboards are relative and name dashboards that were written
        for uid in re.findall(r"/d/([\w-]+)", json.dumps(board)):
            assert uid in uids, uid
    alerts = yaml.safe_load((bundle / "otelprof-alerts.yaml").read_text())
    for rule in (r for g in alerts["groups"] for r in g["rules"]):
        [uid] = re.findall(r"/d/([\w-]+)", rule["annotations"]["dashboard_url"])
        assert uid in uids, rule["alert"]


def test_rule_tests_pass_promtool_for_the_bundles_settings(bundle: Path) -> None:
    promtool = require_binary("promtool")
    result = subprocess.run([promtool, "test", "rules", "otelprof-rules-test.yaml"], cwd=bundle / "tests",
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (bundle / "tests/otelprof-rules-test.yaml").read_text()
    assert 'namespace=\\"ml\\"' in text  # the test series carry the selector the rules filter on


@pytest.mark.parametrize("settings", [["window=5m"], ["straggler_window=2m", "input_bound_window=3m", "window=90s"],
                                      ["dashboard_rate_window=2m", "straggler_window=10m"]])
def test_dashboards_read_the_recording_rules_their_settings_generate(tmp_path: Path, settings: list[str]) -> None:
    result = _mixin(tmp_path, "-o", "out", *(a for s in settings for a in ("--set", s)))
    assert result.returncode == 0, result.stderr
    rules = yaml.safe_load((tmp_path / "out/otelprof-rules.yaml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"]}
    read = {name for board in _boards(tmp_path / "out").values() for e in _exprs(board)
            for name in re.findall(r"\botelprof(?:_job)?:\w+:\w+", e)}
    assert len(read) > 10 and read <= recorded, read - recorded


def test_dashboards_have_cluster_and_namespace_variables(bundle: Path) -> None:
    for board in _boards(bundle).values():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        for name in ("cluster", "namespace"):
            assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*", board["uid"]
        assert "$namespace" in variables["job_name"]["query"] and "$cluster" in variables["namespace"]["query"]
        queries = [e for e in _exprs(board) if "otelprof_" in e and "job_name=" in e]
        assert queries and all('namespace=~"$namespace"' in e for e in queries), board["uid"]


def test_cluster_wiring_files_carry_the_settings(bundle: Path) -> None:
    import kubernetes_validate

    [monitor] = [d for d in yaml.safe_load_all((bundle / "kubernetes/podmonitor.yaml").read_text()) if d]
    assert monitor["kind"] == "PodMonitor" and monitor["metadata"]["labels"]["release"] == "prom"
    [webhook] = [d for d in yaml.safe_load_all((bundle / "kubernetes/servicemonitor.yaml").read_text()) if d]
    assert webhook["kind"] == "ServiceMonitor" and webhook["metadata"]["labels"]["release"] == "prom"
    assert webhook["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]
    scrape = yaml.safe_load((bundle / "prometheus/prometheus.yml").read_text())["scrape_configs"]
    assert [s["job_name"] for s in scrape] == ["otelprof-training", "otelprof-webhook"]  # the ranks and the webhook
    docs = [d for d in yaml.safe_load_all((bundle / "kubernetes/training-job.yaml").read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    [job] = [d for d in docs if d["kind"] == "Job"]
    assert job["spec"]["template"]["metadata"]["labels"]["otelprof.io/scrape"] == "true"
    values = yaml.safe_load((bundle / "kubernetes/kube-prometheus-stack-values.yaml").read_text())
    sidecar = values["grafana"]["sidecar"]
    assert sidecar["dashboards"]["folderAnnotation"] == "grafana_folder"
    dashboards = [d for d in yaml.safe_load_all((bundle / "kubernetes/grafana-dashboards.yaml").read_text()) if d]
    assert all("grafana_folder" in d["metadata"]["annotations"] for d in dashboards)
    assert sidecar["datasources"]["exemplarTraceIdDestinations"]["traceIdLabelName"] == "trace_id"
    spec = values["alertmanager"]["alertmanagerSpec"]
    [amc] = [d for d in yaml.safe_load_all((bundle / "kubernetes/alertmanagerconfig.yaml").read_text()) if d]
    assert spec["alertmanagerConfigSelector"]["matchLabels"].items() <= amc["metadata"]["labels"].items()
    assert "configSecret" not in spec
    for doc in (monitor, webhook):  # last: skips where the CRDs are absent (the AlertmanagerConfig's: its own test)
        schema = _crd_schema(doc["kind"])
        jsonschema.validators.validator_for(schema)(schema).validate(doc)


def test_provisioning_and_configmaps_carry_the_settings(bundle: Path) -> None:
    import kubernetes_validate

    sources = yaml.safe_load((bundle / "dashboards/provisioning/datasources.yaml").read_text())
    [prometheus] = [s for s in sources["datasources"] if s["type"] == "prometheus"]
    assert prometheus["url"] == "http://prometheus-operated:9090"
    boards = _boards(bundle)
    sidecar = [d for d in yaml.safe_load_all((bundle / "kubernetes/grafana-dashboards.yaml").read_text()) if d]
    assert {name for d in sidecar for name in d["data"]} == set(boards)
    assert all(d["metadata"]["labels"]["grafana_dashboard"] == "1" for d in sidecar)
    assert all(json.loads(text) == boards[name] for d in sidecar for name, text in d["data"].items())
    plain = [d for d in yaml.safe_load_all((bundle / "kubernetes/grafana-provisioning.yaml").read_text()) if d]
    assert plain[0]["data"]["datasources.yaml"] == (bundle / "dashboards/provisioning/datasources.yaml").read_text()
    for name in ("grafana-dashboards.yaml", "grafana-datasources.yaml", "grafana-provisioning.yaml"):
        for doc in yaml.safe_load_all((bundle / "kubernetes" / name).read_text()):
            if doc:
                kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def test_default_bundle_equals_the_committed_files() -> None:
    """With no settings the bundle is what the repository commits (one source for both)."""
    from otelprof.dashboards.generate import DASHBOARDS_DIR
    from otelprof.mixin.generate import PROMETHEUS_DIR
    from otelprof.mixin.rulers import RULERS_DIR

    for relative, text in render(MixinConfig()).items():
        if relative.parts[0] == "dashboards":
            committed = ROOT / DASHBOARDS_DIR / Path(*relative.parts[1:])
        elif relative.parts[0] in ("kubernetes", "prometheus", "otel-collector", "tests"):
            continue
        elif relative.parts[0] == "scale":
            committed = ROOT / RULERS_DIR / relative.name
        else:
            committed = ROOT / PROMETHEUS_DIR / relative
        assert committed.read_text(encoding="utf-8") == text, relative


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "window=soon"], "not a duration"),
    (["--config", "missing.yaml"], "cannot read the config file"),
    (["--set", "no_such=1"], "unknown mixin setting"),
])
def test_bad_settings_give_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = _mixin(tmp_path, "-o", "out", *args)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
