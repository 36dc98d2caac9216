"""Beyond one Prometheus: the agent-mode config remote-writes otelprof's series with their labels."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

import otelprof
from otelprof import semconv as sc
from otelprof.mixin.deploy import prometheus_config
from otelprof.mixin.promql import IDENTITY, series_name
from otelprof.mixin.recording_rules import aggregate_names
from tests.remote_write import decode_write_request, remote_write_receiver, snappy_decompress
from tests.servers import free_port, require_binary

ROOT = Path(__file__).resolve().parent.parent
AGENT = ROOT / "deploy/scale/prometheus-agent.yml"
POD = {"namespace": "ml", "pod": "resnet-0", "container": "trainer"}
RULE_FILES = (ROOT / "deploy/prometheus/otelprof-alerts.yaml", ROOT / "deploy/prometheus/otelprof-rules.yaml")
AGGREGATES = aggregate_names()


def _agent_flag(binary: str) -> str:
    """Agent mode: ``--agent`` from Prometheus 3, a feature flag before."""
    text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30).stdout
    return "--agent" if re.search(r"^\s+--agent\b", text, re.MULTILINE) else "--enable-feature=agent"


def _agent_config(target: str, write_url: str) -> dict[str, Any]:
    """The shipped agent config on this machine: pod discovery replaced by one static target carrying the
    labels pod discovery would set (so the shipped relabelling runs), the store by the test receiver."""
    config = yaml.safe_load(AGENT.read_text())
    scrape, webhook = config["scrape_configs"]
    assert webhook["job_name"] == "otelprof-webhook"  # tests/test_deploy_webhook.py runs its relabelling
    config["scrape_configs"] = [scrape]
    # Debian's Prometheus is built without Kubernetes discovery.
    assert scrape.pop("kubernetes_sd_configs") == [{"role": "pod"}]
    scrape["scrape_interval"] = "1s"
    scrape["static_configs"] = [{"targets": [target], "labels": {
        "__meta_kubernetes_pod_label_otelprof_io_scrape": "true",
        "__meta_kubernetes_pod_container_port_name": "metrics-0",
        "__meta_kubernetes_namespace": POD["namespace"], "__meta_kubernetes_pod_name": POD["pod"],
        "__meta_kubernetes_pod_container_name": POD["container"], "__meta_kubernetes_pod_ip": "127.0.0.1"}}]
    [store] = config["remote_write"]
    store["url"] = write_url
    store["queue_config"]["batch_send_deadline"] = "1s"
    return config


def test_agent_config_scrapes_like_the_plain_prometheus_overlay() -> None:
    agent = yaml.safe_load(AGENT.read_text())
    assert agent["scrape_configs"] == prometheus_config()["scrape_configs"]
    assert "rule_files" not in agent and "alerting" not in agent  # an agent evaluates nothing


def test_agent_config_passes_promtool(tmp_path: Path) -> None:
    path = tmp_path / "agent.yml"
    path.write_text(yaml.safe_dump(_agent_config("127.0.0.1:9464", "http://127.0.0.1:1/api/v1/write")))
    result = subprocess.run([require_binary("promtool"), "check", "config", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _wait(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    return check()


def test_agent_remote_writes_otelprof_series_with_their_labels(tmp_path: Path) -> None:
    binary = require_binary("prometheus")
    session = otelprof.init(job_name="agent-job", record_dir=str(tmp_path / "runs"),
                            metrics_exporters=("prometheus",), prometheus_port=0, traces_exporters=())
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    host, port = session.metrics_address
    try:
        for _ in range(12):
            with otelprof.step():
                with otelprof.annotate("forward"):
                    time.sleep(0.001)
        with remote_write_receiver() as (url, receiver):
            config = tmp_path / "agent.yml"
            config.write_text(yaml.safe_dump(_agent_config(f"{host}:{port}", url)))
            web = free_port()
            log = (tmp_path / "agent.log").open("w")
            agent = subprocess.Popen([binary, _agent_flag(binary), f"--config.file={config}",
                                      f"--storage.agent.path={tmp_path / 'wal'}",
                                      f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
            try:
                steps = _wait(lambda: [s for s in receiver.find(series_name(sc.STEPS))
                                       if s.labels.get("job_name") == "agent-job"])
                assert steps, (tmp_path / "agent.log").read_text()[-3000:]
                with urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/status/runtimeinfo",
                                            timeout=5) as response:
                    assert response.status == 200
            finally:
                agent.terminate()
                agent.wait(20)
                log.close()
        labels = steps[0].labels
        assert {name: labels[name] for name in POD} == POD  # the shipped relabelling ran
        assert labels["job"] == "otelprof-training" and labels["cluster"] == "training-cluster-1"
        assert all(labels.get(name) for name in IDENTITY), labels
        assert labels["phase"] == "train"
        assert max(value for _, value in steps[0].samples) == 12
        buckets = [s for s in receiver.find(series_name(sc.STEP_DURATION, "bucket"))
                   if s.labels.get("job_name") == "agent-job"]
        assert {s.labels["le"] for s in buckets} >= {"+Inf"} and len(buckets) == len(sc.STEP_DURATION.buckets) + 1
        assert receiver.find("up") and receiver.headers[0]["content-encoding"] == "snappy"
        assert receiver.headers[0]["x-prometheus-remote-write-version"].startswith("0.1")
    finally:
        otelprof.shutdown()


@contextmanager
def _stepping(stop: threading.Event) -> Iterator[None]:
    """Training steps every 20 ms on a thread until the block ends (the rules' rates need growth)."""

    def loop() -> None:
        while not stop.is_set():
            with otelprof.step():
                with otelprof.annotate("forward"):
                    time.sleep(0.002)
            time.sleep(0.02)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def _process(args: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = log_path.open("w")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _query(url: str, promql: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}),
                                timeout=10) as response:
        return list(json.load(response)["data"]["result"])


def test_the_shipped_rules_evaluate_on_remote_written_series(tmp_path: Path) -> None:
    """agent -> a store that evaluates the rules (here a Prometheus receiving remote write, as Thanos Receive +
    Thanos Rule or Mimir would): every shipped rule evaluates without error on the written series."""
    binary = require_binary("prometheus")
    session = otelprof.init(job_name="remote-job", record_dir=str(tmp_path / "runs"),
                            metrics_exporters=("prometheus",), prometheus_port=0, traces_exporters=())
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    host, port = session.metrics_address
    store_port, agent_port = free_port(), free_port()
    store = tmp_path / "store"
    store.mkdir()
    (store / "prometheus.yml").write_text(json.dumps({
        "global": {"evaluation_interval": "1s"}, "rule_files": [str(p) for p in RULE_FILES]}))
    config = tmp_path / "agent.yml"
    config.write_text(yaml.safe_dump(_agent_config(f"{host}:{port}",
                                                   f"http://127.0.0.1:{store_port}/api/v1/write")))
    url = f"http://127.0.0.1:{store_port}"
    try:
        with _stepping(threading.Event()), \
                _process([binary, f"--config.file={store / 'prometheus.yml'}", f"--storage.tsdb.path={store / 'data'}",
                          f"--web.listen-address=127.0.0.1:{store_port}", "--web.enable-remote-write-receiver"],
                         tmp_path / "store.log"), \
                _process([binary, _agent_flag(binary), f"--config.file={config}",
                          f"--storage.agent.path={tmp_path / 'wal'}", f"--web.listen-address=127.0.0.1:{agent_port}"],
                         tmp_path / "agent.log"):
            p95 = f'{AGGREGATES["step_p95_rate"]}{{job_name="remote-job", phase="train"}} > 0'

            def ready() -> list[dict[str, Any]]:
                try:
                    return _query(url, p95)
                except OSError:
                    return []

            found = _wait(ready, timeout=90)
            assert found, (tmp_path / "agent.log").read_text()[-2000:] + (tmp_path / "store.log").read_text()[-2000:]
            assert found[0]["metric"]["namespace"] == POD["namespace"] and found[0]["metric"]["rank"] == "0"
            assert 0.001 < float(found[0]["value"][1]) < 1.0
            def evaluated() -> list[dict[str, Any]]:  # every group (the recording groups every 30 s)
                time.sleep(1)  # ...and once more after that: on the written series
                with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as response:
                    groups: list[dict[str, Any]] = json.load(response)["data"]["groups"]
                return groups if all(rule["health"] != "unknown" for g in groups for rule in g["rules"]) else []

            groups = _wait(evaluated, timeout=90)
    finally:
        otelprof.shutdown()
    rules = [rule for group in groups for rule in group["rules"]]
    shipped = sum(len(g["rules"]) for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"])
    assert len(rules) == shipped
    failing = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
    assert not failing, failing


def test_snappy_and_protobuf_decoders_read_known_bytes() -> None:
    # literal "ab", then a 1-byte-offset copy of 4 bytes at offset 2 (overlapping): "ababab"
    assert snappy_decompress(bytes([6, 0b000001_00, 0x61, 0x62, 0b000_000_01, 2])) == b"ababab"
    with pytest.raises(ValueError):
        snappy_decompress(bytes([9, 0b000001_00, 0x61, 0x62]))
    label = b"\x0a\x08__name__\x12\x02up"
    sample = b"\x09" + struct.pack("<d", 1.5) + b"\x10\xe8\x07"  # value 1.5, timestamp 1000
    series = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    [decoded] = decode_write_request(b"\x0a" + bytes([len(series)]) + series)
    assert decoded.labels == {"__name__": "up"} and decoded.samples == [(1000, 1.5)]
