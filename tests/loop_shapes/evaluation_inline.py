"""Evaluation without a DataLoader, interleaved with training: batches are slices of in-memory tensors; every
``EVAL_EVERY`` updates the loop evaluates a few batches with ``model.eval()`` only (gradients stay on, as in
loops that forget ``torch.no_grad()``), then goes back to ``model.train()``. The model returns a Hugging
Face-style output (a dict with attribute access, ``loss`` and ``logits``); evaluation never calls ``backward()``,
and each evaluation batch's loss is its eval step's loss."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tests.loop_shapes import Account, Instrument, run_as_script

EVAL_EVERY, EVAL_BATCHES, UPDATES, BATCH = 3, 2, 8, 8


class Output(dict[str, Any]):
    """A ``ModelOutput``-like result: a mapping whose keys are also attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor | None = None) -> Output:
        logits = self.body(inputs)
        output = Output(logits=logits)
        if labels is not None:
            output["loss"] = F.cross_entropy(logits, labels)
        return output


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    inputs, labels = torch.randn(96, 6), torch.randint(0, 3, (96,))
    held_out, held_out_labels = torch.randn(32, 6), torch.randint(0, 3, (32,))
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if instrument is not None:
        instrument(model=model, optimizer=optimizer)
    account = Account()
    for update in range(UPDATES):
        start = update * BATCH % len(inputs)
        account.step("train")
        output = model(inputs[start:start + BATCH], labels=labels[start:start + BATCH])
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        account.did("forward", "backward", "optimizer")
        account.backward_loss(output.loss)
        if (update + 1) % EVAL_EVERY == 0:
            model.eval()
            for k in range(EVAL_BATCHES):
                account.step("eval")
                output = model(held_out[k * BATCH:(k + 1) * BATCH], labels=held_out_labels[k * BATCH:(k + 1) * BATCH])
                account.did("forward")
                account.eval_loss(output.loss)
            model.train()
    return account


if __name__ == "__main__":
    run_as_script(main)
