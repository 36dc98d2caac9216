"""Per-step time of a torch.compile'd model, bare and instrumented, side by side in one run.

    python benchmarks/compiled_model.py            # ~40 s on a CPU (compiling included)
    python benchmarks/compiled_model.py --quick    # ~15 s
    python benchmarks/compiled_model.py --device cuda   # the same on a GPU

One model (an MLP, batch 64, compiled with inductor's default mode), one otelprof session (recording on, no
system metrics, no periodic windows), compiled and warmed up before anything is timed. Then ``--blocks`` sets of
blocks of ``--steps`` steps: a bare block, an instrumented block (``otelprof.torch.instrument(model=compiled,
optimizer=...)`` before it, ``uninstrument()`` after), and a second bare block (the A/A control: how far two
identical blocks land on the machine), the order rotated from set to set. Each step is timed (on CUDA up to a
``synchronize()`` at its end, in every block). Printed: the median step of each variant over all their steps, the
median of the sets' differences of block medians (instrumented minus bare: the figure, free of the drifts between
sets; bare again minus bare: the noise floor), their quartiles, and the graph breaks and graphs compiled during
the timed part (0 and 0: otelprof changes no guard).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from typing import Any

import torch

import otelprof
from otelprof.integrations import torch as otorch


def make(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    return model, optimizer, x, y


def block(compiled: Any, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, steps: int,
          sync: bool) -> list[float]:
    """``steps`` training steps; each one's seconds."""
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return times


def counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graph_breaks": sum(counters["graph_break"].values()),
            "graphs": int(counters["stats"]["unique_graphs"])}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=30, help="sets of blocks (default 30)")
    parser.add_argument("--steps", type=int, default=50, help="steps per block (default 50)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--quick", action="store_true", help="9 sets of 30-step blocks")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.blocks, args.steps = 9, 30
    if args.device == "cpu":
        torch.set_num_threads(1)
    sync = args.device.startswith("cuda")
    model, optimizer, x, y = make(args.device)
    compiled = torch.compile(model)
    began = time.perf_counter()
    block(compiled, optimizer, x, y, 3, sync)  # compiles
    compile_s = time.perf_counter() - began
    with tempfile.TemporaryDirectory() as directory:
        otelprof.init(record_dir=directory, system_metrics=False, profile_every=0)
        otorch.instrument(model=compiled, optimizer=optimizer)  # warm-up of the instrumented path too
        block(compiled, optimizer, x, y, 20, sync)
        otorch.uninstrument()
        block(compiled, optimizer, x, y, 20, sync)
        before = counts()
        variants = ("bare", "instrumented", "bare again")
        steps: dict[str, list[float]] = {name: [] for name in variants}
        differences: list[float] = []
        controls: list[float] = []
        for pair in range(args.blocks):
            medians = {}
            for variant in variants[pair % 3:] + variants[:pair % 3]:
                if variant == "instrumented":
                    otorch.instrument(model=compiled, optimizer=optimizer)
                times = block(compiled, optimizer, x, y, args.steps, sync)
                if variant == "instrumented":
                    otorch.uninstrument()
                steps[variant].extend(times)
                medians[variant] = statistics.median(times)
            differences.append(medians["instrumented"] - medians["bare"])
            controls.append(medians["bare again"] - medians["bare"])
        after = counts()
        otelprof.shutdown()
    bare_s, inst_s = statistics.median(steps["bare"]), statistics.median(steps["instrumented"])
    difference, control = statistics.median(differences), statistics.median(controls)
    quartiles = statistics.quantiles(differences, n=4) if len(differences) > 1 else [difference] * 3
    control_quartiles = statistics.quantiles(controls, n=4) if len(controls) > 1 else [control] * 3
    result = {"device": args.device, "torch": torch.__version__, "sets": args.blocks, "steps_per_block": args.steps,
              "compile_s": compile_s, "bare_step_s": bare_s, "instrumented_step_s": inst_s,
              "difference_s": difference, "difference_share": difference / bare_s,
              "difference_quartiles_s": [quartiles[0], quartiles[2]], "control_s": control,
              "control_share": control / bare_s, "control_quartiles_s": [control_quartiles[0], control_quartiles[2]],
              "graph_breaks": after["graph_breaks"] - before["graph_breaks"],
              "new_graphs": after["graphs"] - before["graphs"]}
    print(f"compiled model on {args.device} (torch {torch.__version__}): compiled in {compile_s:.1f} s; "
          f"{args.blocks} sets of {args.steps}-step blocks, interleaved")
    print(f"  bare          median step {bare_s * 1e6:9.1f} us")
    print(f"  instrumented  median step {inst_s * 1e6:9.1f} us")
    print(f"  difference    {difference * 1e6:+.1f} us ({difference / bare_s:+.2%}) per step, median of the sets "
          f"(quartiles {quartiles[0] * 1e6:+.1f} .. {quartiles[2] * 1e6:+.1f} us)")
    print(f"  A/A control   {control * 1e6:+.1f} us ({control / bare_s:+.2%}) bare again - bare "
          f"(quartiles {control_quartiles[0] * 1e6:+.1f} .. {control_quartiles[2] * 1e6:+.1f} us)")
    print(f"  while timed: {result['graph_breaks']} graph breaks, {result['new_graphs']} graphs compiled")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
