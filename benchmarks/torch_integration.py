"""Cost of the PyTorch integration per step, side by side with bare torch.profiler.

    python benchmarks/torch_integration.py           # ~2-3 minutes
    python benchmarks/torch_integration.py --quick   # ~30 s

Variants, interleaved in one process (order rotated each round), medians of per-round figures:

* bare                — the loop alone;
* instrumented        — ``otelprof.torch.instrument(model, optimizer, dataloader)``: auto steps and the
                        dataloader / forward / backward / optimizer regions, loss, lr, samples;
* + grad_norm         — the same with the global gradient norm;
* torch.profiler      — the loop inside ``torch.profiler.profile`` (CPU activities), for comparison;
* profiling window    — instrumented, with an otelprof window over the round's middle steps.

Two loops: the small CNN (batch 32 of 1x28x28, torch threads = 1) where the goal is <= 1 % of the step,
and a tiny Linear(8, 8) model that makes the fixed cost per step visible in microseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import otelprof
from otelprof.integrations import torch as otorch


def make_cnn() -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader[Any]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))
    data = TensorDataset(torch.randn(32 * 64, 1, 28, 28), torch.randint(0, 10, (32 * 64,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), DataLoader(data, batch_size=32)


def make_tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader[Any]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    data = TensorDataset(torch.randn(4 * 2048, 8), torch.randn(4 * 2048, 8))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), DataLoader(data, batch_size=4)


def run_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any], steps: int,
             classify: bool) -> float:
    """Seconds for ``steps`` training steps."""
    loss_fn = torch.nn.functional.cross_entropy if classify else torch.nn.functional.mse_loss
    done = 0
    began = time.perf_counter()
    while done < steps:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done += 1
            if done >= steps:
                break
    return time.perf_counter() - began


def variant(name: str, make: Callable[[], Any], steps: int, classify: bool, record_dir: str) -> float:
    model, optimizer, loader = make()
    run_loop(model, optimizer, loader, 5, classify)  # warm-up outside the timing
    if name == "bare":
        return run_loop(model, optimizer, loader, steps, classify)
    if name == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            return run_loop(model, optimizer, loader, steps, classify)
    otelprof.init(record_dir=record_dir, system_metrics=False)
    try:
        inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader,
                                 grad_norm=(name == "+ grad_norm"))
        if name == "profiling window":
            inst.profile_window(steps // 2, 5)
        return run_loop(model, optimizer, loader, steps, classify)
    finally:
        otorch.uninstrument()
        otelprof.shutdown()


VARIANTS = ("bare", "instrumented", "+ grad_norm", "profiling window", "torch.profiler")


def measure(make: Callable[[], Any], steps: int, rounds: int, classify: bool) -> dict[str, dict[str, float]]:
    per_round: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[: r % len(VARIANTS)]
            times = {v: variant(v, make, steps, classify, tmp) for v in order}
            for v in VARIANTS:
                per_round[v].append(times[v])
    bare = per_round["bare"]
    results = {}
    for v in VARIANTS:
        ratios = [t / b for t, b in zip(per_round[v], bare)]
        added = [(t - b) / steps * 1e6 for t, b in zip(per_round[v], bare)]
        results[v] = {"step_us": statistics.median(per_round[v]) / steps * 1e6,
                      "ratio": statistics.median(ratios), "added_us": statistics.median(added)}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rounds = 3 if args.quick else 9
    out = {
        "cnn": measure(make_cnn, 40 if args.quick else 120, rounds, True),
        "tiny": measure(make_tiny, 300 if args.quick else 1500, rounds, False),
    }
    for loop, results in out.items():
        print(f"\n{loop} loop ({rounds} rounds, medians)")
        print(f"  {'variant':<18} {'step':>10} {'vs bare':>9} {'added/step':>12}")
        for v, r in results.items():
            print(f"  {v:<18} {r['step_us']:>8.0f}us {(r['ratio'] - 1) * 100:>+8.2f}% {r['added_us']:>+10.1f}us")
    print("\ngoal: instrumented <= 1 % of the CNN step")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
