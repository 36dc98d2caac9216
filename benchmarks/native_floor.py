"""The floor of hook cost on the training thread: hooks that only write timestamps into a native buffer.

    python benchmarks/native_floor.py               # CNN, 200 rounds, ~8 minutes
    python benchmarks/native_floor.py --rounds 20   # ~30 s, rough

otelprof's PyTorch integration costs the benchmark CNN more in wall time than its instruction count says
(``instructions.py --cache``: the hooks' code and objects are fetched again from L3 or memory at every hook,
because the kernels in between push them out of the core's caches). This measures what the same four hook
points cost when each hook touches no Python object at all: ``native_floor.c`` (compiled here with the C
compiler Python was built with) writes an event code and a ``CLOCK_MONOTONIC`` timestamp into one
preallocated array around the data loader's ``next()``, the model's ``forward``, ``Tensor.backward`` and
``optimizer.step()`` (its step pre- and post-hooks), the same points otelprof hooks. No steps are assembled,
nothing is recorded: the part of the cost that a hot path shaped that way would leave on the training thread.

The same four points in ``otelprof/integrations/_torch_native.c``, otelprof's C hooks, keep a step's
timestamps, batch size, loss and learning rate in C and leave building its record to the recorder (this
harness first prototyped that as a "native step records" variant, now that file's job).

Rounds of five 50-step blocks on one model, in an order rotated each round: bare, bare again (the A/A
control: how far two identical blocks land here), native timestamps, ``otelprof.torch.instrument`` (its hooks
in C) and the same with its Python hooks (whose background recorder processes the previous recording block's records
during each such block, and whatever it has not finished is counted in that block, as in
``torch_integration.py``'s paired blocks).
Each variant's figure is the median over rounds of its block's mean step minus the same round's bare block.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).parent))
import torch_integration as ti

import otelprof
from otelprof.integrations import torch as otorch

FETCH, FORWARD, BACKWARD, OPTIMIZER = 0, 2, 4, 6
"""Event codes: a region's begin; its end is the code + 1."""
EVENTS_PER_STEP = 8
VARIANTS = ("bare again", "native timestamps", "otelprof", "otelprof, Python hooks")
BLOCK_STEPS = 50


def build(out: Path) -> ModuleType:
    """Compile ``native_floor.c`` into ``out`` and import it."""
    source = Path(__file__).with_name("native_floor.c")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        raise SystemExit(f"C compiler {compiler!r} not found: this benchmark builds native_floor.c "
                         "(Debian: apt-get install gcc python3-dev)")
    target = out / f"native_floor{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [compiler, "-O2", "-shared", "-fPIC", "-Wall", f"-I{sysconfig.get_paths()['include']}",
               str(source), "-o", str(target)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"building native_floor.c failed:\n{' '.join(command)}\n{done.stderr}")
    spec = importlib.util.spec_from_file_location("native_floor", target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HookPoints:
    """Hooks at the four points ``otelprof.torch.instrument`` hooks: the model's ``forward`` (through a subclass)
    and ``Tensor.backward`` replaced by what ``timed(original)`` makes of them, data-loader iterators wrapped by
    ``iterate``, and the optimizer's step pre- and post-hooks."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 forward: Callable[[Any], Any], backward: Callable[[Any], Any], iterate: Callable[[Any], Any],
                 pre_hook: Any, post_hook: Any) -> None:
        self.model, self.optimizer = model, optimizer
        self.forward, self.backward, self.iterate = forward, backward, iterate
        self.pre_hook, self.post_hook = pre_hook, post_hook
        self._undo: list[Callable[[], None]] = []

    def install(self) -> None:
        cls = type(self.model)
        self.model.__class__ = type(cls.__name__, (cls,), {"forward": self.forward(cls.forward)})
        backward = torch.Tensor.backward
        torch.Tensor.backward = self.backward(backward)  # type: ignore[method-assign]
        loader_iter, iterate = DataLoader.__iter__, self.iterate
        DataLoader.__iter__ = lambda loader: iterate(loader_iter(loader))  # type: ignore[method-assign]
        handles = [self.optimizer.register_step_pre_hook(self.pre_hook),
                   self.optimizer.register_step_post_hook(self.post_hook)]

        def undo() -> None:
            self.model.__class__ = cls
            torch.Tensor.backward = backward  # type: ignore[method-assign]
            DataLoader.__iter__ = loader_iter  # type: ignore[method-assign]
            for handle in handles:
                handle.remove()

        self._undo.append(undo)

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


def timestamp_hooks(native: ModuleType, log: Any, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer) -> HookPoints:
    """Each point a native timestamp pair in ``log`` (``native_floor.Log``)."""
    return HookPoints(model, optimizer, lambda original: native.Timer(log, FORWARD, original),
                      lambda original: native.Timer(log, BACKWARD, original),
                      lambda iterator: native.TimedIterator(log, FETCH, iterator),
                      native.Hook(log, OPTIMIZER), native.Hook(log, OPTIMIZER + 1))


def measure(native: ModuleType, rounds: int, classify: bool, make: Callable[[], Any]) -> dict[str, list[float]]:
    """Per round, the bare block's mean step and each variant's mean step minus it (µs), in rotated order."""
    model, optimizer, loader = make()
    ti.run_loop(model, optimizer, loader, ti.WARMUP, classify)
    log = native.Log()
    hooks = timestamp_hooks(native, log, model, optimizer)
    added: dict[str, list[float]] = {v: [] for v in VARIANTS}
    steps: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        otelprof.init(record_dir=tmp, system_metrics=False, flush_interval=10.0)
        recorder = otelprof.runtime.session.get_session().recorder  # type: ignore[union-attr]

        def block(variant: str) -> float:
            recording = variant.startswith("otelprof")
            if variant == "native timestamps":
                hooks.install()
            elif recording:
                with ti.hooks_of(variant):
                    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
            ti.run_loop(model, optimizer, loader, 2, classify)  # the first iteration with fresh hooks, untimed
            log.take()
            if recording:
                recorder.wake_up()
            seconds = ti.run_loop(model, optimizer, loader, BLOCK_STEPS, classify)
            if recording:
                waited = time.perf_counter()
                with recorder._drain_lock:  # the previous block's records: counted here, not in the next block
                    seconds += time.perf_counter() - waited
            if recording:
                otorch.uninstrument()
            elif variant == "native timestamps":
                hooks.remove()
                events = log.count
                if events != EVENTS_PER_STEP * BLOCK_STEPS:
                    raise SystemExit(f"native hooks logged {events} events in {BLOCK_STEPS} steps, expected "
                                     f"{EVENTS_PER_STEP * BLOCK_STEPS}: a hook point was missed")
            return seconds / BLOCK_STEPS * 1e6

        order = ["bare", *VARIANTS]
        try:
            for _ in range(2):  # warm every variant
                for variant in order:
                    block(variant)
            for i in range(rounds):
                shift = i % len(order)
                timed = {variant: block(variant) for variant in order[shift:] + order[:shift]}
                steps.append(timed["bare"])
                for variant in VARIANTS:
                    added[variant].append(timed[variant] - timed["bare"])
                if (i + 1) % 20 == 0:
                    print(f"  {i + 1}/{rounds} rounds", file=sys.stderr, flush=True)
        finally:
            hooks.remove()
            otorch.uninstrument()
            otelprof.shutdown()
    return {"bare step": steps, **added}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200, help="rounds of the five blocks (default 200)")
    parser.add_argument("--loop", choices=("cnn", "tiny"), default="cnn", help="the training loop (default cnn)")
    parser.add_argument("--no-malloc-pin", action="store_true", help="leave glibc malloc's thresholds alone")
    args = parser.parse_args()
    if not args.no_malloc_pin:
        ti.pin_malloc()
    torch.set_num_threads(1)
    make, classify = (ti.make_cnn, True) if args.loop == "cnn" else (ti.make_tiny, False)
    with tempfile.TemporaryDirectory() as build_dir:
        native = build(Path(build_dir))
        print(f"{args.loop} loop: {args.rounds} rounds of {1 + len(VARIANTS)} x {BLOCK_STEPS}-step blocks",
              file=sys.stderr, flush=True)
        result = measure(native, args.rounds, classify, make)
    step = statistics.median(result["bare step"])
    print(f"\n{args.loop} loop, bare step {step:,.0f} us (median of {args.rounds} rounds)")
    print(f"  {'added per step':<20} {'median':>9} {'quartiles':>20} {'of the step':>12}")
    for variant in VARIANTS:
        values = result[variant]
        q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
        median = statistics.median(values)
        print(f"  {variant:<20} {median:>+8.1f}us {f'{q1:+.1f}..{q3:+.1f}':>20} {median / step * 100:>+11.2f}%")


if __name__ == "__main__":
    main()
