"""otelprof report --prometheus: a real Prometheus scrapes a real instrumented process; the report's
main sections come back from PromQL and agree with what the process did."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import otelprof
from otelprof import semconv as sc
from otelprof.analysis.prometheus import PrometheusError, parse_time, report_from_prometheus
from otelprof.report.html import SECTIONS, render
from tests.servers import prometheus

STEPS = 40


def test_report_from_a_live_prometheus(tmp_path: Path) -> None:
    session = otelprof.init(job_name="promreport", record_dir=str(tmp_path / "runs"),
                            metrics_exporters=("prometheus",), prometheus_port=0)
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    host, port = session.metrics_address
    with prometheus(tmp_path, [f"{host}:{port}"]) as prom:
        for i in range(STEPS):
            with otelprof.step():
                with otelprof.annotate(sc.REGION_DATALOADER):
                    time.sleep(0.01)
                with otelprof.annotate(sc.REGION_FORWARD):
                    time.sleep(0.02 if i != STEPS - 1 else 0.2)
                otelprof.record("samples", 16)
        prom.wait_for(f'{sc.STEPS.prometheus_name}_total{{job_name="promreport"}} == {STEPS}')
        prom.wait_for(f'{sc.NODE_CPU_UTILIZATION.prometheus_name}_count{{job_name="promreport"}} > 2')
        report = report_from_prometheus(prom.url, "promreport")
        summary = report.summary
        assert summary.job == "promreport" and summary.steps_per_phase == (("train", STEPS),)
        assert summary.nodes and summary.training_start is not None and summary.start is not None
        assert summary.start <= summary.training_start <= time.time()
        [row] = report.steps.rows
        assert (row.rank, row.phase, row.durations.count) == (0, "train", STEPS)
        assert 0.03 <= row.durations.mean <= 0.2
        assert 0.025 <= row.durations.p50 <= 0.1  # bucket resolution around 30 ms
        assert row.samples_per_step == 16 and row.samples_per_second == pytest.approx(16 / row.durations.mean)
        regions = {r.name: r for r in report.framework.regions}
        assert regions[sc.REGION_FORWARD].count == STEPS
        assert regions[sc.REGION_FORWARD].total == pytest.approx(0.02 * (STEPS - 1) + 0.2, rel=0.3)
        cpu = report.system.row(summary.nodes[0], "CPU")
        assert cpu is not None and 0.0 <= cpu.p50 <= 1.0 and cpu.datapoints >= 2
        [loader] = report.dataloader.phases
        assert loader.steps == STEPS and 0.009 <= loader.wait.p50 <= 0.025
        assert report.rules.error is not None  # this Prometheus has no otelprof rules loaded
        html = render(report)
        for anchor, _ in SECTIONS:
            assert f'<section id="{anchor}">' in html
        result = subprocess.run([sys.executable, "-m", "otelprof", "report", "--prometheus", prom.url, "--job",
                                 "promreport", "--from", "now-10m", "-o", str(tmp_path / "live.json")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        with pytest.raises(PrometheusError, match="no otelprof series of job"):
            report_from_prometheus(prom.url, "no-such-job")
    otelprof.shutdown()


def test_time_arguments() -> None:
    assert parse_time("1700000000") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20") == 1700000000.0
    assert abs(parse_time("now-1h") - (time.time() - 3600)) < 5  # type: ignore[operator]
    assert parse_time(None) is None
    with pytest.raises(ValueError):
        parse_time("yesterday")
