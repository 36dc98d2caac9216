"""What periodic operator-profiling windows cost, side by side with a bare loop and torch.profiler always on.

    python benchmarks/profile_windows.py            # about a minute on CPU
    python benchmarks/profile_windows.py --rounds 9 --steps 120

Rounds interleave the variants (their order rotates each round) so that machine noise hits them alike:

* ``bare``: the training loop alone.
* ``otelprof``: the default session with the PyTorch integration; the round holds one periodic window
  (``OTELPROF_PROFILE_WARMUP=0``, the window after the warm-up steps) so its cost is in the round.
* ``no-window``: the same session with periodic windows off (``OTELPROF_PROFILE_EVERY=0``).
* ``profiler``: the loop under ``torch.profiler`` (CPU activity) for every step.

Printed: per variant the median step time, each window's measured overhead X (the window's steps beyond as many
steps at the pace just before it, plus its processing, as ``profiles.jsonl`` records it) and the amortized cost
X / interval at the default interval (600 s), which the schedule keeps within ``OTELPROF_PROFILE_BUDGET`` (1 %).
On a GPU the same command measures the CUDA profiler's cost (kernels, memcpys) as well.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch_integration import cnn_step

import otelprof
from otelprof.integrations import torch as otorch
from otelprof.recording.reader import read_recording

WARMUP_STEPS = 10


def _parts() -> tuple[Callable[[], None], nn.Module, torch.optim.Optimizer]:
    return cnn_step()


def _bare(steps: int) -> float:
    step, _, _ = _parts()
    for _ in range(WARMUP_STEPS):
        step()
    began = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - began) / steps


def _profiler(steps: int) -> float:
    step, _, _ = _parts()
    for _ in range(WARMUP_STEPS):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        began = time.perf_counter()
        for _ in range(steps):
            step()
        return (time.perf_counter() - began) / steps


def _otelprof(steps: int, windows: list[dict[str, Any]], every: float = 600.0) -> float:
    step, model, optimizer = _parts()
    with tempfile.TemporaryDirectory() as tmp:
        session = otelprof.init(record_dir=tmp, system_metrics=False, profile_warmup=0.0, profile_every=every,
                                profile_warmup_steps=WARMUP_STEPS + 5)
        otorch.instrument(model=model, optimizer=optimizer)
        for _ in range(WARMUP_STEPS):
            with otelprof.step():
                step()
        began = time.perf_counter()
        for _ in range(steps):
            with otelprof.step():
                step()
        elapsed = (time.perf_counter() - began) / steps
        deadline = time.monotonic() + 10
        while every and not session.profile_schedule.windows_run and time.monotonic() < deadline:
            time.sleep(0.05)
        run_dir = session.run_dir
        otelprof.shutdown()
        windows.extend(read_recording(run_dir).ranks[0].profiles())
        otorch.uninstrument()
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    windows: list[dict[str, Any]] = []
    variants: dict[str, Callable[[], float]] = {
        "bare": lambda: _bare(args.steps),
        "otelprof": lambda: _otelprof(args.steps, windows),
        "no-window": lambda: _otelprof(args.steps, [], every=0.0),
        "profiler": lambda: _profiler(args.steps),
    }
    results: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            results[name].append(variants[name]())
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    bare = statistics.median(results["bare"])
    print(f"CNN, batch 32, {args.steps} steps per round, {args.rounds} interleaved rounds, median step time:")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"  {name:9} {median * 1e3:8.3f} ms   ({(median / bare - 1) * 100:+6.1f} % vs bare)")
    overheads = [w["overhead_s"] for w in windows]
    if overheads:
        window = statistics.median(overheads)
        print(f"periodic window (3 steps): overhead X median {window * 1e3:.1f} ms over {len(overheads)} windows "
              f"(min {min(overheads) * 1e3:.1f}, max {max(overheads) * 1e3:.1f})")
        print(f"amortized at the default 600 s interval: {window / 600 * 100:.4f} % of training time "
              f"(budget 1 %: the interval stretches past {window / 0.01:.1f} s only when X exceeds 6 s)")
        for part in ("steps_s", "flop_step_s", "processing_s"):
            values = [w["cost"][part] for w in windows if "cost" in w]
            if values:
                print(f"  of which {part[:-2]:10} median {statistics.median(values) * 1e3:.1f} ms")
        kept = [w["events"]["kept"] for w in windows if "events" in w]
        if kept:
            print(f"profiler events per window: median {statistics.median(kept):.0f} "
                  f"(cap OTELPROF_PROFILE_MAX_EVENTS {windows[0]['events']['max']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
