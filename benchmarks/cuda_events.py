"""On a machine with a CUDA GPU: device times from CUDA events, end to end, and what they cost per step.

    python benchmarks/cuda_events.py            # needs torch with CUDA and one GPU

The test suite checks the event logic against a fake GPU (there is none on the CI machines); this
script runs the real thing: an MLP on the GPU, instrumented, then prints per region the host time and
the device time from the recording, and the step time bare vs instrumented (medians of 5 rounds).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

import otelprof
from otelprof.integrations import cuda_timing
from otelprof.integrations import torch as otorch
from otelprof.recording.reader import read_recording


def parts() -> tuple[torch.nn.Module, torch.optim.Optimizer, DataLoader[Any]]:
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
    data = TensorDataset(torch.randn(64 * 200, 1024), torch.randint(0, 10, (64 * 200,)))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), DataLoader(data, batch_size=64, pin_memory=True)


def loop(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader[Any]) -> float:
    began = time.perf_counter()
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / len(loader)


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure here (the tests cover the logic with a fake GPU)")
        return 2
    bare, instrumented = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(5):
            model, optimizer, loader = parts()
            loop(model, optimizer, loader)  # warm-up
            bare.append(loop(model, optimizer, loader))
            session = otelprof.init(record_dir=tmp, system_metrics=False)
            inst = otorch.instrument(model=model, optimizer=optimizer, dataloader=loader)
            instrumented.append(loop(model, optimizer, loader))
            assert isinstance(inst.device_timer, cuda_timing.DeviceTimer), "no device timer on a CUDA model"
            run_dir = session.run_dir
            otorch.uninstrument()
            otelprof.shutdown()
        assert run_dir is not None
        rank = read_recording(run_dir).ranks[0]
        host: dict[str, list[int]] = {}
        for step in rank.steps:
            for a in step.annotations:
                host.setdefault(a.name, []).append(a.duration_ns)
        device: dict[str, list[int]] = {}
        for d in rank.device_times:
            device.setdefault(d.name, []).append(d.duration_ns)
    print(f"{'region':<12} {'host p50':>10} {'device p50':>11} {'device times':>13}")
    for name in sorted(host):
        d = device.get(name, [])
        print(f"{name:<12} {statistics.median(host[name]) / 1e3:>8.0f}us "
              f"{(statistics.median(d) / 1e3 if d else float('nan')):>9.0f}us {len(d):>13}")
    b, i = statistics.median(bare), statistics.median(instrumented)
    print(f"\nstep: bare {b * 1e3:.3f} ms, instrumented {i * 1e3:.3f} ms ({(i / b - 1) * 100:+.2f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
