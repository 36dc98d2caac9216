"""Cost of timing DDP's gradient all-reduce, side by side: two gloo ranks on the CPU, one process each.

    python benchmarks/ddp.py            # ~3 minutes
    python benchmarks/ddp.py --quick    # ~30 s, rough

Each round builds a fresh ``DistributedDataParallel`` MLP per variant (DDP takes one communication hook per
model, for good) with small buckets, so that a step reduces several of them, and times ``--steps`` steps after
a warm-up; the variants' order rotates each round, and both ranks run them in step (a barrier before each).
Variants:

* bare                   — the loop alone;
* instrumented           — ``otelprof.torch.instrument(model, optimizer)``: steps, regions, loss, and the
                           gradient reduction timed per bucket by otelprof's communication hook (``collective``
                           regions; the step hooks then run in Python);
* collectives off        — the same with ``OTELPROF_DDP_COLLECTIVES=false``: DDP keeps its C++ all-reduce and
                           the step hooks stay in C;
* python hook alone      — no otelprof; DDP's own all-reduce registered as a Python communication hook
                           (``default_hooks.allreduce_hook``): what any Python hook costs, otelprof's included;
* torch.profiler         — the loop inside ``torch.profiler.profile`` (CPU activities).

Rank 0 prints the median step of each variant over the rounds and what each adds to the bare step, per step
and per reduced bucket.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import otelprof
from otelprof.integrations import torch as otorch

WIDTH = 256
LAYERS = 6
BUCKET_MB = 0.25
BATCH = 32
VARIANTS = ("bare", "instrumented", "collectives off", "python hook alone", "torch.profiler")


def _model() -> torch.nn.parallel.DistributedDataParallel:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=BUCKET_MB)


def _steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: list[torch.Tensor], n: int) -> None:
    for i in range(n):
        loss = model(batches[i % len(batches)]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _timed(variant: str, steps: int, warmup: int, record_dir: str) -> tuple[float, int]:
    """(seconds per step, buckets reduced per step) of one variant."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [torch.randn(BATCH, WIDTH) for _ in range(4)]
    finish: Callable[[], None] = lambda: None  # noqa: E731
    context: Any = None
    if variant in ("instrumented", "collectives off"):
        otelprof.init(record_dir=record_dir, system_metrics=False, quiet=True,
                      ddp_collectives=variant == "instrumented")
        otorch.instrument(model=model, optimizer=optimizer)

        def finish() -> None:
            otorch.uninstrument()
            otelprof.shutdown()
    elif variant == "python hook alone":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.allreduce_hook)
    elif variant == "torch.profiler":
        context = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        context.__enter__()
    _steps(model, optimizer, batches, warmup)
    dist.barrier()
    began = time.perf_counter()
    _steps(model, optimizer, batches, steps)
    elapsed = time.perf_counter() - began
    if context is not None:
        context.__exit__(None, None, None)
    finish()
    logging_data: dict[str, Any] = model._get_ddp_logging_data()  # type: ignore[no-untyped-call]
    buckets = int(logging_data.get("num_buckets_reduced", 0) or 0)
    return elapsed / steps, buckets


def _rank(rank: int, world: int, init: str, rounds: int, steps: int, warmup: int) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    per_variant: dict[str, list[float]] = {v: [] for v in VARIANTS}
    buckets = 0
    with tempfile.TemporaryDirectory() as record_dir:
        for r in range(rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            for variant in order:
                seconds, reduced = _timed(variant, steps, warmup, record_dir)
                per_variant[variant].append(seconds)
                buckets = max(buckets, reduced)
            if rank == 0:
                print(f"round {r + 1}/{rounds}", file=sys.stderr)
    if rank == 0:
        bare = statistics.median(per_variant["bare"])
        print(f"2 gloo ranks, MLP {LAYERS}x{WIDTH}, bucket_cap_mb={BUCKET_MB} ({buckets} buckets per step), "
              f"batch {BATCH}, {rounds} rounds x {steps} steps\n")
        print("| variant | step (median of rounds) | added per step | per bucket |")
        print("| --- | --- | --- | --- |")
        for variant in VARIANTS:
            step = statistics.median(per_variant[variant])
            added = step - bare
            per_bucket = f"{added / buckets * 1e6:+.0f} µs" if buckets and variant != "bare" else "—"
            print(f"| {variant} | {step * 1e3:.3f} ms | {added * 1e6:+.0f} µs ({added / bare:+.1%}) | {per_bucket} |")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 50 steps")
    args = parser.parse_args()
    rounds, steps = (3, 50) if args.quick else (args.rounds, args.steps)
    handle, path = tempfile.mkstemp(prefix="otelprof-bench-pg-")
    os.close(handle)
    os.unlink(path)
    spawn: Any = mp.spawn  # type: ignore[attr-defined]
    spawn(_rank, args=(2, f"file://{path}", rounds, steps, 20), nprocs=2, join=True)


if __name__ == "__main__":
    main()
