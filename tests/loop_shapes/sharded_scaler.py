"""Mixed precision as FSDP recipes write it: FSDP's ``ShardedGradScaler`` (its own ``scale()``, the base class's
``step()``) in a one-rank gloo group on the CPU, ``scaler.scale(loss).backward()``, ``scaler.step(optimizer)``,
``scaler.update()``. The recorded loss is the loss as computed, not times the scaler's 2^10."""

from __future__ import annotations

import contextlib
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from tests.loop_shapes import Account, Instrument, run_as_script

STEPS = 6


def main(instrument: Instrument | None = None) -> Account:
    handle, path = tempfile.mkstemp(prefix="otelprof-pg-")
    os.close(handle)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Tanh(), torch.nn.Linear(20, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        scaler = ShardedGradScaler("cpu", init_scale=1024.0)
        if instrument is not None:
            instrument(model=model, optimizer=optimizer)
        account = Account()
        for _ in range(STEPS):
            account.step("train")
            x, y = torch.randn(16, 10), torch.randn(16, 1)
            loss = F.mse_loss(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            account.did("forward", "backward")
            account.backward_loss(loss)
            scaler.step(optimizer)
            scaler.update()
            account.did("optimizer")
        return account
    finally:
        dist.destroy_process_group()
        with contextlib.suppress(FileNotFoundError):  # the file store removes it itself
            os.unlink(path)


if __name__ == "__main__":
    run_as_script(main)
