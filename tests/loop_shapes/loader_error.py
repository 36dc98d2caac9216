"""A data loader that raises (a dataset whose ``__getitem__`` cannot read one sample, once): the loop catches the
error and goes on with the next epoch. The fetch that raised opens no step (as the fetch that ends an epoch), and
the error reaches the loop with the traceback bare PyTorch gives it: the loop's line, then the data loader's and
the dataset's frames, none of otelprof's (the account keeps the frames; the test compares them with a run
without otelprof)."""

from __future__ import annotations

import traceback

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from tests.loop_shapes import Account, Instrument, run_as_script

SAMPLES, BATCH, BAD = 40, 8, 20


class Flaky(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(5)
        self.inputs = torch.randn(SAMPLES, 6, generator=generator)
        self.targets = torch.randint(0, 3, (SAMPLES,), generator=generator)
        self.failed = False

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if index == BAD and not self.failed:
            self.failed = True
            raise OSError(f"cannot read sample {index}")
        return self.inputs[index], self.targets[index]


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Flaky(), batch_size=BATCH)
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=loader)
    account = Account()
    for _epoch in range(2):
        try:
            for data, target in loader:  # the first epoch raises at its third batch
                account.step("train")
                account.samples(len(data))
                optimizer.zero_grad()
                loss = F.cross_entropy(model(data), target)
                loss.backward()
                optimizer.step()
                account.did("dataloader", "forward", "backward", "optimizer")
                account.backward_loss(loss)
        except OSError as exc:
            account.facts["traceback"] = [(f.filename, f.lineno, f.name, f.line)
                                          for f in traceback.extract_tb(exc.__traceback__)]
    return account


if __name__ == "__main__":
    run_as_script(main)
