"""Model FLOPs of a training step and its utilization of the device's peak.

:class:`FlopCount` is ``torch.utils.flop_counter.FlopCounterMode`` that also keeps the FLOPs by the dtype
and device of the tensors they ran on. The profiling windows count one step (the one right after a window,
so that the counter's Python dispatch neither shows in the window's operator times nor goes unmeasured: its
cost joins the window's). :func:`figures` turns the count into achieved FLOP/s at the pace of the steps
before the window, and, on a GPU whose model (from the NVML seam) and dtype have a peak in
:data:`PEAK_FLOPS` (or with ``OTELPROF_PEAK_FLOPS`` set), the model FLOPs utilization (MFU).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any

from otelprof import _warnings
from otelprof import semconv as sc
from otelprof.runtime.metrics import MetricRegistry

_DENSE = dict[str, float]
PEAK_FLOPS: tuple[tuple[str, re.Pattern[str], _DENSE], ...] = (
    # Dense (no sparsity) peaks from the vendor's datasheets, FLOP/s per GPU. First match wins.
    ("B200", re.compile(r"\bB200\b", re.I), {"tf32": 1.1e15, "bf16": 2.25e15, "fp16": 2.25e15, "fp8": 4.5e15}),
    ("H100 PCIe", re.compile(r"H100.*PCIe", re.I),
     {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12, "fp16": 756e12, "fp8": 1513e12}),
    ("H100 SXM / H200", re.compile(r"\bH(100|200|800)\b|GH200", re.I),
     {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12}),
    ("A100", re.compile(r"A100|A800", re.I), {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12}),
    ("L40S", re.compile(r"L40S", re.I), {"fp32": 91.6e12, "tf32": 183e12, "bf16": 362e12, "fp16": 362e12,
                                          "fp8": 733e12}),
    ("L4", re.compile(r"\bL4\b", re.I), {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12,
                                          "fp8": 242e12}),
    ("A10 / A10G", re.compile(r"\bA10G?\b", re.I), {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12,
                                                     "fp16": 125e12}),
    ("T4", re.compile(r"\bT4\b", re.I), {"fp32": 8.1e12, "fp16": 65e12}),
    ("V100 PCIe", re.compile(r"V100.*PCI", re.I), {"fp32": 14e12, "fp16": 112e12}),
    ("V100 SXM", re.compile(r"V100", re.I), {"fp32": 15.7e12, "fp16": 125e12}),
)
"""Peak dense FLOP/s by GPU model (matched in the NVML name) and dtype (documented in docs/pytorch.md)."""

DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float64": "fp64",
          "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8"}


def peak_flops(gpu_model: str, dtype: str) -> float | None:
    """The table's dense peak for ``dtype`` on the first model whose pattern matches ``gpu_model``."""
    for _, pattern, peaks in PEAK_FLOPS:
        if pattern.search(gpu_model):
            return peaks.get(dtype)
    return None


def _matmul_dtype(dtype: str) -> str:
    """fp32 matmuls run as TF32 on tensor cores when PyTorch allows it."""
    if dtype != "fp32":
        return dtype
    try:
        import torch

        if torch.get_float32_matmul_precision() != "highest" or torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
    except Exception:
        pass
    return dtype


def compiled() -> bool:
    """True once torch.compile has compiled a frame: a dispatch mode would make it recompile or fall back.
    (``fullgraph=True`` counts no frames, only graphs.)"""
    dynamo = sys.modules.get("torch._dynamo.utils")
    try:
        counters = dynamo.counters if dynamo is not None else None
        return bool(counters is not None and (counters["frames"]["ok"] or counters["stats"]["unique_graphs"]))
    except Exception:
        return True


def _cpu_attention() -> dict[Any, Any]:
    """Formulas for the CPU flash-attention kernels ``scaled_dot_product_attention`` runs on the CPU, which
    torch's flop counter lacks (it counts the CUDA ones): the same as the CUDA flash attention's."""
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    found: dict[Any, Any] = {}
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is not None:
        found[forward] = lambda q, k, v, *args, out_shape=None, **kwargs: sdpa_flop_count(q, k, v)  # type: ignore[no-untyped-call]
    if backward is not None:
        found[backward] = (lambda grad, q, k, v, *args, out_shape=None, **kwargs:
                           sdpa_backward_flop_count(grad, q, k, v))  # type: ignore[no-untyped-call]
    return found


def _counter_class() -> Any:
    from torch.utils.flop_counter import FlopCounterMode

    class FlopCount(FlopCounterMode):  # type: ignore[misc]
        """FlopCounterMode keeping FLOPs by (device type, dtype) of each counted operator's first tensor."""

        def __init__(self) -> None:
            super().__init__(display=False, custom_mapping=_cpu_attention())
            self.by_kind: dict[tuple[str, str], int] = {}

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            before = self.get_total_flops()
            result = super()._count_flops(func_packet, out, args, kwargs)  # type: ignore[no-untyped-call]
            added = self.get_total_flops() - before
            if added:
                tensor = next((a for a in args if hasattr(a, "dtype") and hasattr(a, "device")), None)
                key = (tensor.device.type, str(tensor.dtype)) if tensor is not None else ("unknown", "unknown")
                self.by_kind[key] = self.by_kind.get(key, 0) + added
            return result

    return FlopCount


def start() -> Any:
    """A started counter (``__enter__`` done), or None when it cannot count (no flop counter, torch.compile)."""
    if compiled():
        return None
    try:
        with _warnings.untouched():  # torch.utils.flop_counter's first import adds warning filters
            counter = _counter_class()()
            counter.__enter__()
    except Exception:
        return None
    return counter


def stop(counter: Any) -> dict[str, Any] | None:
    """Stop ``counter``; its FLOPs with the device and dtype most of them ran on."""
    try:
        with _warnings.untouched():
            counter.__exit__(None, None, None)
        total = int(counter.get_total_flops())
    except Exception:
        return None
    by_kind: dict[tuple[str, str], int] = counter.by_kind
    device, dtype = max(by_kind, key=by_kind.__getitem__) if by_kind else ("unknown", "unknown")
    return {"flops": total, "device": device, "dtype": DTYPES.get(dtype, dtype.replace("torch.", ""))}


def figures(count: Mapping[str, Any], step_s: float, gpu_model: str | None, override: float) -> dict[str, Any]:
    """FLOPs per step, achieved FLOP/s at ``step_s`` per step and, on a GPU with a known (or given) peak for
    the dtype in use, the peak and the utilization. ``override`` (FLOP/s, 0 = the table) replaces the peak."""
    flops = float(count["flops"])
    out: dict[str, Any] = {"per_step": flops, "device": str(count["device"]), "dtype": str(count["dtype"])}
    if step_s > 0:
        out["achieved"] = flops / step_s
    if gpu_model:
        out["gpu_model"] = gpu_model
    if out["device"] == "cuda":
        out["dtype"] = _matmul_dtype(out["dtype"])
        peak = override or (peak_flops(gpu_model, out["dtype"]) if gpu_model else None)
        if peak:
            out["peak"] = peak
            if "achieved" in out:
                out["utilization"] = out["achieved"] / peak
    elif override and "achieved" in out:
        out["peak"] = override
        out["utilization"] = out["achieved"] / override
    return out


def set_metrics(registry: MetricRegistry, figures: Mapping[str, Any]) -> None:
    with registry.lock:
        registry.gauge(sc.MODEL_FLOPS).set(figures["per_step"])
        if "achieved" in figures:
            registry.gauge(sc.MODEL_FLOPS_ACHIEVED).set(figures["achieved"])
        if "utilization" in figures:
            registry.gauge(sc.MODEL_FLOPS_UTILIZATION).set(figures["utilization"])
