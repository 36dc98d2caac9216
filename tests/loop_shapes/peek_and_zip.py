"""Two habits of tutorial and semi-supervised scripts: at each epoch's start a batch is peeked at to learn the
batch size (``len(next(iter(loader))[0])``, a throwaway iterator), then the loop zips two loaders (labelled and
unlabelled batches) and runs the model on both. The peeked fetch and the two fetches of an iteration belong to
that iteration's step: one step per optimizer update, none of a fetch alone. The samples are those of every
batch fetched in the step, the peeked one included."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.loop_shapes import Account, Instrument, run_as_script

EPOCHS = 2


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    labelled = DataLoader(TensorDataset(torch.randn(32, 6), torch.randn(32, 1)), batch_size=8)  # 4 batches
    unlabelled = DataLoader(TensorDataset(torch.randn(48, 6)), batch_size=12)  # 4 batches
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=labelled)
        instrument(dataloader=unlabelled)
    account = Account()
    for _ in range(EPOCHS):
        peeked = len(next(iter(labelled))[0])
        first = True
        for (x, y), (u,) in zip(labelled, unlabelled):
            account.step("train")
            if first:
                account.did("dataloader")
                account.samples(peeked)
                first = False
            account.did("dataloader", "dataloader")
            account.samples(len(x) + len(u))
            loss = F.mse_loss(model(x), y) + 0.1 * model(u).pow(2).mean()
            account.did("forward", "forward")
            optimizer.zero_grad()
            loss.backward()
            account.did("backward")
            account.backward_loss(loss)
            optimizer.step()
            account.did("optimizer")
    return account


if __name__ == "__main__":
    run_as_script(main)
