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

from otelprof import dcgm_series as ds
from otelprof import semconv as sc
from otelprof.dashboards import ids
from otelprof.dashboards.generate import render_all as render_dashboards
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.generate import render_alerts, render_rules
from otelprof.mixin.ruletests import group_eval_order
from tests.fake_nvml import FIXTURES, FakeNvml
from tests.servers import Prometheus, free_port, require_binary
from tests.test_dashboards_prometheus import JOB as DASHBOARD_JOB
from tests.test_dashboards_prometheus import substitute

ROOT = Path(__file__).resolve().parent.parent
EXPOSITION = FIXTURES / "dcgm_exporter_a100x3.prom"
SERVE = r"""
import functools, sys
import otelprof, otelprof.runtime.session
from otelprof.runtime.collectors.sampler import Sampler
from tests.fake_nvml import FakeNvml
otelprof.runtime.session.Sampler = functools.partial(Sampler, nvml_factory=FakeNvml)
session = otelprof.init()
host, port = session.metrics_address
print(f"{host}:{port}", flush=True)
sys.stdin.read()
otelprof.shutdown()
"""
JOB = "llm"
CONFIG = MixinConfig(gpu_source="dcgm", window="10s", patience="0s", low_gpu_for="0s",
                     gpu_memory_capacity_window="10s", batch_size_for="0s", recording_interval="")


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
        series.append(_dcgm(ds.DCGM_GPU_UTIL, uuid, host_gpu, pod, const(util, n)))
        series.append(_dcgm(ds.DCGM_FB_USED, uuid, host_gpu, pod, const(20000, n)))
        series.append(_dcgm(ds.DCGM_FB_FREE, uuid, host_gpu, pod, const(20000, n)))

    def expected(short: str, index: int, value: float, **extra: str) -> dict[str, Any]:
        alert = by_name[short]
        rule = alert.rule(PROMTOOL_CONFIG)
        labels = {"job_name": "llm", "node": "n1", "gpu": str(index % 2), **extra}
        return {"exp_labels": {**labels, **rule["labels"]},
                "exp_annotations": {k: render(v, labels, value) for k, v in rule["annotations"].items()}}

    full = {"rank": "0", "local_rank": "0", "hw_id": "GPU-a"}
    document = {"rule_files": ["alerts.yaml", "rules.yaml"], "evaluation_interval": "15s",
                "group_eval_order": group_eval_order(PROMTOOL_CONFIG), "tests": [{
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


# ------------------------------------------------------------------ MIG instances and the deeper default counters

MIG_EXPOSITION = FIXTURES / "dcgm_exporter_mig.prom"
SERVE_MIG = SERVE.replace("nvml_factory=FakeNvml", 'nvml_factory=functools.partial(FakeNvml, "nvml_mig.json")')
MIG_A100, MIG_H100, WHOLE_H100 = ("MIG-b7e2f4a1-6c3d-5e8f-9a0b-1c2d3e4f5a6b",
                                  "MIG-9e8d7c6b-5a49-5382-8170-f6e5d4c3b2a1",
                                  "GPU-7d2c4e6f-8a1b-4c3d-9e5f-6a7b8c9d0e1f")
UNKNOWN_MIG = "MIG-11111111-2222-5333-8444-555555555555"


def test_dcgm_mode_maps_mig_instances_the_default_counters_and_the_otlp_path(tmp_path: Path) -> None:
    """Four single-GPU pods on one node (tests/fixtures/dcgm_exporter_mig.prom, dcgm-exporter's MIG label set):
    rank 0 runs on an A100 MIG instance (3g.20gb, GPU instance 2; another pod has the 1g.5gb one), rank 1 on an
    H100 MIG instance, rank 2 was given a MIG instance NVML does not list, rank 3 on a whole H100 and its target
    carries no pod labels (as when the ranks push OTLP through a collector: the pod comes from otelprof_gpu_info's
    k8s_pod_name). dcgm-exporter reports no DCGM_FI_DEV_GPU_UTIL for a MIG instance: utilization is its graphics
    engine activity."""
    binary = require_binary("prometheus")
    (tmp_path / "alerts.yaml").write_text(render_alerts(CONFIG))
    (tmp_path / "rules.yaml").write_text(render_rules(CONFIG))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                                                      "CUDA_VISIBLE", "NVIDIA_VISIBLE"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    given = {0: MIG_A100, 1: MIG_H100, 2: UNKNOWN_MIG, 3: WHOLE_H100}
    processes = []
    prom_process = None
    with _serve(MIG_EXPOSITION.read_bytes()) as dcgm_address:
        try:
            for rank, device in given.items():
                pod = {"OTELPROF_POD_NAME": "trainer-3", "OTELPROF_POD_NAMESPACE": "ml"} if rank == 3 else {}
                processes.append(subprocess.Popen(
                    [sys.executable, "-c", SERVE_MIG], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True,
                    env={**env, **pod, "OTELPROF_JOB_NAME": JOB, "OTEL_METRICS_EXPORTER": "prometheus",
                         "OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_PROMETHEUS_PORT": str(free_port()),
                         "OTELPROF_GPU_SAMPLING": "false", "RANK": str(rank), "LOCAL_RANK": "0",
                         "WORLD_SIZE": "4", "NVIDIA_VISIBLE_DEVICES": device,
                         "OTELPROF_RECORD_DIR": str(tmp_path / f"runs{rank}")}))
            targets = [p.stdout.readline().strip() for p in processes]  # type: ignore[union-attr]
            assert all(targets), targets
            static = [{"targets": [targets[rank]], "labels": {"namespace": "ml", "pod": f"trainer-{rank}"}}
                      for rank in (0, 1, 2)]
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp_path / "alerts.yaml"), str(tmp_path / "rules.yaml")],
                "scrape_configs": [
                    {"job_name": "otelprof", "static_configs": [*static, {"targets": [targets[3]]}]},
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
            _check_mig(prom)
        finally:
            errors = [p.communicate("", timeout=30)[1] for p in processes]
            if prom_process is not None:
                prom_process.terminate()
                prom_process.wait(10)
    assert all(p.returncode == 0 for p in processes)
    assert errors[:2] == ["", ""] and errors[3] == ""  # the mapped ranks said nothing
    assert "cannot tell which it computes on (not_found)" in errors[2] and errors[2].count("\n") == 1


def _ranks(prom: Prometheus, promql: str, ranks: set[str]) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        result = _by_rank(prom.query(promql))
        if set(result) >= ranks or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def _values_by_rank(prom: Prometheus, promql: str, ranks: set[str]) -> dict[str, float]:
    return {r: float(s["value"][1]) for r, s in _ranks(prom, promql, ranks).items()}


def _check_mig(prom: Prometheus) -> None:
    mapped = {"0", "1", "3"}
    info = _ranks(prom, sc.GPU_INFO.prometheus_name, mapped)
    # gpu: a MIG instance's CUDA index; a whole GPU's NVML index (the fake NVML lists the whole H100 third)
    assert {r: (s["metric"]["gpu"], s["metric"]["hw_id"], s["metric"].get("gpu_instance", ""),
                s["metric"].get("gpu_profile", "")) for r, s in info.items()} == {
        "0": ("0", MIG_A100, "2", "3g.20gb"), "1": ("0", MIG_H100, "13", "1g.10gb"), "3": ("2", WHOLE_H100, "", "")}
    assert info["3"]["metric"]["k8s_pod_name"] == "trainer-3" and "pod" not in info["3"]["metric"]
    unmapped = _ranks(prom, sc.GPU_UNMAPPED.prometheus_name, {"2"})
    assert unmapped["2"]["metric"]["reason"] == "not_found"

    util = _ranks(prom, "otelprof:hw_gpu_utilization_ratio:dcgm", mapped)
    assert {r: (s["metric"]["hw_id"], float(s["value"][1])) for r, s in util.items()} == {
        "0": (MIG_A100, 0.04), "1": (MIG_H100, 0.91), "3": (WHOLE_H100, 0.88)}  # the notebook's instance: no rank
    used = _values_by_rank(prom, "otelprof:hw_gpu_memory_usage_bytes:dcgm", mapped)
    assert used == {"0": 19000 * 2**20, "1": 6000 * 2**20, "3": 61440 * 2**20}
    assert _values_by_rank(prom, "otelprof:otelprof_gpu_sm_active_ratio:dcgm", mapped) == {
        "0": 0.03, "1": 0.85, "3": 0.83}
    assert _values_by_rank(prom, "otelprof:otelprof_gpu_sm_occupancy_ratio:dcgm", mapped) == {
        "0": 0.01, "1": 0.47, "3": 0.41}
    assert _values_by_rank(prom, "otelprof:otelprof_gpu_tensor_active_ratio:dcgm", mapped) == {
        "0": 0.0, "1": 0.52, "3": 0.37}
    # the whole GPU's device-level counters; a MIG instance's GPU-wide fields (power, energy) name no instance
    pcie = _ranks(prom, f"otelprof:{sc.GPU_PCIE_THROUGHPUT.prometheus_name}:dcgm", {"3"})
    assert {s["metric"]["network_io_direction"]: float(s["value"][1]) for s in prom.query(
        f"otelprof:{sc.GPU_PCIE_THROUGHPUT.prometheus_name}:dcgm")} == {"receive": 2.1e9, "transmit": 4.1e8}
    assert set(pcie) == {"3"}
    energy = _ranks(prom, f"otelprof:{sc.GPU_ENERGY.prometheus_name}:dcgm", {"3"})
    assert {r: (float(s["value"][1]), s["metric"]["hw_type"]) for r, s in energy.items()} == {
        "3": (9182736.5, "gpu")}
    assert _values_by_rank(prom, f"otelprof:{sc.GPU_XID.prometheus_name}:dcgm", {"3"}) == {"3": 0.0}
    rows = prom.query(f"otelprof:{sc.GPU_REMAPPED_ROWS.prometheus_name}:dcgm")
    assert {(s["metric"]["rank"], s["metric"]["error_type"]): float(s["value"][1]) for s in rows} == {
        ("3", "correctable"): 2.0, ("3", "uncorrectable"): 0.0}

    def firing(name: str) -> list[dict[str, Any]]:
        return prom.query(f'ALERTS{{alertname="Otelprof{name}", alertstate="firing"}}')

    def absent() -> list[dict[str, Any]]:  # pending or firing: its `for` (1 min) outlasts the test
        return prom.query('ALERTS{alertname="OtelprofGPUTelemetryAbsent"}')

    def settled() -> bool:  # a loaded machine scrapes a rank's info before its join's records: pending a while
        return bool(firing("GPUUnderutilized")) and [a["metric"]["gpu"] for a in absent()] == ["unmapped"]

    deadline = time.monotonic() + 90  # a guard against a hang: the loop ends as soon as the alerts settle
    while time.monotonic() < deadline and not settled():
        time.sleep(1)
    # rank 0's idle MIG instance is judged like a GPU; rank 2's unmapped GPU is visible; every mapped GPU joined
    assert {a["metric"]["rank"] for a in firing("GPUUnderutilized")} == {"0"}
    assert [(a["metric"]["job_name"], a["metric"]["gpu"]) for a in absent()] == [(JOB, "unmapped")]

    # the GPU dashboard's SM-activity and PCIe panels read the records in dcgm mode
    board = json.loads(render_dashboards(CONFIG)[f"{ids.GPU_SYSTEM}.json"])
    exprs = [t["expr"] for row in board["panels"] for p in [row, *row.get("panels", [])] for t in p.get("targets", [])]
    for record in (f"otelprof:{sc.GPU_SM_ACTIVE.prometheus_name}:dcgm",
                   f"otelprof:{sc.GPU_PCIE_THROUGHPUT.prometheus_name}:dcgm"):
        expr = next(e for e in exprs if record in e)
        result = prom.query(substitute(expr, 60).replace(f'"{DASHBOARD_JOB}"', f'"{JOB}"'))
        assert "3" in {s["metric"].get("rank", "3") for s in result} and result, (record, expr)


def test_promtool_cases_of_the_dcgm_mode_alerts_on_mig_instances(tmp_path: Path) -> None:
    """Two ranks on MIG instances of one GPU (dcgm's UUID is the GPU's; GPU_I_ID tells the instances apart; no
    DCGM_FI_DEV_GPU_UTIL): rank 0's instance idles (GPUUnderutilized fires), rank 1's is busy (quiet), and neither
    is reported absent; rank 2 exports otelprof_gpu_unmapped: GPUTelemetryAbsent fires with gpu="unmapped"."""
    from otelprof.mixin.alerts import alerts
    from tests.rules.cases import const, render

    binary = require_binary("promtool")
    (tmp_path / "alerts.yaml").write_text(render_alerts(PROMTOOL_CONFIG))
    (tmp_path / "rules.yaml").write_text(render_rules(PROMTOOL_CONFIG))
    by_name = {a.short: a for a in alerts(PROMTOOL_CONFIG)}
    n = 80
    series = []
    instances = {0: ("MIG-a", "3", "3g.20gb", 0.05), 1: ("MIG-b", "4", "3g.20gb", 0.9)}
    for rank in range(3):
        ident = {"job_name": "llm", "rank": str(rank), "local_rank": "0", "node": "n1", "namespace": "ml",
                 "pod": f"trainer-{rank}", "job": "otelprof", "instance": f"10.0.0.1:{rank}"}
        labels = ", ".join(f'{k}="{v}"' for k, v in ident.items())
        series.append({"series": f"{sc.PROCESS_START_TIME.prometheus_name}{{{labels}}}", "values": const(0, n)})
        if rank == 2:
            series.append({"series": f'{sc.GPU_UNMAPPED.prometheus_name}{{{labels}, reason="not_found"}}',
                           "values": const(1, n)})
            continue
        uuid, instance, profile, active = instances[rank]
        series.append({"series": f'{sc.GPU_INFO.prometheus_name}{{{labels}, gpu="0", hw_id="{uuid}", '
                                 f'hw_parent="GPU-p", gpu_instance="{instance}", gpu_profile="{profile}"}}',
                       "values": const(1, n)})
        for name, value in ((ds.DCGM_GR_ENGINE_ACTIVE, active), (ds.DCGM_FB_USED, 10000), (ds.DCGM_FB_FREE, 9968)):
            dcgm = _dcgm(name, "GPU-p", "1", f"trainer-{rank}", const(value, n))
            dcgm["series"] = dcgm["series"][:-1] + f', GPU_I_PROFILE="{profile}", GPU_I_ID="{instance}"}}'
            series.append(dcgm)

    def expected(short: str, value: float, **labels: str) -> dict[str, Any]:
        rule = by_name[short].rule(PROMTOOL_CONFIG)
        labels = {"job_name": "llm", "node": "n1", **labels}
        return {"exp_labels": {**labels, **rule["labels"]},
                "exp_annotations": {k: render(v, labels, value) for k, v in rule["annotations"].items()}}

    rank0 = {"rank": "0", "local_rank": "0", "gpu": "0", "hw_id": "MIG-a"}
    document = {"rule_files": ["alerts.yaml", "rules.yaml"], "evaluation_interval": "15s",
                "group_eval_order": group_eval_order(PROMTOOL_CONFIG), "tests": [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [
            {"eval_time": "15m", "alertname": by_name["GPUUnderutilized"].name,
             "exp_alerts": [expected("GPUUnderutilized", 0.05, **rank0)]},
            {"eval_time": "15m", "alertname": by_name["GPUTelemetryAbsent"].name,
             "exp_alerts": [expected("GPUTelemetryAbsent", 1, gpu="unmapped")]},
        ],
        "promql_expr_test": [{"expr": "otelprof:hw_gpu_utilization_ratio:dcgm", "eval_time": "5m", "exp_samples": [
            {"labels": f'otelprof:hw_gpu_utilization_ratio:dcgm{{job_name="llm", rank="{r}", local_rank="0", '
                       f'node="n1", gpu="0", hw_id="{instances[r][0]}"}}', "value": instances[r][3]}
            for r in (0, 1)]}],
    }]}
    (tmp_path / "mig_test.yaml").write_text(yaml.safe_dump(document))
    result = subprocess.run([binary, "test", "rules", "mig_test.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
