"""Model FLOPs: counted by torch.utils.flop_counter in the step after a profiling window, achieved FLOP/s at the
steps' pace, and utilization of the GPU's peak (GPU model from the NVML seam, faked here; dtype in use)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest
import torch

import otelprof
from otelprof import semconv as sc
from otelprof.analysis.report import build_report
from otelprof.integrations import flops
from otelprof.integrations import torch as otorch
from otelprof.recording.reader import read_recording
from otelprof.report.html import render
from otelprof.runtime.collectors.sampler import Sampler
from tests.fake_nvml import FakeNvml
from tests.test_report_fixtures import T0, manifest, step_line, write_rank

BATCH, IN, HIDDEN, OUT = 16, 64, 128, 32


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor) -> None:
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()


# forward 2*B*in*out per Linear; backward twice that (input and weight gradients), except that the first layer
# computes no input gradient (its input needs none): 2x forward for the first, 3x for the second.
EXPECTED = 2 * 2 * BATCH * IN * HIDDEN + 3 * 2 * BATCH * HIDDEN * OUT


def test_the_counter_counts_linear_layers_exactly() -> None:
    model, optimizer = _model()
    x = torch.randn(BATCH, IN)
    counter = flops.start()
    _step(model, optimizer, x)
    count = flops.stop(counter)
    assert count == {"flops": EXPECTED, "device": "cpu", "dtype": "fp32"}
    counter = flops.start()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    count = flops.stop(counter)
    assert count is not None and count["flops"] == 2 * BATCH * (IN * HIDDEN + HIDDEN * OUT)
    assert count["dtype"] == "bf16"  # the dtype the matmuls ran in


def test_utilization_is_achieved_over_the_peak_of_the_gpu_model_and_dtype() -> None:
    name = FakeNvml().device(0).name  # as the NVML seam reports it
    assert name == "NVIDIA A100-SXM4-40GB"
    gpu = flops.figures({"flops": 3.12e12, "device": "cuda", "dtype": "bf16"}, 0.1, name, 0.0)
    assert gpu["achieved"] == pytest.approx(3.12e13) and gpu["peak"] == 312e12
    assert gpu["utilization"] == pytest.approx(0.1)
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert flops.peak_flops("NVIDIA H100 PCIe", "bf16") == 756e12
    assert flops.peak_flops("Tesla T4", "fp16") == 65e12 and flops.peak_flops("Tesla T4", "bf16") is None
    assert flops.peak_flops("NVIDIA L4", "bf16") == 121e12 and flops.peak_flops("NVIDIA L40S", "bf16") == 362e12
    assert flops.peak_flops("NVIDIA A10G", "fp16") == 125e12
    assert flops.peak_flops("Tesla V100-SXM2-16GB", "fp16") == 125e12
    assert flops.peak_flops("Some Future GPU", "bf16") is None
    unknown = flops.figures({"flops": 1e9, "device": "cuda", "dtype": "bf16"}, 0.1, "Some Future GPU", 0.0)
    assert "utilization" not in unknown and unknown["achieved"] == pytest.approx(1e10)
    given = flops.figures({"flops": 1e9, "device": "cuda", "dtype": "bf16"}, 0.1, "Some Future GPU", 1e11)
    assert given["utilization"] == pytest.approx(0.1)  # OTELPROF_PEAK_FLOPS replaces the table
    cpu = flops.figures({"flops": 1e9, "device": "cpu", "dtype": "fp32"}, 0.1, name, 0.0)
    assert cpu["achieved"] == pytest.approx(1e10) and "utilization" not in cpu and "peak" not in cpu


def test_a_window_counts_the_flops_of_the_next_step_and_reports_achieved_flops(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    monkeypatch.setattr(otelprof.runtime.session, "Sampler", functools.partial(Sampler, nvml_factory=lambda: fake))
    for name in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    session = otelprof.init(record_dir=str(tmp_path), profile_every=0, sample_interval=0.1)
    otorch.profile_window(4, 1)
    model, optimizer = _model()
    x = torch.randn(BATCH, IN)
    for _ in range(8):
        with otelprof.step():
            _step(model, optimizer, x)
            time.sleep(0.01)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not list(read_recording(session.run_dir).ranks[0].profiles()):
        session.flush()
        time.sleep(0.1)
    gauges = {spec: dict(session.registry.gauge(spec).values)
              for spec in (sc.MODEL_FLOPS, sc.MODEL_FLOPS_ACHIEVED, sc.MODEL_FLOPS_UTILIZATION)}
    run_dir = session.run_dir
    otelprof.shutdown()
    [window] = list(read_recording(run_dir).ranks[0].profiles())
    figures = window["flops"]
    assert figures["per_step"] == EXPECTED and figures["device"] == "cpu" and figures["dtype"] == "fp32"
    assert figures["gpu_model"] == "NVIDIA A100-SXM4-40GB"  # from the NVML seam
    assert 0 < figures["achieved"] <= EXPECTED / 0.01  # every step sleeps 10 ms
    assert "utilization" not in figures  # the model ran on the CPU: no GPU peak applies
    assert gauges[sc.MODEL_FLOPS] == {(): EXPECTED} and gauges[sc.MODEL_FLOPS_ACHIEVED][()] == figures["achieved"]
    assert gauges[sc.MODEL_FLOPS_UTILIZATION] == {}
    assert window["overhead_s"] >= 0
    report = build_report(read_recording(run_dir.parent), checks=False)
    [row] = report.device.flops
    assert row.per_step == EXPECTED and row.utilization is None and row.gpu_model == "NVIDIA A100-SXM4-40GB"
    assert row.steps_per_second > 0 and row.achieved == pytest.approx(EXPECTED * row.steps_per_second)
    assert "Achieved FLOP/s without a utilization" in render(report)


def test_the_report_shows_mfu_of_a_gpu_window(tmp_path: Path) -> None:
    run = tmp_path / "run"
    steps = [step_line("train", n, T0 + 0.5 * n, 0.5) for n in range(11)]  # 2 steps/s
    figures = {"per_step": 5e13, "device": "cuda", "dtype": "bf16", "gpu_model": "NVIDIA A100-SXM4-40GB",
               "achieved": 1e14, "peak": 312e12, "utilization": 1e14 / 312e12}
    write_rank(run, 0, manifest(), steps, profiles=[{"start_step": 3, "num_steps": 1, "t": 1, "d": 1,
                                                      "flops": figures}])
    report = build_report(read_recording(run), checks=False)
    [row] = report.device.flops
    assert row.steps_per_second == pytest.approx(2.0) and row.achieved == pytest.approx(1e14)
    assert row.utilization == pytest.approx(1e14 / 312e12)
    html = render(report)
    assert "reached 32.1 % of the NVIDIA A100-SXM4-40GB" in html and "312.00 T" in html


def test_attention_on_the_cpu_is_counted_like_on_the_gpu() -> None:
    """A causal self-attention block (the shape of GPT training loops): its matmuls and the CPU flash attention
    of scaled_dot_product_attention (QK^T and AV), which torch's own counter leaves out on the CPU."""
    batch, heads, seq, dim = 2, 4, 16, 8
    width = heads * dim
    qkv, proj = torch.nn.Linear(width, 3 * width, bias=False), torch.nn.Linear(width, width, bias=False)
    x = torch.randn(batch, seq, width, requires_grad=True)

    def block() -> torch.Tensor:
        q, k, v = qkv(x).split(width, dim=2)
        q, k, v = (t.view(batch, seq, heads, dim).transpose(1, 2) for t in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return proj(y.transpose(1, 2).reshape(batch, seq, width))

    tokens = batch * seq
    matmuls = 2 * tokens * width * 3 * width + 2 * tokens * width * width
    attention = 2 * (2 * batch * heads * seq * seq * dim)  # QK^T and AV, causal mask not discounted
    counter = flops.start()
    with torch.no_grad():
        block()
    forward = flops.stop(counter)
    assert forward is not None and forward["flops"] == matmuls + attention
    counter = flops.start()
    block().sum().backward()
    count = flops.stop(counter)
    # backward: twice the matmuls; attention's as torch counts the CUDA kernels' (dQ, dK, dV, dP and the
    # recomputed scores: 2.5 times its forward)
    assert count is not None and count["flops"] == 3 * matmuls + attention + attention * 5 // 2
