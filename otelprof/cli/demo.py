"""``otelprof demo``: a small model trained on synthetic data on the CPU, recorded locally.

Uses PyTorch when it is installed, a pure-Python model otherwise. A data stall
is injected now and then inside the data loader (the ``dataloader`` region, before
the batch is built), so it shows as an outlier step and as time spent waiting for data.
"""

from __future__ import annotations

import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import otelprof
from otelprof.recording.reader import read_recording
from otelprof.semconv import REGION_DATALOADER

STALL = 0.05
"""Seconds of the data-loader stall injected every ``stall_every`` seconds of training: on any machine about
1 % of the time, so it stands out as an outlier step without making the run input-bound."""


@dataclass(frozen=True)
class DemoResult:
    run_dir: Path
    steps: int
    backend: str


Trainer = tuple[Callable[[float], float], Callable[[], float], Callable[[], None]]
"""A train step (given seconds the data loader stalls first), an eval step and a checkpoint."""


def _torch_trainer(batch_size: int, seed: int) -> Trainer:
    import torch
    from torch import nn

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    with otelprof.annotate("initialization"):
        model = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(16 * 7 * 7, 10),
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        prototypes = torch.randn(10, 1, 28, 28)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, 10, (batch_size,))
        return prototypes[labels] + 3.0 * torch.randn(batch_size, 1, 28, 28), labels

    def train_step(stall: float = 0.0) -> float:
        with otelprof.annotate(REGION_DATALOADER):
            if stall:
                time.sleep(stall)  # an injected slow data loader
            x, y = batch()
        with otelprof.annotate("forward"):
            loss = loss_fn(model(x), y)
        with otelprof.annotate("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with otelprof.annotate("optimizer"):
            optimizer.step()
        otelprof.record("learning_rate", optimizer.param_groups[0]["lr"])
        return float(loss.detach())

    def eval_step() -> float:
        with otelprof.annotate(REGION_DATALOADER):
            x, y = batch()
        with torch.no_grad(), otelprof.annotate("forward"):
            return float(loss_fn(model(x), y))

    def checkpoint() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(model.state_dict(), Path(tmp) / "model.pt")

    return train_step, eval_step, checkpoint


def _python_trainer(batch_size: int, seed: int) -> Trainer:
    rng = random.Random(seed)
    with otelprof.annotate("initialization"):
        true_w = [rng.uniform(-1, 1) for _ in range(16)]
        weights = [0.0] * 16

    def batch() -> list[tuple[list[float], float]]:
        rows = []
        for _ in range(batch_size):
            x = [rng.gauss(0, 1) for _ in range(16)]
            rows.append((x, sum(a * b for a, b in zip(x, true_w)) + rng.gauss(0, 0.1)))
        return rows

    def loss_and_grad(rows: list[tuple[list[float], float]]) -> tuple[float, list[float]]:
        grad = [0.0] * 16
        total = 0.0
        for x, y in rows:
            err = sum(a * b for a, b in zip(x, weights)) - y
            total += err * err
            for i, xi in enumerate(x):
                grad[i] += 2 * err * xi / len(rows)
        return total / len(rows), grad

    def train_step(stall: float = 0.0) -> float:
        with otelprof.annotate(REGION_DATALOADER):
            if stall:
                time.sleep(stall)  # an injected slow data loader
            rows = batch()
        with otelprof.annotate("forward"):
            loss, grad = loss_and_grad(rows)
        with otelprof.annotate("optimizer"):
            for i, g in enumerate(grad):
                weights[i] -= 0.05 * g
        otelprof.record("learning_rate", 0.05)
        return loss

    def eval_step() -> float:
        with otelprof.annotate(REGION_DATALOADER):
            rows = batch()
        with otelprof.annotate("forward"):
            return loss_and_grad(rows)[0]

    def checkpoint() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "weights.txt").write_text(" ".join(map(str, weights)))

    return train_step, eval_step, checkpoint


def run_demo(
    duration: float = 30.0,
    record_dir: str | None = None,
    batch_size: int = 64,
    eval_every: int = 100,
    stall_every: float = 5.0,
    seed: int = 0,
    progress: Callable[[str], None] = print,
    loader_delay: float = 0.0,
    loader_delay_after: float = 0.0,
) -> DemoResult:
    """Train for about ``duration`` seconds and return where the recording is.

    ``loader_delay`` injects a slow data loader: from ``loader_delay_after`` seconds on, every training
    step waits that many seconds more in its ``dataloader`` region (input-bound steps). Every
    ``stall_every`` seconds (0: never) the data loader of one training step also stalls for 50 ms
    (an outlier step).
    """
    session = otelprof.init(job_name="otelprof-demo", record_dir=record_dir)
    try:
        try:
            train_step, eval_step, checkpoint = _torch_trainer(batch_size, seed)
            backend = "pytorch"
        except ImportError:
            train_step, eval_step, checkpoint = _python_trainer(batch_size, seed)
            backend = "python"
        progress(f"otelprof demo: training a small {backend} model on synthetic data for {duration:.0f} s")
        started = time.monotonic()
        next_report = started + 5.0
        next_stall = started + stall_every if stall_every > 0 else math.inf
        steps = 0
        while time.monotonic() - started < duration:
            stall = 0.0
            if loader_delay > 0 and time.monotonic() - started >= loader_delay_after:
                stall += loader_delay  # a slow data loader: input-bound steps
            if time.monotonic() >= next_stall:
                stall += STALL  # an input stall: an outlier step
                next_stall += stall_every
            with otelprof.step():
                loss = train_step(stall)
                otelprof.record("loss", loss)
                otelprof.record("samples", batch_size)
            steps += 1
            if eval_every and steps % eval_every == 0:
                with otelprof.phase("eval"):
                    for _ in range(5):
                        with otelprof.step():
                            otelprof.record("loss", eval_step())
                            otelprof.record("samples", batch_size)
            now = time.monotonic()
            if now >= next_report:
                progress(f"  {now - started:5.1f} s  step {steps:6d}  loss {loss:.4f}")
                next_report = now + 5.0
        with otelprof.annotate("checkpoint"):
            checkpoint()
    finally:
        run_dir = session.run_dir
        session.shutdown()
    if run_dir is None:
        raise RuntimeError("the demo needs the local recording (OTELPROF_RECORD is off or OTEL_SDK_DISABLED is on)")
    return DemoResult(run_dir.parent, steps, backend)


def summarize(run_dir: Path) -> str:
    """A few lines about a recording: steps per phase, step-time percentiles, outliers, spans."""
    recording = read_recording(run_dir)
    lines = []
    for rank in recording.ranks:
        life = rank.lifecycle
        for phase in sorted({s.phase for s in rank.steps}):
            durations = sorted(s.duration for s in rank.steps if s.phase == phase)
            p50 = statistics.median(durations)
            p95 = durations[min(len(durations) - 1, math.ceil(0.95 * len(durations)) - 1)]
            lines.append(f"  rank {rank.rank} {phase:>5}: {len(durations)} steps, p50 {p50 * 1e3:.2f} ms, "
                         f"p95 {p95 * 1e3:.2f} ms, max {durations[-1] * 1e3:.2f} ms")
        spans = list(rank.spans())
        outliers = sum(1 for s in spans if s.attributes.get("otelprof.step.outlier"))
        lines.append(f"  rank {rank.rank}: {len(spans)} spans recorded ({outliers} outlier steps traced)")
        if life.get("first_step_start") and life.get("process_start"):
            init = life["first_step_start"] - life["process_start"]  # type: ignore[operator]
            lines.append(f"  rank {rank.rank}: initialization {init:.2f} s before the first step")
    if recording.skipped_lines:
        lines.append(f"  {recording.skipped_lines} corrupt lines skipped")
    return "\n".join(lines)
