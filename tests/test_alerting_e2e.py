"""End to end on this machine: real training processes -> Prometheus (1 s scrape and evaluation) -> the
generated alert rules -> Alertmanager (the committed routing) -> `otelprof webhook` -> the training
process's control endpoint.

One job develops an input bottleneck (its data loader starts sleeping: OtelprofInputBound, action
`capture`) and then a NaN loss (OtelprofNonFiniteValues, action `stop`): it gets a profiling window,
then stops at a step boundary after its on_stop callback. A healthy job in the same harness gets
nothing. The onset -> webhook latencies are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from otelprof.cli import actions
from otelprof.mixin import MixinConfig
from otelprof.mixin.config import with_overrides
from otelprof.mixin.generate import render_alerts, render_rules
from tests.servers import Prometheus, free_port, require_binary
from tests.test_webhook_storm import DeadTargets, dead_targets

ROOT = Path(__file__).resolve().parent.parent
WEBHOOK_TOKEN = "e2e-webhook-token"
CONTROL_TOKEN = "e2e-control-token"

# The production rules except a short input-bound window, so the bottleneck shows within seconds.
E2E_CONFIG = with_overrides(MixinConfig(), ["input_bound_window=6s", "input_bound_for=0s", "recording_interval="])

TRAINING = r"""
import json, logging, math, os, random, sys, time
import otelprof

logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
schedule = json.loads(sys.argv[1])
session = otelprof.init()
session.on_stop(lambda: print(json.dumps({"event": "checkpoint", "t": time.time()}), flush=True))
print(json.dumps({"event": "ready", "t": time.time(), "metrics": session.metrics_address,
                  "control": session.control_address}), flush=True)
t0 = time.time()
step = 0
nan_reported = slow_reported = False
while time.time() - t0 < schedule["duration"]:
    elapsed = time.time() - t0
    slow = schedule.get("slow_at") is not None and elapsed >= schedule["slow_at"]
    nan = schedule.get("nan_at") is not None and elapsed >= schedule["nan_at"]
    with otelprof.step():
        with otelprof.annotate("dataloader"):
            time.sleep(0.1 if slow else 0.001)
        with otelprof.annotate("forward"):
            time.sleep(random.uniform(0.015, 0.035))  # steps vary, as real ones do
        if slow and not slow_reported:
            slow_reported = True
            print(json.dumps({"event": "slow", "t": time.time()}), flush=True)
        if nan and not nan_reported:
            nan_reported = True
            print(json.dumps({"event": "nan", "t": time.time()}), flush=True)
        otelprof.record("loss", math.nan if nan else 1.0 / (step + 1))
    step += 1
    if session.should_stop():
        print(json.dumps({"event": "stopped", "t": time.time(), "step": step}), flush=True)
        break
otelprof.shutdown()
print(json.dumps({"event": "exit", "t": time.time(), "step": step}), flush=True)
"""


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start:\n{log.read_text()}")
        time.sleep(0.1)


@contextmanager
def _service(name: str, args: list[str], ready_url: str, tmp: Path) -> Iterator[None]:
    log_path = tmp / f"{name}.log"
    with open(log_path, "w") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(ready_url, process, log_path, name)
            yield
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def _alertmanager_binary() -> str:
    for name in ("alertmanager", "prometheus-alertmanager"):
        if shutil.which(name):
            return str(shutil.which(name))
    return require_binary("prometheus-alertmanager")


@contextmanager
def alertmanager(tmp: Path, webhook_port: int) -> Iterator[str]:
    binary = _alertmanager_binary()
    token_file = tmp / "webhook-token"
    token_file.write_text(WEBHOOK_TOKEN)
    committed = (ROOT / "deploy" / "alertmanager" / "alertmanager.yml").read_text()
    config = committed.replace("http://otelprof-webhook:9095/v1/alerts", f"http://127.0.0.1:{webhook_port}/v1/alerts")
    config = config.replace("/etc/alertmanager/secrets/otelprof-webhook/token", str(token_file))
    assert config != committed
    (tmp / "alertmanager.yml").write_text(config)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with _service("alertmanager", [binary, f"--config.file={tmp / 'alertmanager.yml'}",
                                   f"--storage.path={tmp / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
                                   "--cluster.listen-address="], url + "/-/ready", tmp):
        yield url


@contextmanager
def prometheus_with_rules(tmp: Path, targets: list[str], alertmanager_url: str) -> Iterator[Prometheus]:
    binary = require_binary("prometheus")
    (tmp / "alerts.yaml").write_text(render_alerts(E2E_CONFIG))
    (tmp / "rules.yaml").write_text(render_rules(E2E_CONFIG))  # InputBound reads the recorded data-wait share
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "alerts.yaml"), str(tmp / "rules.yaml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_url.split("//")[1]]}]}]},
        "scrape_configs": [{"job_name": "training", "static_configs": [{"targets": targets}]}],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with _service("prometheus", [binary, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'prom-data'}", f"--web.listen-address=127.0.0.1:{port}"],
                  url + "/-/ready", tmp):
        yield Prometheus(url)


class Recorder:
    """The webhook's sender, timestamping each action it sends to a control endpoint."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, dict[str, Any]]] = []

    def __call__(self, url: str, body: dict[str, Any], token: str, timeout: float) -> int:
        self.sent.append((time.time(), url, body))
        return actions.post_json(url, body, token, timeout)


def _events(output: str) -> dict[str, dict[str, Any]]:
    events = {}
    for line in output.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            events.setdefault(event["event"], event)
    return events


DEAD_RANKS = 120
"""Ranks of a job whose control endpoints hang (half never accept, half never answer), each alerting a stop."""


def push_storm(am_url: str, ranks: range) -> None:
    """Stop alerts for the dead job's ``ranks``, straight into Alertmanager: the committed routing sends each
    in a notification of its own."""
    alerts = [{"labels": {"alertname": "OtelprofNonFiniteValues", "job_name": "dead", "rank": str(rank),
                          "severity": "critical", "action": "stop"},
               "annotations": {"summary": "storm"}} for rank in ranks]
    request = urllib.request.Request(f"{am_url}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_alert_to_action_end_to_end(tmp_path: Path) -> None:
    """With a storm of stop alerts for a job whose endpoints hang arriving before the NaN, and during it."""
    require_binary("prometheus")
    _alertmanager_binary()
    began = time.monotonic()
    jobs = {
        "sick": {"duration": 40, "slow_at": 3, "nan_at": 16},
        "healthy": {"duration": 22},
    }
    ports = {job: (free_port(), free_port()) for job in jobs}
    sender = Recorder()
    dead = DeadTargets()
    hanging = dead_targets(dead, 8)
    storm_targets = [f"dead/{rank}=http://{hanging[rank % 8][0]}:{hanging[rank % 8][1]}/r{rank}"
                     for rank in range(DEAD_RANKS)]
    targets = actions.TargetMap([actions.parse_target(f"{job}=http://127.0.0.1:{control}")
                                 for job, (_, control) in ports.items()]
                                + [actions.parse_target(t) for t in storm_targets])
    receiver = actions.WebhookReceiver(WEBHOOK_TOKEN, targets, CONTROL_TOKEN, capture_steps=5, sender=sender)
    webhook = actions.WebhookServer(receiver)
    _, webhook_port = webhook.start_background("127.0.0.1", 0)
    processes: dict[str, subprocess.Popen[str]] = {}
    storm: threading.Timer | None = None
    try:
        with alertmanager(tmp_path, webhook_port) as am_url, \
                prometheus_with_rules(tmp_path, [f"127.0.0.1:{m}" for m, _ in ports.values()], am_url) as prom:
            push_storm(am_url, range(DEAD_RANKS // 2))
            storm = threading.Timer(jobs["sick"]["nan_at"] - 1, push_storm, (am_url, range(DEAD_RANKS // 2,
                                                                                             DEAD_RANKS)))
            storm.start()
            for job, schedule in jobs.items():
                metrics_port, control_port = ports[job]
                env = {**os.environ, "OTELPROF_JOB_NAME": job, "OTEL_METRICS_EXPORTER": "prometheus",
                       "OTEL_EXPORTER_PROMETHEUS_PORT": str(metrics_port), "OTELPROF_CONTROL_PORT": str(control_port),
                       "OTELPROF_CONTROL_TOKEN": CONTROL_TOKEN, "OTELPROF_RECORD_DIR": str(tmp_path / "runs"),
                       "OTEL_TRACES_EXPORTER": "none"}
                env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
                processes[job] = subprocess.Popen([sys.executable, "-c", TRAINING, json.dumps(schedule)], env=env,
                                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            outputs = {job: p.communicate(timeout=90) for job, p in processes.items()}
            fired = prom.query('count by (alertname, job_name) (max_over_time(ALERTS{alertstate="firing"}[5m]))')
        storm_state = receiver.queue.snapshot()
    finally:
        if storm is not None:
            storm.cancel()
        for process in processes.values():
            if process.poll() is None:
                process.kill()
        webhook.stop()
        dead.close()

    sick_out, sick_err = outputs["sick"]
    healthy_out, healthy_err = outputs["healthy"]
    sick, healthy = _events(sick_out), _events(healthy_out)
    assert processes["sick"].returncode == 0, sick_err[-3000:]
    assert processes["healthy"].returncode == 0, healthy_err[-3000:]

    # the storm: its stops were tried, found dead targets, and were kept (bounded) for retries
    tried = {url for _, url, _ in sender.sent if "/r" in url}
    assert tried and storm_state["targets_waiting"] == len(hanging), storm_state
    assert 0 < storm_state["queued"] + storm_state["in_flight"] <= DEAD_RANKS, storm_state
    # the bottleneck: a capture reached the sick job's control endpoint, and only it
    captures = [(t, url) for t, url, _ in sender.sent if url.endswith("/v1/capture")]
    stops = [(t, url) for t, url, _ in sender.sent if url.endswith("/v1/stop") and url not in tried]
    sick_url = f"http://127.0.0.1:{ports['sick'][1]}"
    assert captures and all(url.startswith(sick_url) for _, url in captures), (sender.sent, fired)
    assert "POST /v1/capture -> 202" in sick_err
    # the NaN: the sick job stopped at a step boundary, after its checkpoint callback, before its deadline
    assert stops and all(url.startswith(sick_url) for _, url in stops), sender.sent
    assert "POST /v1/stop -> 202" in sick_err
    assert sick["checkpoint"]["t"] <= sick["stopped"]["t"] < sick["slow"]["t"] + 37
    # the healthy job got nothing and fired nothing
    assert "/v1/" not in healthy_err
    assert "stopped" not in healthy and healthy["exit"]["t"] - healthy["ready"]["t"] >= 21
    names = {(a["metric"]["alertname"], a["metric"].get("job_name")) for a in fired}
    assert not [n for n in names if n[1] == "healthy"], names
    assert {("OtelprofInputBound", "sick"), ("OtelprofNonFiniteValues", "sick")} <= names, names

    capture_latency = captures[0][0] - sick["slow"]["t"]
    stop_latency = stops[0][0] - sick["nan"]["t"]
    stopped_latency = sick["stopped"]["t"] - sick["nan"]["t"]
    print(f"\nonset -> webhook: NaN loss -> stop sent {stop_latency:.2f} s (stopped at a step boundary "
          f"{stopped_latency:.2f} s after the NaN); data loader slowed -> capture sent {capture_latency:.2f} s "
          f"(window {E2E_CONFIG.input_bound_window}); alerts that fired: {sorted(names)}; "
          f"test took {time.monotonic() - began:.0f} s; the storm's {DEAD_RANKS} stops for hanging endpoints: "
          f"{len(tried)} URLs tried, then {storm_state}")
    assert stop_latency <= 3.0
