"""Evaluation with a DataLoader (as in PyTorch's ImageNet example): after each training epoch, ``validate()`` runs
the validation loader under ``model.eval()`` and ``torch.no_grad()``; the loss comes from a loss module
(``nn.CrossEntropyLoss``), in training and in evaluation. Each validation batch is an eval step; its loss is the
loss module's output, which only ``otelprof run``'s global hooks see."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.loop_shapes import OTHER_FORWARD, Account, Instrument, run_as_script


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.BatchNorm1d(20), torch.nn.ReLU(),
                                torch.nn.Dropout(0.1), torch.nn.Linear(20, 5))
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    train_loader = DataLoader(TensorDataset(torch.randn(64, 10), torch.randint(0, 5, (64,))), batch_size=16,
                              shuffle=True)
    val_loader = DataLoader(TensorDataset(torch.randn(40, 10), torch.randint(0, 5, (40,))), batch_size=16)
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=train_loader)
        instrument(dataloader=val_loader)
    account = Account()

    def train() -> None:
        model.train()
        for images, target in train_loader:
            account.step("train")
            account.samples(len(images))
            output = model(images)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            account.did("dataloader", "forward", OTHER_FORWARD, "backward", "optimizer")
            account.backward_loss(loss)

    def validate() -> None:
        model.eval()
        with torch.no_grad():
            for images, target in val_loader:  # 16, 16 and 8
                account.step("eval")
                account.samples(len(images))
                output = model(images)
                loss = criterion(output, target)
                account.did("dataloader", "forward", OTHER_FORWARD)
                account.eval_loss(loss, OTHER_FORWARD)

    for _epoch in range(2):
        train()
        validate()
    return account


if __name__ == "__main__":
    run_as_script(main)
