"""One training process of the verdict suite (tests/test_verdicts.py): a small loop with one injected fault.

``python tests/verdict_job.py KIND STOP_FILE '<json options>'``. otelprof is configured by the environment, as
a deployment configures it (job name, rank, /metrics port, recording directory). The loop prints a JSON line
when otelprof is up (``start``) and one when its fault begins (``onset``, ``onset`` seconds into the loop),
then trains until STOP_FILE exists and shuts otelprof down. (A file, not a closed stdin: a thread blocked
reading stdin holds its lock, and a data-loader worker forked meanwhile deadlocks closing its copy.)

The explicit-API loops (``step`` / ``annotate`` / ``record``) wait most of a step, as a host waits for its
GPU, and do a little fixed CPU work, so a busy neighbour makes them jitter as real steps do; steps last
250 ms, because the scheduler hiccups of a loaded 2-CPU machine are tens of milliseconds. The loops whose
fault is about the PyTorch hooks are real PyTorch on CPU: a slow ``DataLoader`` (and data-loader worker
counts), and DDP over gloo, whose communication hook times the all-reduce that a straggler's peers wait in.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import otelprof

STEP = 0.25
"""Seconds of a typical explicit-API step."""
WORK = 5_000
"""Units of :func:`cpu_work` per step: a quarter of a millisecond on an idle core."""
DEVICE = 0.25
"""Seconds a PyTorch step spends "on the device" (a sleep in the model's last module)."""
BATCH = 64
LEAK_RATE = 8 * 2**20
"""Bytes per second the leaking loop keeps alive."""


def say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def cpu_work(units: int) -> int:
    """A fixed amount of CPU work (not a wall-clock spin): preemption by a neighbour stretches it."""
    total = 0
    for i in range(units):
        total += i * i
    return total


class Run:
    """Time since the loop started, the fault's onset, and the stop request (the stop file exists)."""

    def __init__(self, onset: float, stop_file: str) -> None:
        self.onset_after = onset
        self.stop_file = stop_file
        self.began = time.time()
        self.faulty = False

    def stopped(self) -> bool:
        return os.path.exists(self.stop_file)

    def elapsed(self) -> float:
        return time.time() - self.began

    def fault(self) -> bool:
        """True from the onset on; announces the onset once."""
        if not self.faulty and self.elapsed() >= self.onset_after:
            self.faulty = True
            say("onset")
        return self.faulty

    def wait(self, seconds: float) -> None:
        """Sleep ``seconds`` or until stopped."""
        deadline = time.monotonic() + seconds
        while not self.stopped() and time.monotonic() < deadline:
            time.sleep(0.1)


def trend(elapsed: float) -> float:
    """A loss that keeps falling over the whole run, 6 % per 15 s at first."""
    return 0.5 + 2.0 * math.exp(-elapsed / 200.0)


def healthy_loss(elapsed: float) -> float:
    """:func:`trend` with per-batch noise."""
    return trend(elapsed) * random.uniform(0.98, 1.02)


def warmup_trend(elapsed: float) -> float:
    """A loss under a learning-rate warm-up: it barely moves for the first 20 s, while the learning rate ramps
    up, then falls."""
    progress = elapsed * elapsed / 40.0 if elapsed < 20.0 else elapsed - 10.0
    return 0.2 + 2.3 * math.exp(-progress / 100.0)


def warmup_loss(elapsed: float) -> float:
    """:func:`warmup_trend` with 15 % noise per batch: healthy, if noisy."""
    return warmup_trend(elapsed) * random.uniform(0.85, 1.15)


def batch_tokens(step: int) -> int:
    """Variable-length batches: 16-64 tokens, and every 33rd batch a long document of 256 tokens."""
    return 256 if step % 33 == 32 else random.randint(16, 64)


# ---------------------------------------------------------------------------------------------- explicit API

def api_step(step: float, loss: float, grad_norm: float = 1.0, extra: float = 0.0, tokens: int | None = None,
             checkpoint: float = 0.0) -> None:
    with otelprof.step():
        with otelprof.annotate("dataloader"):
            time.sleep(0.001)
        with otelprof.annotate("forward"):
            cpu_work(WORK)
            time.sleep(step * 0.4 + extra)
        with otelprof.annotate("backward"):
            time.sleep(step * 0.5)
        with otelprof.annotate("optimizer"):
            time.sleep(0.001)
        if checkpoint:  # saved at the end of the step, as many loops do
            with otelprof.annotate("checkpoint"):
                time.sleep(checkpoint)
        otelprof.record("loss", loss)
        otelprof.record("grad_norm", grad_norm)
        otelprof.record("samples", 32)
        if tokens is not None:
            otelprof.record("tokens", tokens)


def eval_pass(step: float, loss: float, steps: int = 3) -> None:
    """An evaluation pass of ``steps`` steps in the ``eval`` phase."""
    with otelprof.phase("eval"):
        for _ in range(steps):
            with otelprof.step():
                with otelprof.annotate("forward"):
                    cpu_work(WORK)
                    time.sleep(step * 0.4)
                otelprof.record("loss", loss * random.uniform(0.99, 1.01))


def api_loop(kind: str, stop_file: str, options: dict[str, Any]) -> None:
    otelprof.init()
    say("start")
    rank = int(os.environ.get("RANK", "0"))
    step_time = float(options.get("step", STEP))
    if kind == "slow_init":
        say("onset")  # the fault is the start itself
        with otelprof.annotate("load_dataset"):
            Run(0, stop_file).wait(float(options["init_seconds"]))
    run = Run(float(options.get("onset", 5.0)), stop_file)
    leaked: list[bytearray] = []
    step = 0
    spike_until = -1
    while not run.stopped():
        loss = warmup_loss(run.elapsed()) if kind == "lr_warmup" else healthy_loss(run.elapsed())
        grad_norm, extra, checkpoint = 1.0, 0.0, 0.0
        tokens = batch_tokens(step) if kind == "varlen" else None
        if tokens is not None:  # a fixed cost and a cost per token: a long document's batch takes long
            extra = 0.05 + 0.004 * tokens - 0.4 * step_time
        if kind == "warmup" and step < 20:
            extra = 2 * step_time  # the first steps compile and tune kernels: three times as long
        if kind == "checkpoint" and step % 40 == 39:
            checkpoint = 3.0  # a synchronous checkpoint every 40 steps
        if kind == "spike" and spike_until < 0 and run.fault():
            spike_until = step + 5
        spiked = step < spike_until
        if spiked:
            loss *= 10  # a bad batch or an update too large: five steps with ten times the loss, then recovery
        if kind == "stall" and run.fault():
            with otelprof.step():  # stuck inside a step, as on a hung collective
                with otelprof.annotate("collective"):
                    run.wait(3600)
            break
        if kind == "dies" and rank == options["rank"] and run.fault():
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer ends a process: no shutdown
        if kind == "nan" and run.fault():
            loss = math.nan
        if kind == "plateau" and run.fault():  # the loss flattens where it is
            loss = trend(run.onset_after) * (1 + 1e-5 * math.sin(step))
        if kind == "vanishing" and run.fault():
            grad_norm = 1e-9
        if kind == "outliers" and run.fault() and step % 20 == 0:
            extra = 2 * step_time  # a periodic hiccup (a synchronous checkpoint, say): 3x a typical step
        if kind == "leak" and run.fault():
            while sum(map(len, leaked)) < LEAK_RATE * (run.elapsed() - run.onset_after):
                leaked.append(bytearray(b"\x01") * 2**20)  # written, so resident
        api_step(step_time, loss, grad_norm, extra, tokens, checkpoint)
        step += 1
        if kind == "long_eval" and step % 40 == 0:
            eval_pass(step_time, loss * 1.05, steps=40)  # an evaluation pass as long as the training between
        elif step % 20 == 0:
            gap = 1.4 if kind == "overfit" and run.fault() else 1.02
            # an evaluation averages a held-out set: it carries little of one training batch's noise
            # (a training spike is one bad batch: the held-out set does not see it)
            base = warmup_trend(run.elapsed()) if kind == "lr_warmup" else loss / 10 if spiked else loss
            eval_pass(step_time, base * gap)
    otelprof.shutdown()
    say("exit", steps=step)


# ---------------------------------------------------------------------------------------------- PyTorch

def torch_loop(kind: str, stop_file: str, options: dict[str, Any]) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    from otelprof.integrations import torch as otorch

    torch.set_num_threads(1)
    if kind == "workers":
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # a container with one CPU...
    ddp = kind == "ddp"
    if ddp:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    otelprof.init()
    say("start")
    rank = int(os.environ.get("RANK", "0"))
    run = Run(float(options.get("onset", 5.0)), stop_file)
    torch.manual_seed(0)
    truth = torch.randn(64, 8)

    class Regression(Dataset[tuple[Any, Any]]):
        """A learnable task, so that the loss keeps falling; for ``slow_loader`` loading slows down after the
        onset."""

        def __init__(self) -> None:
            self.x = torch.randn(1024, 64)
            self.y = self.x @ truth

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> tuple[Any, Any]:
            if kind == "slow_loader" and run.fault():
                time.sleep(DEVICE * 2 / BATCH)  # decoding from a slow store: twice the device time per batch
            return self.x[i], self.y[i]

    slow = ddp and rank == options.get("slow_rank", -1)

    class Device(torch.nn.Module):
        """Time on the accelerator, here a sleep; the straggler's is ``factor`` times longer after the onset."""

        def forward(self, x: Any) -> Any:
            factor = float(options.get("factor", 1.3)) if slow and run.fault() else 1.0
            time.sleep(DEVICE * factor)
            return x

    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(64, 8), Device())
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=2e-2)
    workers = {"slow_loader": 0, "workers": 3}.get(kind, 1)  # 3 workers on one CPU: ...too many
    loader = DataLoader(Regression(), batch_size=BATCH, shuffle=True, num_workers=workers,
                        persistent_workers=workers > 0)
    otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
    steps = 0
    while True:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if kind == "slow_loader":
                run.fault()
            if not ddp and run.stopped():
                break
        if ddp:  # the ranks agree to stop at an epoch's end (each has the same number of batches)
            stop = torch.tensor([float(run.stopped())])
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item() > 0:
                break
        elif run.stopped():
            break
    otelprof.shutdown()
    say("exit", steps=steps)
    if ddp:
        dist.destroy_process_group()


LOOPS: dict[str, Callable[[str, str, dict[str, Any]], None]] = {
    **{k: api_loop for k in ("steady", "slow_init", "nan", "stall", "plateau", "vanishing", "outliers", "leak",
                             "overfit", "dies", "checkpoint", "long_eval", "warmup", "lr_warmup", "varlen", "spike")},
    **{k: torch_loop for k in ("ddp", "slow_loader", "workers")},
}


if __name__ == "__main__":
    LOOPS[sys.argv[1]](sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) > 3 else {})
