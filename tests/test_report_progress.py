"""The report's training curves, step time over the run, step-time breakdown, environment and folded
no-data checks: each compared with what the loop itself recorded.

The main recording is made through the explicit API by a loop of known values: 30 train steps, step i
records loss 3 / (1 + i) (step 17 a NaN), learning rate 0.1 x 0.9^i, 8 samples and 1,024 tokens, and
holds the regions dataloader, forward (with a nested ``attention`` region), backward and optimizer, and a
``sync`` region nested in the forward pass of odd steps and directly in the step in even ones; an
eval pass of 3 steps after train steps 9 and 19 records the losses 1.0, 2.0, 3.0 and 0.5, 0.5, 0.5;
after step 29 a ``val`` phase records its loss 0.25 outside any step, as the Hugging Face callback
records the evaluation's mean.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import platform
import sys
import time
from pathlib import Path

import pytest

import otelprof
import otelprof.runtime.session
from otelprof import semconv as sc
from otelprof.analysis import environment as envmod
from otelprof.analysis import framework as fw
from otelprof.analysis import progress as prog
from otelprof.analysis.prometheus import _Queries
from otelprof.analysis.prometheus_progress import grid, input_series, progress
from otelprof.analysis.report import build_report, load
from otelprof.analysis.steps import StepAnalysis
from otelprof.mixin.alerts import alerts
from otelprof.mixin.config import MixinConfig
from otelprof.mixin.rules import recording_rules
from otelprof.recording.reader import read_recording
from otelprof.report.html import render
from otelprof.runtime.collectors import environment as detect
from otelprof.runtime.collectors.gpu import GpuCollector
from otelprof.runtime.collectors.nvml import NvmlCallError, cuda_version
from otelprof.runtime.collectors.sampler import Sampler
from tests.fake_nvml import FakeNvml
from tests.test_report_fixtures import T0, manifest, small_run, step_line, write_rank

TRAIN = 30
NAN_STEP = 17
EVAL_AFTER = {9: (1.0, 2.0, 3.0), 19: (0.5, 0.5, 0.5)}
VAL_LOSS = 0.25


def _loss(i: int) -> float:
    return math.nan if i == NAN_STEP else 3.0 / (1 + i)


def _lr(i: int) -> float:
    return 0.1 * 0.9 ** i


def _record_loop(record_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fake = FakeNvml()
    monkeypatch.setattr(otelprof.runtime.session, "Sampler", functools.partial(Sampler, nvml_factory=lambda: fake))
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    session = otelprof.init(job_name="curves", record_dir=str(record_dir), sample_interval=0.1)
    time.sleep(0.35)  # a few node samples, with the fake GPUs
    assert isinstance(session, otelprof.Session) and session.run_dir is not None
    for i in range(TRAIN):
        with otelprof.step():
            with otelprof.annotate(sc.REGION_DATALOADER):
                time.sleep(0.001)
            with otelprof.annotate(sc.REGION_FORWARD):
                with otelprof.annotate("attention"):
                    time.sleep(0.001)
                if i % 2:
                    with otelprof.annotate("sync"):  # nested in odd steps...
                        pass
            with otelprof.annotate(sc.REGION_BACKWARD):
                time.sleep(0.001)
            if i % 2 == 0:
                with otelprof.annotate("sync"):  # ...top-level in even ones
                    pass
            time.sleep(0.001)  # the loop's own code: in no region
            with otelprof.annotate(sc.REGION_OPTIMIZER):
                pass
            otelprof.record("loss", _loss(i))
            otelprof.record("lr", _lr(i))
            otelprof.record("samples", 8)
            otelprof.record("tokens", 1024)
        if i in EVAL_AFTER:
            with otelprof.phase("eval"):
                for loss in EVAL_AFTER[i]:
                    with otelprof.step():
                        with otelprof.annotate(sc.REGION_FORWARD):
                            pass
                        otelprof.record("loss", loss)
    with otelprof.phase("val"):
        otelprof.record("loss", VAL_LOSS)
    otelprof.shutdown()
    return session.run_dir.parent


def test_curves_breakdown_and_environment_equal_what_the_loop_recorded(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    run = _record_loop(tmp_path / "runs", monkeypatch)
    report = build_report(load(run), checks=False)
    [rank] = read_recording(run).ranks  # the recording itself, read independently of the analyses
    train = [s for s in rank.steps if s.phase == "train"]
    assert [s.number for s in train] == list(range(TRAIN))
    g = report.progress
    assert g.main_phase == "train" and g.missing == ()
    curves = {(c.name, c.phase): c for c in g.curves}
    assert [(c.name, c.phase) for c in g.curves][:4] == [("loss", "train"), ("loss", "eval"), ("loss", "val"),
                                                         ("learning_rate", "train")]

    loss = curves[("loss", "train")]
    finite = [i for i in range(TRAIN) if i != NAN_STEP]
    assert loss.x == tuple(finite) and loss.y == tuple(_loss(i) for i in finite) and loss.per_point == 1
    assert (loss.nonfinite, loss.first_nonfinite, loss.rank) == (1, NAN_STEP, 0)
    assert (loss.first, loss.last, loss.values) == (3.0, _loss(TRAIN - 1), TRAIN - 1)
    evaluation = curves[("loss", "eval")]  # one point per pass: its steps' mean, at the train step before it
    assert evaluation.per_pass and evaluation.x == (9, 19) and evaluation.y == (2.0, 0.5)
    val = curves[("loss", "val")]  # recorded outside steps: the loop's own value, after the last train step
    assert val.per_pass and (val.x, val.y) == ((TRAIN - 1,), (VAL_LOSS,))
    lr = curves[("learning_rate", "train")]  # recorded as "lr"
    assert lr.x == tuple(range(TRAIN)) and lr.y == tuple(_lr(i) for i in range(TRAIN))
    for name, per_step in ((prog.SAMPLES_PER_SECOND, 8), (prog.TOKENS_PER_SECOND, 1024)):
        throughput = curves[(name, "train")]
        assert throughput.y == pytest.approx([per_step * 1e9 / s.duration_ns for s in train], rel=1e-12)

    [timeline, eval_timeline] = g.timelines
    assert (timeline.phase, timeline.rank, timeline.steps, timeline.per_point) == ("train", 0, TRAIN, 1)
    origin = min(s.start_ns for s in rank.steps) / 1e9  # no earlier record than... the process start, below
    assert timeline.series.mean == tuple(s.duration for s in train)
    assert report.summary.start is not None and report.summary.start <= origin
    assert timeline.series.t == pytest.approx([s.start_ns / 1e9 - report.summary.start for s in train])
    assert eval_timeline.phase == "eval" and eval_timeline.steps == 6

    b = report.framework.breakdown("train")
    assert b is not None and b.steps == TRAIN and b.nesting_known and b.overlap == 0.0
    assert [x.name for x in b.parts] == [sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD,
                                         sc.REGION_OPTIMIZER, "sync", fw.UNCOVERED]  # attention: always nested
    for name in (sc.REGION_DATALOADER, sc.REGION_FORWARD, sc.REGION_BACKWARD, sc.REGION_OPTIMIZER, "sync"):
        assert b.part(name) == pytest.approx(sum(a.duration_ns for s in train for a in s.annotations
                                                 if a.name == name and a.depth == 0) / 1e9, rel=1e-12)
    assert sum(1 for s in train for a in s.annotations if a.name == "sync" and a.depth == 1) == TRAIN // 2
    uncovered = sum(s.duration_ns - sum(a.duration_ns for a in s.annotations if a.depth == 0) for s in train)
    assert b.part(fw.UNCOVERED) == pytest.approx(uncovered / 1e9, rel=1e-12) and uncovered >= TRAIN * 1_000_000
    assert math.fsum(x.seconds for x in b.parts) == pytest.approx(b.step_time, rel=1e-12)
    assert b.step_time == pytest.approx(sum(s.duration_ns for s in train) / 1e9, rel=1e-12)
    assert math.fsum(x.share for x in b.parts) == pytest.approx(1.0)

    rows = {row.field: row for row in report.environment.rows}
    assert rows[sc.OTELPROF_GPU_MODEL].value == "NVIDIA A100-SXM4-40GB"
    assert (rows[sc.OTELPROF_GPU_COUNT].value, rows[sc.OTELPROF_GPU_DRIVER].value,
            rows[sc.OTELPROF_CUDA_DRIVER].value) == ("2", "550.54.15", "12.4")
    assert rows[sc.PROCESS_RUNTIME_VERSION].value == f"{sys.implementation.name} {platform.python_version()}"
    import torch

    assert rows[sc.OTELPROF_TORCH_VERSION].value == torch.__version__
    assert rows[sc.OTELPROF_TORCH_CUDA].value == (torch.version.cuda or detect.NO_CUDA)
    assert rows[envmod.GPUS_SAMPLED].value == "2" and all(row.everywhere for row in report.environment.rows)

    html = render(report)
    training = _section(html, "training")
    assert training.count("<svg") == 4  # loss, learning rate, samples/s, tokens/s, and no other scalar
    assert "1 loss value(s) of train were NaN or infinite, the first at step 17" in training
    assert "Not recorded" not in training
    assert "NVIDIA A100-SXM4-40GB" in _section(html, "environment")
    assert "older than this report" not in _section(html, "environment")
    assert "uncovered" in _section(html, "framework") and "Step time over the run" in _section(html, "steps")


def test_long_runs_are_downsampled_to_a_bounded_report(tmp_path: Path) -> None:
    """20,000 train steps with eval passes: every curve and step-time series holds at most MAX_POINTS points,
    each the mean of a run of consecutive values, and the page stays small."""
    n, per_point = 20_000, 50  # 20,000 / 400
    steps, t = [], T0 + 1
    for i in range(n):
        steps.append(step_line("train", i, t, 0.01 + (i % 7) * 1e-3, [("forward", 0.0, 0.005, 0)],
                               {"loss": 5.0 - i * 1e-4, "learning_rate": 1e-3, "samples": 32.0}))
        t += 0.02
        if i % 1000 == 999:
            steps.append(step_line("eval", i // 1000, t, 0.005, [], {"loss": 4.0}))
            t += 0.01
    run = tmp_path / "long"
    write_rank(run, 0, manifest(lifecycle={"process_start": T0, "shutdown": t + 1}), steps)
    report = build_report(load(run), checks=False)
    loss = next(c for c in report.progress.curves if (c.name, c.phase) == ("loss", "train"))
    assert len(loss.x) == prog.MAX_POINTS and loss.per_point == per_point and loss.values == n
    assert loss.y[0] == pytest.approx(math.fsum(5.0 - i * 1e-4 for i in range(per_point)) / per_point)
    assert (loss.low[0], loss.high[0]) == (5.0 - (per_point - 1) * 1e-4, 5.0)
    assert loss.x[0] == per_point // 2
    evaluation = next(c for c in report.progress.curves if (c.name, c.phase) == ("loss", "eval"))
    assert len(evaluation.x) == 20 and evaluation.x[0] == 999
    assert all(len(c.x) <= prog.MAX_POINTS for c in report.progress.curves)
    assert all(len(t.series.t) <= prog.MAX_POINTS for t in report.progress.timelines)
    html = render(report)
    assert len(html.encode()) < 600_000, len(html.encode())


def test_absent_series_render_as_not_recorded(tmp_path: Path) -> None:
    """A recording without scalars, regions or environment (an older otelprof): every section renders and
    says what is missing."""
    run = tmp_path / "bare"
    write_rank(run, 0, manifest(lifecycle={"process_start": T0, "shutdown": T0 + 5}),
               [step_line("train", i, T0 + 1 + 0.1 * i, 0.1) for i in range(5)])
    report = build_report(load(run), checks=False)
    assert report.progress.curves == () and report.progress.missing == prog.EXPECTED
    [b] = report.framework.breakdowns
    assert [(x.name, x.share) for x in b.parts] == [(fw.UNCOVERED, 1.0)]
    html = render(report)
    assert "No training scalar (loss, learning rate, samples, tokens) was recorded" in html
    assert "Not recorded: loss — otelprof.record" in html
    environment = _section(html, "environment")
    assert "Not recorded: Instance type" in environment and "GPU model" in environment
    assert "Processes of an otelprof older than this report record none of these" in environment
    assert "nan" not in _section(html, "training") + environment


def test_checks_without_data_fold_into_one_line(tmp_path: Path) -> None:
    report = build_report(load(small_run(tmp_path)))
    rows = report.rules.rows
    assert len(rows) >= 6
    nodata = {r.alert for r in rows[3:6]}
    changed = tuple(dataclasses.replace(r, triggered=False, firing_evaluations=0, datapoints=0)
                    if r.alert in nodata else dataclasses.replace(r, datapoints=max(r.datapoints, 1)) for r in rows)
    report = dataclasses.replace(report, rules=dataclasses.replace(report.rules, rows=changed))
    assert {r.alert for r in report.rules.no_data} == nodata
    assert all(r.status == "no data" for r in report.rules.no_data)
    html = _section(render(report), "rules")
    table, folded = html.split("Not judged, no data: ")
    for alert in nodata:
        assert alert in folded and f"<b>{alert}</b>" not in table  # one line, not a table row
    assert "checks with data" in table and f"None of the {len(rows) - 3} checks with data fired" in table
    assert table.count('<span class="badge ok">ok</span>') == len(rows) - 3


def test_environment_rows_say_where_values_differ() -> None:
    subjects = [envmod.Subject(r, f"node-{r // 2}", {sc.OTELPROF_GPU_DRIVER: "550.54" if r < 2 else "535.1",
                                                     sc.OTELPROF_TORCH_VERSION: "2.5.1", sc.OS_TYPE: "linux"})
                for r in range(4)]
    e = envmod.environment(subjects, {"node-0": {envmod.GPUS_SAMPLED: "8"}, "node-1": {envmod.GPUS_SAMPLED: "8"}})
    drivers = [r for r in e.rows if r.field == sc.OTELPROF_GPU_DRIVER]
    assert [(r.value, r.nodes, r.ranks, r.everywhere) for r in drivers] == [
        ("535.1", ("node-1",), (2, 3), False), ("550.54", ("node-0",), (0, 1), False)]
    [torch_row] = [r for r in e.rows if r.field == sc.OTELPROF_TORCH_VERSION]
    assert torch_row.everywhere and torch_row.ranks == (0, 1, 2, 3)
    assert [r.value for r in e.rows if r.field == envmod.GPUS_SAMPLED] == ["8"]
    assert (sc.HOST_TYPE, "Instance type") in e.missing


def test_environment_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    (dmi / "product_name").write_text("p4d.24xlarge\n")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)   Platinum 8275CL\n")
    found = detect.machine_attributes({}, dmi, cpuinfo)
    assert found == {sc.HOST_CPU_MODEL: "Intel(R) Xeon(R) Platinum 8275CL", sc.CLOUD_PROVIDER: "aws",
                     sc.HOST_TYPE: "p4d.24xlarge"}
    (dmi / "sys_vendor").write_text("Google\n")
    (dmi / "product_name").write_text("Google Compute Engine\n")
    assert detect.machine_attributes({}, dmi, tmp_path / "none") == {sc.CLOUD_PROVIDER: "gcp"}  # no type there
    sagemaker = detect.machine_attributes({detect.SAGEMAKER_INSTANCE_TYPE: "ml.g5.2xlarge"}, tmp_path / "x",
                                          tmp_path / "none")
    assert sagemaker == {sc.CLOUD_PROVIDER: "aws", sc.HOST_TYPE: "ml.g5.2xlarge"}
    assert detect.machine_attributes({}, tmp_path / "x", tmp_path / "none") == {}  # nothing readable: nothing

    # PyTorch without importing it: its version.py, as the wheel ships it
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / "version.py").write_text("from typing import Optional\n__version__ = '2.5.1+cu124'\ndebug = False\n"
                                        "cuda: Optional[str] = '12.4'\nhip: Optional[str] = None\n")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert detect.torch_attributes() == {sc.OTELPROF_TORCH_VERSION: "2.5.1+cu124", sc.OTELPROF_TORCH_CUDA: "12.4"}
    (package / "version.py").write_text("__version__ = '2.5.1+cpu'\ncuda = None\n")
    assert detect.torch_attributes()[sc.OTELPROF_TORCH_CUDA] == detect.NO_CUDA
    assert "torch" not in sys.modules

    # OTEL_RESOURCE_ATTRIBUTES wins over detected values, the GPUs' included
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.type=a2-highgpu-8g,otelprof.gpu.model=told")
    session = otelprof.init(job_name="env", record=False, system_metrics=True)
    assert isinstance(session, otelprof.Session)
    assert session.resource.attributes[sc.HOST_TYPE] == "a2-highgpu-8g"


def test_gpu_attributes_through_the_nvml_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[tuple[str, str]] = []
    fake = FakeNvml()
    visible = GpuCollector(lambda s, r: errors.append((s, r)), lambda: fake, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert detect.gpu_attributes(visible) == {sc.OTELPROF_GPU_COUNT: 1, sc.OTELPROF_GPU_MODEL: "NVIDIA A100-SXM4-40GB",
                                              sc.OTELPROF_GPU_DRIVER: "550.54.15", sc.OTELPROF_CUDA_DRIVER: "12.4"}
    fake.errors[(-1, "versions")] = "not_supported"  # an old driver: model and count only, and no error counted
    assert sc.OTELPROF_GPU_DRIVER not in detect.gpu_attributes(GpuCollector(lambda s, r: errors.append((s, r)),
                                                                            lambda: fake, env={}))
    assert errors == [] and detect.gpu_attributes(None) == {}
    assert (cuda_version(12040), cuda_version(11080), cuda_version(0)) == ("12.4", "11.8", "")
    with pytest.raises(NvmlCallError):
        fake.versions()


def test_prometheus_curves_end_at_the_range_end() -> None:
    """The evaluation grid ends at the range's end, so the curves see the last scrape, and holds at most
    MAX_POINTS + 1 evaluations a whole number of seconds apart."""
    for start, end in ((1000.0, 1012.3456), (0.0, 100_000.5), (5.0, 5.5), (1.7e9, 1.7e9 + 86_400 * 30)):
        first, last, step = grid(start, end)
        assert last == math.floor(end * 1000) / 1000 and start <= first <= last and step == int(step) >= 1
        count = (last - first) / step
        assert count == pytest.approx(round(count)) and round(count) + 1 <= prog.MAX_POINTS + 1


def test_prometheus_alert_inputs_leave_out_the_warm_up_guard() -> None:
    by_name = {a.name: a for a in alerts(MixinConfig())}
    recorded = {record.name: record.expr for record in recording_rules(MixinConfig())}
    gpu = input_series(by_name["OtelprofGPUUnderutilized"].expr, recorded)  # through the recorded percentile
    assert gpu == {"otelprof_gpu_utilization_bucket", "hw_gpu_utilization_ratio"}
    straggler = input_series(by_name["OtelprofRankStraggler"].expr, recorded)
    assert sc.STEP_DURATION.prometheus_name + "_count" in straggler
    assert input_series(by_name["OtelprofTelemetryAbsent"].expr) == {sc.PROCESS_START_TIME.prometheus_name}


def _section(html: str, anchor: str) -> str:
    start = html.index(f'<section id="{anchor}">')
    return html[start:html.index("</section>", start)]


class _RangeAnswers:
    """Answers the progress queries from fixed series: the steps counter, and a samples rate whose first
    windows end before the first step (zero) and which pauses once mid-run (zero again)."""

    def __init__(self, start: float) -> None:
        self.times = [start + 10.0 * i for i in range(8)]
        self.steps = [0.0, 0.0, 5.0, 10.0, 15.0, 15.0, 20.0, 25.0]
        self.rates = [0.0, 0.0, 4.0, 4.0, 4.0, 0.0, 4.0, 4.0]

    def query_range(self, promql: str, first: float, last: float, step: float
                    ) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        if promql.startswith(f"sum by (rank) ({sc.STEPS.prometheus_name}"):
            return [({"rank": "0"}, list(zip(self.times, self.steps)))]
        if promql.startswith(f"sum(rate({sc.SAMPLES.prometheus_name}"):
            return [({}, list(zip(self.times, self.rates)))]
        return []


def test_prometheus_throughput_starts_at_the_first_samples_and_keeps_later_pauses() -> None:
    """The rate windows before the first samples were counted are not a throughput of zero; a pause after
    training started is."""
    answers = _RangeAnswers(1000.0)
    queries = _Queries(answers, "job", 1000.0, 1070.0)  # type: ignore[arg-type]
    got = progress(queries, [("train", 25)], StepAnalysis(math.nan, (), ()), 1000.0)
    [curve] = [c for c in got.curves if c.name == prog.SAMPLES_PER_SECOND]
    assert curve.x == (5.0, 10.0, 15.0, 15.0, 20.0, 25.0) and curve.y == (4.0, 4.0, 4.0, 0.0, 4.0, 4.0)
