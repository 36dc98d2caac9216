"""A streaming dataset (``IterableDataset``: no length, a generator of samples), batched by a DataLoader; the loop
stops after a set number of steps (``break`` mid-stream) and a second stream runs out with a short last batch."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from tests.loop_shapes import Account, Instrument, run_as_script


class Stream(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, samples: int | None) -> None:
        self.samples = samples

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(3)
        produced = 0
        while self.samples is None or produced < self.samples:
            x = torch.randn(6, generator=generator)
            yield x, x.sum(0, keepdim=True)
            produced += 1


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    endless = DataLoader(Stream(None), batch_size=8)
    finite = DataLoader(Stream(43), batch_size=8)  # 5 full batches and one of 3
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=endless)
        instrument(dataloader=finite)
    account = Account()
    for loader, limit in ((endless, 6), (finite, None)):
        for step, (x, y) in enumerate(loader):
            account.step("train")
            account.samples(len(x))
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            account.did("dataloader", "forward", "backward", "optimizer")
            account.backward_loss(loss)
            if limit is not None and step + 1 == limit:
                break
    return account


if __name__ == "__main__":
    run_as_script(main)
