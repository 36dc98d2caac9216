"""What the profiling windows' extras cost: the FLOP counter's step and ``profile_memory``, side by side.

    python benchmarks/window_extras.py                 # about a minute on CPU
    python benchmarks/window_extras.py --rounds 9 --steps 20

Rounds interleave the variants (their order rotates each round) so that machine noise hits them alike. The same
CNN step as benchmarks/torch_integration.py (its cnn_step), per variant the median step time of one round:

* ``bare``: the step alone.
* ``flop-counter``: the step under ``torch.utils.flop_counter`` (otelprof's counter, integrations/flops.py),
  as otelprof runs it in the one step after each profiling window.
* ``profiler``: the step under ``torch.profiler`` (CPU activity), as in a window with OTELPROF_PROFILE_MEMORY=false.
* ``profiler+memory``: the same with ``profile_memory=True`` (the default).

A window's cost is (its steps' time beyond bare) + (the counted step's time beyond bare): the printed extra of
``flop-counter`` is what counting adds once per window; ``profiler+memory`` vs ``profiler`` is what recording
allocations adds per window step. On a GPU the same command measures the CUDA side (kernels are not slowed by
the counter; its cost is host-side dispatch).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch_integration import cnn_step

from otelprof.integrations import flops

WARMUP_STEPS = 5


def _parts() -> Callable[[], None]:
    step, _, _ = cnn_step()
    for _ in range(WARMUP_STEPS):
        step()
    return step


def _timed(step: Callable[[], None], steps: int, wrap: Callable[[Callable[[], None]], None] | None = None) -> float:
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        if wrap is None:
            step()
        else:
            wrap(step)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _counted(step: Callable[[], None]) -> None:
    counter = flops.start()
    step()
    flops.stop(counter)


def _profiled(steps: int, memory: bool) -> float:
    step = _parts()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=memory):
        return _timed(step, steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    variants: dict[str, Callable[[], float]] = {
        "bare": lambda: _timed(_parts(), args.steps),
        "flop-counter": lambda: _timed(_parts(), args.steps, _counted),
        "profiler": lambda: _profiled(args.steps, False),
        "profiler+memory": lambda: _profiled(args.steps, True),
    }
    results: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            results[name].append(variants[name]())
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    bare = statistics.median(results["bare"])
    print(f"CNN, batch 32, {args.steps} steps per round, {args.rounds} interleaved rounds, median step time:")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"  {name:16} {median * 1e3:8.3f} ms   ({(median / bare - 1) * 100:+6.1f} % vs bare, "
              f"{(median - bare) * 1e3:+.3f} ms)")
    profiler = statistics.median(results["profiler"])
    memory = statistics.median(results["profiler+memory"])
    print(f"profile_memory adds {(memory - profiler) * 1e3:+.3f} ms per window step "
          f"({(memory / profiler - 1) * 100:+.1f} % vs the profiler alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
