"""A closure optimizer (as in PyTorch's time-sequence-prediction example): the whole training set is one batch,
``optimizer.step(closure)`` with L-BFGS evaluates the closure (zero_grad, forward, loss module, ``backward()``)
up to ``max_iter`` times, and after each update the loop predicts the test set under ``torch.no_grad()``. A step
is one ``step(closure)``, holding all its evaluations; its loss is what ``step()`` returns (the first evaluation's,
as the loop prints it); each prediction is an eval step of its own."""

from __future__ import annotations

import torch

from tests.loop_shapes import OTHER_FORWARD, Account, Instrument, run_as_script

STEPS, LENGTH = 3, 12


class Sequence(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = torch.nn.LSTMCell(1, 6)
        self.linear = torch.nn.Linear(6, 1)

    def forward(self, inputs: torch.Tensor, future: int = 0) -> torch.Tensor:
        h = torch.zeros(inputs.size(0), 6, dtype=inputs.dtype)
        c = torch.zeros(inputs.size(0), 6, dtype=inputs.dtype)
        outputs = []
        for step_input in inputs.split(1, dim=1):
            h, c = self.cell(step_input, (h, c))
            outputs.append(self.linear(h))
        for _ in range(future):
            h, c = self.cell(outputs[-1], (h, c))
            outputs.append(self.linear(h))
        return torch.cat(outputs, dim=1)


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(0)
    shifts = torch.randint(-8, 8, (10, 1))
    waves = torch.sin((torch.arange(LENGTH + 1) + shifts).double() / 4.0)
    train_input, train_target = waves[3:, :-1], waves[3:, 1:]
    test_input, test_target = waves[:3, :-1], waves[:3, 1:]
    seq = Sequence().double()
    criterion = torch.nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=6)
    if instrument is not None:
        instrument(model=seq, optimizer=optimizer)
    account = Account()
    evaluations: list[float] = []  # the current step's

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        out = seq(train_input)
        loss = criterion(out, train_target)
        evaluations.append(loss.item())
        loss.backward()
        account.did("forward", OTHER_FORWARD, "backward")
        return loss

    for _ in range(STEPS):
        account.step("train")
        evaluations.clear()
        returned = optimizer.step(closure)
        account.did("optimizer")
        assert returned.item() == evaluations[0] and len(evaluations) > 1  # L-BFGS returns its first evaluation
        account.backward_loss(returned)
        account.step("eval")
        with torch.no_grad():
            future = 4
            prediction = seq(test_input, future=future)
            loss = criterion(prediction[:, :-future], test_target)
        account.did("forward", OTHER_FORWARD)
        account.eval_loss(loss, OTHER_FORWARD)
    return account


if __name__ == "__main__":
    run_as_script(main)
