"""What periodic operator-profiling windows cost, side by side with a bare loop and torch.profiler always on.

    python benchmarks/profile_windows.py            # about a minute on CPU
    python benchmarks/profile_windows.py --rounds 9 --steps 120
    python benchmarks/profile_windows.py --interval 2 --seconds 40 --rounds 5   # the budget over whole runs, ~12 min

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

``--interval S`` measures the budget over whole runs instead: each round runs the same number of steps (about
``--seconds`` of training) three times in one process, in rotated order — a session with periodic windows every
``S`` seconds, and twice a session without windows (the second shows how far two identical runs land: the A/A
spread). The windows' excess over the run without them, the median over rounds, should stay within
``OTELPROF_PROFILE_BUDGET`` plus that spread, whatever ``S``: the schedule stretches the interval to
cost / budget. Printed beside it: the windows run and the cost they recorded as a share of the run.
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
from otelprof.runtime import profile_schedule

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


def _session_run(steps: int, windows: list[dict[str, Any]], every: float, warmup: float, warmup_steps: int,
                 wait_for_window: bool) -> float:
    """Seconds for ``steps`` instrumented steps in a session with windows every ``every`` s (0: none); the
    recorded windows are appended to ``windows``."""
    step, model, optimizer = _parts()
    with tempfile.TemporaryDirectory() as tmp:
        session = otelprof.init(record_dir=tmp, system_metrics=False, profile_warmup=warmup, profile_every=every,
                                profile_warmup_steps=warmup_steps)
        otorch.instrument(model=model, optimizer=optimizer)
        for _ in range(WARMUP_STEPS):
            with otelprof.step():
                step()
        began = time.perf_counter()
        for _ in range(steps):
            with otelprof.step():
                step()
        elapsed = time.perf_counter() - began
        schedule = profile_schedule.of(session)
        deadline = time.monotonic() + 10
        while wait_for_window and schedule is not None and not schedule.windows_run and time.monotonic() < deadline:
            time.sleep(0.05)
        run_dir = session.run_dir
        otelprof.shutdown()
        assert run_dir is not None
        windows.extend(read_recording(run_dir).ranks[0].profiles())
        otorch.uninstrument()
    return elapsed


def _otelprof(steps: int, windows: list[dict[str, Any]], every: float = 600.0) -> float:
    """Seconds per step, with one periodic window after the warm-up steps (none with ``every=0``)."""
    return _session_run(steps, windows, every, 0.0, WARMUP_STEPS + 5, wait_for_window=bool(every)) / steps


def _whole(steps: int, every: float, windows: list[dict[str, Any]]) -> float:
    """Seconds for ``steps`` steps in a session with windows every ``every`` s (0: none)."""
    return _session_run(steps, windows, every, every, WARMUP_STEPS, wait_for_window=False)


def whole(interval: float, seconds: float, rounds: int, budget: float) -> None:
    """The ``--interval`` mode: see the module's docstring."""
    step, _, _ = _parts()
    for _ in range(WARMUP_STEPS):
        step()
    began = time.perf_counter()
    for _ in range(20):
        step()
    steps = max(100, int(seconds / ((time.perf_counter() - began) / 20)))
    names = ["windows", "no-window", "no-window again"]
    results: dict[str, list[float]] = {name: [] for name in names}
    found: list[list[dict[str, Any]]] = []
    for round_ in range(rounds):
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            windows: list[dict[str, Any]] = []
            results[name].append(_whole(steps, interval if name == "windows" else 0.0, windows))
            if name == "windows":
                found.append(windows)
        print(f"round {round_ + 1}/{rounds} done", file=sys.stderr)
    excess = [w / n - 1 for w, n in zip(results["windows"], results["no-window"])]
    spread = [a / n - 1 for a, n in zip(results["no-window again"], results["no-window"])]
    shares = [sum(w.get("overhead_s", 0.0) for w in ws) / t for ws, t in zip(found, results["windows"])]
    counts = [len(ws) for ws in found]
    print(f"CNN, batch 32, {steps} steps per run (~{seconds:.0f} s), windows every {interval:g} s at most, "
          f"budget {budget:.0%}, {rounds} interleaved rounds:")
    print(f"  windows vs no window: median {statistics.median(excess):+.2%} "
          f"[{min(excess):+.2%}..{max(excess):+.2%}]")
    print(f"  A/A (no window twice): median {statistics.median(spread):+.2%} "
          f"[{min(spread):+.2%}..{max(spread):+.2%}]")
    print(f"  windows per run {min(counts)}..{max(counts)}; their recorded cost {statistics.median(shares):.2%} "
          f"of the run (median)")
    bound = budget + max(abs(x) for x in spread)
    verdict = "within" if statistics.median(excess) <= bound else "OVER"
    print(f"  {verdict} the budget plus the A/A spread ({bound:.2%})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--interval", type=float, default=0.0,
                        help="measure whole runs with windows every INTERVAL seconds (see above)")
    parser.add_argument("--seconds", type=float, default=40.0, help="with --interval: each run's length")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.interval > 0:
        whole(args.interval, args.seconds, args.rounds, otelprof.Config.from_env().profile_budget)
        return 0
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
