"""No optimizer (as in PyTorch's word-language-model example): an LSTM language model over batches cut from one long
tensor (``get_batch(source, i)``), a loss module (``nn.NLLLoss``), ``model.zero_grad()``, ``backward()``, gradient
clipping and the update done by hand (``p.data.add_(p.grad, alpha=-lr)``); evaluation under ``torch.no_grad()``
after each epoch, and on the test split at the end. Without ``optimizer.step()``, a step ends at the model's next
forward; the last one (the last test batch) when the process ends."""

from __future__ import annotations

import torch

from tests.loop_shapes import OTHER_FORWARD, Account, Instrument, run_as_script

TOKENS, BPTT, BATCH = 20, 5, 4


class RNNModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Embedding(TOKENS, 8)
        self.rnn = torch.nn.LSTM(8, 8)
        self.decoder = torch.nn.Linear(8, TOKENS)

    def forward(self, data: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        output, hidden = self.rnn(self.encoder(data), hidden)
        return torch.log_softmax(self.decoder(output), dim=-1).view(-1, TOKENS), hidden

    def init_hidden(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, batch, 8), torch.zeros(1, batch, 8)


def main(instrument: Instrument | None = None) -> Account:
    torch.manual_seed(1111)
    splits = {name: torch.randint(0, TOKENS, (length,)).view(BATCH, -1).t().contiguous()
              for name, length in (("train", 96), ("valid", 48), ("test", 40))}
    model = RNNModel()
    criterion = torch.nn.NLLLoss()
    if instrument is not None:
        instrument(model=model)
    account = Account()
    lr = 5.0

    def get_batch(source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq_len = min(BPTT, len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)

    def evaluate(source: torch.Tensor) -> None:
        model.eval()
        hidden = model.init_hidden(BATCH)
        with torch.no_grad():
            for i in range(0, source.size(0) - 1, BPTT):
                account.step("eval")
                data, targets = get_batch(source, i)
                output, hidden = model(data, hidden)
                loss = criterion(output, targets)
                account.did("forward", OTHER_FORWARD)
                account.eval_loss(loss, OTHER_FORWARD)

    def train() -> None:
        model.train()
        hidden = model.init_hidden(BATCH)
        for i in range(0, splits["train"].size(0) - 1, BPTT):
            account.step("train")
            data, targets = get_batch(splits["train"], i)
            model.zero_grad()
            hidden = (hidden[0].detach(), hidden[1].detach())
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            account.did("forward", OTHER_FORWARD, "backward")
            account.backward_loss(loss)

    for _epoch in range(2):
        train()
        evaluate(splits["valid"])
        lr /= 4.0
    evaluate(splits["test"])
    return account


if __name__ == "__main__":
    run_as_script(main)
