"""``optimizer.step(closure)`` with an optimizer that evaluates the closure once (SGD with momentum), over a
DataLoader: the closure does zero_grad, forward, loss, ``backward()`` and returns the loss, which ``step()``
returns. One train step per batch; its loss is the closure's."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.loop_shapes import Account, Instrument, run_as_script


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(TensorDataset(torch.randn(44, 5), torch.randint(0, 3, (44,))), batch_size=8, shuffle=True)
    if instrument is not None:
        instrument(model=model, optimizer=optimizer, dataloader=loader)
    account = Account()
    for _epoch in range(2):
        for data, target in loader:  # 6 batches an epoch, the last of 4
            account.step("train")
            account.samples(len(data))
            evaluations: list[torch.Tensor] = []

            def closure(data: torch.Tensor = data, target: torch.Tensor = target,
                        evaluations: list[torch.Tensor] = evaluations) -> torch.Tensor:
                optimizer.zero_grad()
                loss = F.cross_entropy(model(data), target)
                loss.backward()
                evaluations.append(loss)
                return loss

            returned = optimizer.step(closure)
            assert len(evaluations) == 1 and returned is evaluations[0]
            account.did("dataloader", "forward", "backward", "optimizer")
            account.backward_loss(returned)
    return account


if __name__ == "__main__":
    run_as_script(main)
