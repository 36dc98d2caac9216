"""dcgm-exporter alongside: a real Prometheus scrapes a dcgm-exporter exposition and two real training ranks.

The ranks run with OTELPROF_GPU_SAMPLING=false over the fake NVML (the fixture's two GPUs): they only export
``otelprof_gpu_info`` (GPU index in the container, UUID). The exposition (tests/fixtures/dcgm_exporter_a100x3.prom,
dcgm-exporter's format with pod attribution) has the same two GPUs at other host indices (4, 5) and a third GPU of
another pod at host index 0. Scraped like dcgm-exporter's ServiceMonitor does (honorLabels: false: its pod labels
become exported_pod/exported_namespace), the mixin's dcgm-mode rules must join by pod and UUID: rank 0's idle,
nearly full GPU fires, rank 1's busy GPU stays quiet, the other pod's GPU never reaches the job, and the GPU panels
of the dashboards return both ranks.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards.generate import render_all as render_dashboards
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import render_alerts, render_rules
from tests.fake_nvml import FIXTURES, FakeNvml
from tests.servers import Prometheus, free_port, require_binary
from tests.test_dashboards_prometheus import JOB as DASHBOARD_JOB
from tests.test_dashboards_prometheus import substitute

ROOT = Path(__file__).resolve().parent.parent
EXPOSITION = FIXTURES / "dcgm_exporter_a100x3.prom"
SERVE = r"""
import functools, sys
import otelprof, otelprof.session
from otelprof.collectors.sampler import Sampler
from tests.fake_nvml import FakeNvml
otelprof.session.Sampler = functools.partial(Sampler, nvml_factory=FakeNvml)
session = otelprof.init()
host, port = session.metrics_address
print(f"{host}:{port}", flush=True)
sys.stdin.read()
otelprof.shutdown()
"""
JOB = "llm"
CONFIG = MixinConfig(gpu_source="dcgm", window="10s", patience="0s", low_gpu_for="0s",
                     gpu_memory_capacity_window="10s", batch_size_for="0s")


@contextmanager
def _serve(body: bytes) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_dcgm_mode_rules_and_panels_join_dcgm_exporter_to_the_ranks(tmp_path: Path) -> None:
    binary = require_binary("prometheus")
    (tmp_path / "alerts.yaml").write_text(render_alerts(CONFIG))
    (tmp_path / "rules.yaml").write_text(render_rules(CONFIG))
    uuid0, uuid1 = (d["uuid"] for d in FakeNvml().data["devices"])
    base = free_port(2)  # the ranks listen on base + LOCAL_RANK
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                      "CUDA_VISIBLE", "NVIDIA_VISIBLE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    processes = []
    prom_process = None
    with _serve(EXPOSITION.read_bytes()) as dcgm_address:
        try:
            for rank in range(2):
                processes.append(subprocess.Popen(
                    [sys.executable, "-c", SERVE], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True,
                    env={**env, "OTELPROF_JOB_NAME": JOB, "OTEL_METRICS_EXPORTER": "prometheus",
                         "OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_PROMETHEUS_PORT": str(base),
                         "OTELPROF_GPU_SAMPLING": "false", "RANK": str(rank), "LOCAL_RANK": str(rank),
                         "WORLD_SIZE": "2", "OTELPROF_RECORD_DIR": str(tmp_path / "runs")}))
            ranks = [p.stdout.readline().strip() for p in processes]  # type: ignore[union-attr]
            assert ranks == [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}"], ranks
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "alerts.yaml"), str(tmp_path / "rules.yaml")],
                "scrape_configs": [
                    # as the PodMonitor labels the training pod's targets
                    {"job_name": "otelprof", "static_configs": [
                        {"targets": ranks, "labels": {"namespace": "ml", "pod": "trainer-0"}}]},
                    # as dcgm-exporter's ServiceMonitor (honorLabels: false) labels its own pod's target
                    {"job_name": "nvidia-dcgm-exporter", "static_configs": [
                        {"targets": [dcgm_address],
                         "labels": {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-7xk2p"}}]},
                ]}
            (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
            port = free_port()
            prom_process = subprocess.Popen(
                [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            prom = Prometheus(f"http://127.0.0.1:{port}")
            _wait_ready(prom)
            _check(prom, uuid0, uuid1)
        finally:
            errors = [p.communicate("", timeout=30)[1] for p in processes]
            if prom_process is not None:
                prom_process.terminate()
                prom_process.wait(10)
    assert all(p.returncode == 0 for p in processes)
    assert errors == ["", ""]  # the ranks said nothing on stderr (no GPU sampling, no warning)


def _wait_ready(prom: Prometheus) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            prom.query("1")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _by_rank(result: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {s["metric"]["rank"]: s for s in result}


def _both_ranks(prom: Prometheus, promql: str) -> dict[str, dict[str, Any]]:
    """``promql``'s series by rank once both ranks have one (each target is scraped on its own schedule)."""
    deadline = time.monotonic() + 30
    while True:
        result = _by_rank(prom.query(promql))
        if set(result) >= {"0", "1"} or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def _check(prom: Prometheus, uuid0: str, uuid1: str) -> None:
    info = _both_ranks(prom, sc.GPU_INFO.prometheus_name)
    assert {r: (s["metric"]["gpu"], s["metric"]["hw_id"]) for r, s in info.items()} == {
        "0": ("0", uuid0), "1": ("1", uuid1)}
    assert not prom.query(sc.GPU_UTILIZATION.prometheus_name)  # otelprof's own GPU sampling is off

    # the records: base units, the ranks' labels, gpu = the index in the container (not dcgm's host index)
    util = _both_ranks(prom, "otelprof:hw_gpu_utilization_ratio:dcgm")
    assert set(util) == {"0", "1"}  # the other pod's GPU (host index 0) joins no rank
    assert {r: (s["metric"]["gpu"], s["metric"]["hw_id"], s["metric"]["job_name"], float(s["value"][1]))
            for r, s in util.items()} == {"0": ("0", uuid0, JOB, 0.03), "1": ("1", uuid1, JOB, 0.95)}
    used = _both_ranks(prom, "otelprof:hw_gpu_memory_usage_bytes:dcgm")
    assert float(used["0"]["value"][1]) == 39000 * 2**20
    ratio = _both_ranks(prom, "otelprof:hw_gpu_memory_utilization_ratio:dcgm")
    assert abs(float(ratio["0"]["value"][1]) - 39000 / 39960) < 1e-9
    clock = _both_ranks(prom, "otelprof:otelprof_gpu_sm_clock_hertz:dcgm")
    assert float(clock["1"]["value"][1]) == 1.41e9
    # power and temperature under their hw.* names, with the labels otelprof's own series have (hw_type="gpu"
    # on the generic hw.power), so a panel reads the record in place of the series
    for spec, dcgm_values in ((sc.GPU_POWER, {"0": 92.5, "1": 305.25}), (sc.GPU_TEMPERATURE, {"0": 61, "1": 55})):
        record = _both_ranks(prom, f"otelprof:{spec.prometheus_name}:dcgm")
        assert {r: float(s["value"][1]) for r, s in record.items()} == dcgm_values, spec.name
        assert all(set(s["metric"]) - {"__name__"} == set(spec.prometheus_labels) for s in record.values()), record
    power = _both_ranks(prom, "otelprof:hw_power_watts:dcgm")
    assert {s["metric"]["hw_type"] for s in power.values()} == {"gpu"}

    # the alerts: rank 0's GPU idles and is nearly full; rank 1's is busy and half full
    def firing(name: str) -> dict[str, dict[str, Any]]:
        return _by_rank(prom.query(f'ALERTS{{alertname="Otelprof{name}", alertstate="firing"}}'))

    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not (firing("GPUUnderutilized") and firing("GPUMemoryNearCapacity")):
        time.sleep(1)
    for name in ("GPUUnderutilized", "GPUMemoryNearCapacity"):
        alerts = firing(name)
        assert set(alerts) == {"0"}, (name, alerts)
        assert alerts["0"]["metric"]["gpu"] == "0" and alerts["0"]["metric"]["hw_id"] == uuid0
    # every rank's GPU joined (pending for a moment is allowed: a rank may be scraped an interval before the
    # exporter, and `for` is there to ride that out)
    assert not firing("GPUTelemetryAbsent")
    assert not prom.query('ALERTS{alertname="OtelprofGPUUtilizationFluctuating"}')

    # the dashboards' GPU panels in dcgm mode return the run's ranks' GPUs
    board = json.loads(render_dashboards(CONFIG)[f"{ids.GPU_SYSTEM}.json"])
    panels = {p["id"]: p for row in board["panels"] for p in [row, *row.get("panels", [])]}
    for panel_id, expected in ((ids.SYSTEM_GPU_UTILIZATION, {"0": 0.03, "1": 0.95}),
                               (ids.SYSTEM_GPU_MEMORY, {"0": 39000 / 39960, "1": 19600 / 39960})):
        expr = substitute(panels[panel_id]["targets"][0]["expr"], 60).replace(f'"{DASHBOARD_JOB}"', f'"{JOB}"')
        result = prom.query(expr)
        got = {s["metric"]["rank"]: float(s["value"][1]) for s in result}
        assert got.keys() == expected.keys(), (panel_id, expr, result)
        assert all(abs(got[r] - expected[r]) < 1e-9 for r in expected)



# ------------------------------------------------------------------ promtool cases of the dcgm-mode rules

PROMTOOL_CONFIG = MixinConfig(gpu_source="dcgm")  # the defaults: 250 s window, 500 s patience, 1 min for


def _dcgm(name: str, uuid: str, host_gpu: str, pod: str, values: str) -> dict[str, str]:
    labels = {"gpu": host_gpu, "UUID": uuid, "modelName": "NVIDIA A100-SXM4-40GB", "Hostname": "n1",
              "exported_namespace": "ml", "exported_pod": pod, "namespace": "gpu-operator", "pod": "dcgm-abc",
              "job": "nvidia-dcgm-exporter", "instance": "10.0.0.9:9400"}
    return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def test_promtool_cases_of_the_dcgm_mode_alerts(tmp_path: Path) -> None:
    """Rank 0's GPU idles at 5 % (fires after patience + for), rank 1's is busy (quiet); a rank whose pod label
    dcgm-exporter does not carry gets GPUTelemetryAbsent instead of a wrong join through the host index."""
    import subprocess as sp

    from otelprof.mixin.alerts import alerts
    from tests.rules.cases import const, render

    binary = require_binary("promtool")
    (tmp_path / "alerts.yaml").write_text(render_alerts(PROMTOOL_CONFIG))
    (tmp_path / "rules.yaml").write_text(render_rules(PROMTOOL_CONFIG))
    by_name = {a.short: a for a in alerts(PROMTOOL_CONFIG)}
    n = 80  # 80 x 15 s = 20 min
    series = []
    ranks = {0: ("GPU-a", "4", 5.0), 1: ("GPU-b", "5", 90.0), 2: ("GPU-c", "0", 1.0)}
    for rank, (uuid, host_gpu, util) in ranks.items():
        ident = {"job_name": "llm", "rank": str(rank), "local_rank": str(rank), "node": "n1", "namespace": "ml",
                 "pod": "trainer-0" if rank < 2 else "trainer-1", "job": "otelprof", "instance": f"10.0.0.1:{rank}"}
        labels = ", ".join(f'{k}="{v}"' for k, v in ident.items())
        series.append({"series": f'{sc.GPU_INFO.prometheus_name}{{{labels}, gpu="{rank % 2}", hw_id="{uuid}"}}',
                       "values": const(1, n)})
        series.append({"series": f"{sc.PROCESS_START_TIME.prometheus_name}{{{labels}}}", "values": const(0, n)})
        # rank 2's GPU is attributed to another pod by dcgm-exporter: no join, whatever the host index
        pod = "trainer-0" if rank < 2 else "somebody-else"
        series.append(_dcgm(sc.DCGM_GPU_UTIL, uuid, host_gpu, pod, const(util, n)))
        series.append(_dcgm(sc.DCGM_FB_USED, uuid, host_gpu, pod, const(20000, n)))
        series.append(_dcgm(sc.DCGM_FB_FREE, uuid, host_gpu, pod, const(20000, n)))

    def expected(short: str, index: int, value: float, **extra: str) -> dict[str, Any]:
        alert = by_name[short]
        rule = alert.rule(PROMTOOL_CONFIG)
        labels = {"job_name": "llm", "node": "n1", "gpu": str(index % 2), **extra}
        return {"exp_labels": {**labels, **rule["labels"]},
                "exp_annotations": {k: render(v, labels, value) for k, v in rule["annotations"].items()}}

    full = {"rank": "0", "local_rank": "0", "hw_id": "GPU-a"}
    document = {"rule_files": ["alerts.yaml", "rules.yaml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": by_name["GPUUnderutilized"].name, "exp_alerts": []},  # patience
            {"eval_time": "15m", "alertname": by_name["GPUUnderutilized"].name,
             "exp_alerts": [expected("GPUUnderutilized", 0, 0.05, **full)]},
            {"eval_time": "15m", "alertname": by_name["GPUMemoryNearCapacity"].name, "exp_alerts": []},
            {"eval_time": "15m", "alertname": by_name["GPUTelemetryAbsent"].name,
             "exp_alerts": [expected("GPUTelemetryAbsent", 2, 1)]},
        ],
        "promql_expr_test": [{"expr": "otelprof:hw_gpu_memory_utilization_ratio:dcgm", "eval_time": "5m",
                              "exp_samples": [
            {"labels": f'otelprof:hw_gpu_memory_utilization_ratio:dcgm{{job_name="llm", rank="{r}", '
                       f'local_rank="{r}", node="n1", gpu="{r}", hw_id="{ranks[r][0]}"}}', "value": 0.5}
            for r in (0, 1)]}],
    }]}
    (tmp_path / "dcgm_test.yaml").write_text(yaml.safe_dump(document))
    result = sp.run([binary, "test", "rules", "dcgm_test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
