"""Cost of the PyTorch integration per step, side by side with bare torch.profiler.

    python benchmarks/torch_integration.py           # ~6 minutes
    python benchmarks/torch_integration.py --paired-only --only cnn --repeat 3   # the goal's figure, ~10 minutes
    python benchmarks/torch_integration.py --paired-only --only cnn --parts   # and where it goes, ~6 minutes
    python benchmarks/torch_integration.py --quick   # ~40 s

Variants, interleaved in one process (order rotated each round), medians of per-round figures:

* bare, bare again    — the loop alone, twice: the second shows how far two identical loops differ
                        here (the noise floor of every other row);
* instrumented        — ``otelprof.torch.instrument(model, optimizer, dataloader)``: auto steps and the
                        dataloader / forward / backward / optimizer regions, loss, lr, samples;
* + grad_norm         — the same with the global gradient norm;
* profiling window    — instrumented, with an otelprof window (torch.profiler) over 5 of the round's steps;
* torch.profiler      — the loop inside ``torch.profiler.profile`` (CPU activities), for comparison.

Then, per loop, paired blocks (the figure for the goal): one model and one session, a bare block, an
instrumented block (the hooks in C where the extension is built) and one instrumented with the Python
hooks (``instrument`` / ``uninstrument`` in between) 100 times, the order permuted each time,
with the background recorder processing the previous instrumented block's records during each
instrumented block; the median of the adjacent blocks' differences is the steady-state cost, free of the
drifts between separate rounds; an A/A run of the same shape (both blocks bare) shows how far apart two
identical blocks land on the machine. glibc malloc's thresholds are pinned for the run (``MALLOC_PINS``;
``--no-malloc-pin`` leaves them). ``--parts`` splits the CNN's training-thread cost (see :func:`parts`).

Every variant gets its own fresh model and runs ``WARMUP`` steps after ``init()`` before the timed
steps: the one-time work (threads starting, the first steps traced as spans, torch.profiler's set-up)
is reported separately as "start-up", so that "added per step" is the steady-state cost.

Two loops: the small CNN (batch 32 of 1x28x28, torch threads = 1) where the goal is <= 1 % of the step,
and a tiny Linear(8, 8) model whose steps are short enough that the integration's fixed cost per step
shows in microseconds; that cost does not grow with the model (one hook per region, not per layer), so
its share of the CNN step is also given ("fixed cost / CNN step").
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
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


LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_function(classify: bool) -> LossFn:
    return torch.nn.functional.cross_entropy if classify else torch.nn.functional.mse_loss


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn, x: torch.Tensor,
               y: torch.Tensor) -> None:
    loss = loss_fn(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def cnn_step() -> tuple[Callable[[], None], torch.nn.Module, torch.optim.Optimizer]:
    """One training step of the CNN as a call, cycling over 4 batches held in memory (no data loader)."""
    model, optimizer, loader = make_cnn()
    batches = [batch for batch, _ in zip(loader, range(4))]
    state = {"i": 0}

    def step() -> None:
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        train_step(model, optimizer, torch.nn.functional.cross_entropy, x, y)

    return step, model, optimizer


def run_loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any], steps: int,
             classify: bool) -> float:
    """Seconds for ``steps`` training steps."""
    loss_fn = loss_function(classify)
    done = 0
    began = time.perf_counter()
    while done < steps:
        for x, y in loader:
            train_step(model, optimizer, loss_fn, x, y)
            done += 1
            if done >= steps:
                break
    return time.perf_counter() - began


WARMUP = 20
"""Steps after start-up and before the timing (more than the 10 first steps that become spans)."""


def variant(name: str, make: Callable[[], Any], steps: int, classify: bool, record_dir: str) -> tuple[float, float]:
    """(seconds for ``steps`` timed steps, seconds of start-up: init + warm-up steps - bare warm-up)."""
    model, optimizer, loader = make()
    bare_warmup = run_loop(model, optimizer, loader, WARMUP, classify)  # torch's own warm-up, and a yardstick
    began = time.perf_counter()
    if name.startswith("bare"):
        run_loop(model, optimizer, loader, WARMUP, classify)
        startup = time.perf_counter() - began - bare_warmup
        return run_loop(model, optimizer, loader, steps, classify), startup
    if name == "torch.profiler":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]):
            run_loop(model, optimizer, loader, WARMUP, classify)
            startup = time.perf_counter() - began - bare_warmup
            return run_loop(model, optimizer, loader, steps, classify), startup
    otelprof.init(record_dir=record_dir, system_metrics=False)
    try:
        inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader,
                                 grad_norm=(name == "+ grad_norm"))
        run_loop(model, optimizer, loader, WARMUP, classify)
        startup = time.perf_counter() - began - bare_warmup
        if name == "profiling window":
            inst.profile_window(WARMUP + steps // 2, 5)
        return run_loop(model, optimizer, loader, steps, classify), startup
    finally:
        otorch.uninstrument()
        otelprof.shutdown()


VARIANTS = ("bare", "bare again", "instrumented", "+ grad_norm", "profiling window", "torch.profiler")


def measure(make: Callable[[], Any], steps: int, rounds: int, classify: bool) -> dict[str, dict[str, float]]:
    per_round: dict[str, list[float]] = {v: [] for v in VARIANTS}
    startups: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[: r % len(VARIANTS)]
            times = {v: variant(v, make, steps, classify, tmp) for v in order}
            for v in VARIANTS:
                per_round[v].append(times[v][0])
                startups[v].append(times[v][1])
    bare = per_round["bare"]
    results = {}
    for v in VARIANTS:
        ratios = [t / b for t, b in zip(per_round[v], bare)]
        added = sorted((t - b) / steps * 1e6 for t, b in zip(per_round[v], bare))
        results[v] = {"step_us": statistics.median(per_round[v]) / steps * 1e6,
                      "ratio": statistics.median(ratios), "added_us": statistics.median(added),
                      "added_q1_us": added[len(added) // 4], "added_q3_us": added[(3 * len(added)) // 4],
                      "startup_ms": statistics.median(startups[v]) * 1e3}
    return results


PAIRED = ("bare", "instrumented", "instrumented, Python hooks")
"""The paired blocks: the loop alone, instrumented (the hooks in C where the extension is built), and
instrumented with the Python hooks (``OTELPROF_TORCH_NATIVE=false``)."""
CONTROL = ("bare", "bare again")


@contextlib.contextmanager
def hooks_of(kind: str) -> Iterator[None]:
    """``instrument()`` calls inside get the Python hooks for ``kind`` "..., Python hooks"."""
    saved = otorch._native
    if kind.endswith("Python hooks"):
        otorch._native = None
    try:
        yield
    finally:
        otorch._native = saved


def paired(make: Callable[[], Any], pairs: int, block_steps: int, classify: bool,
           kinds: tuple[str, ...] = PAIRED) -> dict[str, dict[str, float]]:
    """Steady-state cost from adjacent blocks of one model and one session: a bare block and an instrumented
    one of each other kind (``instrument`` / ``uninstrument`` in between, untimed), ``pairs`` times, the
    order permuted every time. Adjacent blocks share the machine's state, so their difference cancels the
    slow drifts that separate rounds cannot.

    The recorder works as in a real run, on its background thread and in batches, and its cost lands in
    the instrumented blocks: at the start of each one it is woken to process the records of the previous
    instrumented block while this one runs (what it does every flush interval during training), whatever
    of that it has not finished when the block ends is waited for and counted in the block, and it has
    nothing to do during bare blocks. Each block's figure is its mean step (so rare slow steps count);
    the result, per kind, is the median of the differences to the bare block of the same set, with their
    quartiles and mean. ``kinds`` :data:`CONTROL`: both blocks bare (an A/A run: how far apart two identical
    blocks land here)."""
    model, optimizer, loader = make()
    run_loop(model, optimizer, loader, WARMUP, classify)
    orders = list(itertools.permutations(kinds))
    with tempfile.TemporaryDirectory() as tmp:
        # Only the wake-ups below start processing (the flush interval's own drains, at most every 10 s, could
        # otherwise process an instrumented block's records during the bare block after it).
        otelprof.init(record_dir=tmp, system_metrics=False, flush_interval=10.0)
        recorder = otelprof.runtime.session.get_session().recorder  # type: ignore[union-attr]

        def block(kind: str) -> float:
            instrumented = not kind.startswith("bare")
            if instrumented:
                with hooks_of(kind):
                    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
            run_loop(model, optimizer, loader, 2, classify)  # the first iteration with fresh hooks, untimed
            if instrumented:
                recorder.wake_up()
            seconds = run_loop(model, optimizer, loader, block_steps, classify)
            if instrumented:
                # The previous block's records must be processed by now, not during the next (bare) block:
                # what the recorder has not finished is waited for and counted in this block.
                waited = time.perf_counter()
                with recorder._drain_lock:
                    seconds += time.perf_counter() - waited
            otorch.uninstrument()
            return seconds / block_steps * 1e6

        differences: dict[str, list[float]] = {kind: [] for kind in kinds[1:]}
        bare_steps = []
        try:
            for order in orders[:3]:  # warm every side
                for kind in order:
                    block(kind)
            for i in range(pairs):
                times = {kind: block(kind) for kind in orders[i % len(orders)]}
                for kind in kinds[1:]:
                    differences[kind].append(times[kind] - times["bare"])
                bare_steps.append(times["bare"])
        finally:
            otelprof.shutdown()
    step = statistics.median(bare_steps)
    results = {}
    for kind, added in differences.items():
        added.sort()
        results[kind] = {"step_us": step, "added_us": statistics.median(added), "mean_us": statistics.mean(added),
                         "added_q1_us": added[len(added) // 4], "added_q3_us": added[(3 * len(added)) // 4],
                         "share": statistics.median(added) / step}
    return results


PARTS = ("bare again", "empty torch hooks", "otelprof inactive", "otelprof, training thread",
         "otelprof, training thread, Python hooks")


def parts(make: Callable[[], Any], pairs: int, block_steps: int, classify: bool) -> dict[str, dict[str, float]]:
    """Where the training thread's added time goes, as medians of single steps (rare slow steps and the
    recorder's batches do not count here; :func:`paired` has those): blocks of ``block_steps`` steps
    alternate between bare and one of :data:`PARTS`, each step timed, the first two of a block left out.

    * bare again — the A/A control;
    * empty torch hooks — a forward pre-hook and hook doing nothing on the model: torch's own slower
      module call once a module has hooks (no otelprof);
    * otelprof inactive — ``instrument(model, optimizer, dataloader)`` with the session switched off on
      the hot path: every hook runs and returns at its first check;
    * otelprof, training thread — instrumented and active; the records are processed between blocks,
      untimed (the recorder's share is the difference to :func:`paired`);
    * otelprof, training thread, Python hooks — the same with the Python hooks (no C extension)."""
    from otelprof.runtime import hotpath

    model, optimizer, loader = make()
    loss_fn = loss_function(classify)
    run_loop(model, optimizer, loader, WARMUP, classify)
    added: dict[str, tuple[list[float], list[float]]] = {part: ([], []) for part in PARTS}
    with tempfile.TemporaryDirectory() as tmp:
        otelprof.init(record_dir=tmp, system_metrics=False, flush_interval=10.0)
        recorder = otelprof.runtime.session.get_session().recorder  # type: ignore[union-attr]

        def block(part: str | None) -> list[float]:
            handles = []
            active = hotpath._active
            if part == "empty torch hooks":
                handles = [model.register_forward_pre_hook(lambda m, a: None),
                           model.register_forward_hook(lambda m, a, o: None)]
            elif part is not None and part.startswith("otelprof"):
                with hooks_of(part):
                    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
                if part == "otelprof inactive":
                    hotpath._active = None
            batches = iter(loader)
            times = []
            for _ in range(block_steps):
                began = time.perf_counter()
                train_step(model, optimizer, loss_fn, *next(batches))
                times.append(time.perf_counter() - began)
            hotpath._active = active
            for handle in handles:
                handle.remove()
            otorch.uninstrument()
            recorder.drain()
            return times[2:]

        try:
            for i in range(pairs):
                for part in PARTS:
                    order = (None, part) if i % 2 else (part, None)
                    timed = {p: block(p) for p in order}
                    added[part][0].extend(timed[None])
                    added[part][1].extend(timed[part])
        finally:
            otelprof.shutdown()
    med = statistics.median
    return {part: {"step_us": med(bare) * 1e6, "added_us": (med(other) - med(bare)) * 1e6}
            for part, (bare, other) in added.items()}


MALLOC_PINS = {"MALLOC_MMAP_THRESHOLD_": str(16 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
"""glibc malloc settings for the whole run. By default glibc hands the CNN's activation buffers back to the
system and faults them in again, a different number of pages each block (thousands per 50 steps here), which
doubles the spread of an A/A comparison; pinned, every block runs with the same allocator behaviour (what
jemalloc or tcmalloc, which PyTorch's tuning guide recommends, also give)."""


def pin_malloc() -> None:
    """Re-run this process with :data:`MALLOC_PINS` in its environment (glibc reads them at start)."""
    if all(os.environ.get(k) == v for k, v in MALLOC_PINS.items()):
        return
    env = {**os.environ, **MALLOC_PINS}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def record_cost(calls: int = 20000, repeats: int = 15) -> dict[str, dict[str, float]]:
    """``otelprof.record(name, value)`` inside a step, per call on the training thread: as it is (the value at the
    call: a CPU tensor's ``item()`` now) and with the value kept as given (before: ``item()`` on the recorder's
    thread, after the loop may have changed the tensor). Medians of ``repeats`` timings of ``calls`` calls."""
    from otelprof.runtime import hotpath

    values = {"float": 0.5, "CPU tensor": torch.tensor(0.5),
              "CPU tensor, requires_grad": torch.tensor(0.5, requires_grad=True) * 2.0}
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        otelprof.init(record_dir=tmp, system_metrics=False, flush_interval=10.0)
        kept = hotpath._value_now
        try:
            for label, value in values.items():
                figures = {}
                for mode, freeze in (("as given", lambda v: v), ("value at the call", kept)):
                    hotpath._value_now = freeze
                    times = []
                    with otelprof.step():
                        for _ in range(repeats):
                            start = time.perf_counter_ns()
                            for _ in range(calls):
                                otelprof.record("running_loss", value)
                            times.append((time.perf_counter_ns() - start) / calls / 1000)
                    figures[mode] = statistics.median(times)
                figures["added"] = figures["value at the call"] - figures["as given"]
                out[label] = figures
        finally:
            hotpath._value_now = kept
            otelprof.shutdown()
    return out


def summarise(runs: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per kind, the median and range over runs of the runs' median added time and share of the step, the median
    bare step, and the range of the load average (1 min) at the runs' starts."""
    summary = {}
    for kind, results in runs.items():
        added = [r["added_us"] for r in results]
        shares = [r["share"] for r in results]
        loads = [r["load"] for r in results]
        summary[kind] = {"added_us": statistics.median(added), "added_min_us": min(added), "added_max_us": max(added),
                         "share": statistics.median(shares), "share_min": min(shares), "share_max": max(shares),
                         "step_us": statistics.median(r["step_us"] for r in results), "runs": len(results),
                         "load_min": min(loads), "load_max": max(loads)}
    return summary


def commit() -> str:
    """The checked-out commit the figures were measured on (``+`` when the tree has changes), or "unknown"."""
    import subprocess

    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--only", choices=("cnn", "tiny"), help="run one of the two loops")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per loop (default 11, --quick 3)")
    parser.add_argument("--pairs", type=int, default=None, help="paired blocks per loop (default 100, --quick 6)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the paired blocks and their A/A control this many times: median and range over runs")
    parser.add_argument("--paired-only", action="store_true", help="skip the rounds table (variants side by side)")
    parser.add_argument("--parts", action="store_true",
                        help="also split the CNN's training-thread cost into parts (per-step medians, ~2 minutes)")
    parser.add_argument("--no-malloc-pin", action="store_true",
                        help="leave glibc malloc's thresholds alone (the A/A spread about doubles)")
    parser.add_argument("--record", action="store_true",
                        help="only the cost of otelprof.record() of a float and of a CPU tensor per call (~10 s)")
    args = parser.parse_args()
    if args.record:
        torch.set_num_threads(1)
        print("otelprof.record() inside a step, per call (medians): the value at the call vs the value as given")
        for label, figures in record_cost().items():
            print(f"  {label:<26} {figures['value at the call']:6.2f}us  (as given {figures['as given']:.2f}us, "
                  f"added {figures['added']:+.2f}us)")
        return
    if not args.no_malloc_pin:
        pin_malloc()
    torch.set_num_threads(1)
    rounds = args.rounds or (3 if args.quick else 11)
    out: dict[str, Any] = {}
    if args.only != "tiny" and not args.paired_only:
        out["cnn"] = measure(make_cnn, 60 if args.quick else 300, rounds, True)
    if args.only != "cnn" and not args.paired_only:
        out["tiny"] = measure(make_tiny, 600 if args.quick else 3000, rounds, False)
    for loop, results in out.items():
        print(f"\n{loop} loop ({rounds} rounds, medians; added/step with the rounds' quartiles)")
        print(f"  {'variant':<18} {'step':>10} {'vs bare':>9} {'added/step':>12} {'quartiles':>18} {'start-up':>10}")
        for v, r in results.items():
            print(f"  {v:<18} {r['step_us']:>8.0f}us {(r['ratio'] - 1) * 100:>+8.2f}% {r['added_us']:>+10.1f}us "
                  f"{r['added_q1_us']:>+8.1f}..{r['added_q3_us']:<+8.1f} {r['startup_ms']:>8.1f}ms")
    pairs = args.pairs or (6 if args.quick else 100)
    for loop, make, block_steps, classify in (("cnn", make_cnn, 50, True), ("tiny", make_tiny, 500, False)):
        if args.only not in (None, loop):
            continue
        runs: dict[str, list[dict[str, float]]] = {}
        for run in range(args.repeat):
            for label, kinds in (("paired", PAIRED), ("paired A/A control", CONTROL)):
                load = os.getloadavg()[0]
                results = paired(make, pairs, block_steps, classify, kinds)
                out.setdefault(f"{loop} {label}", []).append(results)
                print(f"\n{loop} loop, {label}, run {run + 1}/{args.repeat} ({pairs} sets of {block_steps}-step "
                      f"blocks: {', '.join(kinds)}; bare step {results[kinds[1]]['step_us']:.0f}us; load {load:.1f})")
                for kind, result in results.items():
                    runs.setdefault("bare again" if label.endswith("control") else kind, []).append(
                        {**result, "load": load})
                    print(f"  {kind:<28} adds {result['added_us']:+7.1f}us (quartiles {result['added_q1_us']:+.1f}.."
                          f"{result['added_q3_us']:+.1f}, mean {result['mean_us']:+.1f}) = "
                          f"{result['share'] * 100:+.2f} % of the step", flush=True)
        out[f"{loop} summary"] = summary = summarise(runs)
        print(f"\n{loop} loop, over {args.repeat} runs (commit {commit()}): median [range] of the runs' medians")
        for kind, f in summary.items():
            print(f"  {kind:<28} {f['added_us']:+7.1f}us [{f['added_min_us']:+.1f}..{f['added_max_us']:+.1f}] = "
                  f"{f['share'] * 100:+.2f} % [{f['share_min'] * 100:+.2f}..{f['share_max'] * 100:+.2f}] of a "
                  f"{f['step_us']:.0f}us step; load {f['load_min']:.1f}..{f['load_max']:.1f}", flush=True)
    if args.parts and args.only in (None, "cnn"):
        pairs = 12 if args.quick else 100
        out["cnn parts"] = split = parts(make_cnn, pairs, 8, True)
        print(f"\ncnn loop, training thread only ({pairs} x {len(PARTS)} pairs of 8-step blocks, medians of steps):")
        for part, r in split.items():
            print(f"  {part:<28} {r['added_us']:+8.1f}us  ({r['added_us'] / r['step_us'] * 100:+.2f} %)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    if "cnn" not in out or "tiny" not in out:
        return
    cnn_step = out["cnn"]["bare"]["step_us"]
    print("\nfixed cost per step (tiny loop) as a share of the CNN step "
          f"({cnn_step:.0f} us): goal instrumented <= 1 %")
    for v in ("instrumented", "+ grad_norm"):
        print(f"  {v:<18} {out['tiny'][v]['added_us'] / cnn_step * 100:>6.2f} %")


if __name__ == "__main__":
    main()
