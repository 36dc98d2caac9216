"""The minimal loop (as in PyTorch's MNIST example): a DataLoader, zero_grad / forward / loss / backward / step, two
epochs; the loss a function of the model's output."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.loop_shapes import Account, Instrument, run_as_script


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = DataLoader(TensorDataset(torch.randn(72, 4, 4), torch.randint(0, 4, (72,))), batch_size=16, shuffle=True)
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=loader)
    account = Account()
    model.train()
    for _epoch in range(2):
        for data, target in loader:  # 5 batches an epoch, the last of 8
            account.step("train")
            account.samples(len(data))
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(F.log_softmax(output, dim=1), target)
            loss.backward()
            optimizer.step()
            account.did("dataloader", "forward", "backward", "optimizer")
            account.backward_loss(loss)
    return account


if __name__ == "__main__":
    run_as_script(main)
