"""Cost of tensor collections at the default save interval, side by side with collections off.

    python benchmarks/tensors.py            # ~8 minutes on 2 CPU cores
    python benchmarks/tensors.py --pairs 3  # quicker, noisier

For the benchmark CNN (benchmarks/torch_integration.py) and a small transformer encoder, in one process:
blocks of ``BLOCK`` training steps with collections off and on (``gradients,weights,biases,outputs,
optimizer`` at ``OTELPROF_SAVE_INTERVAL``'s default, 500: each block saves two steps; with the tensor metrics
on, as under a session with the default ``OTELPROF_TENSOR_SERIES_MAX``), the order alternating, ``--pairs``
times. Printed: the median step time of each side, the median of the pairs' differences as a share of the step
(the amortized cost), what one saved step costs, and the time the metrics (sums, flags, the per-layer checks)
took per saved step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from otelprof import semconv as sc
from otelprof.config import Config
from otelprof.integrations.tensor_metrics import TensorMetrics
from otelprof.integrations.tensors import TensorCollector
from otelprof.runtime.metrics import MetricRegistry
from otelprof.tensor_collections import DEFAULT_SAVE_INTERVAL, parse_collections

BLOCK = 2 * DEFAULT_SAVE_INTERVAL
COLLECTIONS = "gradients,weights,biases,outputs,optimizer"
METRICS_TIME: list[float] = []
"""Seconds each saved step's metrics took (TensorMetrics.observe)."""


class _TimedMetrics(TensorMetrics):
    def observe(self, *args: object, **kwargs: object) -> None:
        start = time.perf_counter()
        super().observe(*args, **kwargs)  # type: ignore[arg-type]
        METRICS_TIME.append(time.perf_counter() - start)


def make_cnn() -> tuple[torch.nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 7 * 7, 10))
    x, y = torch.randn(32, 1, 28, 28), torch.randint(0, 10, (32,))
    return model, lambda: (x, y)


class _Transformer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, 64)
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(64, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(self.embed(tokens)))
        return out.reshape(-1, 256)


def make_transformer() -> tuple[torch.nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    tokens = torch.randint(0, 256, (16, 33))
    return _Transformer(), lambda: (tokens[:, :-1], tokens[:, 1:].reshape(-1))


def block(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: Callable[[], tuple[torch.Tensor,
          torch.Tensor]], on: bool, directory: Path) -> list[float]:
    """Step times (seconds) of one block; ``on``: with a collector saving :data:`COLLECTIONS`."""
    collector = None
    if on:
        collector = TensorCollector(parse_collections(COLLECTIONS), DEFAULT_SAVE_INTERVAL, directory)
        collector.metrics = _TimedMetrics(MetricRegistry({k: "bench" for k in sc.IDENTITY_LABELS}),
                                          Config().tensor_series_max)
        collector.add_model(model)
        collector.start(discover=False)
    times = []
    for _ in range(BLOCK):
        start = time.perf_counter()
        x, y = data()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    if collector is not None:
        collector.close()
    return times


def measure(name: str, make: Callable[[], tuple[torch.nn.Module, Callable[[], tuple[torch.Tensor, torch.Tensor]]]],
            pairs: int) -> None:
    model, data = make()
    METRICS_TIME.clear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with tempfile.TemporaryDirectory() as tmp:
        block(model, optimizer, data, False, Path(tmp))  # warm-up
        off: list[float] = []
        on: list[float] = []
        saved: list[float] = []
        unsaved: list[float] = []
        differences = []
        for i in range(pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            sums = {}
            for side in order:
                times = block(model, optimizer, data, side, Path(tmp) / f"{i}")
                sums[side] = sum(times) / len(times)
                (on if side else off).extend(times)
                if side:
                    saved += [times[0], times[DEFAULT_SAVE_INTERVAL]]
                    unsaved += times[1:DEFAULT_SAVE_INTERVAL] + times[DEFAULT_SAVE_INTERVAL + 1:]
            differences.append((sums[True] - sums[False]) / sums[False])
        lines = sum(1 for _ in (Path(tmp) / "0" / "tensors.jsonl").open())
    median_off = statistics.median(off)
    print(f"{name}: step {median_off * 1e3:.2f} ms off, {statistics.median(on) * 1e3:.2f} ms on; "
          f"amortized cost at every {DEFAULT_SAVE_INTERVAL} steps: {statistics.median(differences) * 100:+.2f} % "
          f"(pairs: {', '.join(f'{d * 100:+.1f}' for d in differences)}); one saved step: "
          f"{(statistics.median(saved) - statistics.median(unsaved)) * 1e3:.1f} ms more "
          f"({len(saved)} saved steps, {lines} lines per block), of which the tensor metrics "
          f"{statistics.median(METRICS_TIME) * 1e3:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, collections {COLLECTIONS}, blocks of {BLOCK} steps")
    measure("CNN", make_cnn, args.pairs)
    measure("transformer", make_transformer, args.pairs)


if __name__ == "__main__":
    main()
