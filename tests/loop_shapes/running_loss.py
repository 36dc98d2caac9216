"""A running-loss accumulator (a tensor: ``running += loss.detach()``, recorded each step with ``otelprof.record``
and reset in place every few steps, as loops that log a windowed mean do): each step keeps the value the
accumulator had when it was recorded, not the one the recorder would find later (0 after a reset)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import otelprof
from tests.loop_shapes import Account, Instrument, run_as_script

WINDOW = 4


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.ReLU(), torch.nn.Linear(10, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(80, 6), torch.randint(0, 2, (80,))), batch_size=8)
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=loader)
    account = Account()
    running = torch.zeros(())
    for i, (data, target) in enumerate(loader):
        account.step("train")
        account.samples(len(data))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        running += loss.detach()
        otelprof.record("running_loss", running)
        account.recorded("running_loss", running)
        optimizer.step()
        account.did("dataloader", "forward", "backward", "optimizer")
        account.backward_loss(loss)
        if i % WINDOW == WINDOW - 1:
            running.zero_()
    return account


if __name__ == "__main__":
    run_as_script(main)
