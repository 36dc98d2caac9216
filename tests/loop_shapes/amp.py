"""Automatic mixed precision with a gradient scaler (as in PyTorch's AMP recipe): ``torch.autocast`` (CPU,
bfloat16) around forward and loss, ``scaler.scale(loss).backward()``, ``scaler.step(optimizer)``,
``scaler.update()``. One iteration's gradients are made infinite: the scaler skips that ``optimizer.step()``
(and halves its scale), and the iteration is still one step, without an optimizer region."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.loop_shapes import Account, Instrument, run_as_script

SKIPPED = 3
"""The iteration whose gradients are made infinite."""


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.Linear(24, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(96, 12), torch.randint(0, 3, (96,))), batch_size=16)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=loader)
    account = Account()
    for i, (x, y) in enumerate(loader):
        account.step("train")
        account.samples(len(x))
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            output = model(x)
            loss = F.cross_entropy(output, y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        account.did("dataloader", "forward", "backward")
        account.backward_loss(loss)  # the loss as computed, not times the scale
        if i == SKIPPED:
            next(model.parameters()).grad[0, 0] = float("inf")
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() < scale:
            assert i == SKIPPED  # the scaler skipped optimizer.step() for this iteration only
        else:
            account.did("optimizer")
    return account


if __name__ == "__main__":
    run_as_script(main)
