"""otelprof report --prometheus: a real Prometheus scrapes a real instrumented process; the report's
main sections come back from PromQL and agree with what the process did.

The process runs 40 train steps: an 11 ms ``dataloader`` region (but every fourth step, 3, 7 ... 35,
gets its batch at once: no region, 31 steps wait), then a ``forward`` region of 15 ms (even steps) or
115 ms (odd steps); the last step stalls, 301 ms in its data loader and 201 ms in its forward pass.
Sleeps only overrun, and on a shared machine an overrun of tens of milliseconds happens, so every
expectation sits far from a bucket's upper edge (duration buckets ... 10, 25, 50 ... 100, 150, 200,
300, 500, 750 ms): the fastest step (26 ms and a little, the best of 20) is in the bucket (25 ms,
50 ms]; the slowest, the stalled one (502 ms), in (500 ms, 750 ms]; the longest forward region in
(200 ms, 300 ms]; the longest data-loader wait in (300 ms, 500 ms]. The live outlier detector (mean +
3 sigma of the recent steps, from the 20th step on) sees steps of 26, 115 and 126 ms, a threshold
about 225 ms, and flags exactly the stalled step. Two operator-profiling windows are counted as the
PyTorch integration counts them.

The node sampler reads two fake GPUs that hold still: utilization 62 % and 82 %, memory 33 % and 97 %
of the device; utilization buckets are 5 % wide (ratio buckets 0.05 ... 1.0), so every sample of a GPU
lands in one known bucket, and the pooled node rows span the two. CPU and host memory are whatever
this machine does: they are checked for their form (bucket or exact value, source, count), not value.
"""

from __future__ import annotations

import functools
import math
import platform
import subprocess
import sys
import time
from html import escape
from pathlib import Path

import psutil
import pytest

import otelprof
import otelprof.runtime.session
from otelprof import semconv as sc
from otelprof.analysis import environment as envmod
from otelprof.analysis import framework as fw
from otelprof.analysis import progress as prog
from otelprof.analysis import system as sysmod
from otelprof.analysis.prometheus import PrometheusError, extreme_buckets, parse_time, report_from_prometheus
from otelprof.analysis.report import ORIGIN_PROMETHEUS, Report
from otelprof.analysis.stats import Bucket
from otelprof.mixin import MixinConfig
from otelprof.mixin.config import with_overrides
from otelprof.mixin.generate import render_rules
from otelprof.report.formatting import bounds, pct, secs
from otelprof.report.html import SECTIONS, render
from otelprof.runtime.collectors.sampler import Sampler
from tests.fake_nvml import FakeNvml
from tests.servers import prometheus

STEPS = 40
LOADER, FAST, SLOW = 0.011, 0.015, 0.115
"""Seconds: the data-loader region, the forward region of even and odd steps..."""
LOADER_STALL, FORWARD_STALL = 0.301, 0.201
"""...and of the last step."""
PROFILE_WINDOWS = 2
NO_WAIT = frozenset(range(3, STEPS - 1, 4))
"""Steps that get their batch at once: no dataloader region."""
GPU_UTILIZATION, GPU_MEMORY = (0.62, 0.82), (0.33, 0.97)
"""The fake GPUs 0 and 1, every sample."""
SCRAPES = 5
ALERT_RULES = Path(__file__).parent.parent / "deploy" / "prometheus" / "otelprof-alerts.yaml"
RECORDING_RULES = render_rules(with_overrides(MixinConfig(), ["recording_interval="]))
"""The committed recording rules, every group at the test's evaluation interval: several alerts read them (the GPU
percentiles, the straggler's compute time, ...)."""
"""Scrapes of the node's gauges to wait for: enough for quantiles over scrapes and the sample counter's slope."""


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _loader(i: int) -> float:
    return LOADER_STALL if i == STEPS - 1 else 0.0 if i in NO_WAIT else LOADER


def _fake_gpus() -> FakeNvml:
    fake = FakeNvml()
    tick = fake.data["ticks"][0]
    for index, (utilization, memory) in enumerate(zip(GPU_UTILIZATION, GPU_MEMORY)):
        gpu = tick[str(index)]
        gpu.update(utilization=utilization, memory_used=int(memory * gpu["memory_total"]))
    fake.data["ticks"] = [tick]
    return fake


def _forward(i: int) -> float:
    return FORWARD_STALL if i == STEPS - 1 else FAST if i % 2 == 0 else SLOW


def _loss(i: int) -> float:
    return 2.0 - 0.03125 * i  # exact in binary: the curve's values compare equal


def _learning_rate(i: int) -> float:
    return 0.5 ** (i // 10)


EVAL_LOSS = 1.75
"""Recorded once, outside any step, in the eval phase after step 19 (as the Hugging Face callback does)."""


def test_report_from_a_live_prometheus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_gpus()
    monkeypatch.setattr(otelprof.runtime.session, "Sampler", functools.partial(Sampler, nvml_factory=lambda: fake))
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    session = otelprof.init(job_name="promreport", record_dir=str(tmp_path / "runs"),
                            metrics_exporters=("prometheus",), prometheus_port=0,
                            profile_every=0)  # the windows the test arms, not also a periodic one of a slow run
    assert isinstance(session, otelprof.Session) and session.metrics_address is not None
    host, port = session.metrics_address
    recording = _written(tmp_path / "rules.yaml", RECORDING_RULES)
    with prometheus(tmp_path, [f"{host}:{port}"], rule_files=[ALERT_RULES, recording]) as prom:
        # scraped before the loop starts, so that the steps span several scrapes (the curves' resolution)
        prom.wait_for(f'{sc.PROCESS_START_TIME.prometheus_name}{{job_name="promreport"}}')
        for i in range(STEPS):
            with otelprof.step():
                if _loader(i):
                    with otelprof.annotate(sc.REGION_DATALOADER):
                        time.sleep(_loader(i))
                with otelprof.annotate(sc.REGION_FORWARD):
                    time.sleep(_forward(i))
                otelprof.record("samples", 16)
                otelprof.record("loss", _loss(i))
                otelprof.record("learning_rate", _learning_rate(i))
            if i == 19:
                with otelprof.phase("eval"):
                    otelprof.record("loss", EVAL_LOSS)
            if i in (10, 30):  # an operator-profiling window ended: counted as otelprof.torch.profile_window does
                with session.registry.lock:
                    session.registry.counter(sc.PROFILE_WINDOWS).add(1)
        prom.wait_for(f'{sc.STEPS.prometheus_name}_total{{job_name="promreport"}} == {STEPS}')
        prom.wait_for(f'{sc.NODE_CPU_UTILIZATION.prometheus_name}_count{{job_name="promreport"}} > 2')
        prom.wait_for(f'count_over_time({sc.SYSTEM_MEMORY_UTILIZATION.prometheus_name}{{job_name="promreport"}}[1m]) '
                      f'>= {SCRAPES}')
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
        waiting = STEPS - len(NO_WAIT)
        assert (loader.steps, loader.steps_waiting) == (STEPS, waiting)  # all steps; those with a dataloader region
        assert 0.01 <= loader.wait.p50 <= 0.025 and regions[sc.REGION_DATALOADER].count == waiting
        _assert_progress(report)
        _assert_environment(report)
        breakdown = report.framework.breakdown("train")
        assert breakdown is not None and not breakdown.nesting_known and breakdown.steps == STEPS
        assert breakdown.part(sc.REGION_FORWARD) == regions[sc.REGION_FORWARD].total
        assert [x.name for x in breakdown.parts] == [sc.REGION_DATALOADER, sc.REGION_FORWARD, fw.UNCOVERED]
        assert math.fsum(x.seconds for x in breakdown.parts) == pytest.approx(breakdown.step_time, rel=1e-12)
        assert breakdown.step_time == pytest.approx(row.durations.mean * STEPS)
        # the diagnosis from the same figures: the data loader's share of the step time (a cause) ranks before
        # the under-used fake GPU 0 (62 %, a symptom)
        keys = [f.key for f in report.diagnosis.findings]
        assert "input-bound" in keys and "gpu-idle" in keys[keys.index("input-bound") + 1:], keys
        top = report.diagnosis.findings[keys.index("input-bound")]
        assert top.cost == pytest.approx(breakdown.part(sc.REGION_DATALOADER) / breakdown.step_time)
        # alerts: the rules are loaded; an alert whose input series this job lacks judged nothing
        assert report.rules.error is None
        verdicts = {r.alert: r for r in report.rules.rows}
        assert verdicts["OtelprofTooFewDataLoaderWorkers"].status == "no data"  # no DataLoader: no workers gauge
        assert verdicts["OtelprofGPUUnderutilized"].datapoints >= SCRAPES  # the fake GPUs' series
        assert verdicts["OtelprofGPUUnderutilized"].status in ("ok", "fired")

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

        # system: histogram rows at bucket resolution, gauges exact over their scrapes, and the node's facts
        node = summary.nodes[0]
        assert (cpu.source, cpu.max_bucket is not None, cpu.min_bucket is not None) == (sysmod.SOURCE_HISTOGRAM,
                                                                                         True, True)
        assert math.isnan(cpu.max) and math.isnan(cpu.min)  # a bucket edge is no maximum
        assert cpu.min_bucket.high <= cpu.max_bucket.high and cpu.max_bucket.high - cpu.max_bucket.low <= 0.0501
        gpu = report.system.row(node, "GPU")
        gpu_memory = report.system.row(node, "GPU memory")
        assert gpu is not None and gpu_memory is not None and gpu.source == sysmod.SOURCE_HISTOGRAM
        assert (gpu.min_bucket, gpu.max_bucket) == (Bucket(0.6, 0.65), Bucket(0.8, 0.85))  # both GPUs pooled
        assert (gpu_memory.min_bucket, gpu_memory.max_bucket) == (Bucket(0.3, 0.35), Bucket(0.95, 1.0))
        memory = report.system.row(node, "CPU memory")
        assert memory is not None and memory.source == sysmod.SOURCE_SCRAPES
        assert memory.datapoints >= SCRAPES  # the scrapes its exact figures cover (was 0)
        assert 0 < memory.min <= memory.p50 <= memory.max <= 1 and memory.max_bucket is None
        assert summary.start is not None and summary.end is not None
        every = max(math.ceil((summary.end - summary.start) / 1000), 1)  # 1 s unless the range passes 1000 s
        for metric in ("CPU, busiest core", "I/O wait"):
            row = report.system.row(node, metric)
            assert row is not None and row.source == sysmod.SOURCE_EVALUATED and row.resolution == every, metric
            assert 0 <= row.min <= row.max <= 1 and row.datapoints >= SCRAPES - 1, metric  # per-CPU: a sample later
        [usage] = report.system.nodes
        assert (usage.sampled_by_rank, usage.gpus) == (0, ("0", "1"))
        assert usage.cores == len(psutil.cpu_times(percpu=True))  # the per-CPU series, as the sampler reads them
        assert 0.4 <= usage.interval <= 1.0  # OTELPROF_SAMPLE_INTERVAL_MS 500; an overrun skips ticks, never adds
        gpus = {g.gpu: g for g in report.gpus.gpus}
        for index, (utilization, used) in enumerate(zip(GPU_UTILIZATION, GPU_MEMORY)):
            g = gpus[str(index)]
            held = Bucket(round(utilization - 0.02, 2), round(utilization + 0.03, 2))  # 0.62 in (0.6, 0.65]
            assert (g.utilization.min_bucket, g.utilization.max_bucket) == (held, held)
            assert g.utilization.mean == pytest.approx(utilization)  # exact: sum over count
            assert math.isnan(g.utilization.min) and math.isnan(g.utilization.max) and not g.idle
            assert g.memory.mean == pytest.approx(used, abs=1e-6)
            assert g.memory_growth == 0.0 or math.isnan(g.memory_growth)  # constant, or no scrape in a tenth
        assert gpus["1"].memory.max_bucket == Bucket(0.95, 1.0)
        # training processes: rank 0's own gauges as scraped, exact at the scrapes (CPU share varies: bounds only)
        procs = {row.metric: row for row in report.system.process_rows}
        assert sorted(procs) == ["Process CPU", "Process memory (RSS)"]
        rss_now = psutil.Process().memory_info().rss
        for row in procs.values():
            assert (row.subject, row.source, row.resolution) == ("rank 0", sysmod.SOURCE_SCRAPES, None), row.metric
            assert (row.max_bucket, row.min_bucket) == (None, None) and row.datapoints >= SCRAPES, row.metric
            assert 0 <= row.min <= row.p50 <= row.p95 <= row.p99 <= row.max, row.metric
        assert procs["Process CPU"].unit == sysmod.UNIT_RATIO and procs["Process CPU"].max <= 1.5  # share of CPUs
        rss = procs["Process memory (RSS)"]
        assert rss.unit == sysmod.UNIT_BYTES and rss.min >= 10 * 2**20 and rss.max <= 2 * rss_now  # this process
        # rank status: its series are still scraped at the range end (every 1 s here)
        [rank0] = summary.ranks
        assert rank0.status == "running" and "scraped every 1 s" in rank0.status_basis, rank0.status_basis
        # job summary: the otelprof version and run from the processes' target_info
        assert summary.otelprof_version == otelprof.__version__ and summary.schema_version == ""
        assert summary.run_id == session.config.run_id and summary.world_size == 1

        html = render(report)
        for anchor, _ in SECTIONS:
            assert f'<section id="{anchor}">' in html
        assert "Not judged, no data: " in _section(html, "rules") and "OtelprofTooFewDataLoaderWorkers" in \
            _section(html, "rules").split("Not judged, no data: ")[1]
        assert "NVIDIA A100-SXM4-40GB" in _section(html, "environment")
        assert "<svg" in _section(html, "training") and "Step time over the run" in _section(html, "steps")
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
        assert html.index('<section id="diagnosis">') < html.index('<section id="summary">')
        assert f"Waiting for data</b>: {escape(top.cost_text)}" in _section(html, "diagnosis")
        summary_html = _section(html, "summary")
        assert f"<td class=\"l\">otelprof {otelprof.__version__}</td>" in summary_html and "schema" not in summary_html
        system_html = _section(html, "system")
        assert f"<td>{escape(bounds(cpu.max_bucket, pct))}</td>" in system_html
        assert "<td>&gt; 80.0 %, ≤ 85.0 %</td>" in system_html and "<td>&gt; 60.0 %, ≤ 65.0 %</td>" in system_html
        assert f"<td>{memory.datapoints:,}</td><td>gauge, as scraped</td>" in system_html
        assert f"<td>evaluated every {secs(every)}</td>" in system_html
        processes_html = system_html[system_html.index("<h3>Training processes</h3>"):]
        assert '<td class="l">rank 0</td><td class="l">Process CPU</td>' in processes_html
        assert processes_html.count("<td>gauge, as scraped</td>") == 2
        assert (f"samples about every {escape(secs(usage.interval))}, {usage.cores} logical CPUs, 2 GPU(s) (0, 1); "
                "sampled by rank 0.</p>") in system_html
        assert "rank -1" not in system_html and "about every -" not in system_html and " 0 logical" not in system_html
        gpu_html = _section(html, "gpu")
        assert "<td>&gt; 60.0 %, ≤ 65.0 %</td>" in gpu_html and "<td>&gt; 80.0 %, ≤ 85.0 %</td>" in gpu_html
        assert "<td>62.0 %</td>" in gpu_html and "<td>82.0 %</td>" in gpu_html  # the exact means
        assert "peaked at &gt; 95.0 %, ≤ 100.0 %, close to capacity" in _section(html, "gpu-memory")
        assert f"<td>{STEPS}</td><td>{waiting}</td>" in _section(html, "dataloader")
        result = subprocess.run([sys.executable, "-m", "otelprof", "report", "--prometheus", prom.url, "--job",
                                 "promreport", "--from", "now-10m", "-o", str(tmp_path / "live.json")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        with pytest.raises(PrometheusError, match="no otelprof series of job"):
            report_from_prometheus(prom.url, "no-such-job")
        # the process stops serving /metrics: a few scrape intervals later its rank has stopped
        otelprof.shutdown()
        time.sleep(5)
        ended = report_from_prometheus(prom.url, "promreport", end=time.time())
        [rank0] = ended.summary.ranks
        assert rank0.status == "stopped" and "scraped every 1 s" in rank0.status_basis, rank0.status_basis
        # a finished job's report is the job's, whatever the range's end (its series are stale by then)
        for late in (ended, report_from_prometheus(prom.url, "promreport")):
            assert late.summary.steps_per_phase == (("train", STEPS),), late.summary.missing
            assert [(x.phase, x.durations.count) for x in late.steps.rows] == [("train", STEPS)]
            assert mean <= late.steps.rows[0].durations.mean <= mean + 0.03
            assert late.summary.end is not None and late.summary.end <= time.time() - 3


def _assert_progress(report: Report) -> None:
    """The curves at scrape resolution: each point is the gauge's value when the steps counter read x, so the
    loss and learning rate equal what step x - 1 (the x-th step) recorded."""
    g = report.progress
    assert g.main_phase == "train" and sc.SCALAR_TOKENS in g.missing and sc.SCALAR_LOSS not in g.missing
    curves = {(c.name, c.phase): c for c in g.curves}
    loss, lr = curves[(sc.SCALAR_LOSS, "train")], curves[(sc.SCALAR_LEARNING_RATE, "train")]
    for curve, recorded in ((loss, _loss), (lr, _learning_rate)):
        assert curve.rank == 0 and len(set(curve.x)) >= 2 and not curve.per_pass  # the steps span scrapes
        assert list(curve.x) == sorted(curve.x) and curve.x[0] >= 1 and curve.x[-1] == STEPS
        assert list(curve.y) == [recorded(int(x) - 1) for x in curve.x]
    assert loss.last == _loss(STEPS - 1)
    evaluation = curves[(sc.SCALAR_LOSS, "eval")]
    assert evaluation.per_pass and evaluation.y == (EVAL_LOSS,) and 20 <= evaluation.x[0] <= STEPS  # one value
    throughput = curves[(prog.SAMPLES_PER_SECOND, "train")]
    assert throughput.rank is None and all(v > 0 for v in throughput.y)
    [timeline] = g.timelines
    assert (timeline.rank, timeline.phase, timeline.steps, timeline.outlier_count) == (0, "train", STEPS, 1)
    assert timeline.series.t and all(0 < v <= h for v, h in zip(timeline.series.mean, timeline.series.max))


def _assert_environment(report: Report) -> None:
    rows = {row.field: row for row in report.environment.rows}
    assert rows[sc.OTELPROF_GPU_MODEL].value == "NVIDIA A100-SXM4-40GB"
    assert (rows[sc.OTELPROF_GPU_DRIVER].value, rows[sc.OTELPROF_CUDA_DRIVER].value) == ("550.54.15", "12.4")
    assert rows[sc.OTELPROF_GPU_COUNT].value == "2" and rows[envmod.GPUS_SAMPLED].value == "2"
    assert rows[sc.PROCESS_RUNTIME_VERSION].value == f"{sys.implementation.name} {platform.python_version()}"
    assert rows[sc.OTELPROF_VERSION].value == otelprof.__version__ and rows[sc.OTELPROF_VERSION].everywhere


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
