"""The tensor verdict suite, live: each pathology's alert fires in a real Prometheus naming the right layer, the
healthy run raises nothing, and the live verdicts are the offline ones (``otelprof check``) on the same runs.

The jobs of tests/tensor_job.py train under ``otelprof run`` (collections from the environment, saved every 5
steps) with their /metrics endpoint on, stretched to a step every 0.1 s and kept alive after training until the
test is done; one Prometheus scrapes them every second and evaluates the per-layer alerts
(:mod:`otelprof.mixin.tensor_alerts`) with windows short enough for runs of seconds. The Layers row of the
training report dashboard runs against the same Prometheus.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from otelprof.dashboards.queries import Queries
from otelprof.dashboards.tensors import layers_row
from otelprof.mixin import MixinConfig, yamlout
from otelprof.mixin.config import ALERT_PREFIX, with_overrides
from otelprof.mixin.rules import recording_rules
from otelprof.mixin.tensor_alerts import tensor_alerts
from tests.servers import Prometheus, free_port, prometheus
from tests.test_tensors import ALL, JOB

pytestmark = pytest.mark.serial  # alone, after the parallel part of make test: its timings are live

ROOT = Path(__file__).resolve().parent.parent
CONFIG = with_overrides(MixinConfig(), ["tensor_window=10m", "overtraining_window=3s", "overtraining_lookback=2m",
                                        "overtraining_for=2s"])
JOBS: dict[str, tuple[int, set[tuple[str, str]]]] = {
    # scenario: (steps, alerts that must fire live as (alert, tensor label; "" for overtraining))
    "vanishing": (60, {("LayerVanishingGradient", "gradients/0.weight")}),
    "saturated": (60, {("SaturatedActivation", "1/output")}),
    "dead_relu": (60, {("DeadRelu", "3/output")}),
    "exploding": (60, {("LayerExplodingTensor", "0.weight"), ("WeightUpdateRatio", "update/4.bias")}),
    "zero_init": (60, {("PoorWeightInitialization", "2.weight"), ("AllZeroTensor", "2.weight"),
                       ("TensorUnchanged", "0.weight")}),  # the zeroed layer blocks every gradient before it
    "imbalanced": (60, {("ClassImbalance", "class 1")}),
    "overtraining": (150, {("Overtraining", "")}),
    "healthy": (60, set()),
}
DEADLINE = 150.0


def _env(tmp: Path, name: str, port: int, stop: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTELPROF_"))}
    env.update({"PYTHONPATH": str(ROOT), "OTELPROF_JOB_NAME": name, "OTELPROF_RUN_ID": name,
                "OTELPROF_RECORD_DIR": str(tmp / "runs"), "OTELPROF_SYSTEM_METRICS": "false",
                "OTELPROF_COLLECTIONS": ALL, "OTELPROF_SAVE_INTERVAL": "5", "OTEL_METRICS_EXPORTER": "prometheus",
                "OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                "OTEL_EXPORTER_PROMETHEUS_PORT": str(port), "OTEL_METRIC_EXPORT_INTERVAL": "600000",
                "OMP_NUM_THREADS": "1", "OTELPROF_PROFILE_EVERY": "0", "TENSOR_JOB_STEP_SLEEP": "0.1",
                "TENSOR_JOB_STOP_FILE": str(stop)})
    return env


def _live(prom: Prometheus, since: float) -> dict[str, set[tuple[str, str]]]:
    """Per job, (alert, tensor) of every tensor alert at warning or above that fired since ``since``."""
    window = max(int(time.time() - since) + 2, 5)
    out: dict[str, set[tuple[str, str]]] = {}
    query = f'max_over_time(ALERTS{{alertstate="firing", severity=~"warning|critical"}}[{window}s])'
    for result in prom.query(query):
        m = result["metric"]
        out.setdefault(m.get("job_name", ""), set()).add((m["alertname"].removeprefix(ALERT_PREFIX),
                                                          m.get("tensor", "")))
    return out


def _offline(run: Path) -> set[tuple[str, str]]:
    """(check, tensor) of every loud tensor check ``otelprof check`` fired on the same run."""
    result = subprocess.run([sys.executable, "-m", "otelprof", "check", str(run), "--json"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode in (0, 1), result.stderr
    names = {a.name for a in tensor_alerts(CONFIG)}
    out = set()
    for row in json.loads(result.stdout)["checks"]:
        if row["alert"] not in names or not row["fired"] or row["severity"] == "info":
            continue
        short = row["alert"].removeprefix(ALERT_PREFIX)
        if short == "Overtraining":
            out.add((short, ""))
            continue
        for subject in row["subjects"]:
            tensor = subject.removeprefix("rank 0 ")
            out.add((short, " ".join(tensor.split()[:2]) if tensor.startswith("class ") else tensor))
    return out


def _panel_results(prom: Prometheus, job: str) -> dict[str, int]:
    """Series each query of the Layers row returns for ``job`` (instant queries over the last 10 minutes)."""
    counts = {}
    for panel in layers_row(Queries(CONFIG)).panels:
        for target in panel.targets:
            expr = target.expr
            for var, value in (("$__range", "10m"), ("$__rate_interval", "4s"), ("$job_name", job),
                               ("$cluster", ".*"), ("$namespace", ".*"), ("$node", ".*"), ("$rank", ".*")):
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.load(response)
            assert body["status"] == "success", (panel.title, body)
            counts[f"{panel.title}: {target.legend or expr[:40]}"] = len(body["data"]["result"])
    return counts


def test_each_pathology_fires_its_live_alert_naming_the_layer_as_offline(tmp_path: Path) -> None:
    rules = tmp_path / "tensor-alerts.yaml"
    records = [r.rule() for r in recording_rules(CONFIG)]  # overtraining reads the recorded loss means
    rules.write_text(yamlout.dump({"groups": [{"name": "tensors", "rules": [a.rule(CONFIG)
                                                                            for a in tensor_alerts(CONFIG)]},
                                              {"name": "records", "rules": records}]}))
    ports = {name: free_port() for name in JOBS}
    stop = tmp_path / "stop"
    processes: dict[str, subprocess.Popen[bytes]] = {}
    with prometheus(tmp_path, [f"127.0.0.1:{p}" for p in ports.values()], "1s", [rules]) as prom:
        since = time.time()
        try:
            for name, (steps, _) in JOBS.items():
                with open(tmp_path / f"{name}.log", "wb") as log:
                    processes[name] = subprocess.Popen(
                        [sys.executable, "-m", "otelprof", "run", "-q", "--", sys.executable, str(JOB), name,
                         str(steps)], env=_env(tmp_path, name, ports[name], stop), cwd=tmp_path,
                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + DEADLINE
            trained = False
            while time.monotonic() < deadline:
                live = _live(prom, since)
                trained = all((tmp_path / f"{n}.log").read_bytes().count(b"last_loss") for n in JOBS)
                if trained and all(expected <= live.get(n, set()) for n, (_, expected) in JOBS.items()):
                    break
                time.sleep(1)
            time.sleep(3)  # the last read-back steps scraped and judged
            live = _live(prom, since)
            print(f"live verdicts after {time.time() - since:.0f} s: {live}")
            panels = _panel_results(prom, "dead_relu")
        finally:
            stop.touch()
            for p in processes.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(60)
                if p.poll() is None:
                    p.kill()
                    p.wait()
    logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in JOBS}
    assert trained, logs
    with ThreadPoolExecutor(4) as pool:
        offline = dict(zip(JOBS, pool.map(lambda n: _offline(tmp_path / "runs" / n), JOBS)))
    for name, (_, expected) in JOBS.items():
        assert processes[name].returncode == 0, logs[name][-3000:]
        assert "otelprof:" not in logs[name], logs[name]  # no warning: nothing went wrong
        fired = live.get(name, set())
        assert expected <= fired, (name, fired)
        assert fired == offline[name], name  # live = offline, layer by layer
    assert live.get("healthy", set()) == set()
    assert all(panels.values()), panels  # the dashboard's Layers row has data for a run with collections
