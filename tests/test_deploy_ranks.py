"""Every local rank of a multi-GPU pod is scraped: the built manifests' pod discovery, run for real.

The example Job's pod (8 local ranks, ports metrics-0..7 and control-0..7) becomes the targets
Kubernetes pod discovery would give Prometheus -- one per declared container port, with the
``__meta_kubernetes_pod_*`` labels -- written to a file_sd file (Debian's Prometheus has no
Kubernetes discovery). A real Prometheus scrapes them with the plain-Prometheus overlay's relabeling
and with the PodMonitor's (its selector and relabelings, as the operator renders them), while 8 real
processes serve /metrics with LOCAL_RANK=0..7: both jobs see 8 targets up and 8 ranks' series.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from otelprof import semconv as sc
from otelprof.mixin import deploy
from otelprof.mixin.promql import series_name
from tests.servers import Prometheus, free_port, require_binary
from tests.test_deploy import build

SERVE = r"""
import sys, otelprof
session = otelprof.init()
host, port = session.metrics_address
print(f"{host}:{port}", flush=True)
sys.stdin.read()  # until the test closes stdin
otelprof.shutdown()
"""

POD_IP = "10.0.0.7"




def _pod_targets(pod: dict[str, Any], address: dict[int, str]) -> list[dict[str, Any]]:
    """What Kubernetes pod discovery yields for ``pod``: one target per declared container port."""
    groups = []
    labels = {f"__meta_kubernetes_pod_label_{k.replace('.', '_').replace('/', '_').replace('-', '_')}": v
              for k, v in pod["metadata"]["labels"].items()}
    for container in pod["spec"]["containers"]:
        for port in container["ports"]:
            groups.append({"targets": [address[port["containerPort"]]], "labels": {
                **labels,
                "__meta_kubernetes_namespace": "ml",
                "__meta_kubernetes_pod_name": "otelprof-example-training-0-abcde",
                "__meta_kubernetes_pod_ip": POD_IP,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_port_name": port["name"],
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
            }})
    return groups


def _podmonitor_relabeling(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """The PodMonitor as prometheus-operator renders it: keep the selected pods, then its relabelings."""
    keep = [{"source_labels": [f"__meta_kubernetes_pod_label_{k.replace('.', '_').replace('/', '_')}"],
             "regex": v, "action": "keep"} for k, v in monitor["spec"]["selector"]["matchLabels"].items()]
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert "port" not in endpoint and "portNumber" not in endpoint  # every declared port, filtered below
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return keep + [{names.get(k, k): v for k, v in rule.items()} for rule in endpoint["relabelings"]]


def test_a_pod_with_8_local_ranks_yields_8_ranks_scraped(tmp_path: Path) -> None:
    binary = require_binary("prometheus")
    [job] = [d for d in build("base") if d["kind"] == "Job"]
    pod = job["spec"]["template"]
    [monitor] = [d for d in build("overlays/kube-prometheus-stack") if d["kind"] == "PodMonitor"]
    [config_map] = [d for d in build("overlays/plain-prometheus") if d["metadata"]["name"] == "otelprof-prometheus"]
    [plain] = [s for s in yaml.safe_load(config_map["data"]["prometheus.yml"])["scrape_configs"]
               if s["job_name"] == "otelprof-training"]
    ranks = 8

    base = free_port(ranks)  # the ranks listen on base + LOCAL_RANK
    address = {p["containerPort"]: f"127.0.0.1:{free_port()}" for c in pod["spec"]["containers"] for p in c["ports"]}
    for rank in range(ranks):  # the pod's metrics-N port (9464 + N) is where local rank N listens here
        address[9464 + rank] = f"127.0.0.1:{base + rank}"
    sd_file = tmp_path / "pod.json"
    sd_file.write_text(json.dumps(_pod_targets(pod, address)))
    assert len(json.loads(sd_file.read_text())) == 2 * ranks  # metrics-N and control-N: 16 targets

    plain.pop("kubernetes_sd_configs")
    scrape = {"scrape_interval": "1s", "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}]}
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [
        {**plain, **scrape},
        {"job_name": "podmonitor", "relabel_configs": _podmonitor_relabeling(monitor), **scrape},
    ]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    processes = []
    prom_port = free_port()
    prom = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for rank in range(ranks):
            processes.append(subprocess.Popen(
                [sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, env={**env, "OTELPROF_JOB_NAME": "multi-gpu", "OTEL_METRICS_EXPORTER": "prometheus",
                                "OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
                                "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(ranks),
                                "OTELPROF_RECORD_DIR": str(tmp_path / "runs")}))
        listening = sorted(p.stdout.readline().strip() for p in processes)  # type: ignore[union-attr]
        assert listening == sorted(f"127.0.0.1:{base + r}" for r in range(ranks)), listening

        server = Prometheus(f"http://127.0.0.1:{prom_port}")
        present = series_name(sc.PROCESS_START_TIME)
        for scrape_job in (plain["job_name"], "podmonitor"):
            query = f'count(count by ({sc.prometheus_label(sc.LABEL_RANK)}) ({present}{{job="{scrape_job}"}}))'
            deadline_result = _wait_for_value(server, query, ranks)
            assert deadline_result == ranks, (scrape_job, deadline_result)
            # 8 targets, all up: the control-N ports were dropped, not scraped and down
            assert _value(server, f'count(up{{job="{scrape_job}"}})') == ranks
            assert _value(server, f'count(up{{job="{scrape_job}"}} == 1)') == ranks
            [row] = server.query(f'count by (pod_ip) ({present}{{job="{scrape_job}"}})')
            assert row["metric"]["pod_ip"] == POD_IP
            ranks_seen = {r["metric"][sc.prometheus_label(sc.LABEL_LOCAL_RANK)]
                          for r in server.query(f'{present}{{job="{scrape_job}"}}')}
            assert ranks_seen == {str(r) for r in range(ranks)}
    finally:
        for process in processes:
            process.communicate(timeout=30)
        prom.terminate()
        prom.wait(10)
    for process in processes:
        assert process.returncode == 0


def _value(server: Prometheus, query: str) -> float:
    result = server.query(query)
    return float(result[0]["value"][1]) if result else 0.0


def _wait_for_value(server: Prometheus, query: str, expected: float, timeout: float = 40.0) -> float:
    import time

    deadline = time.monotonic() + timeout
    value = 0.0
    while time.monotonic() < deadline:
        try:
            value = _value(server, query)
        except OSError:
            value = 0.0
        if value == expected:
            return value
        time.sleep(0.5)
    return value


@pytest.mark.parametrize("overlay", ["overlays/kube-prometheus-stack", "overlays/plain-prometheus"])
def test_both_overlays_select_the_same_ports(overlay: str) -> None:
    docs = build(overlay)
    if overlay.endswith("stack"):
        [monitor] = [d for d in docs if d["kind"] == "PodMonitor"]
        regexes = [r["regex"] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"] if "regex" in r]
    else:
        [config_map] = [d for d in docs if d["metadata"]["name"] == "otelprof-prometheus"]
        [plain] = [s for s in yaml.safe_load(config_map["data"]["prometheus.yml"])["scrape_configs"]
                   if s["job_name"] == "otelprof-training"]
        regexes = [r["regex"] for r in plain["relabel_configs"]
                   if r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]]
    assert regexes == [deploy.METRICS_PORT_REGEX]
