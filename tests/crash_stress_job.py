"""One process of the crash stress test (tests/test_crash_stress.py): many short otelprof sessions over a real
PyTorch loop, each ending in a way that once left torch.profiler or the FLOP counter behind.

``python tests/crash_stress_job.py SEED ROUNDS RECORD_DIR``. Each round starts a session with the PyTorch hooks
(the C path when it is built), arms profiling windows as the periodic schedule and captures do, trains a few
steps with evaluation passes in between (eval mode, no_grad), and ends one of these ways, drawn from SEED:

* ``shutdown``: ``otelprof.shutdown()`` on the training thread, a window possibly still running;
* ``thread``: the loop runs on a thread that ends (a window possibly running), then the session shuts down;
* ``foreign``: the loop runs on a thread; the session shuts down from the main thread while that thread is
  mid-window, then the thread trains on a little and ends;
* ``flops``: shutdown right after a window, as the step after it counts FLOPs;
* ``left``: the last round only: the session is left running, the interpreter's exit shuts it down.

After each round the main thread checks that no profiler is enabled on it and that its dispatch-mode stack is
empty, and prints a JSON line of what it did. The test asserts the process exits 0 (a profiler left running
makes it die in torch's teardown: "Requested callback is not found", then SIGSEGV) with a quiet stderr.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from typing import Any

import torch
from torch import nn

import otelprof
from otelprof.integrations import torch as otorch
from otelprof.integrations.torch_profiler import windows

ENDINGS = ("shutdown", "thread", "foreign", "flops")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, eval_every: int, evaluated: list[int],
          midway: threading.Event | None = None, resume: threading.Event | None = None) -> None:
    """``steps`` training steps with an evaluation pass every ``eval_every``, counting its batches in
    ``evaluated``. With ``midway``: set after half the steps, then wait for ``resume`` before the rest."""
    for number in range(steps):
        if midway is not None and resume is not None and number == steps // 2:
            midway.set()
            resume.wait(30)
        model.train()
        x, y = torch.randn(4, 8), torch.randn(4, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (number + 1) % eval_every == 0:
            model.eval()
            with torch.no_grad():
                for _ in range(2):
                    model(torch.randn(4, 8))
                    evaluated[0] += 1
            model.train()


def profiler_left() -> bool:
    """torch.profiler enabled on this thread, or a dispatch mode (a FLOP counter) still pushed."""
    return bool(torch.autograd.profiler._is_profiler_enabled or torch._C._len_torch_dispatch_stack())


def one_round(rng: random.Random, record_dir: str, ending: str) -> dict[str, Any]:
    session = otelprof.init(record_dir=record_dir, system_metrics=False, profile_every=0,
                            metrics_exporters=[], traces_exporters=[], handle_sigterm=False,
                            profile_flops=ending == "flops" or rng.random() < 0.5)
    model, steps, every = Net(), rng.randint(3, 9), rng.randint(2, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    otorch.instrument(model, optimizer)
    if ending == "flops":  # the window ends a step before the last, which counts FLOPs
        start = rng.randint(0, steps - 2)
        length = steps - 1 - start
    else:
        start, length = rng.randint(0, steps - 1), rng.randint(1, 6)
    windows.arm(start, length, trigger="periodic", phase="train")
    if rng.random() < 0.3:
        session.capture(rng.randint(1, 3))
    evaluated = [0]
    if ending in ("shutdown", "flops", "left"):
        train(model, optimizer, steps, every, evaluated)
        if ending != "left":
            otelprof.shutdown()
    elif ending == "thread":
        worker = threading.Thread(target=train, args=(model, optimizer, steps, every, evaluated))
        worker.start()
        worker.join()
        otelprof.shutdown()
    else:  # foreign: shut down from here while the thread is mid-window
        midway, resume = threading.Event(), threading.Event()
        worker = threading.Thread(target=train, args=(model, optimizer, steps, every, evaluated, midway, resume))
        worker.start()
        midway.wait(30)
        otelprof.shutdown()
        resume.set()
        worker.join()
    profiles = []
    if ending != "left":
        otorch.uninstrument()
        path = session.run_dir / "profiles.jsonl" if session.run_dir is not None else None
        if path is not None and path.exists():
            profiles = [json.loads(line) for line in path.read_text().splitlines()]
    return {"ending": ending, "steps": steps, "window": [start, length], "evaluated": evaluated[0],
            "profiles": [[p["start_step"], p["num_steps"], "flops" in p] for p in profiles],
            "left": profiler_left()}


def main() -> None:
    seed, rounds, record_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    rng = random.Random(seed)
    for number in range(rounds):
        ending = "left" if number == rounds - 1 else ENDINGS[(seed + number) % len(ENDINGS)]
        print(json.dumps(one_round(rng, record_dir, ending)), flush=True)


if __name__ == "__main__":
    main()
