"""Side-by-side overhead benchmark: a bare training loop vs otelprof vs torch.profiler, on CPU.

    .venv/bin/python benchmarks/overhead.py            # full run, about 3 minutes
    .venv/bin/python benchmarks/overhead.py --quick    # smoke run, under 30 seconds
    .venv/bin/python benchmarks/overhead.py --json results.json

Every variant runs in this one process, interleaved round by round (order rotated each
round), and is compared with the bare loop of the same round. ``benchmarks/README.md``
explains each table and how to read it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter_ns
from typing import Any

# torch warns at import when numpy is missing; numpy plays no part here.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import otelprof  # noqa: E402
from otelprof import semconv  # noqa: E402
from otelprof.recording import schema  # noqa: E402

# ---------------------------------------------------------------- targets (from the issue)
TARGET_ADDED_US = 40.0  # added wall time per step, default settings
TARGET_ANNOTATE_US = 2.0  # one annotate() enter + exit
TARGET_BYTES_PER_STEP = 2048  # recording bytes per step, default settings
REF_TORCH_PROFILER_US = 200.0  # torch.profiler (CPU) per step, as quoted in the issue
REF_TORCH_TRACE_BYTES = 54 * 1024  # torch.profiler Chrome trace per step, as quoted in the issue

BARE = "bare"
CONTROL = "bare (control)"  # a second bare loop: its "added" spread is the noise floor of the comparison
OTEL = "otelprof default"
OTEL_SPANS = "otelprof span_every=1"
TORCH = "torch.profiler"

# "otelprof default" is Config's defaults, every field pinned so that OTELPROF_* / OTEL_* variables in
# the environment cannot change what is measured; exporters off, local recording on.
PINNED: dict[str, Any] = {
    **{f.name: getattr(otelprof.Config(), f.name) for f in dataclasses.fields(otelprof.Config)},
    "disabled": False,
    "record": True,
    "traces_exporters": "none",
    "metrics_exporters": "none",
    "handle_sigterm": False,
    "job_name": "overhead-benchmark",
}
# For the direct measurements (hot path, recorder work): no flush timer and no system sampler while timing.
QUIET: dict[str, Any] = {"flush_interval": 10.0}
if "system_metrics" in PINNED:
    QUIET["system_metrics"] = False
VARIANT_SETTINGS: dict[str, dict[str, Any]] = {OTEL: {}, OTEL_SPANS: {"span_every": 1}}


# ---------------------------------------------------------------- workloads
class SmallCNN(nn.Module):
    """Two conv layers and a linear head for 1x28x28 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3)  # 28 -> 26, pooled to 13
        self.conv2 = nn.Conv2d(16, 32, 3)  # 13 -> 11, pooled to 5
        self.fc = nn.Linear(32 * 5 * 5, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        logits: torch.Tensor = self.fc(x.flatten(1))
        return logits


Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Workload:
    """A model, its SGD optimizer and a few synthetic batches, cycled."""

    name: str
    description: str
    model: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batches: list[Batch]
    optimizer: torch.optim.Optimizer = field(init=False)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)

    def run(self, steps: int, instrumented: bool) -> int:
        """Run ``steps`` training steps and return the loop's wall time in ns.

        ``instrumented`` adds what a user of otelprof adds: a step, four annotations
        (data, forward, backward, optimizer) and two scalars (loss, samples)."""
        model, optimizer, loss_fn, batches = self.model, self.optimizer, self.loss_fn, self.batches
        count = len(batches)
        batch_size = int(batches[0][0].shape[0])
        gc.collect()
        if not instrumented:
            start = perf_counter_ns()
            for i in range(steps):
                x, y = batches[i % count]
                loss = loss_fn(model(x), y)
                loss.backward()  # type: ignore[no-untyped-call]
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            return perf_counter_ns() - start
        start = perf_counter_ns()
        for i in range(steps):
            with otelprof.step():
                with otelprof.annotate("data"):
                    x, y = batches[i % count]
                with otelprof.annotate("forward"):
                    loss = loss_fn(model(x), y)
                with otelprof.annotate("backward"):
                    loss.backward()  # type: ignore[no-untyped-call]
                with otelprof.annotate("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                otelprof.record("loss", loss)
                otelprof.record("samples", batch_size)
        return perf_counter_ns() - start


def cnn_workload() -> Workload:
    batches = [(torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))) for _ in range(4)]
    return Workload("cnn", "small CNN (2 conv + linear), batch 32x1x28x28, SGD", SmallCNN(), F.cross_entropy, batches)


def tiny_workload() -> Workload:
    batches = [(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(4)]
    return Workload("tiny", "Linear(8,8), batch 4x8, MSE, SGD", nn.Linear(8, 8), F.mse_loss, batches)


# ---------------------------------------------------------------- one round of one variant
@dataclass
class Sample:
    """One round of one variant. Times in ns; ``loop_ns`` is the only one in the comparison."""

    loop_ns: int
    pending_ns: int = 0  # otelprof: processing what the recorder had not yet processed when the loop ended
    setup_ns: int = 0  # otelprof.init() / profiler start; not timed
    teardown_ns: int = 0  # otelprof.shutdown() / profiler stop; not timed
    files: dict[str, int] = field(default_factory=dict)  # recording (or trace) file -> bytes
    recorded_steps: int = 0  # step lines in steps.jsonl
    traced_steps: dict[str, int] = field(default_factory=dict)  # span reason -> steps traced for it
    dropped: float = 0.0  # records dropped (manifest "dropped")
    span_ns: int = 0  # the recorder's otelprof.span.build_time counter: building and encoding spans

    @property
    def total_bytes(self) -> int:
        return sum(self.files.values())


def start_session(record_dir: Path, run_id: str, **settings: Any) -> otelprof.Session:
    session = otelprof.init(**{**PINNED, "record_dir": str(record_dir), "run_id": run_id, **settings})
    if not isinstance(session, otelprof.Session):
        raise SystemExit("otelprof.init() did not start a session (OTEL_SDK_DISABLED set, or init failed)")
    return session


def run_otelprof(workload: Workload, steps: int, record_dir: Path, run_id: str, settings: dict[str, Any]) -> Sample:
    t0 = perf_counter_ns()
    session = start_session(record_dir, run_id, **settings)
    setup_ns = perf_counter_ns() - t0
    try:
        loop_ns = workload.run(steps, instrumented=True)
        # What the background thread had not processed yet: done here, and timed, so that the
        # recorder's whole cost for these steps is known whatever the flush timer's phase was.
        t1 = perf_counter_ns()
        session.recorder.drain()
        pending_ns = perf_counter_ns() - t1
        with session.registry.lock:
            span_ns = int(sum(session.recorder.span_build_time.values.values()) * 1e9)
    finally:
        t2 = perf_counter_ns()
        otelprof.shutdown()
        teardown_ns = perf_counter_ns() - t2
    sample = Sample(loop_ns, pending_ns, setup_ns, teardown_ns, span_ns=span_ns)
    if session.run_dir is not None:
        read_recording(session.run_dir, sample)
    return sample


def read_recording(run_dir: Path, sample: Sample) -> None:
    """File sizes, step count, traced steps by reason and drops of one recording."""
    sample.files = {path.name: path.stat().st_size for path in sorted(run_dir.iterdir()) if path.is_file()}
    steps_file = run_dir / schema.STEPS
    if steps_file.exists():
        with steps_file.open(encoding="utf-8") as handle:
            sample.recorded_steps = sum(1 for line in handle if json.loads(line).get("k") == schema.KIND_STEP)
    spans_file = run_dir / schema.SPANS
    if spans_file.exists():
        with spans_file.open(encoding="utf-8") as handle:
            for line in handle:
                for resource in json.loads(line).get("resourceSpans", []):
                    for scope in resource.get("scopeSpans", []):
                        for span in scope.get("spans", []):
                            if span.get("name") != semconv.SPAN_STEP:
                                continue
                            reason = next((a["value"].get("stringValue", "?") for a in span.get("attributes", [])
                                           if a.get("key") == semconv.ATTR_SPAN_REASON), "?")
                            sample.traced_steps[reason] = sample.traced_steps.get(reason, 0) + 1
    manifest = json.loads((run_dir / schema.MANIFEST).read_text(encoding="utf-8"))
    sample.dropped = float(sum((manifest.get("dropped") or {}).values()))


def run_torch_profiler(workload: Workload, steps: int, trace_path: Path | None = None) -> Sample:
    t0 = perf_counter_ns()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t1 = perf_counter_ns()
        loop_ns = workload.run(steps, instrumented=False)
        t2 = perf_counter_ns()
    t3 = perf_counter_ns()
    sample = Sample(loop_ns, 0, t1 - t0, t3 - t2)
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
        sample.files = {trace_path.name: trace_path.stat().st_size}
    return sample


def run_variant(variant: str, workload: Workload, steps: int, record_dir: Path, run_id: str) -> Sample:
    if variant in (BARE, CONTROL):
        return Sample(workload.run(steps, instrumented=False))
    if variant == TORCH:
        return run_torch_profiler(workload, steps)
    return run_otelprof(workload, steps, record_dir, run_id, VARIANT_SETTINGS[variant])


# ---------------------------------------------------------------- side-by-side comparison
def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


@dataclass
class VariantSummary:
    """Medians over rounds; ``added_*`` compare with the bare loop of the same round."""

    variant: str
    rounds: int
    steps: int
    step_us: float
    ratio: float
    added_us: float
    added_us_q1: float
    added_us_q3: float
    added_with_pending_us: float | None
    pending_us: float | None
    span_work_us: float | None
    setup_ms: float
    teardown_ms: float
    bytes_per_step: float | None
    file_bytes_per_step: dict[str, float]
    traced_steps: dict[str, float]
    recorded_steps_ok: bool | None
    dropped: float


def summarize(variant: str, samples: list[Sample], bare: list[Sample], steps: int) -> VariantSummary:
    ratios = [s.loop_ns / b.loop_ns for s, b in zip(samples, bare)]
    added = [(s.loop_ns - b.loop_ns) / steps / 1e3 for s, b in zip(samples, bare)]
    added_total = [(s.loop_ns + s.pending_ns - b.loop_ns) / steps / 1e3 for s, b in zip(samples, bare)]
    is_otel = variant in VARIANT_SETTINGS
    q1, q3 = quartiles(added)
    names = sorted({name for s in samples for name in s.files})
    reasons = sorted({reason for s in samples for reason in s.traced_steps})
    return VariantSummary(
        variant=variant,
        rounds=len(samples),
        steps=steps,
        step_us=median([s.loop_ns / steps / 1e3 for s in samples]),
        ratio=median(ratios),
        added_us=median(added),
        added_us_q1=q1,
        added_us_q3=q3,
        added_with_pending_us=median(added_total) if is_otel else None,
        pending_us=median([s.pending_ns / steps / 1e3 for s in samples]) if is_otel else None,
        span_work_us=median([s.span_ns / steps / 1e3 for s in samples]) if is_otel else None,
        setup_ms=median([s.setup_ns / 1e6 for s in samples]),
        teardown_ms=median([s.teardown_ns / 1e6 for s in samples]),
        bytes_per_step=median([s.total_bytes / steps for s in samples]) if is_otel else None,
        file_bytes_per_step={n: median([s.files.get(n, 0) / steps for s in samples]) for n in names},
        traced_steps={r: median([s.traced_steps.get(r, 0) for s in samples]) for r in reasons},
        recorded_steps_ok=all(s.recorded_steps == steps for s in samples) if is_otel else None,
        dropped=sum(s.dropped for s in samples),
    )


def compare(workload: Workload, variants: list[str], rounds: int, steps: int, tmp: Path) -> dict[str, Any]:
    """Interleave ``variants`` for ``rounds`` rounds of ``steps`` steps; summarize vs bare."""
    warm = max(steps // 10, 5)
    for index, variant in enumerate(variants):  # warm-up: first-call costs of torch, otelprof, the profiler
        run_variant(variant, workload, warm, tmp / "warmup", f"{workload.name}-warmup-{index}")
    samples: dict[str, list[Sample]] = {variant: [] for variant in variants}
    began = time.monotonic()
    for r in range(rounds):
        shift = r % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            run_id = f"{workload.name}-{r:03d}-{variant.replace(' ', '_').replace('=', '')}"
            samples[variant].append(run_variant(variant, workload, steps, tmp / workload.name, run_id))
        progress(f"{workload.name}: round {r + 1}/{rounds} ({time.monotonic() - began:.0f} s)")
    summaries = [summarize(v, samples[v], samples[BARE], steps) for v in variants]
    return {
        "workload": workload.description,
        "rounds": rounds,
        "steps": steps,
        "summary": [asdict(s) for s in summaries],
        "samples": {v: [asdict(s) for s in samples[v]] for v in variants},
        "_summaries": summaries,
    }


def chrome_trace_bytes(workload: Workload, steps: int, tmp: Path) -> dict[str, float]:
    """One extra profiled round exported as a Chrome trace (export not timed anywhere)."""
    path = tmp / f"{workload.name}-trace.json"
    sample = run_torch_profiler(workload, steps, path)
    return {"steps": steps, "bytes": sample.total_bytes, "bytes_per_step": sample.total_bytes / steps}


# ---------------------------------------------------------------- hot-path micro-benchmarks
def loop_empty(n: int) -> int:
    start = perf_counter_ns()
    for _ in range(n):
        pass
    return perf_counter_ns() - start


def loop_annotate(n: int) -> int:
    with otelprof.step():
        start = perf_counter_ns()
        for _ in range(n):
            with otelprof.annotate("forward"):
                pass
        return perf_counter_ns() - start


def loop_step(n: int) -> int:
    start = perf_counter_ns()
    for _ in range(n):
        with otelprof.step():
            pass
    return perf_counter_ns() - start


def loop_record(n: int) -> int:
    with otelprof.step():
        start = perf_counter_ns()
        for _ in range(n):
            otelprof.record("loss", 0.5)
        return perf_counter_ns() - start


def loop_step_number(n: int) -> int:
    start = perf_counter_ns()
    for i in range(n):
        with otelprof.step(number=i):
            pass
    return perf_counter_ns() - start


def loop_record_outside(n: int) -> int:
    start = perf_counter_ns()
    for _ in range(n):
        otelprof.record("loss", 0.5)
    return perf_counter_ns() - start


def loop_default_instrumentation(n: int) -> int:
    """What the training loops above add per step, around an empty body."""
    start = perf_counter_ns()
    for _ in range(n):
        with otelprof.step():
            with otelprof.annotate("data"):
                pass
            with otelprof.annotate("forward"):
                pass
            with otelprof.annotate("backward"):
                pass
            with otelprof.annotate("optimizer"):
                pass
            otelprof.record("loss", 0.5)
            otelprof.record("samples", 32)
    return perf_counter_ns() - start


def loop_annotate_no_session(n: int) -> int:
    start = perf_counter_ns()
    for _ in range(n):
        with otelprof.annotate("forward"):
            pass
    return perf_counter_ns() - start


MICRO_CASES: list[tuple[str, Callable[[int], int], bool]] = [
    ("annotate() enter+exit, in an open step", loop_annotate, True),
    ("step() enter+exit, empty body", loop_step, True),
    ("record() in an open step", loop_record, True),
    ("step(number=i) enter+exit, empty body", loop_step_number, True),
    ("record() outside steps", loop_record_outside, True),
    ("step + 4 annotate + 2 record, empty body", loop_default_instrumentation, True),
    ("annotate() with no session running", loop_annotate_no_session, False),
]


def micro_benchmarks(rounds: int, calls: int, tmp: Path) -> dict[str, dict[str, float]]:
    """Median over ``rounds`` of (loop with the call - empty loop) / ``calls``, in ns per call.

    The session's flush timer is set long, and spans and the system sampler are off, so no otelprof thread
    runs while a loop is timed; records are processed between rounds, outside the timing."""
    results: dict[str, dict[str, float]] = {}
    for name, loop, needs_session in MICRO_CASES:
        session = start_session(tmp, f"micro-{len(results)}", **QUIET, span_first_steps=0,
                                span_budget=0.0) if needs_session else None
        try:
            loop(calls)  # warm-up
            per_call: list[float] = []
            for r in range(rounds):
                gc.collect()
                if r % 2:
                    with_call, empty = loop(calls), loop_empty(calls)
                else:
                    empty, with_call = loop_empty(calls), loop(calls)
                per_call.append((with_call - empty) / calls)
                if session is not None:
                    session.recorder.drain()
        finally:
            otelprof.shutdown()
        q1, q3 = quartiles(per_call)
        results[name] = {"ns": median(per_call), "q1_ns": q1, "q3_ns": q3, "rounds": rounds, "calls": calls}
    return results


def recorder_cost(rounds: int, steps: int, tmp: Path) -> dict[str, dict[str, float]]:
    """The background work per step, measured by draining on this thread after ``steps`` empty-body steps.

    Split into the recorder's own ``otelprof.span.build_time`` counter (span work, what it charges to
    ``span_budget``) and the rest (aggregation into metrics, steps.jsonl lines)."""
    results: dict[str, dict[str, float]] = {}
    for label, settings in ((OTEL, {}), (OTEL_SPANS, {"span_every": 1})):
        session = start_session(tmp, f"recorder-{len(results)}", **{**QUIET, **settings})
        drain_us: list[float] = []
        build_us: list[float] = []
        try:
            loop_default_instrumentation(steps)  # warm-up, includes the span_first_steps spans
            session.recorder.drain()
            for _ in range(rounds):
                loop_default_instrumentation(steps)
                built_before = sum(session.recorder.span_build_time.values.values())
                gc.collect()
                start = perf_counter_ns()
                session.recorder.drain()
                drain_us.append((perf_counter_ns() - start) / steps / 1e3)
                built = sum(session.recorder.span_build_time.values.values()) - built_before
                build_us.append(built / steps * 1e6)
        finally:
            otelprof.shutdown()
        results[label] = {"us_per_step": median(drain_us), "span_build_us_per_step": median(build_us),
                          "rounds": rounds, "steps": steps}
    return results


# ---------------------------------------------------------------- output
def progress(message: str) -> None:
    print(f"  .. {message}", file=sys.stderr, flush=True)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Plain-text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows)]

    def line(cells: list[str]) -> str:
        return "  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(row) for row in rows)])


def fmt_bytes(value: float) -> str:
    return f"{value / 1024:.1f} KB" if value >= 1024 else f"{value:.0f} B"


def find(result: dict[str, Any], variant: str) -> VariantSummary | None:
    return next((s for s in result["_summaries"] if s.variant == variant), None)


def print_comparison(title: str, result: dict[str, Any]) -> None:
    summaries: list[VariantSummary] = result["_summaries"]
    print(f"\n{title}\n  {result['workload']}; {result['rounds']} rounds x {result['steps']} steps, "
          "order rotated per round; medians over rounds (q1..q3 in brackets)")
    headers = ["variant", "us/step", "ratio vs bare", "added us/step", "q1..q3",
               "added incl. pending", "setup/teardown ms (untimed)"]
    rows = []
    for s in summaries:
        bare = s.variant == BARE
        pending = "" if s.added_with_pending_us is None else f"{s.added_with_pending_us:+.1f}"
        setup = "" if s.variant in (BARE, CONTROL) else f"{s.setup_ms:.1f} / {s.teardown_ms:.1f}"
        rows.append([
            s.variant, f"{s.step_us:.1f}", f"{s.ratio:.3f}", "" if bare else f"{s.added_us:+.1f}",
            "" if bare else f"[{s.added_us_q1:+.1f}..{s.added_us_q3:+.1f}]", pending, setup,
        ])
    print(table(headers, rows))
    for s in summaries:
        if s.recorded_steps_ok is None:
            continue
        traced = ", ".join(f"{k} {v:g}" for k, v in s.traced_steps.items()) or "none"
        status = "all steps recorded" if s.recorded_steps_ok else "STEPS MISSING from steps.jsonl"
        print(f"  {s.variant}: {status}, {s.dropped:g} dropped; traced steps per round: {traced}; "
              f"recorder span work {s.span_work_us or 0.0:.1f} us/step")


def print_bytes(cnn: dict[str, Any], trace: dict[str, float]) -> None:
    summaries = [s for s in cnn["_summaries"] if s.bytes_per_step is not None]
    names = sorted({n for s in summaries for n in s.file_bytes_per_step})
    print(f"\nBytes recorded per step (CNN rounds of {cnn['steps']} steps; medians over rounds)")
    headers = ["variant", "total/step", *names]
    rows = [[s.variant, fmt_bytes(s.bytes_per_step or 0), *(fmt_bytes(s.file_bytes_per_step.get(n, 0)) for n in names)]
            for s in summaries]
    rows.append([f"{TORCH} (Chrome trace)", fmt_bytes(trace["bytes_per_step"]), *("" for _ in names)])
    print(table(headers, rows))
    print("  manifest.json, metrics.jsonl and samples.jsonl are per-run or per-second costs, spread over the "
          "round's steps")


def print_micro(micro: dict[str, dict[str, float]], recorder: dict[str, dict[str, float]]) -> None:
    first = next(iter(micro.values()))
    print(f"\nHot path, per call (median of {first['rounds']:g} rounds x {first['calls']:g} calls, "
          "minus the empty loop; recorder thread idle)")
    rows = [[name, f"{r['ns']:.0f}", f"[{r['q1_ns']:.0f}..{r['q3_ns']:.0f}]"] for name, r in micro.items()]
    print(table(["operation", "ns/call", "q1..q3"], rows))
    first = next(iter(recorder.values()))
    print(f"\nRecorder (background thread) work per step, 4 annotations + 2 scalars, empty body (median of "
          f"{first['rounds']:g} drains of {first['steps']:g} steps)")
    rows = [[name, f"{r['us_per_step']:.1f}", f"{r['span_build_us_per_step']:.1f}",
             f"{r['us_per_step'] - r['span_build_us_per_step']:.1f}"] for name, r in recorder.items()]
    print(table(["settings", "us/step", "span work (otelprof.span.build_time)", "rest"], rows))


def check(what: str, value: float, target: float, note: str = "", noise: float | None = None) -> dict[str, Any]:
    """PASS/MISS against ``target``; NOISY when the control's q1..q3 width (``noise``) exceeds the target."""
    verdict = "PASS" if value <= target else "MISS"
    if noise is not None and noise > target:
        verdict = "NOISY"
    if noise is not None and not math.isfinite(noise):
        noise = None  # fewer than 3 rounds: no spread to judge by
    return {"what": what, "value": value, "target": target, "verdict": verdict, "note": note, "noise": noise}


def noise_width(result: dict[str, Any]) -> float | None:
    control = find(result, CONTROL)
    if control is None:
        return None
    return control.added_us_q3 - control.added_us_q1 if control.rounds >= 3 else float("inf")


def targets(tiny: dict[str, Any], cnn: dict[str, Any], micro: dict[str, dict[str, float]],
            trace: dict[str, float]) -> list[dict[str, Any]]:
    checks = []
    torch_note = ""
    cnn_torch = find(cnn, TORCH)
    if cnn_torch is not None:
        torch_note = f"torch.profiler on the CNN here: {cnn_torch.added_us:+.1f}"
    tiny_default = find(tiny, OTEL)
    if tiny_default is not None and tiny_default.added_with_pending_us is not None:
        checks.append(check("added us/step, otelprof default, tiny model, incl. pending",
                            tiny_default.added_with_pending_us, TARGET_ADDED_US, torch_note, noise_width(tiny)))
    cnn_default = find(cnn, OTEL)
    if cnn_default is not None:
        width = noise_width(cnn)
        noise = "" if width is None else f"; control q1..q3 width {width:.0f}"
        checks.append(check("added us/step, otelprof default, CNN, loop only", cnn_default.added_us, TARGET_ADDED_US,
                            f"q1..q3 [{cnn_default.added_us_q1:+.0f}..{cnn_default.added_us_q3:+.0f}]{noise}", width))
    checks.append(check("us per annotate()", micro[MICRO_CASES[0][0]]["ns"] / 1e3, TARGET_ANNOTATE_US))
    if cnn_default is not None and cnn_default.bytes_per_step is not None:
        trace_note = f"torch.profiler Chrome trace here: {fmt_bytes(trace['bytes_per_step'])}"
        checks.append(check("bytes recorded per step, otelprof default, CNN", cnn_default.bytes_per_step,
                            TARGET_BYTES_PER_STEP, trace_note))
    return checks


def print_targets(checks: list[dict[str, Any]]) -> None:
    print(f"\nTargets (issue: <= {TARGET_ADDED_US:g} us/step added, torch.profiler CPU ~{REF_TORCH_PROFILER_US:g} us; "
          f"<= {TARGET_ANNOTATE_US:g} us per annotate(); <= {fmt_bytes(TARGET_BYTES_PER_STEP)} recorded per step, "
          f"torch.profiler ~{fmt_bytes(REF_TORCH_TRACE_BYTES)})")
    rows = []
    for c in checks:
        is_bytes = "bytes" in c["what"]
        value = fmt_bytes(c["value"]) if is_bytes else f"{c['value']:.2f}"
        target = fmt_bytes(c["target"]) if is_bytes else f"{c['target']:g}"
        rows.append([c["what"], value, f"<= {target}", c["verdict"], c["note"]])
    print(table(["check", "measured", "target", "", "notes"], rows))
    if any(c["verdict"] == "NOISY" for c in checks):
        print("  NOISY: the bare-vs-bare control spreads wider than the target, so this comparison cannot decide it")


# ---------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, help="rounds per comparison (default 15; --quick 3)")
    parser.add_argument("--steps", type=int, help="CNN steps per round (default 200; --quick 30)")
    parser.add_argument("--tiny-steps", type=int, help="tiny-model steps per round (default 3000; --quick 400)")
    parser.add_argument("--quick", action="store_true", help="smoke run: few rounds and steps, under 30 s")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 15)
    args.steps = args.steps or (30 if args.quick else 200)
    args.tiny_steps = args.tiny_steps or (400 if args.quick else 3000)
    args.micro_rounds = 21 if args.quick else 101
    args.micro_calls = 500 if args.quick else 1000
    args.recorder_rounds = 3 if args.quick else 11
    args.recorder_steps = 200 if args.quick else 500
    if min(args.rounds, args.steps, args.tiny_steps) < 1:
        parser.error("--rounds, --steps and --tiny-steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    began = time.monotonic()
    environment = {"python": platform.python_version(), "torch": torch.__version__, "otelprof": otelprof.__version__,
                   "cpus": os.cpu_count(), "platform": platform.platform(), "torch_threads": torch.get_num_threads()}
    print(f"otelprof overhead benchmark: otelprof {environment['otelprof']}, torch {environment['torch']}, "
          f"Python {environment['python']}, {environment['cpus']} CPUs, torch threads 1")
    with tempfile.TemporaryDirectory(prefix="otelprof-bench-") as tmp_name:
        tmp = Path(tmp_name)
        progress("hot-path micro-benchmarks")
        micro = micro_benchmarks(args.micro_rounds, args.micro_calls, tmp / "micro")
        recorder = recorder_cost(args.recorder_rounds, args.recorder_steps, tmp / "recorder")
        tiny = compare(tiny_workload(), [BARE, CONTROL, OTEL, OTEL_SPANS], args.rounds, args.tiny_steps, tmp)
        cnn_model = cnn_workload()
        cnn = compare(cnn_model, [BARE, CONTROL, OTEL, OTEL_SPANS, TORCH], args.rounds, args.steps, tmp)
        trace = chrome_trace_bytes(cnn_model, args.steps, tmp)
    print_comparison("Tiny model: added wall time per step", tiny)
    print_comparison("CNN training loop: side by side", cnn)
    print_bytes(cnn, trace)
    print_micro(micro, recorder)
    checks = targets(tiny, cnn, micro, trace)
    print_targets(checks)
    elapsed = time.monotonic() - began
    print(f"\n(total {elapsed:.0f} s)")
    if args.json is not None:
        result = {
            "environment": environment,
            "arguments": {k: v for k, v in vars(args).items() if k != "json"},
            "targets": checks,
            "tiny": {k: v for k, v in tiny.items() if not k.startswith("_")},
            "cnn": {k: v for k, v in cnn.items() if not k.startswith("_")},
            "chrome_trace": trace,
            "hot_path_ns": micro,
            "recorder_us_per_step": recorder,
            "elapsed_s": elapsed,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
