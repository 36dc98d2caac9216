"""Machine instructions the PyTorch integration adds per step, counted by callgrind (valgrind).

    python benchmarks/instructions.py    # CNN and tiny loops, bare / C hooks / Python hooks / torch.profiler, ~20 min
    python benchmarks/instructions.py --only cnn --steps 30 --keep dumps/   # callgrind_annotate dumps/cnn-bare.1
    python benchmarks/instructions.py --only cnn --cache   # and the cache misses they add, ~20 min on 2 cores

Wall-clock figures (``torch_integration.py``) move with the machine: on a shared 2-core VM two identical
blocks of CNN steps land a few percent apart, more than the 1 % being measured. An instruction count does
not: callgrind counts every instruction every thread executes, the same total for the same program and
input whatever else the machine is doing. It does not see time (cache misses, the GIL, kernels' memory
stalls), so it is a floor of the cost, not the cost: the work added, as a share of the work a step does.

Each variant runs in its own process under ``valgrind --tool=callgrind`` with instrumentation off while
torch imports and the loop warms up; the child then switches counting on (``callgrind_control -i on``) and
brackets what it measures with two calls that callgrind is told to act on: ``os.getppid()`` zeroes the
counters (``--zero-before=getppid``) and ``os.getloadavg()`` writes them out (``--dump-before=getloadavg``).
Two brackets per run: the training loop (``steps`` steps, on the training thread), then the recorder
processing those steps' records (``Recorder.drain`` on the same thread, the background thread stopped, so
that both are counted once and apart). Span selection is made deterministic (no first-steps tracing, no
span budget, no outliers): under valgrind a step takes ~50x longer and its timing would decide which steps
become spans; the recorder's figure is the cost of a step that is not traced, the default's common case.

Variants: ``bare`` (the loop alone), ``instrumented`` (``otelprof.torch.instrument(model, optimizer,
dataloader)``: auto steps, the dataloader / forward / backward / optimizer regions, loss, lr, samples; its
hooks in C where the extension is built), ``Python hooks`` (the same with the Python hooks), and
``torch.profiler`` (the loop inside ``torch.profiler.profile(activities=[CPU])``, started before the bracket).

``--cache`` also simulates the caches of one core (``CACHE``: 32 KB L1 instruction and data caches, and a
512 KB last level, the size of one core's L2 on the machine this was written on; 8-way, 64-byte lines) and
reports the misses added per step: L1 instruction misses, and misses of the 512 KB level (instructions and
data), each of which goes to the shared L3 or to memory. That is what makes an instruction of a hook cost
more than an instruction of a kernel: between two hooks the CNN's tensors stream through the caches, so the
interpreter's code and objects are fetched again at every hook. Callgrind models no prefetcher, so the
kernels' own (streaming, prefetched) misses are overcounted; the hooks' (scattered) are not.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

VARIANTS = ("bare", "instrumented", "Python hooks", "torch.profiler")
LOOPS = ("cnn", "tiny")
CACHE = ["--cache-sim=yes", "--I1=32768,8,64", "--D1=32768,8,64", "--LL=524288,8,64"]
"""``--cache``: one core's caches, as callgrind's I1, D1 and last level (LL)."""
STEPS = {"cnn": 100, "tiny": 1000}
"""Counted steps per run: enough that the cyclic garbage collector's passes (about one per 100 CNN steps) are
averaged over the steps rather than falling in or out of a short run."""


def child(loop: str, variant: str, steps: int) -> None:
    """Runs under callgrind: set up, warm up, then the two counted brackets (see the module docstring)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    import torch_integration as ti

    import otelprof
    from otelprof.integrations import torch as otorch

    torch.set_num_threads(1)
    make, classify = (ti.make_cnn, True) if loop == "cnn" else (ti.make_tiny, False)
    model, optimizer, loader = make()
    ti.run_loop(model, optimizer, loader, 5, classify)
    otelprof.init(record_dir=tempfile.mkdtemp(), system_metrics=False, flush_interval=10.0,
                  span_first_steps=0, span_budget=0.0, outlier_sigma=100.0)
    session = otelprof.runtime.session.get_session()
    recorder = session.recorder  # type: ignore[union-attr]
    session._stop.set()  # type: ignore[union-attr]  # the background thread ends: drains happen below only
    recorder.wake_up()
    if variant in ("instrumented", "Python hooks"):
        with ti.hooks_of(variant):
            otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    elif variant == "torch.profiler":  # entered and never left: the process ends with os._exit below
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        profiler.__enter__()
    ti.run_loop(model, optimizer, loader, ti.WARMUP, classify)  # first calls, lazy set-up: not counted
    recorder.drain()
    gc.collect()  # every variant starts the bracket with the collector in the same state
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=False, capture_output=True)
    os.getppid()  # zero
    ti.run_loop(model, optimizer, loader, steps, classify)
    os.getloadavg()  # dump 1: the training loop
    os.getppid()  # zero
    recorder.drain()
    os.getloadavg()  # dump 2: the recorder's work for those steps
    os._exit(0)  # no shutdown, no profiler export: nothing after the brackets is counted


Counts = dict[str, int]
"""Callgrind's totals by event: ``Ir`` (instructions), and with ``--cache`` ``I1mr`` (L1 instruction misses),
``ILmr``, ``DLmr``, ``DLmw`` (last-level misses: instruction fetches, data reads, data writes), and more."""


def count(loop: str, variant: str, steps: int, out: Path, cache: bool) -> tuple[Counts, Counts]:
    """Callgrind's totals for the training loop and for the recorder's drain, for ``steps`` steps."""
    prefix = out / f"{loop}-{re.sub(r'[^a-z]+', '_', variant.lower())}"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--zero-before=getppid",
               "--dump-before=getloadavg", *(CACHE if cache else []), f"--callgrind-out-file={prefix}",
               sys.executable, __file__, "--child", loop, variant, str(steps)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    totals = []
    for part in (1, 2):
        dump = Path(f"{prefix}.{part}")
        text = dump.read_text() if dump.exists() else ""
        events = re.search(r"^events:\s*(.+)$", text, re.M)
        summary = re.search(r"^summary:\s*(.+)$", text, re.M)
        if events is None or summary is None:
            raise SystemExit(f"{loop} {variant}: no callgrind dump {dump} (valgrind said:\n{done.stderr[-2000:]})")
        totals.append(dict(zip(events.group(1).split(), map(int, summary.group(1).split()))))
    return totals[0], totals[1]


def l2_misses(counts: Counts) -> int:
    """Misses of the simulated last level (one core's L2 under ``--cache``): instruction and data."""
    return counts.get("ILmr", 0) + counts.get("DLmr", 0) + counts.get("DLmw", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=LOOPS, help="run one of the two loops")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"counted steps per run (default {STEPS['cnn']} CNN, {STEPS['tiny']} tiny)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="valgrind runs at once")
    parser.add_argument("--keep", metavar="DIR", help="keep callgrind's dumps in DIR (for callgrind_annotate)")
    parser.add_argument("--cache", action="store_true",
                        help="also simulate one core's caches and report the misses added per step (slower)")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help="comma-separated variants to count (default all; bare is always counted)")
    parser.add_argument("--child", nargs=3, metavar=("LOOP", "VARIANT", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: install valgrind (Debian: apt-get install valgrind)")
    from torch_integration import MALLOC_PINS

    os.environ.update(MALLOC_PINS)  # the same allocator behaviour as the wall-clock benchmark
    loops = [args.only] if args.only else list(LOOPS)
    chosen = ["bare", *(v for v in VARIANTS[1:] if v in args.variants.split(","))]
    runs = [(loop, variant) for loop in loops for variant in chosen]
    steps = {loop: args.steps or STEPS[loop] for loop in loops}
    minutes = "4-8" if args.cache else "2-4"
    print(f"{len(runs)} callgrind runs, {args.jobs} at a time ({minutes} min each)", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(args.jobs) as pool:
        out = Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        results = dict(zip(runs, pool.map(lambda run: count(run[0], run[1], steps[run[0]], out, args.cache), runs)))
    for loop in loops:
        n = steps[loop]
        bare_loop = results[(loop, "bare")][0]
        bare = bare_loop["Ir"] / n
        print(f"\n{loop} loop: {bare:,.0f} instructions per bare step ({n} steps counted)")
        header = f"  {'variant':<16} {'training thread':>16} {'recorder':>10} {'added':>10} {'share':>8}"
        if args.cache:
            l1i, l2 = bare_loop["I1mr"] / n, l2_misses(bare_loop) / n
            print(f"  bare step's simulated misses: {l1i:,.0f} L1i, {l2:,.0f} L2 (streaming kernels' overcounted)")
            header += f" {'+L1i misses':>12} {'+L2 misses':>11}"
        print(header)
        for variant in chosen[1:]:
            loop_counts, drain_counts = results[(loop, variant)]
            thread = loop_counts["Ir"] / n - bare
            recorder = drain_counts["Ir"] / n
            added = thread + recorder
            line = f"  {variant:<16} {thread:>+16,.0f} {recorder:>10,.0f} {added:>+10,.0f} {added / bare * 100:>+7.2f}%"
            if args.cache:  # the training thread's: the recorder runs on another core, with its own L1 and L2
                line += f" {(loop_counts['I1mr'] - bare_loop['I1mr']) / n:>+12,.0f}"
                line += f" {(l2_misses(loop_counts) - l2_misses(bare_loop)) / n:>+11,.0f}"
            print(line)

if __name__ == "__main__":
    main()
