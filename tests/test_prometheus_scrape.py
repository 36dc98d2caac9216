"""A real Prometheus scrapes a real instrumented process and stores the catalog's series."""

from __future__ import annotations

import time
from pathlib import Path

import otelprof
from otelprof import semconv as sc
from tests.servers import prometheus


def test_real_prometheus_scrapes_step_series(tmp_path: Path) -> None:
    session = otelprof.init(job_name="scraped", record_dir=str(tmp_path / "runs"),
                            metrics_exporters=("prometheus",), prometheus_port=0)
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    host, port = session.metrics_address
    for i in range(20):
        with otelprof.step():
            with otelprof.annotate("forward"):
                time.sleep(0.002)
            otelprof.record("samples", 8)
            otelprof.record("loss", 1.0 / (i + 1))
    with prometheus(tmp_path, [f"{host}:{port}"]) as prom:
        steps = prom.wait_for(f'{sc.STEPS.prometheus_name}_total{{job_name="scraped"}}')
        assert steps[0]["value"][1] == "20"
        labels = steps[0]["metric"]
        assert labels["phase"] == "train" and labels["rank"] == "0" and labels["job"] == "training"
        p50 = prom.wait_for(
            f"histogram_quantile(0.5, sum by (le) ({sc.STEP_DURATION.prometheus_name}_bucket))")
        assert 0.001 < float(p50[0]["value"][1]) < 0.1
        info = prom.wait_for('target_info{service_name="scraped"}')
        assert info[0]["metric"]["otelprof_run_id"] == session.config.run_id
        # every catalog family that has data was ingested without a parse error
        up = prom.wait_for('up{job="training"}')
        assert up[0]["value"][1] == "1"
