"""A closure optimizer's loop for the tensor collections: ``python tensor_closure_job.py STEPS``.

The shape of PyTorch's time-sequence-prediction example: a recurrent cell called once per time step, the whole
training set one batch, ``optimizer.step(closure)`` with L-BFGS (the model is first called inside ``step()``,
by the closure, several times a step), and after each step a prediction under ``torch.no_grad()`` without
``model.eval()``. Prints, as one JSON line, what the loop itself sees at every step: each parameter's L2 norm
and its gradient's just before ``step()`` (the previous step's last evaluation; none before the first), the
cell's first output of the step's first evaluation, and each parameter's update.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

HIDDEN, LENGTH, TRAIN, TEST = 6, 12, 7, 3


class Sequence(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(1, HIDDEN)
        self.linear = torch.nn.Linear(HIDDEN, 1)
        self.first_h: list[torch.Tensor] = []  # the cell's first output of every forward, as the loop sees it

    def forward(self, inputs: torch.Tensor, future: int = 0) -> torch.Tensor:
        h = torch.zeros(inputs.size(0), HIDDEN, dtype=inputs.dtype)
        c = torch.zeros(inputs.size(0), HIDDEN, dtype=inputs.dtype)
        outputs = []
        for i, step_input in enumerate(inputs.split(1, dim=1)):
            h, c = self.cell(step_input, (h, c))
            if i == 0 and torch.is_grad_enabled():
                self.first_h.append(h.detach().clone())
            outputs.append(self.linear(h))
        for _ in range(future):
            h, c = self.cell(outputs[-1], (h, c))
            outputs.append(self.linear(h))
        return torch.cat(outputs, dim=1)


def l2(tensor: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(tensor.double()))


def main(steps: int) -> None:
    torch.manual_seed(0)
    shifts = torch.randint(-8, 8, (TRAIN + TEST, 1))
    waves = torch.sin((torch.arange(LENGTH + 1) + shifts).double() / 4.0)
    train_input, train_target = waves[TEST:, :-1], waves[TEST:, 1:]
    test_input = waves[:TEST, :-1]
    seq = Sequence().double()
    criterion = torch.nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=4)
    seen: list[dict[str, Any]] = []

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = criterion(seq(train_input), train_target)
        loss.backward()
        return loss

    for _ in range(steps):
        before = {name: p.detach().clone() for name, p in seq.named_parameters()}
        grads = {name: l2(p.grad) for name, p in seq.named_parameters() if p.grad is not None}
        seq.first_h.clear()
        optimizer.step(closure)
        seen.append({"weights": {name: l2(p) for name, p in before.items()}, "gradients": grads,
                     "first_output": l2(seq.first_h[0]), "first_output_shape": list(seq.first_h[0].shape),
                     "evaluations": len(seq.first_h),
                     "updates": {name: l2(p.detach() - before[name]) for name, p in seq.named_parameters()}})
        with torch.no_grad():  # the prediction: a forward of another batch size, the model still in train mode
            seq(test_input, future=4)
    print(json.dumps({"steps": seen}))


if __name__ == "__main__":
    main(int(sys.argv[1]))
