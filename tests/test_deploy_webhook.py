"""The webhook's own /metrics is scraped: the built manifests' discovery, run for real.

The base's pods (the webhook, the example training Job, the Collector) become the targets Kubernetes
discovery would give Prometheus, written to file_sd files (Debian's Prometheus has no Kubernetes
discovery): pod discovery (one target per declared container port) for the plain-Prometheus overlay's
``otelprof-webhook`` job, endpoints discovery (one target per Service port and selected pod) for the
kube-prometheus-stack overlay's ServiceMonitor as the operator renders it. A real ``otelprof webhook``
listens where the webhook pod's ``http`` port is; the other ports point at a port nobody listens on, so a
port the relabeling wrongly kept would be a down target. Both jobs see the webhook, and only it.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from otelprof.cli import actions
from otelprof.mixin import deploy
from tests.endpoints import WebhookProcess
from tests.servers import Prometheus, free_port, require_binary
from tests.test_deploy import build
from tests.test_deploy_ranks import _wait_for_value

SERVICE_MONITOR_JOB = "servicemonitor"


def _meta(name: str) -> str:
    return name.replace(".", "_").replace("/", "_").replace("-", "_")


def _pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pod templates of the base's workloads."""
    return [d["spec"]["template"] for d in docs if d["kind"] in ("Deployment", "Job")]


def _address(container_port: dict[str, Any], webhook: str, nobody: str) -> str:
    return webhook if container_port["name"] == deploy.WEBHOOK_PORT_NAME and container_port["containerPort"] == 9095 \
        else nobody


def _pod_targets(pods: list[dict[str, Any]], webhook_pod: dict[str, Any], webhook: str,
                 nobody: str) -> list[dict[str, Any]]:
    """What pod discovery yields: one target per declared container port of every pod."""
    groups = []
    for pod in pods:
        labels = {f"__meta_kubernetes_pod_label_{_meta(k)}": v for k, v in pod["metadata"]["labels"].items()}
        for container in pod["spec"]["containers"]:
            for port in container.get("ports", []):
                groups.append({"targets": [_address(port, webhook, nobody) if pod is webhook_pod else nobody],
                               "labels": {**labels, "__meta_kubernetes_namespace": "ml",
                                          "__meta_kubernetes_pod_name": f"{container['name']}-0",
                                          "__meta_kubernetes_pod_container_name": container["name"],
                                          "__meta_kubernetes_pod_container_port_name": port["name"]}})
    return groups


def _endpoint_targets(docs: list[dict[str, Any]], webhook_pod: dict[str, Any], webhook: str,
                      nobody: str) -> list[dict[str, Any]]:
    """What endpoints discovery yields: per Service port, the selected pods' port it targets."""
    groups = []
    for service in (d for d in docs if d["kind"] == "Service"):
        selector = service["spec"]["selector"].items()
        for pod in (p for p in _pods(docs) if selector <= p["metadata"]["labels"].items()):
            ports = [p for c in pod["spec"]["containers"] for p in c.get("ports", [])]
            for service_port in service["spec"]["ports"]:
                target = service_port.get("targetPort", service_port["port"])
                [port] = [p for p in ports if target in (p["name"], p["containerPort"])]
                groups.append({"targets": [_address(port, webhook, nobody) if pod is webhook_pod else nobody],
                               "labels": {**{f"__meta_kubernetes_service_label_{_meta(k)}": v
                                             for k, v in service["metadata"].get("labels", {}).items()},
                                          "__meta_kubernetes_service_name": service["metadata"]["name"],
                                          "__meta_kubernetes_namespace": "ml",
                                          "__meta_kubernetes_endpoint_port_name": service_port.get("name", "")}})
    return groups


def _service_monitor_relabeling(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """The ServiceMonitor as prometheus-operator renders it: keep the selected Services and the named port,
    the job from the Service's name, then the endpoint's path."""
    [endpoint] = monitor["spec"]["endpoints"]
    keep = [{"source_labels": [f"__meta_kubernetes_service_label_{_meta(k)}"], "regex": v, "action": "keep"}
            for k, v in monitor["spec"]["selector"]["matchLabels"].items()]
    return [*keep,
            {"source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"], "action": "keep"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "__metrics_path__", "replacement": endpoint.get("path", "/metrics")}]


def test_both_overlays_scrape_the_webhooks_own_metrics_and_nothing_else(tmp_path: Path) -> None:
    binary = require_binary("prometheus")
    base = build("base")
    [webhook_pod] = [d["spec"]["template"] for d in base
                     if d["kind"] == "Deployment" and d["metadata"]["name"] == deploy.WEBHOOK_NAME]
    [monitor] = [d for d in build("overlays/kube-prometheus-stack") if d["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"  # what the operator selects by
    [config_map] = [d for d in build("overlays/plain-prometheus") if d["metadata"]["name"] == "otelprof-prometheus"]
    [plain] = [s for s in yaml.safe_load(config_map["data"]["prometheus.yml"])["scrape_configs"]
               if s["job_name"] == deploy.WEBHOOK_NAME]
    assert plain.pop("kubernetes_sd_configs") == [{"role": "pod"}]

    webhook = WebhookProcess.start(tmp_path, ["train-a=http://127.0.0.1:9"])
    address = webhook.url.removeprefix("http://")
    nobody = f"127.0.0.1:{free_port()}"
    with urllib.request.urlopen(webhook.url + actions.METRICS_PATH, timeout=10) as response:
        served = sum(1 for line in response.read().decode().splitlines() if line and not line.startswith("#"))
    pods_file, endpoints_file = tmp_path / "pods.json", tmp_path / "endpoints.json"
    pods_file.write_text(json.dumps(_pod_targets(_pods(base), webhook_pod, address, nobody)))
    endpoints_file.write_text(json.dumps(_endpoint_targets(base, webhook_pod, address, nobody)))
    assert len(json.loads(pods_file.read_text())) > 10 and len(json.loads(endpoints_file.read_text())) >= 3

    def sd(path: Path) -> dict[str, Any]:
        return {"scrape_interval": "1s", "file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}]}

    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {**plain, **sd(pods_file)},
        {"job_name": SERVICE_MONITOR_JOB, "relabel_configs": _service_monitor_relabeling(monitor),
         **sd(endpoints_file)},
    ]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    prom = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        server = Prometheus(f"http://127.0.0.1:{port}")
        # every webhook series from both scrape jobs, both labelled job="otelprof-webhook" (the ServiceMonitor's
        # by the Service's name, as the operator does)
        query = f'count({{__name__=~"otelprof_webhook_.+", job="{deploy.WEBHOOK_NAME}"}})'
        assert _wait_for_value(server, query, 2 * served) == 2 * served
        targets = _targets(server)
        for scrape_job in (deploy.WEBHOOK_NAME, SERVICE_MONITOR_JOB):
            mine = [t for t in targets if t["scrapePool"] == scrape_job]
            assert [(t["scrapeUrl"], t["health"]) for t in mine] == [(f"{webhook.url}/metrics", "up")], mine
        [row] = server.query(f'otelprof_webhook_queue_depth{{job="{deploy.WEBHOOK_NAME}", namespace="ml"}}')
        assert row["metric"]["pod"] == "webhook-0"  # the plain job's pod labels
    finally:
        prom.terminate()
        prom.wait(10)
        assert "Traceback" not in webhook.stop()


def _targets(server: Prometheus) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{server.url}/api/v1/targets?state=active", timeout=5) as response:
        return list(json.load(response)["data"]["activeTargets"])
