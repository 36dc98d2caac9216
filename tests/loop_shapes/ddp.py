"""Data-parallel training started by ``torchrun`` (gloo, CPU): a ``DistributedDataParallel`` model returning
``(logits, loss)``, a ``DistributedSampler``, gradient accumulation x2 with ``model.no_sync()`` on the first
micro-batch and ``loss / 2``, then an evaluation pass over a sharded validation set under ``torch.no_grad()``.
Each rank's recording holds its own steps and its own loss (the sum of its ``loss / 2`` micro-batch losses)."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tests.loop_shapes import Account, Instrument, run_as_script

ACCUMULATION = 2


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        prediction = self.layers(x)
        return prediction, F.mse_loss(prediction, y)


def main(instrument: Instrument | None = None) -> Account:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Regressor())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train = TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
    val = TensorDataset(torch.randn(40, 8), torch.randn(40, 1))
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    train_loader = DataLoader(train, batch_size=8, sampler=sampler)  # 8 batches per rank
    val_loader = DataLoader(val, batch_size=8, sampler=DistributedSampler(val, shuffle=False))  # 20 per rank: 8, 8, 4
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=train_loader)
        instrument(dataloader=val_loader)
    account = Account()
    sampler.set_epoch(0)
    model.train()
    for i, (x, y) in enumerate(train_loader):
        if i % ACCUMULATION == 0:
            account.step("train")
        account.samples(len(x))
        last = i % ACCUMULATION == ACCUMULATION - 1
        with model.no_sync() if not last else contextlib.nullcontext():
            _, loss = model(x, y)
            loss = loss / ACCUMULATION
            loss.backward()
        account.did("dataloader", "forward", "backward")
        account.backward_loss(loss)
        if last:
            optimizer.step()
            optimizer.zero_grad()
            account.did("optimizer")
    model.eval()
    with torch.no_grad():
        for x, y in val_loader:
            account.step("eval")
            account.samples(len(x))
            _, loss = model(x, y)
            account.did("dataloader", "forward")
            account.eval_loss(loss)
    dist.barrier()
    dist.destroy_process_group()
    return account


if __name__ == "__main__":
    run_as_script(main)
