"""otelprof report --prometheus: a real Prometheus scrapes a real instrumented process; the report's
main sections come back from PromQL and agree with what the process did.

The process runs 40 train steps: an 11 ms ``dataloader`` region, then a ``forward`` region of 15 ms
(even steps) or 115 ms (odd steps); the last step stalls, 301 ms in its data loader and 201 ms in its
forward pass. Sleeps only overrun, and on a shared machine an overrun of tens of milliseconds happens,
so every expectation sits far from a bucket's upper edge (duration buckets ... 10, 25, 50 ... 100,
150, 200, 300, 500, 750 ms): the fastest step (26 ms and a little, the best of 20) is in the bucket
(25 ms, 50 ms]; the slowest, the stalled one (502 ms), in (500 ms, 750 ms]; the longest forward region
in (200 ms, 300 ms]; the longest data-loader wait in (300 ms, 500 ms]. The live outlier detector
(mean + 3 sigma of the recent steps, from the 20th step on) sees steps of 26 and 126 ms, a threshold
about 225 ms, and flags exactly the stalled step. Two operator-profiling windows are counted as the
PyTorch integration counts them.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

import otelprof
from otelprof import semconv as sc
from otelprof.analysis.prometheus import PrometheusError, extreme_buckets, parse_time, report_from_prometheus
from otelprof.analysis.report import ORIGIN_PROMETHEUS
from otelprof.analysis.stats import Bucket
from otelprof.report.html import SECTIONS, render
from tests.servers import prometheus

STEPS = 40
LOADER, FAST, SLOW = 0.011, 0.015, 0.115
"""Seconds: the data-loader region, the forward region of even and odd steps..."""
LOADER_STALL, FORWARD_STALL = 0.301, 0.201
"""...and of the last step."""
PROFILE_WINDOWS = 2


def _loader(i: int) -> float:
    return LOADER_STALL if i == STEPS - 1 else LOADER


def _forward(i: int) -> float:
    return FORWARD_STALL if i == STEPS - 1 else FAST if i % 2 == 0 else SLOW


def test_report_from_a_live_prometheus(tmp_path: Path) -> None:
    session = otelprof.init(job_name="promreport", record_dir=str(tmp_path / "runs"),
                            metrics_exporters=("prometheus",), prometheus_port=0)
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    host, port = session.metrics_address
    with prometheus(tmp_path, [f"{host}:{port}"]) as prom:
        for i in range(STEPS):
            with otelprof.step():
                with otelprof.annotate(sc.REGION_DATALOADER):
                    time.sleep(_loader(i))
                with otelprof.annotate(sc.REGION_FORWARD):
                    time.sleep(_forward(i))
                otelprof.record("samples", 16)
            if i in (10, 30):  # an operator-profiling window ended: counted as otelprof.torch.profile_window does
                with session.registry.lock:
                    session.registry.counter(sc.PROFILE_WINDOWS).add(1)
        prom.wait_for(f'{sc.STEPS.prometheus_name}_total{{job_name="promreport"}} == {STEPS}')
        prom.wait_for(f'{sc.NODE_CPU_UTILIZATION.prometheus_name}_count{{job_name="promreport"}} > 2')
        report = report_from_prometheus(prom.url, "promreport")
        summary = report.summary
        assert summary.job == "promreport" and summary.steps_per_phase == (("train", STEPS),)
        assert summary.nodes and summary.training_start is not None and summary.start is not None
        assert summary.start <= summary.training_start <= time.time()
        [row] = report.steps.rows
        assert (row.rank, row.phase, row.durations.count) == (0, "train", STEPS)
        mean = sum(_loader(i) + _forward(i) for i in range(STEPS)) / STEPS  # exact: the sum over the count
        assert mean <= row.durations.mean <= mean + 0.03
        assert 0.025 <= row.durations.p50 <= 0.15  # bucket resolution: the 20th of 40 steps ends (25, 50 ms]
        assert row.samples_per_step == 16 and row.samples_per_second == pytest.approx(16 / row.durations.mean)
        regions = {r.name: r for r in report.framework.regions}
        assert regions[sc.REGION_FORWARD].count == STEPS
        assert regions[sc.REGION_FORWARD].total == pytest.approx(sum(map(_forward, range(STEPS))), rel=0.3)
        cpu = report.system.row(summary.nodes[0], "CPU")
        assert cpu is not None and 0.0 <= cpu.p50 <= 1.0 and cpu.datapoints >= 2
        [loader] = report.dataloader.phases
        assert loader.steps == STEPS and 0.01 <= loader.wait.p50 <= 0.025
        assert report.rules.error is not None  # this Prometheus has no otelprof rules loaded

        # what only buckets and counters can say, said at their resolution
        assert report.origin == ORIGIN_PROMETHEUS
        assert row.min_bucket == Bucket(0.025, 0.05)  # fastest step: 11 + 15 ms and a little
        assert row.max_bucket == Bucket(0.5, 0.75)  # slowest: the stalled step, 301 + 201 ms
        assert math.isnan(row.durations.min) and math.isnan(row.durations.max)  # no invented precision
        assert row.outliers == 1 and row.outlier_steps == ()  # counted live; the numbers are in spans
        assert regions[sc.REGION_FORWARD].max_bucket == Bucket(0.2, 0.3)
        assert regions[sc.REGION_DATALOADER].max_bucket == Bucket(0.3, 0.5)
        assert loader.max_bucket == Bucket(0.3, 0.5) and math.isnan(loader.wait.max)
        assert report.framework.window_counts == ((0, PROFILE_WINDOWS),) and report.framework.windows == ()

        html = render(report)
        for anchor, _ in SECTIONS:
            assert f'<section id="{anchor}">' in html
        steps_html = _section(html, "steps")
        assert "<td>&gt; 25 ms, ≤ 50 ms</td>" in steps_html and "<td>&gt; 500 ms, ≤ 750 ms</td>" in steps_html
        assert "<td>1</td><td>rolling, per process</td>" in steps_html  # outliers, and why no one threshold
        assert f"{sc.SPAN_STEP} spans with {sc.ATTR_STEP_OUTLIER} = true (Tempo)" in steps_html
        assert "nan" not in steps_html and "without outliers" not in steps_html
        framework_html = _section(html, "framework")
        assert f"{PROFILE_WINDOWS} operator-profiling window(s) completed in the range (rank 0: 2)" \
            in framework_html
        assert "otelprof report RUN_DIR" in framework_html and "No operator-profiling window" not in framework_html
        assert "<td>&gt; 300 ms, ≤ 500 ms</td>" in _section(html, "dataloader")
        assert "<td>&gt; 200 ms, ≤ 300 ms</td>" in framework_html  # the longest forward region
        assert "<td></td>" not in html and '<td class="l"></td>' not in html  # no blank cell anywhere
        result = subprocess.run([sys.executable, "-m", "otelprof", "report", "--prometheus", prom.url, "--job",
                                 "promreport", "--from", "now-10m", "-o", str(tmp_path / "live.json")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        with pytest.raises(PrometheusError, match="no otelprof series of job"):
            report_from_prometheus(prom.url, "no-such-job")
    otelprof.shutdown()


def _section(html: str, anchor: str) -> str:
    start = html.index(f'<section id="{anchor}">')
    return html[start:html.index("</section>", start)]


def test_extreme_buckets_from_cumulative_counts() -> None:
    inf = math.inf
    # 3 observations in (0.01, 0.025], 1 in (0.2, 0.3], none above
    buckets = [(0.01, 0.0), (0.025, 3.0), (0.2, 3.0), (0.3, 4.0), (inf, 4.0)]
    assert extreme_buckets(buckets) == (Bucket(0.01, 0.025), Bucket(0.2, 0.3))
    assert extreme_buckets([(0.1, 2.0), (inf, 5.0)]) == (Bucket(0.0, 0.1), Bucket(0.1, inf))
    assert extreme_buckets([(0.1, 0.0), (inf, 0.0)]) == (None, None) and extreme_buckets([]) == (None, None)


def test_time_arguments() -> None:
    assert parse_time("1700000000") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20") == 1700000000.0
    assert abs(parse_time("now-1h") - (time.time() - 3600)) < 5  # type: ignore[operator]
    assert parse_time(None) is None
    with pytest.raises(ValueError):
        parse_time("yesterday")
